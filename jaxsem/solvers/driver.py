"""The host driver of long time-stepping runs: chunks under ``jit``, guards, progress, checkpoints.

:func:`run` takes ``num_steps`` explicit RK steps (:mod:`jaxsem.solvers.timestepping`) in
chunks of :func:`jaxsem.solvers.timestepping.advance_fn` (how, :class:`RunOptions`); :func:`drive`
is its loop for any stepper (the Navier–Stokes run uses it). Between chunks, on the host:
a tqdm progress bar on stderr, NaN/Inf detection that names the step where the blow-up
appeared (:class:`jaxsem.solvers.stops.NonFiniteError`), an optional growth check
(:class:`jaxsem.solvers.stops.UnstableRunError`), checkpoint files that carry the run's
metadata (:mod:`jaxsem.io.checkpoint`), from which a run with the same metadata resumes to a
bit-identical result, and SIGINT/SIGTERM, which end the run after the current chunk and its
checkpoint (:class:`jaxsem.solvers.stops.RunInterrupted`). A Δt above a given stable limit is
refused before any step; :func:`plan_steps` picks a Δt that reaches ``t_final`` exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..io.checkpoint import (checkpoint_meta, load_checkpoint, meta_mismatch, save_checkpoint, tree_fields,
                             tree_from_fields)
from ..parallel.comm import put_sharded
from .stops import NonFiniteError, RunInterrupted, Terminated, UnstableRunError, take_pending_signal
from .timestepping import _check_steps, advance_fn, tableau

__all__ = ["run", "RunOptions", "RunInfo", "drive", "plan_steps", "stops_deferred", "agreed_signal"]


class RunInfo(NamedTuple):
    """What :func:`run` did: steps taken in this call, final step and time, wall seconds."""

    steps: int
    step: int
    t: float
    seconds: float
    chunks: int
    resumed_from: int | None


def plan_steps(t_final: float, limit: float, method: str, cfl: float = 0.5, dt: float | None = None):
    """``(dt, steps)`` reaching ``t_final`` exactly: a given ``dt`` must divide it;
    otherwise the largest dt ≤ ``cfl``·``limit`` that does (0 < cfl ≤ 1)."""
    if dt is None:
        if not (math.isfinite(cfl) and cfl > 0):
            raise ValueError(f"cfl must be a positive number, got {cfl!r}")
        if cfl > 1:
            raise ValueError(f"cfl = {cfl} exceeds 1: dt would exceed the stable limit {limit:.6g} for {method}")
        steps = max(1, math.ceil(t_final / (cfl * limit) - 1e-9)) if t_final > 0 else 0
        return (t_final / steps if steps else cfl * limit), steps
    steps = max(0, round(t_final / dt))
    if not math.isclose(steps * dt, t_final, rel_tol=1e-12, abs_tol=1e-14):
        raise ValueError(f"t_final = {t_final} is not a whole number of steps of dt = {dt}")
    return dt, steps


_RUN_KEYS = ("dt", "t0", "method")  # what run records itself in every checkpoint


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How :func:`run` drives the steps: chunks, guards, progress, checkpoint files (static, hashable).

    None of it changes the arithmetic of a step: any options give the same bits.

    Attributes:
      chunk_steps: steps per jitted chunk (int ≥ 1): the granularity of progress,
        NaN/Inf checks and checkpoints.
      dt_max: the stable limit (e.g. :func:`jaxsem.solvers.timestepping.cfl_dt` with cfl = 1),
        or ``None``; a ``dt`` above it is refused with a ``ValueError`` naming the limit.
      progress: show a tqdm progress bar on stderr: True, False, or ``"auto"`` (the default:
        where stderr is a terminal or in a Jupyter kernel). It says the first chunk's time
        (compilation included) apart from the steps' rate and the time left.
      desc: the progress bar's label.
      checkpoint_path: write the state (its leaves named, :mod:`jaxsem.io.checkpoint`), ``t``,
        ``step`` and the metadata there (npz, atomic), or ``None``.
      checkpoint_every: write it after every this many chunks (int ≥ 1, default 1: each chunk),
        and always after the last chunk and before a stop by SIGINT/SIGTERM, so that an
        interrupted run's file holds the state it stopped at. A failed or unstable run's
        file holds the last one written.
      resume: path of a checkpoint to continue from, or ``None``. Its metadata
        (``dt``, ``t0``, ``method`` and every key of ``meta``) must equal this run's.
      meta: what identifies the run beyond ``dt``, ``t0`` and ``method`` (the DG
        drivers give flux, form, order, dtype, element count and a mesh
        fingerprint): a mapping from identifiers to str, int, float or bool,
        kept as key-sorted ``(key, value)`` pairs.

    Raises ``ValueError`` or ``TypeError`` naming the field for a bad value.
    """

    chunk_steps: int = 100
    dt_max: float | None = None
    progress: bool | str = "auto"
    desc: str = "time steps"
    checkpoint_path: str | os.PathLike | None = None
    checkpoint_every: int = 1
    resume: str | os.PathLike | None = None
    meta: tuple = ()

    def __post_init__(self):
        for name in ("chunk_steps", "checkpoint_every"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"RunOptions.{name} must be an int >= 1, got {n!r}")
            object.__setattr__(self, name, int(n))
        if self.dt_max is not None:
            try:
                v = math.nan if isinstance(self.dt_max, (bool, str)) else float(self.dt_max)
            except (TypeError, ValueError):
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"RunOptions.dt_max must be None or a positive finite number, got {self.dt_max!r}")
            object.__setattr__(self, "dt_max", v)
        if not isinstance(self.progress, (bool, np.bool_)) and self.progress != "auto":
            raise TypeError(f"RunOptions.progress must be True, False or 'auto', got {self.progress!r}")
        if not isinstance(self.desc, str):
            raise TypeError(f"RunOptions.desc must be a str, got {self.desc!r}")
        for name in ("checkpoint_path", "resume"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"RunOptions.{name} must be None or a path (str or os.PathLike), got {value!r}")
        object.__setattr__(self, "meta", _meta_pairs(self.meta))


def _meta_pairs(meta) -> tuple:
    """``meta`` (a mapping or ``(key, value)`` pairs) as key-sorted pairs of plain Python values."""
    items = meta.items() if isinstance(meta, Mapping) else meta
    try:
        items = [tuple(kv) for kv in items]
    except TypeError:
        raise TypeError(f"RunOptions.meta must be a mapping of str to str/int/float/bool, got {meta!r}") from None
    out = {}
    for kv in items:
        if len(kv) != 2:
            raise TypeError(f"RunOptions.meta must be a mapping of str to str/int/float/bool, got {meta!r}")
        key, value = kv
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"RunOptions.meta keys must be identifiers, got {key!r}")
        if key in _RUN_KEYS:
            raise ValueError(f"RunOptions.meta key {key!r} is reserved: run records {', '.join(_RUN_KEYS)} itself")
        if key in out:
            raise ValueError(f"RunOptions.meta key {key!r} is given twice")
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (str, bool, int, float)):
            raise TypeError(f"RunOptions.meta[{key!r}] must be a str, int, float or bool, got {value!r}")
        out[key] = value
    return tuple(sorted(out.items()))


def run(
    f: Callable,
    y0,
    dt: float,
    num_steps: int,
    *,
    args=None,
    t0: float = 0.0,
    method: str = "lserk4",
    options: RunOptions = RunOptions(),
    comm=None,
    growth_limit: float | None = None,
    norm: Callable | None = None,
):
    """Run ``num_steps`` steps in jitted chunks with guards; return ``(y, RunInfo)``.

    Args:
      f: right-hand side ``f(t, y)``, or ``f(t, y, args)`` when ``args`` is given;
        keep the same function object between calls to reuse the compiled chunk.
      y0: initial state (pytree of arrays).
      dt: step size (> 0).
      num_steps: total steps from ``t0`` (int ≥ 0); a resumed run continues to it.
      args: a pytree of arrays passed to ``f`` as a jit argument (so large
        operands, e.g. the discretization, are not baked into the program).
      t0: initial time.
      method: one of :data:`jaxsem.solvers.timestepping.METHODS`.
      options: chunking, the stable limit, progress and checkpoint files (:class:`RunOptions`).
      growth_limit: None, or for a source-free problem whose stable steps do not let the
        solution grow (upwind or central DG fluxes): the state's ``norm`` passing
        ``growth_limit`` times the start's stops the run with an
        :class:`jaxsem.solvers.stops.UnstableRunError` naming the step, before overflow.
      norm: ``y -> ()`` the global norm for ``growth_limit`` (the DG models: the mass norm,
        which leaves a sharded run's pad elements out); None: the Euclidean norm of every leaf.
      comm: the discretization's transport (:mod:`jaxsem.parallel.comm`): the NaN/Inf
        test and the resume check are then global (every rank stops, and replays,
        together) and, under MPI, each rank writes/reads its own checkpoint file
        ``PATH.rank{r}-of-{P}``.

    Raises :class:`jaxsem.solvers.stops.NonFiniteError` with the first bad step if a NaN/Inf appears
    (the chunk is replayed step by step from its finite start to find it), and
    ``ValueError`` naming the key when a resumed checkpoint's metadata differs
    from this run's. The computation of each step does not depend on the
    chunking, so a resumed run reproduces an uninterrupted one bit for bit.
    """
    tableau(method)
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be a RunOptions, got {options!r}")
    num_steps = _check_steps(num_steps)
    dt = float(dt)
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be a positive finite number, got {dt!r}")
    dt_max = options.dt_max
    if dt_max is not None and dt > dt_max:
        raise ValueError(
            f"dt = {dt:.6g} exceeds the stable limit {dt_max:.6g} for {method}; "
            f"use dt <= {dt_max:.6g}"
        )
    adv = advance_fn(f, method, args is not None)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(y0))
    t0_, dt_ = jnp.asarray(t0, dtype), jnp.asarray(dt, dtype)
    check = None
    if growth_limit is not None:
        check = _growth_check(y0, float(growth_limit), t0, dt, comm, norm)
    return drive(lambda y, a, m0, count: adv(y, a, t0_, dt_, m0, count), y0, num_steps, dt=dt, t0=t0,
                 label=method, args=args, options=options, comm=comm, check=check)


def _per_leaf(y, leaf_fn):
    """``leaf_fn`` of every leaf of ``y``, stacked: the one walk of the host checks below."""
    return jnp.stack([leaf_fn(a) for a in jax.tree_util.tree_leaves(y)])


@jax.jit
def _all_finite(y):
    return jnp.all(_per_leaf(y, lambda a: jnp.all(jnp.isfinite(a))))


@jax.jit
def _sum_of_squares(y):
    return jnp.sum(_per_leaf(y, lambda a: jnp.sum(jnp.square(a))))


def _growth_check(y0, limit: float, t0: float, dt: float, comm, norm):
    """``check`` for :func:`drive`: the state's norm past ``limit`` times the start's stops the run."""
    if norm is None:
        norm = lambda y: jnp.sqrt(_sum_of_squares(y) if comm is None else comm.allreduce(_sum_of_squares(y)))
    n0 = float(norm(y0))

    def check(y, m):
        n = float(norm(y))
        if n0 > 0 and n > limit * n0:  # NaN compares False: left to the NaN/Inf test
            raise UnstableRunError(m, t0 + m * dt, "the state's norm relative to the start", n / n0, limit,
                                   "a source-free run of a stable scheme does not grow: lower dt")

    return check


def _show_progress(progress) -> bool:
    """``RunOptions.progress`` resolved: ``"auto"`` is a terminal on stderr or a Jupyter kernel."""
    if progress != "auto":
        return bool(progress)
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or "ipykernel" in sys.modules


def _catch_stop_signals():
    """``(received, restore)``: SIGINT and SIGTERM append their number to the list
    ``received`` until ``restore()`` puts the previous handlers back. A signal
    :func:`~jaxsem.solvers.stops.raise_on_signal` saw whose exception was lost raises now.

    Python runs handlers in the main thread only; elsewhere nothing is installed.
    """
    sig = take_pending_signal()
    if sig:  # a stop signal whose exception was lost during the set-up: the run ends before its steps
        raise KeyboardInterrupt if sig == signal.SIGINT else Terminated
    received, previous = [], {}
    if threading.current_thread() is not threading.main_thread():
        return received, lambda: None
    for s in (signal.SIGINT, signal.SIGTERM):
        previous[s] = signal.signal(s, lambda signum, frame: received.append(signum))

    def restore():
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)

    return received, restore


@contextlib.contextmanager
def stops_deferred():
    """SIGINT and SIGTERM inside the block are noted, not raised: yields the list their numbers
    go to, for work between a run's parts (its statistics, its checkpoint) that a stop must not
    cut in half; the caller ends the run after the block (:func:`agreed_signal`)."""
    received, restore = _catch_stop_signals()
    try:
        yield received
    finally:
        restore()


def agreed_signal(received: list, comm) -> int:
    """The stop signal any process of the run received (0: none), so that all stop after one chunk."""
    sig = max(received, default=0)
    if comm is not None and comm.name == "mpi":
        sig = int(comm.allreduce(sig, op="max"))
    elif jax.process_count() > 1:
        from jax.experimental import multihost_utils

        sig = int(np.max(multihost_utils.process_allgather(np.int32(sig))))
    return sig


def placed_alike(tree):
    """``tree`` with its uncommitted arrays placed where its committed ones are: on their one
    device, or replicated over their mesh. A jitted program's outputs are committed when any of
    its inputs is, so a chunk loop whose first state mixes the two (a time or a counter made by
    ``jnp.asarray`` beside fields on a device) would compile its chunk program a second time for
    the second chunk: same shapes, other placements. Uncommitted everywhere: unchanged."""
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    placed = next((x.sharding for x in arrays if x.committed), None)
    if placed is None or all(x.committed for x in arrays):
        return tree
    if len(placed.device_set) == 1:
        device = next(iter(placed.device_set))
        put = lambda x: jax.device_put(x, device)  # noqa: E731
    elif isinstance(placed, jax.sharding.NamedSharding):
        everywhere = jax.sharding.NamedSharding(placed.mesh, jax.sharding.PartitionSpec())
        put = lambda x: put_sharded(x, everywhere)  # noqa: E731
    else:
        return tree
    return jax.tree.map(lambda x: put(x) if isinstance(x, jax.Array) and not x.committed else x, tree)


def drive(advance: Callable, y0, num_steps: int, *, dt: float, t0: float, label: str, args=None,
          options: RunOptions = RunOptions(), comm=None, start: int = 0, check: Callable | None = None,
          until: Callable | None = None,
          names: str | tuple[str, ...] = "y"):
    """The guarded chunk loop of :func:`run` for any stepper: ``(y, RunInfo)``.

    ``advance(y, args, m0, count) -> y`` (jitted by the caller) takes steps
    ``m0 .. m0 + count − 1``; it must not depend on how the steps are chunked, so that a
    resumed run reproduces an uninterrupted one. ``label`` names the method in
    checkpoints (key ``method``) and errors; ``dt`` and ``t0`` go into the checkpoint
    metadata and the messages. Chunks, progress, NaN/Inf replay, checkpoints and resume
    are :func:`run`'s (see there). ``start``: steps ``y0`` has taken already (a caller that
    restored it from a checkpoint itself); the run continues from step ``start``.
    ``check(y, m)``: called on the host after each chunk, before the NaN/Inf test and the
    checkpoint, with the state after step ``m``; it raises (a
    :class:`jaxsem.solvers.stops.RunStopped`) to stop the run, and the last checkpoint stays
    the one before the chunk. SIGINT or SIGTERM during the loop ends it after the current
    chunk and its checkpoint with :class:`jaxsem.solvers.stops.RunInterrupted` (every process together).
    ``until(y, m) -> bool``: called on the host after each accepted chunk, before its checkpoint;
    True ends the run there (its state checkpointed) (a converged steady state), which :class:`RunInfo` then reports.
    ``names``: the state's name in checkpoint files, or the names of its parts when it is a tuple
    (``("state", "series")``); its leaves are the fields of :func:`jaxsem.io.checkpoint.tree_fields`
    under it (``y``, ``y.0``, ``state.U``).
    """
    num_steps = _check_steps(num_steps)
    parts = (lambda y: {names: y}) if isinstance(names, str) else (lambda y: dict(zip(names, y, strict=True)))
    fields = lambda y: {k: v for name, part in parts(y).items() for k, v in tree_fields(name, part).items()}
    method, chunk_steps = label, options.chunk_steps
    meta = dict(options.meta, dt=dt, t0=float(t0), method=method)

    checkpoint_path, resume = options.checkpoint_path, options.resume
    suffix = "" if comm is None else comm.file_suffix
    if suffix:
        checkpoint_path = None if checkpoint_path is None else f"{checkpoint_path}{suffix}"
        resume = None if resume is None else f"{resume}{suffix}"

    def finite(y):
        ok = _all_finite(y)
        if comm is not None:
            ok = comm.allreduce(jnp.where(ok, 0, 1)) == 0
        return bool(ok)

    y, m, resumed = y0, int(start), (int(start) if start else None)
    if resume is not None:
        problem = meta_mismatch(resume, checkpoint_meta(resume, max_step=num_steps), meta)
        # Every rank refuses together (a rank's own mesh part may be the only difference).
        if comm is not None and int(comm.allreduce(jnp.asarray(int(problem is not None)))) and problem is None:
            problem = f"resume: the checkpoint of another rank does not match this run (this rank's: {resume})"
        if problem is not None:
            raise ValueError(problem)
        ck = load_checkpoint(resume, fields(y0), max_step=num_steps)
        y = [tree_from_fields(name, part, ck.fields) for name, part in parts(y0).items()]
        y, m = (y[0] if isinstance(names, str) else tuple(y)), ck.step
        resumed = m

    y = placed_alike(y)
    if not finite(y):
        raise ValueError("the initial state contains NaN/Inf" + (f" (checkpoint {resume})" if resume else ""))
    # a stop signal ends the run between chunks, after the checkpoint, never inside XLA
    stop, restore_handlers = _catch_stop_signals()
    bar = None
    if _show_progress(options.progress):
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, initial=m, desc=options.desc, file=sys.stderr, unit="step", leave=False)
    start_step, chunks = m, 0
    tic = time.perf_counter()
    try:
        while m < num_steps:
            count = min(chunk_steps, num_steps - m)
            y_new = advance(y, args, jnp.asarray(m), jnp.asarray(count))
            if check is not None:
                check(y_new, m + count)
            if not finite(y_new):
                bad = m
                for j in range(count):  # replay from the finite chunk start
                    y = advance(y, args, jnp.asarray(m + j), jnp.asarray(1))
                    if not finite(y):
                        bad = m + j
                        break
                raise NonFiniteError(bad + 1, t0 + (bad + 1) * dt, method, dt)
            y, m = y_new, m + count
            chunks += 1
            sig = agreed_signal(stop, comm)
            done = m >= num_steps or (until is not None and until(y, m))
            if checkpoint_path is not None and (done or sig or chunks % options.checkpoint_every == 0):
                save_checkpoint(checkpoint_path, fields(y), t0 + m * dt, m, **meta)
            if bar is not None:
                if chunks == 1:  # the first chunk compiled the program: its time apart from the rate
                    bar.set_postfix_str(f"first chunk {time.perf_counter() - tic:.1f} s incl. compile")
                    bar.unpause()
                bar.update(count)
            if sig:
                raise RunInterrupted(m, t0 + m * dt, sig, checkpoint_path)
            if done:
                break
        jax.block_until_ready(y)
    finally:
        restore_handlers()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - tic
    return y, RunInfo(m - start_step, m, t0 + m * dt, seconds, chunks, resumed)
