"""jax.grad through Navier–Stokes against central differences: the table of issue 38, re-run.

A periodic Taylor–Green start on [−π, π]³ (ν = 0.02, Δt = 0.01, p = 4, pressure and velocity
tolerances 1e-12), K³ elements, a number of BDF3 steps of ``simulate``. The loss is the final
kinetic energy, either summed over every element-local node with that element's GLL weights
(``local``: the copies of a shared node each carry their own weight) or the project's
``NS.diagnostics(...).kinetic_energy`` (``diagnostics``). For each row: jax.grad w.r.t. ν and the
initial amplitude V0 (u⁰ = V0·u_TG) against central differences with relative steps 1e-3
and 1e-4 (their agreement bounds the difference's own error), and the forward-mode jvp.

    python -m experiments.ns_gradient_check                      # the first row, seconds on a CPU
    python -m experiments.ns_gradient_check --rows 6 --out ns_gradient_check_cpu.json   # the table, minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS

ROWS = [(2, 15, "local"), (3, 6, "local"), (3, 6, "diagnostics"), (3, 15, "local"), (4, 4, "local"),
        (4, 15, "local")]


def row(K, steps, loss_kind, nu=0.02, dt=0.01, order=4, tol=1e-12):
    mesh = js.box_mesh(K, order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=nu, dt=dt, options=NS.NSOptions(pressure_tol=tol, velocity_tol=tol))
    u_tg = flows.taylor_green().velocity(*ns.sem.x)

    def energy(nu_, v0):
        n = dataclasses.replace(ns, nu=nu_)
        st = NS.simulate(n, NS.initial_state(n, v0 * u_tg), steps)
        if loss_kind == "local":
            return 0.5 * jnp.sum(n.sem.bmass * jnp.sum(st.u ** 2, 0))
        return NS.diagnostics(n, st).kinetic_energy

    value = jax.jit(energy)
    t0 = time.perf_counter()
    g_nu, g_v0 = (float(g) for g in jax.jit(jax.grad(energy, argnums=(0, 1)))(nu, 1.0))
    jvp_nu = float(jax.jit(lambda a, b: jax.jvp(energy, (a, b), (1.0, 0.0))[1])(nu, 1.0))
    out = dict(elements=K, steps=steps, loss=loss_kind, grad_nu=g_nu, grad_v0=g_v0, jvp_nu=jvp_nu)
    for h in (1e-3, 1e-4):
        fd_nu = (float(value(nu * (1 + h), 1.0)) - float(value(nu * (1 - h), 1.0))) / (2 * nu * h)
        fd_v0 = (float(value(nu, 1 + h)) - float(value(nu, 1 - h))) / (2 * h)
        out[f"fd_nu_h{h:g}"], out[f"fd_v0_h{h:g}"] = fd_nu, fd_v0
        out[f"rel_err_nu_h{h:g}"] = abs(g_nu - fd_nu) / abs(fd_nu)
        out[f"rel_err_v0_h{h:g}"] = abs(g_v0 - fd_v0) / abs(fd_v0)
    out["rel_err_jvp_vs_grad_nu"] = abs(jvp_nu - g_nu) / abs(g_nu)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="ns_gradient_check.json", help="write the rows as JSON here")
    ap.add_argument("--rows", type=int, default=1, help=f"run the first ROWS of the {len(ROWS)} rows")
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    rows = []
    for K, steps, kind in ROWS[: args.rows]:
        r = row(K, steps, kind)
        print(f"{K}^3 {steps:3d} steps {kind:11s} nu: {r['rel_err_nu_h0.001']:.1e} / {r['rel_err_nu_h0.0001']:.1e}"
              f"  V0: {r['rel_err_v0_h0.001']:.1e} / {r['rel_err_v0_h0.0001']:.1e}"
              f"  jvp-grad {r['rel_err_jvp_vs_grad_nu']:.1e}  ({r['seconds']} s)", flush=True)
        rows.append(r)
    if args.out:
        meta = dict(device=str(jax.devices()[0]), platform=platform.platform(), python=sys.version.split()[0],
                    jax=jax.__version__, jaxlib=jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
                    command="python -m experiments.ns_gradient_check " + " ".join(argv or sys.argv[1:]),
                    nu=0.02, dt=0.01, order=4, tol=1e-12)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
