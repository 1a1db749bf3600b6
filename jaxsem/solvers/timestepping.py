"""Explicit Runge–Kutta time stepping as ``lax`` loops, and a guarded driver for long runs.

Methods (``method=``):

* ``"lserk4"`` — Carpenter & Kennedy (1994), 5-stage 4th-order 2N-storage
  (NASA TM-109112, solution 3): ``k ← a_s k + Δt f(t + c_s Δt, y)``,
  ``y ← y + b_s k``; NekCEM's integrator.
* ``"ssprk3"`` — Shu–Osher 3-stage 3rd-order strong-stability-preserving RK.
* ``"rk4"`` — the classic 4-stage 4th-order RK.

``f(t, y)`` may return any pytree shaped like ``y``.

Two entry points:

* :func:`integrate` — pure and differentiable: ``lax.scan`` over a static
  number of steps, optional per-step observations, and a reverse-mode memory
  schedule (:class:`Checkpointing`; ``Checkpointing("sqrt")``: memory ~ √steps
  for ``jax.grad`` through long runs, by ``jax.checkpoint`` or, where steps send
  MPI messages, by an equivalent ``jax.custom_vjp``). Reverse mode keeps the
  input of every stage and recomputes ``f``'s internals from it (each ``f``
  evaluation under ``jax.checkpoint``), exact for any ``f``.
* :func:`run` — the host-side driver (:class:`RunOptions`): chunks of steps
  under ``jit``, a tqdm progress bar on stderr, NaN/Inf detection that names
  the step where the blow-up appeared (:class:`NonFiniteError`), refusal of a
  Δt above a given stable limit, and atomic npz checkpoints that carry the
  run's metadata, from which a run with the same metadata resumes to a
  bit-identical result. Its compiled chunk, :func:`advance_fn`, is also the
  kernel to time (``experiments/maxwell_throughput.py``).

:func:`run` steps low-storage methods with their stages in a loop (one copy of
``f`` in the compiled program: :func:`rk_step` with ``loop_stages=True``);
:func:`integrate` does so on the CPU and writes the stages out on an
accelerator (its ``stages`` argument).

Stability: :func:`stability_radius` is the radius of the largest half-disk
``{|z| ≤ r, Re z ≤ 0}`` inside a method's stability region, so
``Δt ≤ stability_radius(method) / ρ(L)`` is stable (eigenvalue criterion) for a
linear operator whose spectrum lies in the closed left half-plane with spectral radius ρ
(:func:`spectral_radius` estimates ρ by power iteration); :func:`cfl_dt` scales
that limit by a CFL factor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Mapping
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..io import atomic_output
from .stops import UnstableRunError

__all__ = [
    "stability_function",
    "METHODS",
    "LowStorageTableau",
    "ButcherTableau",
    "tableau",
    "rk_step",
    "integrate",
    "Checkpointing",
    "REMATS",
    "run",
    "RunOptions",
    "advance_fn",
    "drive",
    "RunInfo",
    "NonFiniteError",
    "stability_radius",
    "imaginary_axis_limit",
    "spectral_radius",
    "cfl_dt",
    "save_checkpoint",
    "load_checkpoint",
    "checkpoint_meta",
    "checkpoint_shapes",
    "RunInterrupted",
    "meta_mismatch",
]


@dataclasses.dataclass(frozen=True)
class LowStorageTableau:
    """Williamson 2N-storage coefficients ``a, b, c`` (one per stage)."""

    name: str
    order: int
    a: tuple
    b: tuple
    c: tuple

    @property
    def stages(self) -> int:
        return len(self.b)


@dataclasses.dataclass(frozen=True)
class ButcherTableau:
    """An explicit Butcher tableau ``A`` (lower triangular), ``b``, ``c``."""

    name: str
    order: int
    A: tuple
    b: tuple
    c: tuple

    @property
    def stages(self) -> int:
        return len(self.b)


# Carpenter & Kennedy (1994), five-stage fourth-order 2N-storage RK, solution 3
# (as in Hesthaven & Warburton, Nodal DG, Table 3.1, and NekCEM).
LSERK4 = LowStorageTableau(
    "lserk4", 4,
    a=(0.0,
       -567301805773.0 / 1357537059087.0,
       -2404267990393.0 / 2016746695238.0,
       -3550918686646.0 / 2091501179385.0,
       -1275806237668.0 / 842570457699.0),
    b=(1432997174477.0 / 9575080441755.0,
       5161836677717.0 / 13612068292357.0,
       1720146321549.0 / 2090206949498.0,
       3134564353537.0 / 4481467310338.0,
       2277821191437.0 / 14882151754819.0),
    c=(0.0,
       1432997174477.0 / 9575080441755.0,
       2526269341429.0 / 6820363962896.0,
       2006345519317.0 / 3224310063776.0,
       2802321613138.0 / 2924317926251.0),
)
SSPRK3 = ButcherTableau(
    "ssprk3", 3,
    A=((), (1.0,), (0.25, 0.25)),
    b=(1.0 / 6.0, 1.0 / 6.0, 2.0 / 3.0),
    c=(0.0, 1.0, 0.5),
)
RK4 = ButcherTableau(
    "rk4", 4,
    A=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0),
    c=(0.0, 0.5, 0.5, 1.0),
)
_TABLEAUX = {t.name: t for t in (LSERK4, SSPRK3, RK4)}
METHODS = tuple(_TABLEAUX)


def tableau(method: str):
    """The coefficients of ``method`` (one of :data:`METHODS`)."""
    if method not in _TABLEAUX:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return _TABLEAUX[method]


# ----------------------------------------------------------------------------- one step

_axpy = lambda a, x, y: jax.tree_util.tree_map(lambda xi, yi: a * xi + yi, x, y)


def rk_step(f: Callable, t, y, dt, method: str = "lserk4", loop_stages: bool = False):
    """One explicit RK step of ``y' = f(t, y)`` from ``(t, y)`` with step ``dt``.

    ``loop_stages``: run the stages of a low-storage method as a ``fori_loop``
    (one copy of ``f`` in the compiled program instead of one per stage: much
    faster compilation, the same arithmetic), as :func:`integrate` and
    :func:`run` do; unrolled, the step also takes NumPy arrays
    (:func:`stability_function`).
    """
    tab = tableau(method)
    if isinstance(tab, LowStorageTableau) and loop_stages:
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(y))
        A, B, C = (jnp.asarray(v, dtype) for v in (tab.a, tab.b, tab.c))

        def stage(s, carry):
            y, k = carry
            fk = f(t + C[s] * dt, y)
            k = jax.tree_util.tree_map(lambda ki, fi: A[s] * ki + dt * fi, k, fk)
            return _axpy(B[s], k, y), k

        k0 = jax.tree_util.tree_map(jnp.zeros_like, y)
        return jax.lax.fori_loop(0, tab.stages, stage, (y, k0))[0]
    if isinstance(tab, LowStorageTableau):
        k = None
        for a, b, c in zip(tab.a, tab.b, tab.c):
            fk = f(t + c * dt, y)
            if k is None or not a:  # a_1 = 0: the first stage needs no k storage
                k = jax.tree_util.tree_map(lambda fi: dt * fi, fk)
            else:
                k = jax.tree_util.tree_map(lambda ki, fi: a * ki + dt * fi, k, fk)
            y = _axpy(b, k, y)
        return y
    ks = []
    for s in range(tab.stages):
        ys = y
        for j, aij in enumerate(tab.A[s]):
            if aij:
                ys = _axpy(aij * dt, ks[j], ys)
        ks.append(f(t + tab.c[s] * dt, ys))
    for bs, ks_ in zip(tab.b, ks):
        y = _axpy(bs * dt, ks_, y)
    return y


# ----------------------------------------------------------------------------- pure integration

REMATS = ("auto", "checkpoint", "custom_vjp")


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """The memory schedule of reverse mode (``jax.grad``) through :func:`integrate` (static, hashable).

    Values and gradients do not depend on it (each step's arithmetic is the
    same), only memory and time.

    Attributes:
      every: steps per recomputed chunk.

        * ``None`` (default): one ``lax.scan``; reverse mode stores the
          residuals of every step: memory ∝ ``num_steps``.
        * an int ``c ≥ 1``: a segmented scan, an outer ``lax.scan`` over
          ``num_steps // c`` chunks of an inner scan of ``c`` steps (the
          ``num_steps % c`` remaining steps run plain after them). Reverse
          mode stores one state per chunk and, chunk by chunk from the last,
          recomputes the chunk's steps and their residuals: memory
          ``num_steps / c`` states + ``c`` steps' residuals, for one extra
          forward pass of compute.
        * ``"sqrt"``: ``c = ⌈√num_steps⌉`` (:meth:`chunk`): memory
          ∝ (1 + r)·√num_steps instead of r·num_steps.

        A step's residuals (r states) are the inputs of its stages, from
        which the reverse pass recomputes ``f``'s internals (``f`` runs
        under ``jax.checkpoint``): r = stages (5 for LSERK4), plus the
        stage values of ``f`` when ``dt`` is traced. A step that sends
        MPI messages (ordered effects, which ``jax.checkpoint`` cannot
        partially evaluate) keeps all of ``f``'s residuals instead.
      remat: how the chunks are recomputed (only with ``every``):

        * ``"checkpoint"``: each chunk under ``jax.checkpoint``; forward mode
          (``jvp``, Hessian–vector products) works too. JAX cannot
          partially evaluate a checkpoint whose steps have ordered effects,
          such as mpi4jax's messages in a distributed run.
        * ``"custom_vjp"``: the same schedule written out as a ``jax.custom_vjp``
          (the forward pass keeps the chunk-start states, the backward pass
          re-runs each chunk under ``jax.vjp``); reverse mode only, and works
          with ordered effects (distributed gradients through mpi4jax).
        * ``"auto"`` (default): ``"custom_vjp"`` when a step has effects,
          else ``"checkpoint"``.

    Raises ``ValueError`` naming the field for a bad ``every`` or ``remat``.
    """

    every: int | str | None = None
    remat: str = "auto"

    def __post_init__(self):
        every = self.every
        if isinstance(every, (int, np.integer)) and not isinstance(every, bool) and every >= 1:
            object.__setattr__(self, "every", int(every))
        elif not (every is None or (isinstance(every, str) and every == "sqrt")):
            raise ValueError(f"Checkpointing.every must be None, 'sqrt' or an int >= 1, got {every!r}")
        if not isinstance(self.remat, str) or self.remat not in REMATS:
            raise ValueError(f"Checkpointing.remat must be one of {REMATS}, got {self.remat!r}")

    def chunk(self, num_steps: int) -> int | None:
        """Steps per recomputed chunk for a run of ``num_steps`` steps, or ``None`` for a plain scan.

        A chunk of ``num_steps`` or more (or a run of fewer than 2 steps) is a plain scan.
        """
        num_steps = _check_steps(num_steps)
        if self.every is None:
            return None
        c = math.isqrt(max(num_steps - 1, 0)) + 1 if self.every == "sqrt" else self.every  # ⌈√n⌉ for n ≥ 1
        return None if c >= num_steps or num_steps < 2 else c


def integrate(
    f: Callable,
    y0,
    dt,
    num_steps: int,
    *,
    t0=0.0,
    method: str = "lserk4",
    checkpointing: Checkpointing = Checkpointing(),
    observe: Callable | None = None,
    stages: str = "auto",
):
    """Advance ``y0`` by ``num_steps`` steps of size ``dt`` (pure; jit-, vmap- and grad-friendly).

    Args:
      f: right-hand side ``f(t, y)``; it may close over traced parameters (ε, μ,
        a velocity field …): ``jax.grad`` w.r.t. them runs backwards through the loop,
        recomputing ``f`` from each stage's input (see :class:`Checkpointing`).
      y0: initial state (any pytree of arrays, e.g. Maxwell's ``q: (6, E, n, n, n)``).
      dt: step size (time units of ``f``; may be traced).
      num_steps: number of steps (static int ≥ 0).
      t0: initial time; step m starts at ``t0 + m·dt`` (no accumulated round-off).
      method: one of :data:`METHODS`.
      checkpointing: the memory schedule of reverse mode (:class:`Checkpointing`;
        default: a plain scan, memory ∝ ``num_steps``).
      observe: optional ``observe(y) -> pytree``; evaluated after every step.
      stages: ``"loop"`` runs a low-storage method's stages as a loop (one copy of ``f``
        in the compiled program: fast compilation); ``"unrolled"`` writes them out,
        so that reverse mode keeps each stage's input in its own stacked array instead of
        copying a step's stage inputs in and out of a per-step buffer and accumulating
        the parameters' cotangents per step; ``"auto"`` (default): ``"loop"`` when JAX's
        default backend is the CPU, else ``"unrolled"``. Values are the same.

    Returns ``y`` at ``t0 + num_steps·dt`` (shaped like ``y0``), or ``(y, obs)``
    when ``observe`` is given, ``obs`` stacked over steps (leading axis
    ``num_steps``: ``obs[m]`` is ``observe`` of the state at ``t0 + (m+1)·dt``).

    Raises ``ValueError`` for a bad ``method``, ``num_steps`` or ``stages``, ``TypeError`` for a
    ``checkpointing`` that is not a :class:`Checkpointing`.
    """
    tableau(method)
    if stages not in ("auto", "loop", "unrolled"):
        raise ValueError(f"stages must be 'auto', 'loop' or 'unrolled', got {stages!r}")
    loop = stages == "loop" or (stages == "auto" and jax.default_backend() == "cpu")
    if not isinstance(checkpointing, Checkpointing):
        raise TypeError(f"checkpointing must be a Checkpointing, got {checkpointing!r}")
    num_steps = _check_steps(num_steps)
    c = checkpointing.chunk(num_steps)
    remat = checkpointing.remat

    def stepper(rhs):
        def one(y, m):
            y = rk_step(rhs, t0 + m * dt, y, dt, method, loop_stages=loop)
            return y, (observe(y) if observe is not None else None)

        return one

    effects = jax.make_jaxpr(stepper(f))(y0, 0).effects
    # Reverse mode keeps each stage's input and recomputes f's internals from it: f's
    # residuals are several states per stage, and on a bandwidth-bound GPU writing and reading
    # them back costs as much time as recomputing them, or more (docs/performance.md). The
    # forward and backward loops keep values and recomputation apart: no CSE barrier needed.
    one = stepper(f if effects else jax.checkpoint(f, prevent_cse=False))

    steps = jnp.arange(num_steps)
    if c is None:
        y, obs = jax.lax.scan(one, y0, steps)
        return (y, obs) if observe is not None else y

    nchunk, rest = divmod(num_steps, c)
    ms = steps[: nchunk * c].reshape(nchunk, c)
    chunk = lambda y, ms: jax.lax.scan(one, y, ms)
    if remat == "checkpoint" or (remat == "auto" and not effects):
        y, obs = jax.lax.scan(jax.checkpoint(chunk), y0, ms)
    else:
        # The chunk as a function of its closed-over parameters too (ε, dt, …), traced once.
        conv, consts = jax.closure_convert(chunk, y0, ms[0])
        y, obs = _segmented(conv, y0, ms, *consts)
    obs = jax.tree_util.tree_map(lambda o: o.reshape((nchunk * c,) + o.shape[2:]), obs)
    if rest:
        y, obs2 = jax.lax.scan(one, y, steps[nchunk * c:])
        obs = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), obs, obs2)
    return (y, obs) if observe is not None else y


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _segmented(chunk, y0, ms, *consts):
    """``lax.scan`` of ``chunk(y, ms[k], *consts) -> (y, obs)`` over the chunks ``ms: (K, c)``."""
    return jax.lax.scan(lambda y, m: chunk(y, m, *consts), y0, ms)


def _segmented_fwd(chunk, y0, ms, *consts):
    def body(y, m):
        y1, obs = chunk(y, m, *consts)
        return y1, (y, obs)  # keep the chunk's start state, nothing of its inside

    y, (starts, obs) = jax.lax.scan(body, y0, ms)
    return (y, obs), (starts, ms, consts)


def _segmented_bwd(chunk, res, ct):
    starts, ms, consts = res
    ybar, obsbar = ct

    def body(carry, xs):
        ybar, cbar = carry
        y, m, ob = xs
        # recompute this chunk (its residuals live only during this iteration) and pull back
        _, pull = jax.vjp(lambda y, cs: chunk(y, m, *cs), y, consts)
        ybar, cs_bar = pull((ybar, ob))
        return (ybar, jax.tree_util.tree_map(jnp.add, cbar, cs_bar)), None

    zero = jax.tree_util.tree_map(jnp.zeros_like, consts)
    (y0bar, cbar), _ = jax.lax.scan(body, (ybar, zero), (starts, ms, obsbar), reverse=True)
    return (y0bar, None, *cbar)


_segmented.defvjp(_segmented_fwd, _segmented_bwd)


def _check_steps(num_steps):
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an int >= 0, got {num_steps!r}")
    return int(num_steps)


# ----------------------------------------------------------------------------- stability


def stability_function(method: str, z):
    """Stability function R(z) of ``method`` (NumPy, complex ``z``), from y' = λy."""
    return rk_step(lambda t, y: z * y, 0.0, np.ones_like(z), 1.0, method)


def _first_unstable(method: str, direction, r_max: float = 8.0, step: float = 0.01) -> np.ndarray:
    """Per ray ``z = r·direction``: the first r where ``|R(z)| > 1`` (coarse scan, then bisection)."""
    r = np.arange(step, r_max + step, step)
    bad = np.abs(stability_function(method, r[:, None] * direction[None, :])) > 1.0 + 1e-12
    idx = np.where(bad.any(axis=0), np.argmax(bad, axis=0), len(r) - 1)
    lo, hi = np.where(idx > 0, r[idx - 1], 0.0), r[idx]
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        b = np.abs(stability_function(method, mid * direction)) > 1.0 + 1e-12
        lo, hi = np.where(b, lo, mid), np.where(b, mid, hi)
    return lo


@functools.lru_cache(maxsize=None)
def stability_radius(method: str) -> float:
    """Largest r with ``|R(z)| ≤ 1`` on the half-disk ``|z| ≤ r, Re z ≤ 0``."""
    tableau(method)
    theta = np.linspace(np.pi / 2, 3 * np.pi / 2, 721)
    return float(np.min(_first_unstable(method, np.exp(1j * theta))))


@functools.lru_cache(maxsize=None)
def imaginary_axis_limit(method: str) -> float:
    """Largest y with ``|R(i s)| ≤ 1`` for all ``|s| ≤ y`` (central-flux DG spectra)."""
    tableau(method)
    return float(_first_unstable(method, np.array([1j]))[0])


def _dot(u, v, args):
    return jnp.sum(u * v)


@functools.lru_cache(maxsize=32)
def _power_fn(apply, inner, iterations):
    @jax.jit
    def go(v, args):
        def body(_, carry):
            v, _ = carry
            v = v / jnp.sqrt(inner(v, v, args))
            w = apply(v, args)
            return w, jnp.sqrt(inner(w, w, args))

        return jax.lax.fori_loop(0, iterations, body, (v, jnp.zeros((), v.dtype)))[1]

    return go


def spectral_radius(apply: Callable, like, args=None, inner: Callable | None = None,
                    iterations: int = 60, seed: int = 0, start=None) -> float:
    """Power-iteration estimate of the spectral radius of a linear map.

    Args:
      apply: ``(v, args) -> L v`` (linear in v), on arrays shaped like ``like``.
      like: an array (or ``jax.ShapeDtypeStruct``) with the state's shape and dtype.
      args: pytree passed to ``apply`` and ``inner`` (traced, not baked into
        the compiled code; keep ``apply``/``inner`` the same objects between
        calls to reuse the compiled loop).
      inner: ``(u, v, args) -> <u, v>`` (default: sum of products); pass the
        energy inner product for operators skew in it.
      iterations: power iterations. The estimate approaches ρ from below; the
        callers' limits keep a margin (see :func:`jaxsem.models.maxwell.stable_dt`).
      start: the start vector (default: a seed-``seed`` normal draw shaped like ``like``).
    """
    # NumPy's generator: jax.random would compile threefry (seconds on a CPU) for one draw.
    v = np.random.default_rng(seed).standard_normal(tuple(like.shape)) if start is None else start
    v = jnp.asarray(v, like.dtype)
    go = _power_fn(apply, _dot if inner is None else inner, int(iterations))
    return float(go(v, args))


def cfl_dt(rho: float, method: str = "lserk4", cfl: float = 0.5) -> float:
    """``Δt = cfl · stability_radius(method) / ρ``: cfl ≤ 1 is inside the stable limit."""
    if not (np.isfinite(cfl) and cfl > 0):
        raise ValueError(f"cfl must be a positive number, got {cfl!r}")
    if not (np.isfinite(rho) and rho > 0):
        raise ValueError(f"rho (spectral radius) must be a positive number, got {rho!r}")
    return float(cfl) * stability_radius(method) / float(rho)


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(path, y, t: float, step: int, **meta) -> None:
    """Write state ``y`` (a pytree of arrays), time and step to ``path`` (npz), atomically.

    Written through :func:`jaxsem.io.atomic_output`: a temporary file with a unique name,
    created exclusively beside ``path``, renamed onto it when whole; a crash, a full disk or
    a concurrent writer of the same path leaves either the old or a new checkpoint, and no
    temporary file. Raises ``ValueError`` for a symlink at ``path``, a ``step`` that is not
    an integer ≥ 0 or a ``t`` that is not finite (such a file could not be resumed).
    """
    path = os.fspath(path)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"save_checkpoint({path!r}): step must be an integer >= 0, got {step!r}")
    if not math.isfinite(float(t)):
        raise ValueError(f"save_checkpoint({path!r}): t must be finite, got {t!r}")
    leaves = jax.tree_util.tree_leaves(y)
    arrays = {f"leaf_{i}": np.asarray(a) for i, a in enumerate(leaves)}
    with atomic_output(path, "checkpoint") as fh:
        np.savez(fh, t=np.float64(t), step=np.int64(step), num_leaves=np.int64(len(leaves)),
                 **{f"meta_{k}": np.asarray(v) for k, v in meta.items()}, **arrays)


class _Checkpoint(NamedTuple):
    """An open checkpoint file whose container :func:`_open_checkpoint` has checked."""

    path: str
    z: object  # numpy's NpzFile
    num_leaves: int

    def read(self, key: str) -> np.ndarray:
        """The array ``key``; a damaged member is a ``ValueError`` naming the file."""
        try:
            return self.z[key]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(f"checkpoint {self.path!r}: cannot read {key!r} ({err})") from None

    def scalar(self, key: str, kinds: str, allowed: str):
        """The 0-d array ``key`` of a dtype kind in ``kinds``, as a Python value."""
        a = self.read(key)
        if a.shape != () or a.dtype.kind not in kinds:
            raise ValueError(f"checkpoint {self.path!r}: {key} must be {allowed}, got an array of shape "
                             f"{a.shape} and dtype {a.dtype}")
        return a.item()

    def leaf_header(self, i: int) -> tuple[tuple, np.dtype]:
        """Shape and dtype of array ``i`` from its header, without reading its data."""
        try:
            with self.z.zip.open(f"leaf_{i}.npy") as fh:
                version = np.lib.format.read_magic(fh)
                header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)
                shape, _, dtype = header(fh)
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
            raise ValueError(f"checkpoint {self.path!r}: cannot read the header of array {i} ({err})") from None
        return tuple(shape), np.dtype(dtype)


@contextlib.contextmanager
def _open_checkpoint(path, max_step: int | None = None):
    """A checkpoint file with its container checked (every error a ``ValueError`` naming the file).

    Checked: an npz archive (no pickled objects) with ``t`` finite, ``step`` an integer in
    0..``max_step`` (no upper bound for ``None``), ``num_leaves`` an integer ≥ 0 with exactly
    the arrays ``leaf_0 .. leaf_{num_leaves-1}``, and every ``meta_*`` a 0-d str, number or bool.
    A missing file is a ``FileNotFoundError`` naming it.
    """
    p = os.fspath(path)
    try:
        z = np.load(p, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {p!r}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"checkpoint {p!r} is not a checkpoint written by save_checkpoint (an npz "
                         f"archive): {err}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"checkpoint {p!r} is a single .npy array, not a checkpoint written by save_checkpoint "
                         "(an npz archive)")
    with z:
        missing = [k for k in ("t", "step", "num_leaves") if k not in z.files]
        if missing:
            raise ValueError(f"checkpoint {p!r} lacks {', '.join(missing)}: not a checkpoint written by "
                             f"save_checkpoint (it holds {sorted(z.files)})")
        ck = _Checkpoint(p, z, 0)
        n = ck.scalar("num_leaves", "iu", "an integer >= 0")
        leaves = {k for k in z.files if k.startswith("leaf_")}
        if n < 0 or leaves != {f"leaf_{i}" for i in range(n)}:
            raise ValueError(f"checkpoint {p!r}: num_leaves = {n} must be >= 0 and name its arrays "
                             f"leaf_0 .. leaf_{n - 1}, the file holds {sorted(leaves)}")
        step = ck.scalar("step", "iu", "an integer")
        if step < 0 or (max_step is not None and step > max_step):
            allowed = ">= 0" if max_step is None else f"in 0..{max_step} (this run has {max_step} steps)"
            raise ValueError(f"checkpoint {p!r}: step must be an integer {allowed}, got {step}")
        t = ck.scalar("t", "fiu", "a finite number")
        if not math.isfinite(t):
            raise ValueError(f"checkpoint {p!r}: t must be a finite number, got {t}")
        for k in z.files:
            if k.startswith("meta_"):
                ck.scalar(k, "biufU", "a str, number or bool")
        yield ck._replace(num_leaves=n)


def load_checkpoint(path, like, *, max_step: int | None = None):
    """Read a checkpoint written by :func:`save_checkpoint`: ``(y, t, step, meta)``.

    ``like`` gives the pytree structure, shapes and dtypes to expect; ``max_step`` the
    largest step allowed (the run's step count). Every field is checked
    (:func:`_open_checkpoint`, then each array's shape and dtype against ``like``); a
    failure is a ``ValueError`` naming the file, the field, the value and what is allowed.
    """
    with _open_checkpoint(path, max_step) as ck:
        leaves_like, treedef = jax.tree_util.tree_flatten(like)
        if ck.num_leaves != len(leaves_like):
            raise ValueError(f"checkpoint {ck.path!r}: num_leaves = {ck.num_leaves}, this run's state has "
                             f"{len(leaves_like)} arrays")
        leaves = []
        for i, ref in enumerate(leaves_like):
            shape, dtype = ck.leaf_header(i)
            want_shape, want_dtype = tuple(jnp.shape(ref)), jnp.result_type(ref)
            if shape != want_shape or dtype != want_dtype:
                raise ValueError(f"checkpoint {ck.path!r}: array {i} has shape {shape} and dtype {dtype}, "
                                 f"this run's has shape {want_shape} and dtype {want_dtype}")
            leaves.append(jnp.asarray(ck.read(f"leaf_{i}")))
        meta = {k[5:]: ck.read(k)[()] for k in ck.z.files if k.startswith("meta_")}
        return (jax.tree_util.tree_unflatten(treedef, leaves), float(ck.read("t")), int(ck.read("step")), meta)


def checkpoint_shapes(path) -> list:
    """Shapes and dtypes of a checkpoint's arrays (``jax.ShapeDtypeStruct``, in leaf order), without
    reading their data; the container is checked as by :func:`load_checkpoint`."""
    with _open_checkpoint(path) as ck:
        return [jax.ShapeDtypeStruct(*ck.leaf_header(i)) for i in range(ck.num_leaves)]


# ----------------------------------------------------------------------------- guarded driver


class NonFiniteError(FloatingPointError):
    """The solution became NaN/Inf; ``step`` is the first step whose result is not finite."""

    status = "non_finite"

    def __init__(self, step: int, t: float, method: str, dt: float):
        self.step, self.t = step, t
        super().__init__(
            f"non-finite values (NaN/Inf) appeared at step {step} (t = {t:.6g}) of a {method} run "
            f"with dt = {dt:.6g}; the state before that step was finite"
        )


class RunInterrupted(BaseException):
    """A run stopped by SIGINT or SIGTERM after a whole chunk (and its checkpoint).

    Attributes: ``step`` and ``t`` reached, ``signal`` (its number), ``checkpoint`` (the
    file holding that state, or ``None`` where the run writes none). A ``BaseException``,
    as ``KeyboardInterrupt`` is, so that a handler of ``Exception`` does not swallow it;
    ``status = "interrupted"`` as the run-stop exceptions of :mod:`jaxsem.solvers.stops` carry theirs.
    """

    status = "interrupted"

    def __init__(self, step: int, t: float, signum: int, checkpoint: str | None):
        checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.step, self.t, self.signal, self.checkpoint = step, t, signum, checkpoint
        kept = (f"checkpoint {checkpoint} holds this state" if checkpoint is not None
                else "no checkpoint was written")
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step} (t = {t:.6g}); {kept}")


def _catch_stop_signals():
    """``(received, restore)``: SIGINT and SIGTERM append their number to the list
    ``received`` until ``restore()`` puts the previous handlers back.

    Python runs handlers in the main thread only; elsewhere nothing is installed.
    """
    received, previous = [], {}
    if threading.current_thread() is not threading.main_thread():
        return received, lambda: None
    for s in (signal.SIGINT, signal.SIGTERM):
        previous[s] = signal.signal(s, lambda signum, frame: received.append(signum))

    def restore():
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)

    return received, restore


def _agreed_signal(received: list, comm) -> int:
    """The stop signal any process of the run received (0: none), so that all stop after one chunk."""
    sig = max(received, default=0)
    if comm is not None and comm.name == "mpi":
        sig = int(comm.allreduce(sig, op="max"))
    elif jax.process_count() > 1:
        from jax.experimental import multihost_utils

        sig = int(np.max(multihost_utils.process_allgather(np.int32(sig))))
    return sig


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


@jax.jit
def _all_finite(y):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree_util.tree_leaves(y)]))


@functools.lru_cache(maxsize=32)
def advance_fn(f, method: str, with_args: bool = True):
    """A jitted ``(y, args, t0, dt, m0, count) -> y`` running steps ``m0 .. m0+count-1``."""
    g = f if with_args else (lambda t, y, args: f(t, y))

    @jax.jit
    def advance(y, args, t0, dt, m0, count):
        body = lambda m, y: rk_step(lambda t, y: g(t, y, args), t0 + m * dt, y, dt, method, loop_stages=True)
        return jax.lax.fori_loop(m0, m0 + count, body, y)

    return advance


_RUN_KEYS = ("dt", "t0", "method")  # what run records itself in every checkpoint


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How :func:`run` drives the steps: chunks, guards, progress, checkpoint files (static, hashable).

    None of it changes the arithmetic of a step: any options give the same bits.

    Attributes:
      chunk_steps: steps per jitted chunk (int ≥ 1): the granularity of progress,
        NaN/Inf checks and checkpoints.
      dt_max: the stable limit (e.g. :func:`cfl_dt` with cfl = 1), or ``None``; a
        ``dt`` above it is refused with a ``ValueError`` naming the limit.
      progress: show a tqdm progress bar on stderr: True, False, or ``"auto"`` (the default:
        where stderr is a terminal or in a Jupyter kernel). It says the first chunk's time
        (compilation included) apart from the steps' rate and the time left.
      desc: the progress bar's label.
      checkpoint_path: write ``(y, t, step)`` and the metadata there after every
        chunk (npz, atomic), or ``None``.
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
    resume: str | os.PathLike | None = None
    meta: tuple = ()

    def __post_init__(self):
        n = self.chunk_steps
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"RunOptions.chunk_steps must be an int >= 1, got {n!r}")
        object.__setattr__(self, "chunk_steps", int(n))
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


def meta_mismatch(path, saved: dict, want: dict) -> str | None:
    """Every key where a checkpoint's metadata and this run's differ, as one message (``None``: equal)."""
    none = "(none)"
    diffs = [f"{key} = {saved.get(key, none)!r} in the checkpoint, {want.get(key, none)!r} in this run"
             for key in sorted(set(saved) | set(want)) if saved.get(key, none) != want.get(key, none)]
    return f"resume: checkpoint {path} is of another run: " + "; ".join(diffs) if diffs else None


def checkpoint_meta(path, *, max_step: int | None = None) -> dict:
    """The metadata of a checkpoint written by :func:`save_checkpoint`, as plain Python values.

    The file is checked as by :func:`load_checkpoint` (errors name it)."""
    with _open_checkpoint(path, max_step) as ck:
        return {k[5:]: ck.read(k)[()].item() for k in ck.z.files if k.startswith("meta_")}


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
      method: one of :data:`METHODS`.
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

    Raises :class:`NonFiniteError` with the first bad step if a NaN/Inf appears
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


@jax.jit
def _sum_of_squares(y):
    return sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(y))


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


def drive(advance: Callable, y0, num_steps: int, *, dt: float, t0: float, label: str, args=None,
          options: RunOptions = RunOptions(), comm=None, start: int = 0, check: Callable | None = None):
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
    chunk and its checkpoint with :class:`RunInterrupted` (every process together).
    """
    num_steps = _check_steps(num_steps)
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
        y, _, m, _ = load_checkpoint(resume, y0, max_step=num_steps)
        resumed = m

    if not finite(y):
        raise ValueError("the initial state contains NaN/Inf" + (f" (checkpoint {resume})" if resume else ""))
    bar = None
    if _show_progress(options.progress):
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, initial=m, desc=options.desc, file=sys.stderr, unit="step", leave=False)
    start_step, chunks = m, 0
    tic = time.perf_counter()
    # a stop signal ends the run between chunks, after the checkpoint, never inside XLA
    stop, restore_handlers = _catch_stop_signals()
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
            if checkpoint_path is not None:
                save_checkpoint(checkpoint_path, y, t0 + m * dt, m, **meta)
            if bar is not None:
                if chunks == 1:  # the first chunk compiled the program: its time apart from the rate
                    bar.set_postfix_str(f"first chunk {time.perf_counter() - tic:.1f} s incl. compile")
                    bar.unpause()
                bar.update(count)
            sig = _agreed_signal(stop, comm)
            if sig:
                raise RunInterrupted(m, t0 + m * dt, sig, checkpoint_path)
        jax.block_until_ready(y)
    finally:
        restore_handlers()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - tic
    return y, RunInfo(m - start_step, m, t0 + m * dt, seconds, chunks, resumed)
