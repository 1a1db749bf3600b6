"""Jacobi-preconditioned conjugate gradients as compiled loops, with an honest exit test.

Vectors are E-vectors (any pytree-free array shape); the inner product is
supplied by the caller (multiplicity-weighted for SEM, so shared nodes count
once, plus an all-reduce across ranks when distributed). The loop stops on the
relative preconditioner-free *recurrence* residual ‖r‖/‖b‖ ≤ tol, or after
``maxiter`` iterations; with ``tol=0`` exactly ``maxiter`` iterations run (the
bake-off's fixed-100-iteration mode).

Convergence is then decided on the *true* residual b − A x, computed once at
exit (one operator application, inside the compiled loop): in floating point the
recurrence drifts from it, most at tight tolerances. When the recurrence meets
``tol`` and the true residual does not, CG restarts from x with the true
residual, for as long as iterations remain and each restart lowers the true
residual (residual replacement); ``converged`` means ‖b − A x‖ ≤ tol·‖b‖ for
the returned x. Non-convergence and non-finite numbers are reported in
:class:`PCGInfo`, never hidden.

:func:`linear_solve` wraps PCG in ``lax.custom_linear_solve`` so that
``jax.grad`` differentiates by one adjoint solve (implicit differentiation),
not through the iterations; an adjoint solve that misses its tolerance warns
(:class:`AdjointNotConvergedWarning`).

A singular operator (the pure-Neumann or periodic Laplacian annihilates the
constants) names its null space: ``b`` and every preconditioned residual are
projected onto its orthogonal complement (P M P), so the iterates stay in the
range. Without it a preconditioner that is not exactly singular on the null
space (a Chebyshev polynomial's p(0) is large) feeds rounding errors along the
null space back into the search directions, and once the residual reaches the
rounding floor CG diverges instead of stagnating.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["PCGInfo", "AdjointNotConvergedWarning", "pcg", "linear_solve", "min_tol"]

# A relative residual below TOL_EPS·eps of the working precision cannot be
# certified: b − A x itself carries rounding errors of at least eps·‖b‖, and the
# weighted norms add O(eps) relative errors of their own.
TOL_EPS = 10

METHODS = ("classic", "single-reduction", "flexible")


class AdjointNotConvergedWarning(RuntimeWarning):
    """The adjoint PCG of a gradient stopped above its tolerance: the gradient is inaccurate."""


def warn_adjoint(converged, iterations, relative_residual):
    """Host side of the adjoint check: warn when any of the solves missed its tolerance."""
    converged = np.asarray(converged)
    if not converged.all():
        rel = np.asarray(relative_residual)
        warnings.warn(
            f"adjoint PCG did not converge: {int((~converged).sum())} of {converged.size} solve(s), "
            f"iterations {np.asarray(iterations).ravel().tolist()}, relative residual "
            f"{np.max(rel):.3e}; the gradient is inaccurate (raise maxiter or loosen tol)",
            AdjointNotConvergedWarning, stacklevel=2,
        )


def check_adjoint(info, tol):
    """Warn (host callback, only when it fails) if the adjoint solve of ``info`` missed ``tol``;
    nothing in fixed-iteration mode (``tol=0``)."""
    if tol == 0:
        return
    bad = ~jnp.all(info.converged)

    def report():
        jax.debug.callback(warn_adjoint, info.converged, info.iterations, info.true_relative_residual)

    lax.cond(bad, report, lambda: None)


class PCGInfo(NamedTuple):
    """What a PCG run did (all arrays; under ``vmap`` one per batch member).

    ``iterations``: CG iterations performed (those after a restart included);
    ``residual``: ‖r‖ of the recurrence at exit (weighted norm; the quantity the
    loop tests); ``residual0``: ‖b‖; ``converged``: the true residual met the
    tolerance, ‖b − A x‖ ≤ tol·‖b‖, and no breakdown (in fixed-iteration mode,
    ``tol=0``, only if the residual is exactly 0); ``history: (maxiter + 1,)``
    recurrence residual norms, NaN after the last iteration;
    ``true_relative_residual``: ‖b − A x‖/‖b‖ of the returned x (0 for b = 0 = A x,
    inf for b = 0 ≠ A x); ``breakdown``: a NaN or Inf met the solve (in ``b``, the
    initial guess, the operator or the iteration): ``x`` is then all NaN, never
    a plausible-looking zero, and ``converged`` is False.
    """

    iterations: jax.Array
    residual: jax.Array
    residual0: jax.Array
    converged: jax.Array
    history: jax.Array
    true_relative_residual: jax.Array
    breakdown: jax.Array


def min_tol(dtype) -> float:
    """The smallest positive ``tol`` PCG accepts in ``dtype``: 10·eps (float64 2.2e-15, float32 1.2e-6).

    The computed residual b − A x carries rounding errors of at least eps·‖b‖, so
    smaller relative residuals cannot be measured, let alone certified.
    """
    dt = jnp.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.inexact):
        dt = jnp.dtype(float)
    return TOL_EPS * float(jnp.finfo(dt).eps)


def _check_options(tol, maxiter, method, b):
    """Refuse bad static options before anything is traced; errors name the argument."""
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 1:
        raise ValueError(f"maxiter must be an integer >= 1, got {maxiter!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if isinstance(tol, jax.core.Tracer):
        raise ValueError("tol must be a concrete number (it decides the loop's exit statically), got a traced value")
    real = isinstance(tol, (int, float, np.integer, np.floating)) or (
        isinstance(tol, (np.ndarray, jax.Array)) and tol.ndim == 0 and jnp.issubdtype(tol.dtype, jnp.number)
        and not jnp.issubdtype(tol.dtype, jnp.complexfloating))
    if isinstance(tol, (bool, np.bool_)) or not real:
        raise ValueError(f"tol must be a number, got {tol!r}")
    t = float(tol)
    dt = jnp.result_type(b)
    lo = min_tol(dt)
    if t != 0 and not (math.isfinite(t) and lo <= t < 1):
        raise ValueError(
            f"tol must be 0 (fixed-iteration mode: exactly maxiter iterations) or in [{lo:.3g}, 1) "
            f"for {jnp.dtype(dt).name} (10·eps: a smaller relative residual cannot be certified), got {tol!r}")


def _check_finite(value, name, what):
    """NaN/Inf in a concrete (untraced) array: a ValueError naming it. Traced values are left
    to the in-loop flag (:attr:`PCGInfo.breakdown`)."""
    if value is None or isinstance(value, jax.core.Tracer):
        return
    a = jnp.asarray(value)
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return
    with jax.ensure_compile_time_eval():  # concrete data met while a solve is being traced
        bad = int(a.size - jnp.count_nonzero(jnp.isfinite(a)))
    if bad:
        raise ValueError(f"{name} ({what}) has {bad} non-finite value(s) (NaN or Inf) of {a.size}")


def _orthogonal_projection(n, dot):
    """``v -> v − (v, n)/(n, n) n``: the projection onto the complement of span(n) in ``dot``."""
    nn = dot(n, n)
    return lambda v: v - (dot(v, n) / nn) * n


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
    keep_z: bool = False,
    nullspace=None,
):
    """Solve ``A x = b`` with preconditioned CG.

    Args:
      A: symmetric positive (semi-)definite linear map in the ``dot`` inner product.
      b: right-hand side, any array shape.
      dot: inner product ``(u, v) -> scalar``.
      precond: ``r -> z ≈ A⁻¹ r`` (Jacobi: multiply by the inverse diagonal);
        identity if None.
      x0: initial guess (zeros if None).
      tol: relative residual tolerance, a concrete number: 0 runs exactly
        ``maxiter`` iterations; otherwise ``min_tol(b.dtype) ≤ tol < 1``
        (10·eps: 2.2e-15 in float64, 1.2e-6 in float32).
      maxiter: iteration cap (a static int ≥ 1).
      dots: optional ``[(u1, v1), (u2, v2), …] -> array`` of several inner
        products computed together (distributed: one all-reduce for (r, z)
        and (r, r) instead of two); built from ``dot`` if None.
      method: ``"classic"`` (Hestenes–Stiefel: two global reductions per
        iteration) or ``"single-reduction"`` (Chronopoulos & Gear 1989: the
        same iterates in exact arithmetic, one reduction of three inner
        products per iteration; latency-bound multi-GPU runs want it) or
        ``"flexible"`` (classic with the Polak–Ribière β = (z₊, r₊ − r)/(z, r) of
        Notay's flexible CG, one more inner product in the same reduction, z kept: for a
        preconditioner that is not exactly a fixed linear operator, such as a float32
        V-cycle inside a float64 solve).
      keep_z: ``"classic"`` keeps z = M r between the reduction and the update
        instead of applying M twice: one vector more to store, for a preconditioner
        that costs more than a pass over a vector (multigrid; Jacobi recomputes).
      nullspace: None (A nonsingular), or a vector n shaped like ``b`` spanning A's null
        space (A n = 0; the constants of a pure-Neumann Laplacian): ``b`` and every
        preconditioned residual are projected orthogonally to n in ``dot``
        (P v = v − (v, n)/(n, n) n; the preconditioner becomes P M P), so the solution
        is the one orthogonal to n plus x0's component along n. Two more reductions an
        iteration.

    Returns ``(x, PCGInfo)``; ``converged`` is decided on the true residual
    b − A x (one operator application at exit, and CG restarts from the true
    residual where the recurrence drifted; see the module docstring).

    Raises ``ValueError`` (before tracing) for a bad ``tol``, ``maxiter`` or
    ``method``, and for NaN/Inf in a concrete ``b`` or ``x0``; traced non-finite
    values set ``info.breakdown`` and return an all-NaN ``x``.
    """
    _check_options(tol, maxiter, method, b)
    _check_finite(b, "b", "right-hand side")
    _check_finite(x0, "x0", "initial guess")
    maxiter, tol = int(maxiter), float(tol)
    M = precond if precond is not None else (lambda r: r)
    if nullspace is not None:
        P = _orthogonal_projection(nullspace, dot)
        M = lambda r, M=M: P(M(P(r)))
        b = P(b)
    if dots is None:
        dots = lambda pairs: jnp.stack([dot(u, v) for u, v in pairs])
    if method == "single-reduction":
        run = _single_reduction(A, M, dot, dots, maxiter)
    else:
        run = _classic(A, M, dot, dots, maxiter, keep_z or method == "flexible", method == "flexible")

    x = jnp.zeros_like(b) if x0 is None else x0
    r = b - A(x) if x0 is not None else b
    bnorm = jnp.sqrt(dot(b, b))
    rr0 = dot(r, r)
    target = tol * bnorm
    target2 = target * target
    # the loops carry ‖r‖² (the history too; square roots after the loop): one scalar kernel
    # fewer per iteration in the fixed cost t₀ (a sqrt kernel between the reduction and its users)
    hist = jnp.full((maxiter + 1,), jnp.nan, dtype=rr0.dtype).at[0].set(rr0)

    # One pass of CG from (x, r) until the recurrence meets tol or maxiter, then the true
    # residual; again from the true residual while it misses tol, iterations remain and the
    # last pass lowered it. The pass runs once in the common case (the body is traced once;
    # nested loops, unlike a cond in the CG body, keep vmap from running the extra apply
    # every iteration).
    def outer_cond(state):
        _, _, rrt, it, _, _, rrt_prev, first = state
        return first | ((rrt > target2) & (it < maxiter) & (rrt < rrt_prev))

    def outer_body(state):
        x, r, rrt, it, hist, _, _, _ = state
        x, it, rr, hist = run(x, r, rrt, it, hist, target2)
        r_true = b - A(x)
        return x, r_true, dot(r_true, r_true), it, hist, rr, rrt, jnp.asarray(False)

    state = (x, r, rr0, jnp.asarray(0, jnp.int32), hist, rr0, jnp.asarray(jnp.inf, rr0.dtype), jnp.asarray(True))
    x, _, rrt, it, hist, rr, _, _ = lax.while_loop(outer_cond, outer_body, state)

    breakdown = ~(jnp.isfinite(rrt) & jnp.isfinite(bnorm))
    x = jnp.where(breakdown, jnp.asarray(jnp.nan, x.dtype), x)
    rt = jnp.sqrt(rrt)
    rel = jnp.where(bnorm > 0, rt / jnp.where(bnorm > 0, bnorm, 1),
                    jnp.where(rt == 0, jnp.zeros_like(rt), jnp.full_like(rt, jnp.inf)))
    converged = (rrt <= target2) & ~breakdown
    return x, PCGInfo(it, jnp.sqrt(rr), bnorm, converged, jnp.sqrt(hist), rel, breakdown)


def _classic(A, M, dot, dots, maxiter, keep_z=False, flexible=False):
    """Hestenes–Stiefel PCG: ``run(x, r, ‖r‖², it, hist, target²) -> (x, it, ‖r‖², hist)``
    iterates from the residual r of x until ‖r‖² ≤ target² or ``it = maxiter``.
    ``flexible``: β = (z₊, r₊ − r)/(z, r) = −α (z₊, w)/(z, r) (Polak–Ribière), equal to
    the classic β in exact arithmetic with a fixed SPD preconditioner."""

    # Passes over the vectors per iteration (XLA fuses by dataflow; the grouping
    # below is the minimum):
    #   1. w = A p, then (p, w) — the operator's own passes, the dot fused into its output;
    #   2. r ← r − αw with (r, M r) and (r, r) — one reduction (``dots``), z never stored;
    #   3. x ← x + αp and p ← M r + βp — both read p once, after the reduction.
    def body(state):
        x, r, p, rz, it, _, hist = state
        w = A(p)
        alpha = _safe_div(rz, dot(p, w))
        r = r - alpha * w
        z = M(r)
        if flexible:
            rz_new, rr, wz = dots([(r, z), (r, r), (w, z)])
            beta = _safe_div(-alpha * wz, rz)
        else:
            rz_new, rr = dots([(r, z), (r, r)])
            beta = _safe_div(rz_new, rz)
        x = x + alpha * p
        p = (z if keep_z else M(r)) + beta * p  # Jacobi: z = M r recomputed, not kept between passes
        hist = hist.at[it + 1].set(rr)
        return x, r, p, rz_new, it + 1, rr, hist

    def run(x, r, rr, it, hist, target2):
        z = M(r)
        rz = dot(r, z)
        cond = lambda state: (state[4] < maxiter) & (state[5] > target2)
        x, _, _, _, it, rr, hist = lax.while_loop(cond, body, (x, r, z, rz, it, rr, hist))
        return x, it, rr, hist

    return run


def _single_reduction(A, M, dot, dots, maxiter):
    """Chronopoulos–Gear PCG: one fused reduction (γ = (r,u), δ = (w,u), ‖r‖²) per iteration.

    With u = M r and w = A u: β_i = γ_i/γ_{i−1}, α_i = γ_i/(δ_i − β_i γ_i/α_{i−1}),
    p ← u + β p, s ← w + β s (s = A p by recurrence), x ← x + α p, r ← r − α s.
    The residual norm of x_i is known at the start of step i, so the stopping
    test runs there (one extra operator apply on the last step); a pass's
    first step is tested on entry with the ‖r‖² it is given. ``run`` as in
    :func:`_classic`; a pass starts with p = s = 0 (a restart).
    """

    def run(x, r, rr, it, hist, target2):
        dt = rr.dtype
        zero = jnp.zeros((), dt)

        def cond(state):
            return (state[6] < maxiter) & ~state[8]

        def body(state):
            x, r, p, s, gamma_old, alpha_old, it, hist, _, first, _ = state
            u = M(r)
            w = A(u)
            gamma, delta, rr = dots([(r, u), (w, u), (r, r)])
            hist = hist.at[it].set(rr)
            done = (rr <= target2) & ~first  # a pass's first step: tested on entry, by the caller's ‖r‖²
            beta = jnp.where(first, zero, _safe_div(gamma, gamma_old))
            denom = delta - jnp.where(first, zero, beta * _safe_div(gamma, alpha_old))
            alpha = _safe_div(gamma, denom)
            step = jnp.where(done, zero, alpha)
            p = u + beta * p
            s = w + beta * s
            x = x + step * p
            r = r - step * s
            it = it + jnp.where(done, 0, 1).astype(it.dtype)
            return x, r, p, s, gamma, alpha, it, hist, done, jnp.asarray(False), rr

        state = (x, r, jnp.zeros_like(r), jnp.zeros_like(r), zero, zero, it, hist,
                 rr <= target2, jnp.asarray(True), rr)
        x, r, _, _, _, _, it, hist, done, _, rr = lax.while_loop(cond, body, state)
        # after maxiter updates the last residual's norm is not yet known: one more reduction
        rr = jnp.where(done, rr, dot(r, r))
        return x, it, rr, hist.at[it].set(rr)

    return run


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
    keep_z: bool = False,
    x0=None,
    nullspace=None,
    adjoint_guess=None,
):
    """Differentiable SEM solve: ``x = S b`` with implicit-function gradients.

    E-vectors are a redundant representation: ``project`` (``u -> mask·gs(w·u)``)
    maps any E-vector to the continuous, masked subspace where ``A`` is
    symmetric in ``dot``. The solve is ``S b = pcg(A, project(b))``; its
    Euclidean transpose is ``Sᵀ c = weight · pcg(A, mask·gs(c))``, which
    :func:`jax.lax.custom_linear_solve` uses for the adjoint solve. JAX's
    transpose rule drops the adjoint solve's :class:`PCGInfo`: an adjoint that
    misses ``tol`` warns instead (:class:`AdjointNotConvergedWarning`, from a host
    callback that runs only then); to read the info itself use
    :func:`jaxsem.models.inverse.solve`. ``nullspace`` (singular ``A``): as :func:`pcg`,
    for the forward and the adjoint solve alike (Sᵀ is then the transpose of the
    solve onto the complement of the null space).

    Args: ``project`` as above; ``weight`` the inverse multiplicity E-vector
    (times the mask); ``transposable=False`` for an ``A`` that JAX cannot
    transpose (the fused kernels): the transpose solve above never applies
    the operator JAX hands it, so it is handed ``A`` itself (JAX's
    ``symmetric=True``). First derivatives are exact either way; second
    derivatives through such a solve are not supported. ``x0``: an initial guess for
    the forward solve, projected like ``b`` (not differentiated: the solution does not
    depend on it). ``adjoint_guess``: None (the adjoint solve starts from zero) or an array
    like ``b`` that starts it (a guess of Sᵀ c, e.g. the adjoint of the previous time step's
    solve) and whose cotangent is the adjoint solution Sᵀ c itself, to be the next guess: the
    solve's value and tangent do not depend on the guess's value, and its tangent enters as
    ``b``'s does (zero for a guess made of constants; reverse mode alone reads it, through a
    driver that passes it on). Others as :func:`pcg`, whose checks run here first
    (before tracing). Returns ``(x, PCGInfo)``.
    """
    _check_options(tol, maxiter, method, b)
    _check_finite(b, "b", "right-hand side")
    maxiter, tol = int(maxiter), float(tol)
    run = lambda rhs, x0=None: pcg(A, rhs, dot=dot, precond=precond, x0=x0, tol=tol, maxiter=maxiter, dots=dots,
                                   method=method, keep_z=keep_z, nullspace=nullspace)
    # x0 projected like b: a guess off the continuous, masked subspace (a discontinuous field)
    # would otherwise stay in x, which CG changes only along that subspace
    x0 = None if x0 is None else project(lax.stop_gradient(x0))

    def solve(_, rhs):
        return run(project(rhs), x0)

    safe = jnp.where(weight != 0, weight, 1)
    g = None
    if adjoint_guess is not None:
        g = lax.stop_gradient(adjoint_guess)
        b = b + (adjoint_guess - g)  # b's value; its tangent (and so the cotangent Sᵀc) shared with the guess

    def transpose_solve(_, ct):
        # the iterate whose image weight·y is the guess, projected only where a solve is transposed
        y0 = None if g is None else project(jnp.where(weight != 0, g / safe, 0))
        y, info = run(project(ct / safe), y0)
        check_adjoint(info, tol)
        return weight * y, info

    return lax.custom_linear_solve(A, b, solve, transpose_solve, symmetric=not transposable, has_aux=True)
