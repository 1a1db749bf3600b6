"""Ethier–Steinman convergence of the Navier–Stokes solver: spectral in p, order k in Δt.

The exact unsteady 3-D solution (Ethier & Steinman 1994, a = π/4, d = π/2, ν = 1) on
[−1, 1]³ (2³ elements) with its Dirichlet data; every step at order k (exact past levels).
Relative L2 velocity error at T, for p = 3..8 (Δt = 1e-3, T = 0.01, BDF3) and for
Δt = 0.04, 0.02, 0.01 (p = 8, T = 0.4, k = 1, 2, 3) with the fitted orders.

    python experiments/ethier_steinman.py --out ethier_steinman_cpu.json     # a few minutes on a CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys

import jax

import jaxsem as js
from jaxsem.models import flows, poisson
from jaxsem.models import navier_stokes as NS


# One flow per ν: its velocity is the problem's static boundary, and the same function object
# lets the Δt of one p and k run on one compiled program.
_flow = functools.lru_cache(maxsize=None)(lambda nu: flows.ethier_steinman(nu=nu))


def error(p, dt, T, k, K=2, nu=1.0):
    es = _flow(nu)
    mesh = js.box_mesh(K, p, lengths=(2.0,) * 3, origin=(-1.0,) * 3)
    ns = NS.setup(mesh, nu=nu, dt=dt, boundary=es.velocity,
                  options=NS.NSOptions(time_order=k, pressure_tol=1e-11, velocity_tol=1e-12))
    st = NS.initial_state(ns, lambda x, y, z: es.velocity(x, y, z, 0.0), past=es.velocity)
    st, s, _ = NS.run(ns, st, T, sample_interval=T)
    e = poisson.relative_errors(ns.sem, st.u, lambda x, y, z: es.velocity(x, y, z, T))[0]
    return dict(order=p, dt=dt, t_final=T, time_order=k, error_l2=e, divergence=float(s.divergence[-1]),
                pressure_iterations=int(s.pressure_iterations[-1]), velocity_iterations=int(s.velocity_iterations[-1]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, nargs="+", default=[3, 4, 5, 6, 7, 8])
    ap.add_argument("--dts", type=float, nargs="+", default=[0.04, 0.02, 0.01])
    ap.add_argument("--out", default="ethier_steinman.json")
    a = ap.parse_args(argv)
    space = [error(p, 1e-3, 0.01, 3) for p in a.orders]
    for r in space:
        print(r, flush=True)
    time = {}
    for k in (1, 2, 3):
        rows = [error(8, dt, 0.4, k) for dt in a.dts]
        for r0, r1 in zip(rows, rows[1:]):
            r1["observed_order"] = math.log(r0["error_l2"] / r1["error_l2"]) / math.log(r0["dt"] / r1["dt"])
        time[k] = rows
        print(k, [(r["dt"], r["error_l2"], r.get("observed_order")) for r in rows], flush=True)
    json.dump(dict(experiment="ethier_steinman", device=jax.devices()[0].device_kind, jax_version=jax.__version__,
                   command="python " + " ".join(sys.argv), space=space, time=time), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
