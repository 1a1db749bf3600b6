"""Long Navier–Stokes runs: jitted chunks of steps, a time series of diagnostics per sample,
checkpoints and resume, and every failure stopped and named (:func:`run`)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...discretization import probes as probes_
from ...discretization.shard import replicated
from ...parallel.comm import gspmd_on_gpus
from ...io.checkpoint import (checkpoint_meta, checkpoint_shapes, load_checkpoint, meta_mismatch, tree_fields,
                             tree_from_fields)
from ...solvers import driver
from ...solvers.stops import SolveFailedError, UnstableRunError
from .scheme import NavierStokes, StabilityWarning, State, _kinetic_energy, diagnostics, step

__all__ = ["Series", "run"]


class Series(NamedTuple):
    """A run's time series (NumPy, one entry per sample): ``time``, ``kinetic_energy``,
    ``dissipation`` (−dE_k/dt at the sample time from the energies of its last three steps,
    (3Eⁿ − 4Eⁿ⁻¹ + Eⁿ⁻²)/(2Δt), second order; from two where the sample has one step),
    ``enstrophy``, ``divergence``, ``cfl``, ``change`` ‖uⁿ⁺¹ − uⁿ‖/(Δt‖uⁿ⁺¹‖) of the sample's
    last step (L2; a steady state drives it to 0); ``bulk_velocity`` and ``driving``: with a
    drive (:mod:`.driving`), the bulk velocity along its axis and the force per unit mass applied
    (the mean pressure gradient) at the sample's last step (NaN without); of every step of the
    sample, the most
    ``pressure_iterations``, ``velocity_iterations`` and ``scalar_iterations`` (0 without
    scalars), the largest true relative residuals ``pressure_residual``, ``velocity_residual``
    and ``scalar_residual``, and ``failed_solves`` (solves
    that missed their tolerance: :func:`run` stops at the first); ``force: (samples, F, 3)`` the
    force on each of ``ns.force_groups`` at the sample's time (:class:`StepInfo`); ``probe:
    (samples, P, 4)`` the velocity (3) and pressure (1) at each of ``ns.probes``' points. The first
    row (the start) has NaN for the per-step columns and forces."""

    time: np.ndarray
    kinetic_energy: np.ndarray
    dissipation: np.ndarray
    enstrophy: np.ndarray
    divergence: np.ndarray
    cfl: np.ndarray
    change: np.ndarray
    bulk_velocity: np.ndarray
    driving: np.ndarray
    pressure_iterations: np.ndarray
    velocity_iterations: np.ndarray
    pressure_residual: np.ndarray
    velocity_residual: np.ndarray
    scalar_iterations: np.ndarray
    scalar_residual: np.ndarray
    failed_solves: np.ndarray
    force: np.ndarray
    probe: np.ndarray


_SCALARS = len(Series._fields) - 2  # the scalar columns (all but force and probe)
_PER_STEP = [Series._fields.index(c) for c in ("dissipation", "change", "bulk_velocity", "driving",
                                               "pressure_iterations",
                                               "velocity_iterations", "pressure_residual", "velocity_residual",
                                               "scalar_iterations", "scalar_residual", "failed_solves")]


def _num_probes(ns: NavierStokes) -> int:
    return 0 if ns.probes is None else ns.probes.num_points


def _columns(ns: NavierStokes) -> int:
    """Row length: the scalar columns, the first failed step of the sample (0: none), 3 per force
    group, 4 per probe."""
    return _SCALARS + 1 + 3 * len(ns.force_groups) + 4 * _num_probes(ns)


def _probe_values(ns: NavierStokes, st: State):
    """``(4P,)`` u, v, w, p at each probe, point by point (none: ``(0,)``)."""
    if ns.probes is None:
        return jnp.zeros((0,), st.t.dtype)
    return probes_.evaluate(ns.sem, ns.probes, jnp.concatenate([st.u, st.p[None]])).T.ravel()
_ROW_BLOCK = 16  # series rows are allocated in multiples of this


def _advance(ns: NavierStokes, chunk, y, m0, count):
    """``count`` steps from ``y = (state, rows)``; then row ⌈(m0 + count)/chunk⌉ of ``rows``
    gets the sample's diagnostics and the tally of its solves (:class:`Series`).
    ``chunk``, ``m0``, ``count``: ``()`` integers, traced like Δt, so that one compiled
    program serves every step and sample size on a discretization."""
    st, rows = y
    dtype = st.t.dtype
    nan = jnp.asarray(jnp.nan, dtype)

    def body(i, c):
        st, e1, _, tally, _, _ = c
        # E_k before this step, needed only before the sample's last two (with the energy at its
        # end they give −dE_k/dt): one global reduction less on every other step
        e = jax.lax.cond(i >= count - 2, lambda st: _kinetic_energy(ns, st), lambda st: nan, st)
        st, info = step(ns, st)
        p, v, sc = info.pressure, info.velocity, info.scalar
        failed = ~(p.converged & v.converged & sc.converged)
        tally = (jnp.maximum(tally[0], p.iterations.astype(dtype)), jnp.maximum(tally[1], v.iterations.astype(dtype)),
                 jnp.fmax(tally[2], p.true_relative_residual.astype(dtype)),
                 jnp.fmax(tally[3], v.true_relative_residual.astype(dtype)),
                 jnp.maximum(tally[4], sc.iterations.astype(dtype)),
                 jnp.fmax(tally[5], sc.true_relative_residual.astype(dtype)),
                 tally[6] + failed.astype(dtype),
                 jnp.where((tally[7] == 0) & failed, st.step.astype(dtype), tally[7]))
        return st, e, e1, tally, info.force.astype(dtype), info.drive.astype(dtype)

    zero = jnp.zeros((), dtype)
    force0 = jnp.zeros((len(ns.force_groups), 3), dtype)
    st, e1, e2, tally, force, drive = jax.lax.fori_loop(0, count, body, (st, nan, nan, (zero,) * 8, force0,
                                                                         jnp.zeros((2,), dtype)))
    d = diagnostics(ns, st)
    e0 = d.kinetic_energy
    three = -(3 * e0 - 4 * e1 + e2) / (2 * ns.dt)
    diss = jnp.where(count >= 2, three, -(e0 - e1) / ns.dt)
    row = jnp.concatenate([jnp.stack([st.t, e0, diss, d.enstrophy, d.divergence, d.cfl, _change(ns, st), *drive,
                                      *tally]),
                           force.ravel(), _probe_values(ns, st)])
    rows = rows.at[(m0 + count + chunk - 1) // chunk].set(row)
    return st, rows


def _change(ns: NavierStokes, st: State):
    """‖uⁿ⁺¹ − uⁿ‖/(Δt‖uⁿ⁺¹‖) of the last step (L2, global)."""
    def local(s, ns_, U):
        du = s.integrate(jnp.sum((U[0] - U[1]) ** 2, 0))
        return jnp.sqrt(du / jnp.maximum(s.integrate(jnp.sum(U[0] ** 2, 0)), 1e-300)) / ns_.dt
    return ns.sem.local_map(local, ns, st.U)


def _row0(ns: NavierStokes, st: State):
    d = diagnostics(ns, st)
    zero = jnp.zeros((), st.t.dtype)  # no step yet: the per-step columns are undefined (NaN in the Series)
    row = jnp.stack([st.t, d.kinetic_energy, zero, d.enstrophy, d.divergence, d.cfl]
                    + [zero] * (_columns(ns) - 6 - 4 * _num_probes(ns)))
    return jnp.concatenate([row, _probe_values(ns, st)])


def _whole_steps(span: float, dt: float, name: str) -> int:
    k = round(span / dt)
    if k < 0 or not math.isclose(k * dt, span, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"{name} = {span:.12g} is not a whole number of steps of dt = {dt:.12g}")
    return int(k)


def run(ns: NavierStokes, state: State, t_final: float, *, sample_interval: float = 0.1,
        steady_tol: float | None = None, options: driver.RunOptions = driver.RunOptions()):
    """Advance ``state`` to ``t_final`` in jitted chunks of one sample interval each.

    Returns ``(state, Series, RunInfo)``; the series starts with the given state and has
    a row at the end of every chunk (the last one at ``t_final``). ``sample_interval`` and
    ``t_final − state.t`` must be whole numbers of steps (``options.chunk_steps`` is
    replaced by the interval's). Checkpoints (``options.checkpoint_path``) hold the state
    with its BDF/EXT history and the series so far; a resumed run (``options.resume``,
    the same ``meta``) continues both bit for bit. ``steady_tol``: end the run at the first
    sample whose ``change`` (:class:`Series`) is below it — a steady state (the returned state's
    ``t`` then precedes ``t_final``; the series ends there).

    Nothing that went wrong passes silently. Refused before any step (``ValueError``): a start
    whose CFL number is above ``ns.options.max_cfl`` (the message gives a Δt that is not);
    above 1 a :class:`StabilityWarning`.
    Stopped, naming the step and the time (the last checkpoint is the one before):
    :class:`jaxsem.solvers.stops.SolveFailedError` at the first step whose pressure or velocity
    solve missed its tolerance; :class:`jaxsem.solvers.stops.UnstableRunError` when a sample's
    CFL passes ``max_cfl`` or, in a flow with no boundary data, buoyancy or drive (no energy
    enters), its E_k passes ten times the start's; :class:`jaxsem.solvers.stops.NonFiniteError` at the
    first step whose result is not finite (between samples).
    """
    if not isinstance(options, driver.RunOptions):
        raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
    t_start = float(state.t)
    for name, v in (("t_final", t_final), ("sample_interval", sample_interval)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if sample_interval <= 0:
        raise ValueError(f"sample_interval must be > 0, got {sample_interval!r}")
    if steady_tol is not None and (isinstance(steady_tol, bool) or not isinstance(steady_tol, (int, float))
                                   or not (math.isfinite(steady_tol) and steady_tol > 0)):
        raise ValueError(f"steady_tol must be None or a positive number, got {steady_tol!r}")
    dt = float(ns.dt)  # the step count, checkpoint metadata and messages are host values
    num_steps = _whole_steps(t_final - t_start, dt, "t_final - state.t")
    chunk = _whole_steps(sample_interval, dt, "sample_interval")
    if chunk < 1:
        raise ValueError(f"sample_interval = {sample_interval} is shorter than dt = {dt}")
    samples = -(-num_steps // chunk)
    # rows allocated in blocks, so that runs of similar lengths share one compiled chunk program
    # (the buffer's shape is part of it); the rows past samples + 1 stay zero and are cut below
    rows = replicated(ns.sem, np.zeros((-(-(samples + 1) // _ROW_BLOCK) * _ROW_BLOCK, _columns(ns)), state.t.dtype))
    rows = rows.at[0].set(_row0(ns, state))
    o = ns.options
    cfl0 = float(rows[0, Series._fields.index("cfl")])
    if cfl0 > o.max_cfl:
        raise ValueError(f"dt = {dt:.6g} gives CFL {cfl0:.4g} at the start, above NSOptions.max_cfl = "
                         f"{o.max_cfl:g}; use dt <= {dt * 0.5 / cfl0:.3g} (CFL 0.5)")
    if cfl0 > 1:
        warnings.warn(f"dt = {dt:.6g} gives CFL {cfl0:.4g} at the start: above 1 the explicit convection is "
                      f"stable only where viscosity damps it; dt <= {dt * 0.5 / cfl0:.3g} gives CFL 0.5",
                      StabilityWarning, stacklevel=2)
    label = f"BDF{o.time_order}/EXT{o.time_order} Navier-Stokes"
    meta = dict(options.meta, nu=float(ns.nu), order=ns.sem.order, nodes=int(ns.sem.num_global),
                time_order=o.time_order, dealias=o.dealias, sample_steps=chunk)
    start = 0
    if options.resume is not None:  # restored here: the series so far may be shorter than this run's
        state, rows, start = _resume(ns, options.resume, state, rows, dict(meta, dt=dt, t0=t_start, method=label))
        if start > num_steps:
            raise ValueError(f"resume: checkpoint {options.resume} is at step {start} > the {num_steps} steps "
                             f"to t_final = {t_final}")
    opts = dataclasses.replace(options, chunk_steps=chunk, meta=meta, resume=None)
    check = _checker(ns, chunk, dt, float(rows[0, 1]))
    until = None
    if steady_tol is not None:
        col = Series._fields.index("change")
        until = lambda y, m: float(y[1][-(-m // chunk), col]) < steady_tol  # noqa: E731
    with gspmd_on_gpus(ns.sem.comm):  # Shardy crashes compiling these chunks over several GPUs
        (state, rows), info = driver.drive(_advance_jit, (state, rows), num_steps, dt=dt, t0=t_start, label=label,
                                           args=(ns, jnp.asarray(chunk)), options=opts, comm=ns.sem.comm,
                                           start=start, check=check, until=until, names=("state", "series"))
    r = np.array(rows)[:-(-info.step // chunk) + 1]
    r[0, _PER_STEP] = np.nan
    if ns.drive is None:  # the state holds no NaN (the run's finiteness check reads it): marked here
        r[:, [Series._fields.index("bulk_velocity"), Series._fields.index("driving")]] = np.nan
    nf = 3 * len(ns.force_groups)
    force = r[:, _SCALARS + 1:_SCALARS + 1 + nf].reshape(len(r), len(ns.force_groups), 3)
    force[0] = np.nan
    probe = r[:, _SCALARS + 1 + nf:].reshape(len(r), _num_probes(ns), 4)
    return state, Series(*(r[:, c] for c in range(_SCALARS)), force, probe), info


def _checker(ns: NavierStokes, chunk: int, dt: float, e_start: float):
    """The host check of :func:`run` after each chunk: a failed solve, a CFL number past
    ``options.max_cfl`` or, with no boundary data, buoyancy or drive (no energy enters), E_k grown
    tenfold stop the run, named with the step."""
    limit = ns.options.max_cfl
    col = {name: i for i, name in enumerate(Series._fields)}

    def check(y, m):
        row = np.asarray(y[1][-(-m // chunk)])
        step, t = int(np.asarray(y[0].step)), float(row[col["time"]])  # the flow's own step count
        failed = row[col["failed_solves"]]
        if failed > 0:
            first = int(row[_SCALARS])
            p_res, v_res = row[col["pressure_residual"]], row[col["velocity_residual"]]
            s_res = row[col["scalar_residual"]]
            which = ("pressure" if not p_res <= ns.options.pressure_tol
                     else "velocity" if not v_res <= ns.options.velocity_tol else "scalar")
            res = dict(pressure=p_res, velocity=v_res, scalar=s_res)[which]
            opt = "pressure" if which == "pressure" else "velocity"  # the scalars use the velocity's
            raise SolveFailedError(first, t - (step - first) * dt,
                                   which, res, int(failed),
                                   f"raise NSOptions.{opt}_maxiter or loosen {opt}_tol, or lower dt")
        cfl = row[col["cfl"]]
        if cfl > limit:
            raise UnstableRunError(step, t, "CFL", cfl, limit,
                                   f"dt = {dt:.4g} is past the stable step; dt <= {dt * 0.5 / cfl:.3g} gives CFL 0.5 here")
        e = row[col["kinetic_energy"]]
        if not ns.bc.inflow and ns.buoyancy is None and ns.drive is None and e > 10 * e_start + 1e-300:
            raise UnstableRunError(step, t, "kinetic energy", e, 10 * e_start,
                                   "no energy enters this flow (no boundary data), so E_k cannot grow tenfold; "
                                   f"lower dt = {dt:.4g}")

    return check


def _resume(ns: NavierStokes, path, state: State, rows, meta: dict):
    """``(state, rows, step)`` from a checkpoint of :func:`run` with the same ``meta`` (its fields:
    ``state.*`` and ``series``); its series is copied into ``rows`` (this run's buffer; either may
    end in zero rows never written)."""
    comm = ns.sem.comm
    path = f"{path}{comm.file_suffix}"
    problem = meta_mismatch(path, checkpoint_meta(path), meta)
    if int(comm.allreduce(jnp.asarray(int(problem is not None)))) and problem is None:
        problem = f"resume: the checkpoint of another rank does not match this run (this rank's: {path})"
    if problem is not None:
        raise ValueError(problem)
    # the series' length is the saved run's (its t_final): only its columns must be this run's
    series = checkpoint_shapes(path).get("series")
    saved_rows = () if series is None else series.shape
    if len(saved_rows) != 2 or saved_rows[1] != rows.shape[1]:
        raise ValueError(f"resume: checkpoint {path}: its series has shape {None if series is None else saved_rows}, "
                         f"expected (rows, {rows.shape[1]})")
    like = dict(tree_fields("state", state), series=jax.ShapeDtypeStruct(saved_rows, rows.dtype))
    ck = load_checkpoint(path, like)
    state, saved, step = tree_from_fields("state", state, ck.fields), ck.fields["series"], ck.step
    need = -(-step // int(meta["sample_steps"])) + 1  # row 0 and one per sample reached
    if saved_rows[0] < need:
        raise ValueError(f"resume: checkpoint {path}: step {step} needs {need} series rows, the file holds "
                         f"{saved_rows[0]}")
    n = min(saved.shape[0], rows.shape[0])
    return state, rows.at[:n].set(saved[:n]), step


@jax.jit
def _advance_jit(y, args, m0, count):
    """The jitted chunk of :func:`run`: ``args = (ns, chunk)``, see :func:`_advance`."""
    ns, chunk = args
    return _advance(ns, chunk, y, m0, count)
