"""Navier–Stokes time per step (Taylor–Green, Re = 1600, BDF3/EXT3, pMG pressure) over devices: warm timing.

For each mesh and device count P: setup, one sample interval to compile and pass the start-up, then
``--steps`` timed steps (one jitted chunk); reports ms per step, the pressure and velocity iterations
of the last step, and the time of each part alone: one convective term, one curl-curl, one pressure
solve and one velocity solve (the step's own right-hand sides), and one gather–scatter (``dssum``) of
the velocity, its neighbour exchange included (a jitted loop of 20). Transports as in ``scaling.py``:
``shard`` (``--devices`` of this process, or of every process started by ``mpirun``) or ``mpi``
(``mpirun -n P``, one process per device, mpi4jax). Rows go to ``--out`` (JSON) as they finish;
strong-scaling η = t₁/(P·t_P) from them with
``scaling.efficiencies(rows, size="points", per_rank="points_per_rank", time="ms_per_step")``.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m experiments.ns_step_time \\
        --order 3 --elements 4 --steps 5 --devices 1,2                 # a CPU, a minute
    mpirun -n 2 python -m experiments.ns_step_time --order 3 --elements 4 --steps 5 \\
        --transport mpi                                                # a CPU, one process per device
    NCCL_NVLS_ENABLE=0 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --devices 1,2 --out ns_shard.json                              # 2 GPUs, one process
    NCCL_NVLS_ENABLE=0 mpirun -n 2 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --devices 2 --out ns_multi.json                                # 2 GPUs, one process each, one device mesh
    mpirun -n 2 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --transport mpi --out ns_mpi.json                              # 2 GPUs, mpi4jax
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.elliptic import solve_local
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers import multigrid

from experiments.common import Placements, Results, add_transport_args, best_seconds


def case(mesh, K, dt, steps, backend, where, options=NS.NSOptions()):
    t = time.perf_counter()
    ns = NS.setup(mesh, nu=1 / 1600, dt=dt, backend=backend, options=options, **where)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    setup = time.perf_counter() - t
    start = dt * max(1, round(0.1 / dt))  # about t = 0.1, in whole steps
    st, s, _ = NS.run(ns, st, start, sample_interval=start)
    many = jax.jit(lambda ns, st: jax.lax.fori_loop(0, steps, lambda i, x: NS.step(ns, x)[0], st))
    t_step = best_seconds(many, ns, st, repeats=2) / steps
    _, info = jax.jit(NS.step)(ns, st)
    conv = jax.jit(lambda ns, u: ns.sem.local_map(lambda s_, ns_, u_: NS.scheme._convection(ns_, s_, u_), ns, u))
    t_conv = best_seconds(conv, ns, st.u)
    curlcurl = jax.jit(lambda ns, u: ns.sem.local_map(
        lambda s_, ns_, u_: NS.scheme._curl(ns_, s_, NS.scheme._curl(ns_, s_, u_)), ns, u))
    t_cc = best_seconds(curlcurl, ns, st.u)
    reps = 20
    gs_loop = jax.jit(lambda ns, u: ns.sem.local_map(
        lambda s_, u_: jax.lax.fori_loop(0, reps, lambda i, v: s_.dssum(v) * 0.125, u_), u))
    t_gs = best_seconds(gs_loop, ns, st.u) / reps
    # the step's own pressure and velocity right-hand sides (periodic: no lift), then each solve alone
    beta_, a_ = NS.bdf_ext(ns.options.time_order)
    beta, a, h2 = jnp.asarray(beta_), jnp.asarray(a_), beta_[0] / dt

    def rhs(s_, ns_, st_):
        F = jnp.concatenate([NS.scheme._convection(ns_, s_, st_.U[0])[None], st_.F])
        Ub, Fx, ux = jnp.tensordot(beta[1:], st_.U, 1) / ns_.dt, jnp.tensordot(a, F, 1), jnp.tensordot(a, st_.U, 1)
        R = Ub + Fx - ns_.nu * NS.scheme._curl(ns_, s_, NS.scheme._curl(ns_, s_, ux))
        return s_.dssum(NS.scheme._weak_grad_t(s_, R)), s_.mask * s_.dssum(s_.bmass * (Ub + Fx)), s_.mask * ux

    bp, bv, x0 = jax.jit(lambda ns, st: ns.sem.local_map(rhs, ns, st))(ns, st)
    psolve = jax.jit(lambda ns, b, p0: ns.sem.local_map(lambda s_, ns_, b_, p_: NS.scheme._pressure_solve(ns_, b_, p_, 0.0),
                                                        ns, b, p0))
    vsolve = jax.jit(lambda ns, b, x: ns.sem.local_map(
        lambda s_, ns_, b_, x_: solve_local(NS.scheme._velocity(ns_, h2), b_, x0=x_, tol=ns_.options.velocity_tol, maxiter=ns_.options.velocity_maxiter), ns, b, x))
    t_p = best_seconds(psolve, ns, bp, st.p)
    t_v = best_seconds(vsolve, ns, bv, x0)
    pits, vits = int(psolve(ns, bp, st.p)[1].iterations), int(vsolve(ns, bv, x0)[1].iterations)
    p = mesh.order
    return dict(transport=ns.sem.comm.name, backend=ns.sem.backend.name, elements=K, order=p,
                pressure_tol=options.pressure_tol, velocity_tol=options.velocity_tol,
                cycle_dtype=str(options.pmg.dtype or "float64"),
                points=K**3 * p**3, dt=dt, steps=steps, setup_seconds=setup, ms_per_step=1e3 * t_step,
                convection_ms=1e3 * t_conv, curl_curl_ms=1e3 * t_cc, pressure_solve_ms=1e3 * t_p,
                pressure_solve_iterations=pits, velocity_solve_ms=1e3 * t_v, velocity_solve_iterations=vits,
                dssum_ms=1e3 * t_gs, pressure_iterations=int(info.pressure.iterations),
                velocity_iterations=int(info.velocity.iterations), compact_affine=ns.sem.affine is not None,
                kinetic_energy=float(NS.diagnostics(ns, st).kinetic_energy))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, nargs="+", default=[4])
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--pressure-tol", type=float, default=NS.NSOptions.pressure_tol)
    ap.add_argument("--velocity-tol", type=float, default=NS.NSOptions.velocity_tol)
    add_transport_args(ap)
    ap.add_argument("--cycle-dtype", choices=["float64", "float32"], default="float64",
                    help="the pressure V-cycle's precision (float32: NekRS's mixed-precision multigrid)")
    ap.add_argument("--full-factors", action="store_true",
                    help="the CUDA backend reads the full geometric factors on affine meshes too (the "
                         "previous kernels, for a before/after measurement)")
    ap.add_argument("--out", default="ns_step_time.json")
    a = ap.parse_args(argv)
    if a.full_factors:
        from jaxsem.backends import CudaBackend
        CudaBackend.compact_affine = False
    at = Placements(a, ap)
    counts, rank, processes = at.counts, at.rank, at.processes
    rows = Results(a.out, "ns_step_time", write=rank == 0)
    for K in a.elements:
        mesh = js.box_mesh(K, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
        for P, where in ((P, at.where(P)) for P in counts):
            r = case(mesh, K, a.dt, a.steps, a.backend, where,
                     NS.NSOptions(pressure_tol=a.pressure_tol, velocity_tol=a.velocity_tol,
                                  pmg=multigrid.PMGOptions(dtype=None if a.cycle_dtype == "float64" else "float32")))
            r.update(ranks=P, processes=processes, points_per_rank=r["points"] / P)
            rows.append(r)
            if rank == 0:
                print(r, flush=True)


if __name__ == "__main__":
    main()
