"""Explicit Runge–Kutta time stepping as pure ``lax`` loops, and the stability limits of the methods.

Methods (``method=``):

* ``"lserk4"`` — Carpenter & Kennedy (1994), 5-stage 4th-order 2N-storage
  (NASA TM-109112, solution 3): ``k ← a_s k + Δt f(t + c_s Δt, y)``,
  ``y ← y + b_s k``; NekCEM's integrator.
* ``"ssprk3"`` — Shu–Osher 3-stage 3rd-order strong-stability-preserving RK.
* ``"rk4"`` — the classic 4-stage 4th-order RK.

``f(t, y)`` may return any pytree shaped like ``y``. :func:`rk_step` is one step;
:func:`advance_fn` a jitted chunk of steps, the kernel of the host driver
:func:`jaxsem.solvers.driver.run` (chunks, NaN/Inf checks, progress, checkpoint files) and the
one to time (``experiments/maxwell_throughput.py``).

:func:`integrate` is pure and differentiable: ``lax.scan`` over a static number of steps,
optional per-step observations, and a reverse-mode memory schedule (:class:`Checkpointing`;
``Checkpointing("sqrt")``: memory ~ √steps for ``jax.grad`` through long runs, by
``jax.checkpoint`` or, where steps send MPI messages, by an equivalent ``jax.custom_vjp``;
``Checkpointing(snapshots=s)``: the binomial schedule, at most ``s`` stored states and the
least recomputation for them).
Reverse mode keeps the input of every stage and recomputes ``f``'s internals from it (each
``f`` evaluation under ``jax.checkpoint``), exact for any ``f``.

Stability: :func:`stability_radius` is the radius of the largest half-disk
``{|z| ≤ r, Re z ≤ 0}`` inside a method's stability region, so
``Δt ≤ stability_radius(method) / ρ(L)`` is stable (eigenvalue criterion) for a
linear operator whose spectrum lies in the closed left half-plane with spectral radius ρ
(:func:`spectral_radius` estimates ρ by power iteration); :func:`cfl_dt` scales
that limit by a CFL factor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["METHODS", "LowStorageTableau", "ButcherTableau", "tableau", "rk_step", "advance_fn", "integrate", "checkpointed_scan",
           "Checkpointing", "REMATS", "stability_function", "stability_radius", "imaginary_axis_limit",
           "spectral_radius", "cfl_dt"]


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


# ----------------------------------------------------------------------------- steps

_axpy = lambda a, x, y: jax.tree_util.tree_map(lambda xi, yi: a * xi + yi, x, y)


def rk_step(f: Callable, t, y, dt, method: str = "lserk4", loop_stages: bool = False):
    """One explicit RK step of ``y' = f(t, y)`` from ``(t, y)`` with step ``dt``.

    ``loop_stages``: run the stages of a low-storage method as a ``fori_loop``
    (one copy of ``f`` in the compiled program instead of one per stage: much
    faster compilation, the same arithmetic), as :func:`integrate` and
    :func:`advance_fn` do; unrolled, the step also takes NumPy arrays
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


@functools.lru_cache(maxsize=32)
def advance_fn(f, method: str, with_args: bool = True):
    """A jitted ``(y, args, t0, dt, m0, count) -> y`` running steps ``m0 .. m0+count-1``."""
    g = f if with_args else (lambda t, y, args: f(t, y))

    @jax.jit
    def advance(y, args, t0, dt, m0, count):
        body = lambda m, y: rk_step(lambda t, y: g(t, y, args), t0 + m * dt, y, dt, method, loop_stages=True)
        return jax.lax.fori_loop(m0, m0 + count, body, y)

    return advance


# ----------------------------------------------------------------------------- pure integration

REMATS = ("auto", "checkpoint", "custom_vjp")


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """The memory schedule of reverse mode (``jax.grad``) through :func:`integrate` (static, hashable).

    Values and gradients do not depend on it (each step's arithmetic is the
    same), only memory and time; a step whose adjoint solves take guesses
    (:func:`checkpointed_scan`'s ``adjoint_guess``, as Navier–Stokes's do) gets them
    under the binomial schedule alone, and its gradient then agrees to the solves'
    tolerance.

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

      snapshots: the binomial schedule (Griewank's *revolve*; instead of ``every``):
        reverse mode keeps at most ``snapshots`` states (an int ≥ 1, the initial
        one included) plus the last step's input, and recomputes the steps
        between them so that the number of recomputed steps is the least any
        schedule with that memory needs: with ``t`` the least integer with
        ``C(snapshots + t, t) ≥ num_steps``, it is ``t·num_steps −
        C(snapshots + t, t − 1)`` (:meth:`recomputed_steps`), so the time grows like
        the logarithm of ``num_steps`` at fixed memory. Written as a ``jax.custom_vjp``
        (``remat`` is ignored): reverse mode only, with or without effects. The forward pass
        writes each step's input to the snapshot buffer (one state copy per step).
      offload: keep the chunks' start states in the host's memory (pinned) instead of the
        device's (only with ``every``): the device then holds one chunk's residuals and no
        stored states, so a small ``every`` keeps device memory low at the square-root
        schedule's time (one recomputed forward run), while the host holds
        ``num_steps / every`` states. Each chunk copies its start state to the host and back
        once. Reverse mode only (the ``"custom_vjp"`` form, whatever ``remat`` says).

    Raises ``ValueError`` naming the field for a bad ``every``, ``remat``, ``snapshots`` or
    ``offload``.
    """

    every: int | str | None = None
    remat: str = "auto"
    snapshots: int | None = None
    offload: bool = False

    def __post_init__(self):
        every = self.every
        if isinstance(every, (int, np.integer)) and not isinstance(every, bool) and every >= 1:
            object.__setattr__(self, "every", int(every))
        elif not (every is None or (isinstance(every, str) and every == "sqrt")):
            raise ValueError(f"Checkpointing.every must be None, 'sqrt' or an int >= 1, got {every!r}")
        if not isinstance(self.remat, str) or self.remat not in REMATS:
            raise ValueError(f"Checkpointing.remat must be one of {REMATS}, got {self.remat!r}")
        s = self.snapshots
        if s is not None:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
                raise ValueError(f"Checkpointing.snapshots must be None or an int >= 1, got {s!r}")
            if every is not None:
                raise ValueError(f"Checkpointing takes every or snapshots, not both (every={every!r}, snapshots={s!r})")
            object.__setattr__(self, "snapshots", int(s))
        if not isinstance(self.offload, (bool, np.bool_)):
            raise ValueError(f"Checkpointing.offload must be True or False, got {self.offload!r}")
        object.__setattr__(self, "offload", bool(self.offload))
        if self.offload and every is None:
            raise ValueError("Checkpointing.offload=True needs every (an int or 'sqrt'): it moves the chunks' "
                             f"start states to the host (every={every!r}, snapshots={s!r})")

    def recomputed_steps(self, num_steps: int) -> int:
        """Steps the reverse pass recomputes (beyond the forward run's ``num_steps`` and the
        recomputation inside each step's own pull-back) for a run of ``num_steps`` steps."""
        num_steps = _check_steps(num_steps)
        if self.snapshots is not None:
            return _revolve_cost(num_steps, self.snapshots)
        c = self.chunk(num_steps)
        return 0 if c is None else (num_steps // c) * c  # the chunks re-run; the rest is plain

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

    y, obs = checkpointed_scan(one, y0, num_steps, checkpointing)
    return (y, obs) if observe is not None else y


def checkpointed_scan(one: Callable, y0, num_steps: int, checkpointing: Checkpointing = Checkpointing(),
                      adjoint_guess=None):
    """``lax.scan(one, y0, jnp.arange(num_steps))`` under the reverse-mode memory schedule
    ``checkpointing`` (:class:`Checkpointing`): ``one(y, m) -> (y, obs)`` is step ``m``.
    Returns ``(y, obs)`` with ``obs`` stacked over the steps. Values do not depend on the
    schedule; a step with ordered effects (MPI messages) is recomputed through a custom VJP.

    ``adjoint_guess``: None, or a pytree of zeros for a step ``one(y, m, g)`` whose linear
    solves take ``g``'s leaves as their ``adjoint_guess``
    (:func:`jaxsem.solvers.pcg.linear_solve`). The binomial schedule's reverse pass then starts
    each step's adjoint solves from the adjoint solutions of the steps after it (the cotangent
    of ``g``), extrapolated in time from the last three (quadratically; its forward pass calls
    ``one(y, m, zeros)``); the other schedules call ``one(y, m, None)``, whose adjoint solves
    start from zero."""
    if not isinstance(checkpointing, Checkpointing):
        raise TypeError(f"checkpointing must be a Checkpointing, got {checkpointing!r}")
    num_steps = _check_steps(num_steps)
    steps = jnp.arange(num_steps)
    if adjoint_guess is not None:
        if checkpointing.snapshots is not None and num_steps >= 2:
            conv, consts = jax.closure_convert(one, y0, steps[0], adjoint_guess)
            return _revolve(conv, _RevolveTable(num_steps, checkpointing.snapshots), y0, adjoint_guess, *consts)
        with_guess = one
        one = lambda y, m: with_guess(y, m, None)  # noqa: E731
    if checkpointing.snapshots is not None and num_steps >= 2:
        conv, consts = jax.closure_convert(one, y0, steps[0])
        return _revolve(lambda y, m, g, *cs: conv(y, m, *cs), _RevolveTable(num_steps, checkpointing.snapshots),
                        y0, None, *consts)
    c = checkpointing.chunk(num_steps)
    if c is None:
        return jax.lax.scan(one, y0, steps)
    remat = checkpointing.remat
    effects = jax.make_jaxpr(one)(y0, steps[0]).effects
    nchunk, rest = divmod(num_steps, c)
    ms = steps[: nchunk * c].reshape(nchunk, c)
    chunk = lambda y, ms: jax.lax.scan(one, y, ms)  # noqa: E731
    if not checkpointing.offload and (remat == "checkpoint" or (remat == "auto" and not effects)):
        y, obs = jax.lax.scan(jax.checkpoint(chunk), y0, ms)
    else:
        # The chunk as a function of its closed-over parameters too (ε, dt, …), traced once.
        conv, consts = jax.closure_convert(chunk, y0, ms[0])
        y, obs = _segmented(conv, checkpointing.offload, y0, ms, *consts)
    obs = jax.tree_util.tree_map(lambda o: o.reshape((nchunk * c,) + o.shape[2:]), obs)
    if rest:
        y, obs2 = jax.lax.scan(one, y, steps[nchunk * c:])
        obs = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), obs, obs2)
    return y, obs


def _to_memory(tree, space):
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, space), tree)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _segmented(chunk, offload, y0, ms, *consts):
    """``lax.scan`` of ``chunk(y, ms[k], *consts) -> (y, obs)`` over the chunks ``ms: (K, c)``;
    reverse mode keeps the chunks' start states, in the host's memory if ``offload``."""
    return jax.lax.scan(lambda y, m: chunk(y, m, *consts), y0, ms)


def _segmented_fwd(chunk, offload, y0, ms, *consts):
    def body(y, m):
        y1, obs = chunk(y, m, *consts)
        # keep the chunk's start state, nothing of its inside
        return y1, (_to_memory(y, jax.memory.Space.Host) if offload else y, obs)

    y, (starts, obs) = jax.lax.scan(body, y0, ms)
    return (y, obs), (starts, ms, consts)


def _segmented_bwd(chunk, offload, res, ct):
    starts, ms, consts = res
    ybar, obsbar = ct

    def body(carry, xs):
        ybar, cbar = carry
        y, m, ob = xs
        if offload:
            y = _to_memory(y, jax.memory.Space.Device)
        # recompute this chunk (its residuals live only during this iteration) and pull back
        _, pull = jax.vjp(lambda y, cs: chunk(y, m, *cs), y, consts)
        ybar, cs_bar = pull((ybar, ob))
        return (ybar, jax.tree_util.tree_map(jnp.add, cbar, cs_bar)), None

    zero = jax.tree_util.tree_map(jnp.zeros_like, consts)
    (y0bar, cbar), _ = jax.lax.scan(body, (ybar, zero), (starts, ms, obsbar), reverse=True)
    return (y0bar, None, *cbar)


_segmented.defvjp(_segmented_fwd, _segmented_bwd)


# ----------------------------------------------------------------------------- binomial schedule


def _beta(s: int, t: int) -> int:
    """``C(s + t, t)``: the most steps ``s`` snapshots reverse with ``t`` recomputations a step."""
    return math.comb(s + t, t) if t >= 0 else 0


def _repetitions(n: int, s: int) -> int:
    """The least ``t`` with ``β(s, t) ≥ n``."""
    t = 0
    while _beta(s, t) < n:
        t += 1
    return t


def _revolve_cost(n: int, s: int) -> int:
    """Steps the binomial schedule recomputes to reverse ``n`` steps with ``s`` snapshots."""
    if n < 2:
        return 0
    t = _repetitions(n, s)
    return t * n - _beta(s + 1, t - 1) - (n - 1)  # Griewank's count less the forward run's n − 1


def _revolve_actions(n: int, s: int) -> list:
    """The binomial (revolve) schedule reversing steps ``0 .. n − 1`` with ``s`` snapshot slots
    (slot 0 holds the initial state): rows ``(restore, [(start, count, slot), ...], m)``, one
    per reversed step ``m`` (in the order ``n − 1 .. 0``): restore the state of slot ``restore``,
    then for each pair advance ``count`` steps from step ``start`` and store the state reached in
    ``slot`` (``None``: keep none), then pull back through step ``m``."""
    rows = []

    def rev(i0, n, slot, free, origin, row):
        # the state of step i0 is in `slot`; the current row restores `origin` and runs `row`
        if not row:
            origin = slot
        if n == 1:
            rows.append((origin, row, i0))
        elif not free:
            rows.append((origin, row + [(i0, n - 1, None)], i0 + n - 1))
            for j in range(n - 2, -1, -1):
                rows.append((slot, [(i0, j, None)] if j else [], i0 + j))
        else:
            t = _repetitions(n, len(free) + 1)
            # the first snapshot's place: any m in this range gives the least count (checked
            # against the dynamic programme over all splits in the tests)
            m = min(max(1, _beta(len(free) + 1, t - 2), n - _beta(len(free), t)), n - 1)
            rev(i0 + m, n - m, free[0], free[1:], origin, row + [(i0, m, free[0])])
            rev(i0, m, slot, free, slot, [])

    rev(0, n, 0, list(range(1, s)), 0, [])
    return rows


class _RevolveTable:
    """The binomial schedule as static arrays (hashable by ``(n, s)``).

    The forward pass runs the first row (all steps, storing its snapshots) and keeps the last
    step's input in slot ``s``; every other row becomes ``restore``, ``P`` padded pairs
    ``(start, count, slot)`` (padding: count 0 into the scratch slot ``s + 1``) and ``m``.
    """

    def __init__(self, n: int, s: int):
        self.n, self.s = n, s
        rows = _revolve_actions(n, s)
        first = rows[0]
        assert first[0] == 0 and first[2] == n - 1
        self.write = np.full(n, s + 1, np.int32)  # the slot step m's input goes to in the forward pass
        for start, count, slot in first[1]:
            if slot is not None:
                self.write[start + count] = slot
        self.write[0], self.write[n - 1] = 0, s
        rest = rows[1:]
        width = max([len(r[1]) for r in rest] + [1])
        self.restore = np.array([r[0] for r in rest], np.int32)
        self.pairs = np.zeros((len(rest), width, 3), np.int32)
        self.pairs[:, :, 2] = s + 1
        for k, (_, pairs, _) in enumerate(rest):
            for j, (start, count, slot) in enumerate(pairs):
                self.pairs[k, j] = (start, count, s + 1 if slot is None else slot)
        self.m = np.array([r[2] for r in rest], np.int32)
        self.npairs = np.array([len(r[1]) for r in rest], np.int32)

    def __hash__(self):
        return hash((self.n, self.s))

    def __eq__(self, other):
        return isinstance(other, _RevolveTable) and (self.n, self.s) == (other.n, other.s)


def _put(buf, slot, y):
    return jax.tree_util.tree_map(lambda b, a: jax.lax.dynamic_update_index_in_dim(b, a, slot, 0), buf, y)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _revolve(one, table, y0, g0, *consts):
    """``lax.scan`` of ``one(y, m, g0, *consts) -> (y, obs)`` over ``m = 0 .. n − 1``; ``g0``:
    the zero adjoint guesses (a pytree, or None)."""
    return jax.lax.scan(lambda y, m: one(y, m, g0, *consts), y0, jnp.arange(table.n))


def _revolve_fwd(one, table, y0, g0, *consts):
    buf = jax.tree_util.tree_map(lambda a: jnp.zeros((table.s + 2,) + a.shape, a.dtype), y0)

    def body(carry, xs):
        y, buf = carry
        m, slot = xs
        buf = _put(buf, slot, y)  # the step's input, into its snapshot slot or the scratch slot
        y, obs = one(y, m, g0, *consts)
        return (y, buf), obs

    (y, buf), obs = jax.lax.scan(body, (y0, buf), (jnp.arange(table.n), jnp.asarray(table.write)))
    return (y, obs), (buf, g0, consts)


def _revolve_bwd(one, table, res, ct):
    buf, g0, consts = res
    ybar, obsbar = ct
    s = table.s
    tmap = jax.tree_util.tree_map

    def pull(y, m, ybar, cbar, gs):
        # gs = (pulled, g1, g2, g3): the adjoint solutions of the last three steps pulled back
        # start this step's adjoint solves, extrapolated in time as the forward pass extrapolates
        # the pressure (quadratically; of lower order after fewer steps, zero before any)
        pulled, g1, g2, g3 = gs

        def extrapolate(a, b, c):
            return jnp.where(pulled >= 3, 3 * a - 3 * b + c,
                             jnp.where(pulled == 2, 2 * a - b, jnp.where(pulled == 1, a, jnp.zeros_like(a))))

        g = tmap(extrapolate, g1, g2, g3)
        _, vjp = jax.vjp(lambda y, cs, g: one(y, m, g, *cs), y, consts, g)
        ob = tmap(lambda o: np.zeros(o.shape[1:], o.dtype) if o.dtype == jax.dtypes.float0 else o[m], obsbar)
        ybar, cs_bar, g_bar = vjp((ybar, ob))  # (integer observations have float0 cotangents)
        return ybar, tmap(jnp.add, cbar, cs_bar), (pulled + 1, g_bar, g1, g2)

    def advance(y, start, count):
        return jax.lax.fori_loop(0, count, lambda j, y: one(y, start + j, g0, *consts)[0], y)

    def row(carry, xs):
        ybar, cbar, buf, gs = carry
        restore, pairs, npairs, m = xs
        y = tmap(lambda b: b[restore], buf)

        def pair(j, yb):
            y, buf = yb
            start, count, slot = pairs[j, 0], pairs[j, 1], pairs[j, 2]
            y = advance(y, start, count)
            return y, _put(buf, slot, y)

        y, buf = jax.lax.fori_loop(0, npairs, pair, (y, buf))
        ybar, cbar, gs = pull(y, m, ybar, cbar, gs)
        return (ybar, cbar, buf, gs), None

    zero = tmap(jnp.zeros_like, consts)
    last = tmap(lambda b: b[s], buf)
    ybar, cbar, gs = pull(last, table.n - 1, ybar, zero, (jnp.zeros((), jnp.int32), g0, g0, g0))
    (ybar, cbar, _, _), _ = jax.lax.scan(row, (ybar, cbar, buf, gs),
                                         (jnp.asarray(table.restore), jnp.asarray(table.pairs),
                                          jnp.asarray(table.npairs), jnp.asarray(table.m)))
    return (ybar, tmap(jnp.zeros_like, g0), *cbar)


_revolve.defvjp(_revolve_fwd, _revolve_bwd)


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
