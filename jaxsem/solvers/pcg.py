"""Jacobi-preconditioned conjugate gradients as one ``lax.while_loop``.

Vectors are E-vectors (any pytree-free array shape); the inner product is
supplied by the caller (multiplicity-weighted for SEM, so shared nodes count
once, plus an all-reduce across ranks when distributed). Stopping is on the
relative preconditioner-free residual ‖r‖/‖b‖ ≤ tol, or after ``maxiter``
iterations; with ``tol=0`` exactly ``maxiter`` iterations run (the bake-off's
fixed-100-iteration mode). Non-convergence is reported in :class:`PCGInfo`,
never hidden.

:func:`linear_solve` wraps PCG in ``lax.custom_linear_solve`` so that
``jax.grad`` differentiates by one adjoint solve (implicit differentiation),
not through the iterations.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["PCGInfo", "pcg", "linear_solve", "weighted_dots"]


class PCGInfo(NamedTuple):
    """What a PCG run did.

    ``iterations``: iterations performed; ``residual``: final ‖r‖ (weighted
    norm); ``residual0``: ‖b‖; ``converged``: ‖r‖ ≤ tol·‖b‖ (always False in
    fixed-iteration mode unless it happened); ``history: (maxiter + 1,)``
    residual norms, NaN after the last iteration.
    """

    iterations: jax.Array
    residual: jax.Array
    residual0: jax.Array
    converged: jax.Array
    history: jax.Array


def weighted_dots(weight, allreduce: Callable | None = None) -> Callable:
    """A ``dots`` for :func:`pcg`: ``[(u, v), …] ↦ (Σ u·v·weight, …)`` as *one* variadic reduction.

    ``jnp.stack([jnp.sum(u * v * w) for …])`` is one reduction per pair, and XLA
    (CPU always, GPU when its multi-output fusion declines) then reads the shared
    operands once per pair and materializes z = M r between them; a single
    ``lax.reduce`` over the tuple of products reads every operand once and fuses
    the producers (r ← r − αw, z = M r) into the same pass. ``allreduce``: applied
    to the ``(len(pairs),)`` local sums (e.g. ``lambda s: allreduce_sum(s, comm)``).
    Same sums as the per-pair form up to summation order.
    """
    def dots(pairs):
        prods = tuple(u * v * weight for u, v in pairs)
        zeros = tuple(jnp.zeros((), x.dtype) for x in prods)
        sums = lax.reduce(prods, zeros, lambda a, b: tuple(x + y for x, y in zip(a, b)),
                          tuple(range(prods[0].ndim)))
        local = jnp.stack(sums)
        return local if allreduce is None else allreduce(local)

    return dots


def _safe_div(a, b):
    return jnp.where(b != 0, a / jnp.where(b != 0, b, 1), jnp.zeros_like(a))


def pcg(
    A: Callable,
    b,
    *,
    dot: Callable,
    precond: Callable | None = None,
    x0=None,
    tol: float = 1e-10,
    maxiter: int = 1000,
    dots: Callable | None = None,
    method: str = "classic",
):
    """Solve ``A x = b`` with preconditioned CG.

    Args:
      A: symmetric positive (semi-)definite linear map in the ``dot`` inner product.
      b: right-hand side, any array shape.
      dot: inner product ``(u, v) -> scalar``.
      precond: ``r -> z ≈ A⁻¹ r`` (Jacobi: multiply by the inverse diagonal);
        identity if None.
      x0: initial guess (zeros if None).
      tol: relative residual tolerance; 0 runs exactly ``maxiter`` iterations.
      maxiter: iteration cap (a static int ≥ 1).
      dots: optional ``[(u1, v1), (u2, v2), …] -> array`` of several inner
        products computed together (distributed: one all-reduce for (r, z)
        and (r, r) instead of two); built from ``dot`` if None.
      method: ``"classic"`` (Hestenes–Stiefel: two global reductions per
        iteration) or ``"single-reduction"`` (Chronopoulos & Gear 1989: the
        same iterates in exact arithmetic, one reduction of three inner
        products per iteration; latency-bound multi-GPU runs want it).

    Returns ``(x, PCGInfo)``.
    """
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
        raise ValueError(f"maxiter must be an integer >= 1, got {maxiter!r}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    if method not in ("classic", "single-reduction"):
        raise ValueError(f"method must be 'classic' or 'single-reduction', got {method!r}")
    M = precond if precond is not None else (lambda r: r)
    if dots is None:
        dots = lambda pairs: jnp.stack([dot(u, v) for u, v in pairs])
    if method == "single-reduction":
        return _pcg_single_reduction(A, b, M, dot, dots, x0, tol, maxiter)
    x = jnp.zeros_like(b) if x0 is None else x0
    r = b - A(x) if x0 is not None else b
    z = M(r)
    rz = dot(r, z)
    bnorm = jnp.sqrt(dot(b, b))
    rr0 = dot(r, r)
    target = tol * bnorm
    # the loop carries ‖r‖² (the history too; square roots after the loop): one scalar kernel
    # fewer per iteration in the fixed cost t₀ (a sqrt kernel between the reduction and its users)
    hist = jnp.full((maxiter + 1,), jnp.nan, dtype=rr0.dtype).at[0].set(rr0)
    target2 = target * target

    def cond(state):
        _, _, _, _, it, rr, _ = state
        return (it < maxiter) & (rr > target2)

    # Passes over the vectors per iteration (XLA fuses by dataflow; the grouping
    # below is the minimum, experiments/NOTES_speed.md counts the bytes):
    #   1. w = A p, then (p, w) — the operator's own passes, the dot fused into its output;
    #   2. r ← r − αw with (r, M r) and (r, r) — one reduction (``dots``), z never stored;
    #   3. x ← x + αp and p ← M r + βp — both read p once, after the reduction.
    def body(state):
        x, r, p, rz, it, _, hist = state
        w = A(p)
        alpha = _safe_div(rz, dot(p, w))
        r = r - alpha * w
        rz_new, rr = dots([(r, M(r)), (r, r)])
        beta = _safe_div(rz_new, rz)
        x = x + alpha * p
        p = M(r) + beta * p  # z = M r recomputed here rather than kept between passes
        hist = hist.at[it + 1].set(rr)
        return x, r, p, rz_new, it + 1, rr, hist

    state = (x, r, z, rz, jnp.asarray(0, jnp.int32), rr0, hist)
    x, r, _, _, it, rr, hist = lax.while_loop(cond, body, state)
    rn = jnp.sqrt(rr)
    return x, PCGInfo(it, rn, bnorm, rn <= target, jnp.sqrt(hist))


def _pcg_single_reduction(A, b, M, dot, dots, x0, tol, maxiter):
    """Chronopoulos–Gear PCG: one fused reduction (γ = (r,u), δ = (w,u), ‖r‖²) per iteration.

    With u = M r and w = A u: β_i = γ_i/γ_{i−1}, α_i = γ_i/(δ_i − β_i γ_i/α_{i−1}),
    p ← u + β p, s ← w + β s (s = A p by recurrence), x ← x + α p, r ← r − α s.
    The residual norm of x_i is known at the start of step i, so the stopping
    test runs there (one extra operator apply on the last step).
    """
    x = jnp.zeros_like(b) if x0 is None else x0
    r = b - A(x) if x0 is not None else b
    bnorm = jnp.sqrt(dot(b, b))
    target = tol * bnorm
    dt = bnorm.dtype
    hist = jnp.full((maxiter + 1,), jnp.nan, dtype=dt)
    zero = jnp.zeros((), dt)

    def cond(state):
        return (state[6] < maxiter) & ~state[8]

    def body(state):
        x, r, p, s, gamma_old, alpha_old, it, hist, _, _ = state
        u = M(r)
        w = A(u)
        gamma, delta, rr = dots([(r, u), (w, u), (r, r)])
        rn = jnp.sqrt(rr)
        hist = hist.at[it].set(rn)
        done = rn <= target
        first = it == 0
        beta = jnp.where(first, zero, _safe_div(gamma, gamma_old))
        denom = delta - jnp.where(first, zero, beta * _safe_div(gamma, alpha_old))
        alpha = _safe_div(gamma, denom)
        step = jnp.where(done, zero, alpha)
        p = u + beta * p
        s = w + beta * s
        x = x + step * p
        r = r - step * s
        return x, r, p, s, gamma, alpha, it + jnp.where(done, 0, 1).astype(it.dtype), hist, done, rn

    state = (x, r, jnp.zeros_like(b), jnp.zeros_like(b), zero, zero, jnp.asarray(0, jnp.int32), hist,
             jnp.asarray(False), zero)
    x, r, _, _, _, _, it, hist, done, rn = lax.while_loop(cond, body, state)
    # after maxiter updates the last residual's norm is not yet known: one more reduction
    rn = jnp.where(done, rn, jnp.sqrt(dot(r, r)))
    hist = hist.at[it].set(rn)
    return x, PCGInfo(it, rn, bnorm, rn <= target, hist)


def linear_solve(
    A: Callable,
    b,
    *,
    dot: Callable,
    project: Callable,
    weight,
    precond: Callable | None = None,
    tol: float = 1e-10,
    maxiter: int = 1000,
    dots: Callable | None = None,
    method: str = "classic",
    transposable: bool = True,
):
    """Differentiable SEM solve: ``x = S b`` with implicit-function gradients.

    E-vectors are a redundant representation: ``project`` (``u -> mask·gs(w·u)``)
    maps any E-vector to the continuous, masked subspace where ``A`` is
    symmetric in ``dot``. The solve is ``S b = pcg(A, project(b))``; its
    Euclidean transpose is ``Sᵀ c = weight · pcg(A, mask·gs(c))``, which
    :func:`jax.lax.custom_linear_solve` uses for the adjoint solve. JAX's
    transpose rule drops the adjoint solve's :class:`PCGInfo`; to see it (and
    be warned when the adjoint does not converge) use :func:`jaxsem.inverse.solve`.

    Args: ``project`` as above; ``weight`` the inverse multiplicity E-vector
    (times the mask); ``transposable=False`` for an ``A`` that JAX cannot
    transpose (the fused kernels): the transpose solve above never applies
    the operator JAX hands it, so it is handed ``A`` itself (JAX's
    ``symmetric=True``). First derivatives are exact either way; second
    derivatives through such a solve are not supported. Others as
    :func:`pcg`. Returns ``(x, PCGInfo)``.
    """
    run = lambda rhs: pcg(A, rhs, dot=dot, precond=precond, tol=tol, maxiter=maxiter, dots=dots, method=method)

    def solve(_, rhs):
        return run(project(rhs))

    def transpose_solve(_, ct):
        y, info = run(project(ct / jnp.where(weight != 0, weight, 1)))
        return weight * y, info

    return lax.custom_linear_solve(A, b, solve, transpose_solve, symmetric=not transposable, has_aux=True)
