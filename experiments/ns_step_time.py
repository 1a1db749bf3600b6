"""Navier–Stokes time per step (Taylor–Green, Re = 1600, BDF3/EXT3, pMG pressure): warm timing.

For each mesh: setup, one sample interval to compile and pass the start-up, then ``--steps``
timed steps (one jitted chunk); reports ms per step, the pressure and velocity iterations
of the last step, and the time of one convective term and one pressure solve alone.

    python experiments/ns_step_time.py --order 3 --elements 4 --steps 10      # seconds on a CPU
    python experiments/ns_step_time.py --order 7 --elements 16 32 --steps 100 # one GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS


def _time(fn, *args, repeats=3):
    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def case(K, p, dt, steps, backend):
    mesh = js.box_mesh(K, p, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    t = time.perf_counter()
    ns = NS.setup(mesh, nu=1 / 1600, dt=dt, backend=backend)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    setup = time.perf_counter() - t
    st, s, _ = NS.run(ns, st, 0.1, sample_interval=0.1)
    many = jax.jit(lambda ns, st: jax.lax.fori_loop(0, steps, lambda i, x: NS.step(ns, x)[0], st))
    t_step = _time(many, ns, st, repeats=2) / steps
    _, info = jax.jit(NS.step)(ns, st)
    conv = jax.jit(lambda ns, u: ns.sem.local_map(lambda s_, ns_, u_: NS._convection(ns_, s_, u_), ns, u))
    t_conv = _time(conv, ns, st.u)
    curlcurl = jax.jit(lambda ns, u: ns.sem.local_map(
        lambda s_, ns_, u_: NS._curl(ns_, s_, NS._curl(ns_, s_, u_)), ns, u))
    t_cc = _time(curlcurl, ns, st.u)
    # the step's own pressure and velocity right-hand sides (periodic: no lift), then each solve alone
    beta_, a_ = NS.bdf_ext(ns.options.time_order)
    beta, a, h2 = jnp.asarray(beta_), jnp.asarray(a_), beta_[0] / dt

    def rhs(s_, ns_, st_):
        F = jnp.concatenate([NS._convection(ns_, s_, st_.U[0])[None], st_.F[:-1]])
        Ub, Fx, ux = jnp.tensordot(beta[1:], st_.U, 1) / ns_.dt, jnp.tensordot(a, F, 1), jnp.tensordot(a, st_.U, 1)
        R = Ub + Fx - ns_.nu * NS._curl(ns_, s_, NS._curl(ns_, s_, ux))
        return s_.dssum(NS._weak_grad_t(s_, R)), s_.mask * s_.dssum(s_.bmass * (Ub + Fx)), s_.mask * ux

    bp, bv, x0 = jax.jit(lambda ns, st: ns.sem.local_map(rhs, ns, st))(ns, st)
    psolve = jax.jit(lambda ns, b, p0: ns.sem.local_map(lambda s_, ns_, b_, p_: NS._pressure_solve(ns_, b_, p_),
                                                        ns, b, p0))
    vsolve = jax.jit(lambda ns, b, x: ns.sem.local_map(
        lambda s_, ns_, b_, x_: NS._velocity_solve(ns_, b_, x_, h2), ns, b, x))
    t_p = _time(psolve, ns, bp, st.p)
    t_v = _time(vsolve, ns, bv, x0)
    pits, vits = int(psolve(ns, bp, st.p)[1].iterations), int(vsolve(ns, bv, x0)[1].iterations)
    return dict(elements=K, order=p, points=K**3 * p**3, dt=dt, steps=steps, setup_seconds=setup,
                ms_per_step=1e3 * t_step, convection_ms=1e3 * t_conv, curl_curl_ms=1e3 * t_cc,
                pressure_solve_ms=1e3 * t_p, pressure_solve_iterations=pits, velocity_solve_ms=1e3 * t_v,
                velocity_solve_iterations=vits,
                pressure_iterations=int(info.pressure.iterations), velocity_iterations=int(info.velocity.iterations),
                kinetic_energy=float(NS.diagnostics(ns, st).kinetic_energy), backend=ns.sem.backend.name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, nargs="+", default=[4])
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", default="ns_step_time.json")
    a = ap.parse_args(argv)
    rows = []
    for K in a.elements:
        r = case(K, a.order, a.dt, a.steps, a.backend)
        print(r, flush=True)
        rows.append(r)
    dev = jax.devices()[0]
    json.dump(dict(experiment="ns_step_time", device=dev.device_kind, jax_version=jax.__version__,
                   command="python " + " ".join(sys.argv), rows=rows), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
