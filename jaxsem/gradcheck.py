"""Gradient verification: central differences along random directions, the dot-product test, horizon growth.

The protocol every differentiable model of jaxsem passes (``tests/test_gradient_protocol.py``),
with the thresholds of the Mosaic benchmark of differentiable solvers for (a):

(a) :func:`check_gradient`: the directional derivatives ⟨∇L, vᵢ⟩ of a scalar loss (reverse
    mode) against central differences (L(x + h vᵢ) − L(x − h vᵢ)) / 2h along random
    standard-normal directions vᵢ: the median relative error ≤ :data:`MEDIAN_RTOL` and the
    cosine between the two vectors of values ≥ :data:`MIN_COSINE`
    (:meth:`GradientCheck.passed`). The median sees a gradient that is wrong by a factor;
    the cosine sees one that points elsewhere.
(b) :func:`dot_product`: ⟨J v, w⟩ (forward mode, ``jax.jvp``) against ⟨v, Jᵀ w⟩ (reverse
    mode, ``jax.vjp``) for random v, w, to :data:`DOT_RTOL` relative. The entries are
    independent per node, so on element-local fields v and w are discontinuous across
    shared nodes: an adjoint that is right only on continuous fields (multiplicity weights,
    masks, a projection on one side) fails it.
(c) :func:`horizon_growth`: |∇L| for runs of increasing length, reported rather than judged
    (chaotic flows amplify it exponentially; the differences of (a) then need a smaller h).

The point ``x`` may be any pytree of real floating arrays and Python floats (a dict or
tuple of parameters); directions are pytrees shaped like it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MEDIAN_RTOL", "MIN_COSINE", "DOT_RTOL", "GradientCheck", "check_gradient", "directional_errors",
           "random_directions", "dot_product", "HorizonGrowth", "horizon_growth"]

MEDIAN_RTOL = 1e-3
"""(a): the largest median relative error |AD − FD| / |FD| over the directions."""

MIN_COSINE = 0.99
"""(a): the smallest cosine between the AD and FD directional derivatives."""

DOT_RTOL = 1e-10
"""(b): the largest relative mismatch |⟨J v, w⟩ − ⟨v, Jᵀ w⟩| / |⟨J v, w⟩|."""


class GradientCheck(NamedTuple):
    """Outcome of :func:`check_gradient` along D directions.

    Attributes:
      value: L(x).
      grad: ∇L(x), a pytree shaped like x.
      ad: ``(D,)`` ⟨∇L, vᵢ⟩.
      fd: ``(D,)`` central differences (L(x + h vᵢ) − L(x − h vᵢ)) / 2h.
      errors: ``(D,)`` |ad − fd| / |fd| (0 where both vanish, inf where only fd does).
      median_error: the median of ``errors``.
      cosine: ad·fd / (|ad| |fd|) (1 if both vanish, 0 if one does).
      h: the difference step.
    """

    value: float
    grad: Any
    ad: np.ndarray
    fd: np.ndarray
    errors: np.ndarray
    median_error: float
    cosine: float
    h: float

    def passed(self, median_rtol: float = MEDIAN_RTOL, min_cosine: float = MIN_COSINE) -> bool:
        """Whether the median error is ≤ ``median_rtol`` and the cosine ≥ ``min_cosine``."""
        return bool(self.median_error <= median_rtol and self.cosine >= min_cosine)


class HorizonGrowth(NamedTuple):
    """Outcome of :func:`horizon_growth` over K horizons.

    Attributes:
      steps: the K step counts.
      values: ``(K,)`` the loss at each horizon.
      norms: ``(K,)`` |∇L|, the Euclidean norm over all leaves of the gradient.
      leaf_norms: ``(K, P)`` the norm of each of the P leaves of the gradient (order of
        ``jax.tree.leaves(x)``).
    """

    steps: tuple
    values: np.ndarray
    norms: np.ndarray
    leaf_norms: np.ndarray


def _check_point(x):
    leaves = jax.tree.leaves(x)
    if not leaves:
        raise ValueError(f"x must be a pytree with at least one leaf, got {x!r}")
    for leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"x's leaves must be real floating arrays or floats, got a leaf of dtype {dtype}")


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_h(h):
    if isinstance(h, bool) or not isinstance(h, (int, float, np.floating)) or not (math.isfinite(h) and h > 0):
        raise ValueError(f"h must be a finite number > 0, got {h!r}")
    return float(h)


def _check_like(name, trees, x):
    structure = jax.tree.structure(x)
    shapes = [np.shape(a) for a in jax.tree.leaves(x)]
    for i, v in enumerate(trees):
        if jax.tree.structure(v) != structure or [np.shape(a) for a in jax.tree.leaves(v)] != shapes:
            raise ValueError(f"{name}[{i}] must be a pytree shaped like x ({structure}, leaf shapes {shapes}), "
                             f"got {jax.tree.structure(v)}, leaf shapes {[np.shape(a) for a in jax.tree.leaves(v)]}")


def _random_like(rng, tree):
    return jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(np.shape(a)), jnp.result_type(a)), tree)


def _vdot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _relative(a: float, b: float) -> float:
    """|a − b| / |b|: 0 where both vanish, inf where only b does."""
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return abs(a - b) / abs(b)


def random_directions(x, count: int, seed: int = 1) -> list:
    """``count`` pytrees shaped like ``x`` with independent standard-normal entries (NumPy's
    generator with ``seed``; the dtype of each leaf of ``x``)."""
    _check_point(x)
    count = _check_count("count", count)
    rng = np.random.default_rng(seed)
    return [_random_like(rng, x) for _ in range(count)]


def check_gradient(loss: Callable, x, directions: int | Sequence = 10, h: float = 1e-5,
                   seed: int = 1) -> GradientCheck:
    """(a) of the protocol: ⟨∇L, vᵢ⟩ by reverse mode against central differences of ``loss``.

    Args:
      loss: ``L(x) -> ()`` a real scalar, differentiable by ``jax.value_and_grad``; it is
        compiled once (``jax.jit``) and evaluated 2D + 1 times.
      x: the point, a pytree of real floating arrays and floats.
      directions: an int D ≥ 1 (that many :func:`random_directions` from ``seed``) or a
        sequence of D pytrees shaped like ``x``.
      h: the step along each direction (absolute, in the units of ``x``; a standard-normal
        direction moves each entry by about h). The difference error is O(h²) truncation
        plus O(ε L / h) round-off and, through iterative solves, O(tol · L / h).
      seed: of the random directions.
    Returns a :class:`GradientCheck`; ``.passed()`` applies the protocol's thresholds.
    Raises ``ValueError`` naming the argument, before any evaluation, for a bad ``x``,
    ``directions`` or ``h``.
    """
    _check_point(x)
    h = _check_h(h)
    if isinstance(directions, (int, np.integer)) and not isinstance(directions, bool):
        dirs = random_directions(x, _check_count("directions", directions), seed)
    elif isinstance(directions, Sequence) and not isinstance(directions, str) and len(directions) > 0:
        dirs = list(directions)
        _check_like("directions", dirs, x)
    else:
        raise ValueError(f"directions must be an integer >= 1 or a non-empty sequence of pytrees like x, "
                         f"got {directions!r}")
    vg = jax.jit(jax.value_and_grad(loss))  # one compiled program for the gradient and the values
    value, g = vg(x)
    ad, fd = [], []
    for v in dirs:
        step = lambda s: jax.tree.map(lambda a, d: a + s * h * d, x, v)
        fd.append((float(vg(step(1.0))[0]) - float(vg(step(-1.0))[0])) / (2 * h))
        ad.append(float(_vdot(g, v)))
    ad, fd = np.array(ad), np.array(fd)
    errors = np.array([_relative(a, b) for a, b in zip(ad, fd)])
    na, nf = float(np.linalg.norm(ad)), float(np.linalg.norm(fd))
    cosine = 1.0 if na == nf == 0 else (0.0 if na == 0 or nf == 0 else float(ad @ fd) / (na * nf))
    return GradientCheck(float(value), g, ad, fd, errors, float(np.median(errors)), cosine, h)


def directional_errors(loss: Callable, x, dirs: Sequence, h: float) -> tuple:
    """The relative errors of :func:`check_gradient` along the given directions and the
    gradient: ``(list of D floats, ∇L)``."""
    r = check_gradient(loss, x, dirs, h=h)
    return [float(e) for e in r.errors], r.grad


def dot_product(f: Callable, x, *, trials: int = 2, seed: int = 0, reverse: Callable | None = None) -> np.ndarray:
    """(b) of the protocol: |⟨J v, w⟩ − ⟨v, Jᵀ w⟩| / |⟨J v, w⟩| for ``trials`` random pairs.

    Args:
      f: ``x -> y``, any pytrees of real floating arrays; J its Jacobian at ``x``. J v by
        ``jax.jvp`` of ``f``.
      x: the point, a pytree of real floating arrays and floats.
      trials: the number of pairs (v, w), standard-normal entries shaped like x and y.
      seed: of the pairs.
      reverse: the same map, differentiated in reverse mode instead of ``f`` (Jᵀ w by
        ``jax.vjp`` of ``reverse``): for a map whose reverse pass has no forward mode (a
        ``jax.custom_vjp``, such as ``Checkpointing(snapshots=s)``), the forward mode of
        another schedule checks its transpose. Default: ``f``.
    Returns ``(trials,)`` the relative mismatches (to compare with :data:`DOT_RTOL`).
    Raises ``ValueError`` naming the argument, before any evaluation, for a bad ``x`` or
    ``trials``.
    """
    _check_point(x)
    trials = _check_count("trials", trials)
    reverse = f if reverse is None else reverse
    rng = np.random.default_rng(seed)
    jvp = jax.jit(lambda x, v: jax.jvp(f, (x,), (v,))[1])
    vjp = jax.jit(lambda x, w: jax.vjp(reverse, x)[1](w)[0])
    out = []
    for _ in range(trials):
        v = _random_like(rng, x)
        jv = jvp(x, v)
        w = _random_like(rng, jv)
        a, b = float(_vdot(jv, w)), float(_vdot(v, vjp(x, w)))
        out.append(_relative(b, a))
    return np.array(out)


def horizon_growth(loss_of_steps: Callable, x, steps: Sequence[int]) -> HorizonGrowth:
    """(c) of the protocol: L and |∇L| at ``x`` for each horizon in ``steps``.

    Args:
      loss_of_steps: ``(x, num_steps) -> ()`` the loss after ``num_steps`` steps (a static
        int: each horizon is compiled once).
      x: the point, a pytree of real floating arrays and floats.
      steps: K ≥ 1 step counts, integers ≥ 0 (increasing, for a growth curve).
    Returns a :class:`HorizonGrowth`. Nothing is judged: the growth of |∇L| with the horizon
    is a property of the flow (exponential in time for a chaotic one).
    Raises ``ValueError`` naming the argument, before any evaluation, for a bad ``x`` or
    ``steps``.
    """
    _check_point(x)
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps or any(
            isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in steps):
        raise ValueError(f"steps must be a non-empty sequence of integers >= 0, got {steps!r}")
    values, norms, leaf_norms = [], [], []
    for s in steps:
        value, g = jax.jit(jax.value_and_grad(lambda x, s=int(s): loss_of_steps(x, s)))(x)
        per_leaf = [float(jnp.linalg.norm(jnp.ravel(a))) for a in jax.tree.leaves(g)]
        values.append(float(value))
        leaf_norms.append(per_leaf)
        norms.append(math.hypot(*per_leaf))
    return HorizonGrowth(tuple(int(s) for s in steps), np.array(values), np.array(norms), np.array(leaf_norms))
