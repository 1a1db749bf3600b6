"""Ethier–Steinman convergence of the Navier–Stokes solver: spectral in p, order k in Δt.

The exact unsteady 3-D solution (Ethier & Steinman 1994, a = π/4, d = π/2, ν = 1) on
[−1, 1]³ (2³ elements) with its Dirichlet data; every step at order k (exact past levels).
Relative L2 velocity error at T, for ``--orders`` p (Δt = 1e-3, T = 0.01, BDF3) and for
``--dts`` (p = ``--time-p``, T = 0.4, k = 1, 2, 3) with the fitted orders.

    python -m experiments.ethier_steinman                                   # seconds on a CPU: p = 3, 4
    python -m experiments.ethier_steinman --orders 3 4 5 6 7 8 --dts 0.04 0.02 0.01 --time-p 8 \
        --max-cfl 5 --out ethier_steinman_cpu.json                          # docs/navier-stokes.md, minutes
The Δt = 0.04 run at p = 8 starts at CFL 4.3, above the default guard (``NSOptions.max_cfl``).
"""

from __future__ import annotations

import argparse
import functools
import math


import jaxsem as js
from jaxsem.models import flows, poisson
from jaxsem.models import navier_stokes as NS

from experiments.common import record, write_json


# One flow per ν: its velocity is the problem's static boundary, and the same function object
# lets the Δt of one p and k run on one compiled program.
_flow = functools.lru_cache(maxsize=None)(lambda nu: flows.ethier_steinman(nu=nu))


def error(p, dt, T, k, K=2, nu=1.0, max_cfl=NS.NSOptions.max_cfl):
    es = _flow(nu)
    mesh = js.box_mesh(K, p, lengths=(2.0,) * 3, origin=(-1.0,) * 3)
    ns = NS.setup(mesh, nu=nu, dt=dt, boundary=es.velocity,
                  options=NS.NSOptions(time_order=k, pressure_tol=1e-11, velocity_tol=1e-12, max_cfl=max_cfl))
    st = NS.initial_state(ns, lambda x, y, z: es.velocity(x, y, z, 0.0), past=es.velocity)
    st, s, _ = NS.run(ns, st, T, sample_interval=T)
    e = poisson.relative_errors(ns.sem, st.u, lambda x, y, z: es.velocity(x, y, z, T))[0]
    return dict(order=p, dt=dt, t_final=T, time_order=k, error_l2=e, divergence=float(s.divergence[-1]),
                pressure_iterations=int(s.pressure_iterations[-1]), velocity_iterations=int(s.velocity_iterations[-1]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, nargs="+", default=[3, 4], help="orders p of the spatial study")
    ap.add_argument("--dts", type=float, nargs="+", default=[0.02, 0.01], help="time steps of the Δt study")
    ap.add_argument("--time-p", type=int, default=4, help="order p of the Δt study")
    ap.add_argument("--max-cfl", type=float, default=NS.NSOptions.max_cfl, help="NSOptions.max_cfl of every run")
    ap.add_argument("--out", default="ethier_steinman.json", help="JSON output")
    a = ap.parse_args(argv)
    space = [error(p, 1e-3, 0.01, 3, max_cfl=a.max_cfl) for p in a.orders]
    for r in space:
        print(r, flush=True)
    time = {}
    for k in (1, 2, 3):
        rows = [error(a.time_p, dt, 0.4, k, max_cfl=a.max_cfl) for dt in a.dts]
        for r0, r1 in zip(rows, rows[1:]):
            r1["observed_order"] = math.log(r0["error_l2"] / r1["error_l2"]) / math.log(r0["dt"] / r1["dt"])
        time[k] = rows
        print(k, [(r["dt"], r["error_l2"], r.get("observed_order")) for r in rows], flush=True)
    write_json(a.out, dict(record("ethier_steinman"), space=space, time=time))


if __name__ == "__main__":
    main()
