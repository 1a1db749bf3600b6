"""The verification runs behind ``jaxsem solve``: each solves a problem with a known
exact solution and returns a JSON-ready record (the application layer; the library
functions they call return objects)."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..discretization import to_mesh_order
from ..io import rank_path, write_vtu
from ..mesh.box import box_mesh
from ..models import advection, maxwell, poisson
from ..operators.bk import BK_SPECS
from ..solvers.driver import RunOptions
from ..solvers.multigrid import PMGOptions
from ..solvers.stops import NonFiniteError
from .bench import count_dofs

__all__ = ["solve_poisson", "verify_maxwell", "verify_advection"]


def _where(disc) -> dict:
    """Where a run ran: ``transport`` (serial, mpi, shard) and the ``devices`` it spans."""
    return dict(transport=disc.comm.name, devices=disc.comm.size if disc.comm.name == "shard" else 1)


def _write_vtu(path: str, disc, **fields) -> str:
    """Write fields of ``disc`` to ``path`` (under MPI one file per rank, ``PATH.rank<r>.vtu``;
    sharded: the whole mesh in mesh order, pads dropped, written by process 0)."""
    if disc.comm.name == "mpi":
        return write_vtu(rank_path(path, disc.comm), disc, **fields)
    x = to_mesh_order(disc, disc.x)
    fields = {k: to_mesh_order(disc, v) for k, v in fields.items()}
    if jax.process_index() == 0:
        write_vtu(path, x, **fields)
    return path


def _stepped(name: str, base: dict, note, run, vtu, fields):
    """A time-stepping verification: ``run() -> (dg, state, result)``; returns ``(result, record)``.

    A blow-up (:class:`NonFiniteError`) is a record with ``converged: False`` and the step
    (result None), not an exception; ``fields(dg, state)`` names what ``vtu`` gets.
    """
    tic = time.perf_counter()
    try:
        dg, y, r = run()
    except NonFiniteError as e:
        note(f"{name}: {e}")
        return None, dict(base, converged=False, error_l2=None, steps=e.step, seconds=time.perf_counter() - tic,
                          message=str(e))
    total = time.perf_counter() - tic
    if vtu:
        note(f"{name}: writing {vtu}")
        vtu = _write_vtu(vtu, dg, **fields(dg, y))
    return r, dict(base, **_where(dg), vtu=vtu, converged=bool(np.isfinite(r.error_l2)), error_l2=r.error_l2,
                   steps=r.steps, dt=r.dt, dt_limit=r.dt_limit, energy_ratio=r.energy / r.energy0,
                   seconds=r.seconds, compile_seconds=total - r.seconds)


def solve_poisson(bp=5, order=6, elements=(3, 3, 3), deform=0.1, tol=1e-10, maxiter=1000,
                  dtype="float64", progress=None, backend="auto", place: dict | None = None,
                  vtu: str | None = None, precond: str = "pmg", pmg_dtype: str | None = None) -> dict:
    """Solve BPk's manufactured problem on the deformed unit box; return a result dict.

    ``backend``: element kernels (:func:`jaxsem.discretize`; ``"auto"``: the CUDA kernels
    on a GPU, einsum elsewhere); ``place``: as :func:`verify_maxwell`; ``vtu``: write u, the exact
    solution and the error at the GLL nodes to this file; ``precond``: ``"pmg"`` (p-multigrid,
    :func:`jaxsem.models.poisson.pmg`; its setup is ``setup_seconds``) or ``"jacobi"``.
    The solve is compiled ahead of time (``compile_seconds``) and then run once
    (``seconds``); ``dofs = components·E·p³`` (see :mod:`jaxsem.bench`),
    ``dofs_per_second = dofs · iterations / seconds``; ``error_l2`` and
    ``error_max`` are relative to the exact solution.
    """
    note = progress or (lambda m: None)
    spec = BK_SPECS[bp]
    note(f"discretizing: BP{bp}, order {order}, elements {tuple(elements)}, deform {deform}, {dtype}")
    mesh = box_mesh(tuple(elements), order, deform=deform)
    sem = poisson.bp_discretize(mesh, bp, dtype=jnp.dtype(dtype), backend=backend, **(place or {}))
    h1, h2 = poisson.coefficients(bp)
    m = poisson.manufactured(bp)
    pre, setup_s = None, 0.0
    if precond == "pmg":
        note("p-multigrid setup...")
        t0 = time.perf_counter()
        pre = jax.block_until_ready(poisson.pmg(sem, h1, h2, options=PMGOptions(dtype=pmg_dtype)))
        setup_s = time.perf_counter() - t0

    note("compiling...")
    t0 = time.perf_counter()
    fn = jax.jit(lambda sem, pre: poisson.solve(sem, m.f, h1, h2, tol=tol, maxiter=maxiter, precond=pre))
    compiled = fn.lower(sem, pre).compile()
    compile_s = time.perf_counter() - t0

    note("solving...")
    t0 = time.perf_counter()
    u, info = compiled(sem, pre)
    jax.block_until_ready((u, info))
    seconds = time.perf_counter() - t0

    l2, linf = poisson.relative_errors(sem, u, m.u)
    if vtu:
        note(f"writing {vtu}")
        exact = sem.interpolate(m.u)
        vtu = _write_vtu(vtu, sem, u=u, u_exact=exact, error=u - exact)
    its = int(info.iterations)
    points, dofs = count_dofs(spec.components, order, elements)
    return dict(
        problem="poisson", bp=bp, operator=spec.operator, quadrature=spec.quadrature,
        components=spec.components, order=order, elements=list(elements),
        num_elements=int(math.prod(elements)), points=points, dofs=dofs, dtype=dtype,
        deform=float(deform), tol=tol, maxiter=maxiter, backend=sem.backend.name, **_where(sem),
        precond=precond, pmg_orders=None if pre is None else list(pre.orders),
        pmg_dtype=None if pre is None else str(pre.dtype), setup_seconds=setup_s, iterations=its,
        converged=bool(info.converged),
        residual=float(info.true_relative_residual),
        error_l2=l2, error_max=linf, seconds=seconds, compile_seconds=compile_s, vtu=vtu,
        dofs_per_second=dofs * its / seconds if seconds > 0 else None,
    )


def verify_maxwell(order: int = 7, elements=(2, 2, 2), t_final: float = 0.5, *, flux: str = "upwind",
           bc: str = "pec", deform: float = 0.0, cfl: float = 0.5, method: str = "lserk4",
           dtype: str = "float64", vtu: str | None = None, progress=None, progress_bar: bool = False,
           place: dict | None = None) -> dict:
    """:func:`jaxsem.models.maxwell.solve_mode` as a JSON-ready dict (``jaxsem solve maxwell``).

    ``place``: where the elements live, ``dict(comm=...)`` or ``dict(devices=...)``
    (see :func:`jaxsem.discretize`); the numbers are global. Under MPI ``vtu`` gets one
    file per rank, ``PATH.rank{r}.vtu``.

    ``dofs = E·p³`` per field component (6 components: ``components``);
    ``error_l2`` is the relative L2 error of (E, H) against the exact mode at
    ``t_final``; ``converged`` is True when the run stayed finite (a blow-up
    gives ``converged: False`` and no error). ``gflops`` uses NekCEM's work
    model :func:`flops_per_step` (n = E(N+1)³), ``seconds`` the (compiled) time
    stepping, ``compile_seconds`` everything before it (discretization, Δt
    limit, compilation).
    """
    note = progress or (lambda m: None)
    E = int(np.prod(elements))
    base = dict(problem="maxwell", order=order, elements=list(elements), num_elements=E, components=6,
                dofs=E * order**3, points=E * (order + 1) ** 3, flux=flux, bc=bc, method=method,
                deform=float(deform), cfl=float(cfl), t_final=float(t_final), dtype=dtype)
    note(f"maxwell: order {order}, elements {tuple(elements)}, deform {deform}, {bc} {'cavity mode' if bc == 'pec' else 'plane wave'}, "
         f"{flux} flux, {method}, t_final {t_final}")
    if bc not in ("pec", "periodic"):
        raise ValueError(f"bc must be 'pec' or 'periodic', got {bc!r}")

    def run():
        mesh = box_mesh(tuple(elements), order, periodic=(bc == "periodic",) * 3, deform=deform)
        return maxwell.solve_mode(mesh, t_final, scheme=maxwell.Scheme(flux=flux, method=method, cfl=cfl),
                                  dtype=jnp.dtype(dtype), options=RunOptions(progress=progress_bar), **(place or {}))

    r, record = _stepped("maxwell", base, note, run, vtu, lambda dg, q: dict(E=q[:3], H=q[3:]))
    if r is None:
        return record
    return dict(record, gflops=maxwell.flops_per_step(order, E) * r.steps / r.seconds / 1e9 if r.seconds > 0 else None)


def verify_advection(order: int = 7, elements=(2, 2, 2), t_final: float = 0.5, *, velocity=advection.DEFAULT_VELOCITY,
           flux: str = "upwind", deform: float = 0.0, cfl: float = 0.5, method: str = "lserk4",
           dtype: str = "float64", progress=None, progress_bar: bool = False, place: dict | None = None,
           vtu: str | None = None) -> dict:
    """:func:`jaxsem.models.advection.solve_gaussian` as a JSON-ready dict (``jaxsem solve advection``).

    ``place``: as :func:`verify_maxwell`. ``vtu``: write u and the exact solution at
    ``t_final`` to this file (one file per rank under MPI, ``PATH.rank{r}.vtu``).

    ``dofs = E·p³``; ``error_l2`` relative L2 vs the exact translated Gaussian
    at ``t_final``; ``mass_drift`` = |∫u(T) − ∫u(0)| / ∫u(0); ``converged``
    is True when the run stayed finite.
    """
    note = progress or (lambda m: None)
    E = int(np.prod(elements))
    base = dict(problem="advection", order=order, elements=list(elements), num_elements=E, components=1,
                dofs=E * order**3, points=E * (order + 1) ** 3, velocity=[float(v) for v in velocity],
                width=advection.DEFAULT_WIDTH, flux=flux, method=method, deform=float(deform), cfl=float(cfl),
                t_final=float(t_final), dtype=dtype)
    note(f"advection: order {order}, elements {tuple(elements)}, deform {deform}, periodic Gaussian, "
         f"velocity {tuple(velocity)}, {flux} flux, {method}, t_final {t_final}")
    def run():
        mesh = box_mesh(tuple(elements), order, periodic=(True,) * 3, deform=deform)
        scheme = advection.Scheme(flux=flux, method=method, cfl=cfl)
        return advection.solve_gaussian(mesh, t_final, velocity=velocity, scheme=scheme, dtype=jnp.dtype(dtype),
                                        options=RunOptions(progress=progress_bar), **(place or {}))

    fields = lambda dg, u: dict(u=u, u_exact=advection.gaussian(dg.x, t_final, velocity))
    r, record = _stepped("advection", base, note, run, vtu, fields)
    if r is None:
        return record
    return dict(record, mass_drift=abs(r.mass - r.mass0) / abs(r.mass0))
