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

__all__ = ["PCGInfo", "pcg", "linear_solve"]


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

    Returns ``(x, PCGInfo)``.
    """
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
        raise ValueError(f"maxiter must be an integer >= 1, got {maxiter!r}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    M = precond if precond is not None else (lambda r: r)
    if dots is None:
        dots = lambda pairs: jnp.stack([dot(u, v) for u, v in pairs])
    x = jnp.zeros_like(b) if x0 is None else x0
    r = b - A(x) if x0 is not None else b
    z = M(r)
    rz = dot(r, z)
    bnorm = jnp.sqrt(dot(b, b))
    rnorm = jnp.sqrt(dot(r, r))
    target = tol * bnorm
    hist = jnp.full((maxiter + 1,), jnp.nan, dtype=rnorm.dtype).at[0].set(rnorm)

    def cond(state):
        _, _, _, _, it, rn, _ = state
        return (it < maxiter) & (rn > target)

    def body(state):
        x, r, p, rz, it, _, hist = state
        w = A(p)
        alpha = _safe_div(rz, dot(p, w))
        x = x + alpha * p
        r = r - alpha * w
        z = M(r)
        rz_new, rr = dots([(r, z), (r, r)])
        beta = _safe_div(rz_new, rz)
        p = z + beta * p
        rn = jnp.sqrt(rr)
        hist = hist.at[it + 1].set(rn)
        return x, r, p, rz_new, it + 1, rn, hist

    state = (x, r, z, rz, jnp.asarray(0, jnp.int32), rnorm, hist)
    x, r, _, _, it, rn, hist = lax.while_loop(cond, body, state)
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
):
    """Differentiable SEM solve: ``x = S b`` with implicit-function gradients.

    E-vectors are a redundant representation: ``project`` (``u -> mask·gs(w·u)``)
    maps any E-vector to the continuous, masked subspace where ``A`` is
    symmetric in ``dot``. The solve is ``S b = pcg(A, project(b))``; its
    Euclidean transpose is ``Sᵀ c = weight · pcg(A, mask·gs(c))``, which
    :func:`jax.lax.custom_linear_solve` uses for the adjoint solve. The adjoint
    solve's :class:`PCGInfo` is produced like the forward one.

    Args: ``project`` as above; ``weight`` the inverse multiplicity E-vector
    (times the mask); others as :func:`pcg`. Returns ``(x, PCGInfo)``.
    """
    run = lambda rhs: pcg(A, rhs, dot=dot, precond=precond, tol=tol, maxiter=maxiter, dots=dots)

    def solve(_, rhs):
        return run(project(rhs))

    def transpose_solve(_, ct):
        y, info = run(project(ct / jnp.where(weight != 0, weight, 1)))
        return weight * y, info

    return lax.custom_linear_solve(A, b, solve, transpose_solve, has_aux=True)
