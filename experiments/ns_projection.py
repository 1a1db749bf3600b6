"""Pressure projection onto previous solutions (``NSOptions.pressure_projection``) in the
Taylor–Green run: iterations and time per step with and without it, from a state of the run.

Runs the Taylor–Green vortex (Re = 1600, BDF3/EXT3, p-multigrid pressure) to ``--t0`` with the
extrapolated start, then, for each projection length L of ``--lengths`` (0: the extrapolated
start), ``--steps`` steps from that state (one jitted ``simulate``, compiled by a first call, then
timed once) with an empty basis: ms per step, mean pressure and velocity iterations, the
kinetic energy at the end. Rows go to ``--out`` (JSON).

    python -m experiments.ns_projection --elements 5 --order 5 --dt 0.025 --t0 7.5 --steps 100 \\
        --lengths 0 8 16                                               # a CPU, minutes
    python -m experiments.ns_projection --elements 36 --order 7 --dt 3e-3 --t0 6 --steps 100 \\
        --lengths 0 8 16 --pressure-tol 1e-6 --velocity-tol 1e-8      # NekRS's case, one GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS

from experiments.common import Results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--elements", type=int, default=5)
    ap.add_argument("--dt", type=float, default=0.025)
    ap.add_argument("--t0", type=float, default=7.5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lengths", type=int, nargs="+", default=[0, 8, 16])
    ap.add_argument("--pressure-tol", type=float, default=1e-6)
    ap.add_argument("--velocity-tol", type=float, default=1e-8)
    ap.add_argument("--chunk", type=int, default=200, help="steps per jitted call on the way to t0")
    ap.add_argument("--out", default="ns_projection.json")
    a = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    mesh = js.box_mesh(a.elements, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    u0 = flows.taylor_green().velocity
    opts = lambda L: NS.NSOptions(pressure_tol=a.pressure_tol, velocity_tol=a.velocity_tol,  # noqa: E731
                                  pressure_projection=L)
    ns = NS.setup(mesh, 1 / 1600, a.dt, options=opts(0))
    st = NS.initial_state(ns, u0)
    n0 = round(a.t0 / a.dt)
    chunk = jax.jit(lambda ns, st: NS.simulate(ns, st, a.chunk))
    tic = time.perf_counter()
    while int(st.step) + a.chunk <= n0:
        st = chunk(ns, st)
        print(f"t = {float(st.t):.3f} ({time.perf_counter() - tic:.0f} s)", flush=True)
    rest = n0 - int(st.step)
    if rest:
        st = jax.jit(lambda ns, st: NS.simulate(ns, st, rest))(ns, st)
    rows = Results(a.out, "ns_projection")
    for L in a.lengths:
        nsL = NS.setup(mesh, 1 / 1600, a.dt, options=opts(L), backend=ns.sem.backend.name)
        empty = NS.initial_state(nsL, u0)
        start = dataclasses.replace(st, X=empty.X, G=empty.G, nx=empty.nx)
        run = jax.jit(lambda ns, st: NS.simulate(ns, st, a.steps, info=True))
        jax.block_until_ready(run(nsL, start))
        t = time.perf_counter()
        end, info = jax.block_until_ready(run(nsL, start))
        sec = time.perf_counter() - t
        pits, vits = np.asarray(info.pressure.iterations), np.asarray(info.velocity.iterations)
        row = dict(projection=L, elements=a.elements, order=a.order, dt=a.dt, t0=float(st.t), steps=a.steps,
                   pressure_tol=a.pressure_tol, velocity_tol=a.velocity_tol, backend=nsL.sem.backend.name,
                   device=str(jax.devices()[0].device_kind), ms_per_step=1e3 * sec / a.steps,
                   pressure_iterations_mean=float(pits.mean()), pressure_iterations_max=int(pits.max()),
                   velocity_iterations_mean=float(vits.mean()),
                   converged=bool(np.all(np.asarray(info.pressure.converged))),
                   kinetic_energy=float(NS.diagnostics(nsL, end).kinetic_energy))
        rows.append(row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
