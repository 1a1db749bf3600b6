"""Chebyshev iterations of a Jacobi-scaled operator D⁻¹A, and the spectral bounds they need.

* :func:`fourth_kind` — the smoother: Chebyshev polynomials of the fourth kind
  (Lottes, "Optimal polynomial smoothers for multigrid V-cycles", Numer. Linear
  Algebra Appl. 2023; Phillips & Fischer 2022, Alg. 1 with β = 1). It needs only
  ρ ≥ λ_max(D⁻¹A); its error polynomial e(λ) has |e| ≤ 1 on [0, ρ] and damps the
  upper part of the spectrum ((2k+1)⁻¹ in the energy-weighted sense for degree k).
* :func:`first_kind` — the coarse solve: the classical Chebyshev iteration on an
  interval [a, b] ⊇ spectrum (Saad, *Iterative Methods*, §12.3, preconditioned
  by D⁻¹), error ≤ 2((√κ−1)/(√κ+1))^k with κ = b/a.
* :func:`ritz_bounds` — the smallest and largest Ritz values of D⁻¹A from a few
  Jacobi-PCG (Lanczos) steps: λ_max from below, λ_min from above.

Both iterations are fixed polynomials in D⁻¹A applied to D⁻¹r: linear in the
right-hand side, symmetric in the Euclidean inner product of assembled vectors,
and free of inner products (no global reductions), so a multigrid cycle built
from them is a fixed linear operator that plain PCG can use.
Vectors are E-vectors ``(..., E, n, n, n)``; ``dinv`` broadcasts against them.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp
from jax import lax

__all__ = ["fourth_kind", "first_kind", "lanczos", "ritz_bounds", "steps_for"]


def fourth_kind(A: Callable, dinv, rho, degree: int, r, x=None):
    """Fourth-kind Chebyshev smoothing of ``A x = r`` from ``x`` (zero if None).

    Returns ``x + p(D⁻¹A) D⁻¹ (r − A x)``, p of degree ``degree − 1``: the error is
    multiplied by e(D⁻¹A), e(λ) = 1 − λp(λ) the fourth-kind polynomial of degree k with
    |e| ≤ 1 on [0, ρ] and |e| ≤ 1/(2k+1) at λ = ρ. ``degree − 1`` applications of ``A``
    (one more when ``x`` is given). ``rho``: an upper bound of λ_max(D⁻¹A).
    Recurrence (Phillips & Fischer 2022):
    d₀ = 4/(3ρ) D⁻¹r₀; for i = 1…k−1: x += d, r −= A d,
    d = (2i−1)/(2i+3) d + (8i+4)/((2i+3)ρ) D⁻¹r; x += d.
    """
    if x is None:
        x = jnp.zeros_like(r)
    else:
        r = r - A(x)
    d = (4.0 / 3.0) / rho * (dinv * r)
    for i in range(1, degree):
        x = x + d
        r = r - A(d)
        d = (2 * i - 1) / (2 * i + 3) * d + (8 * i + 4) / (2 * i + 3) / rho * (dinv * r)
    return x + d


def first_kind(A: Callable, dinv, lmin, lmax, degree: int, r):
    """Chebyshev iteration for ``A x = r`` on [lmin, lmax], from zero: ``degree`` steps.

    Returns ``p(D⁻¹A) D⁻¹ r``: e(λ) = T_k((b + a − 2λ)/(b − a)) / T_k((b + a)/(b − a)).
    ``degree − 1`` applications of ``A`` (a ``lax.fori_loop``). Positive on (0, lmax] for any
    0 < lmin < lmax, so the result is an SPD operator whenever ``lmax ≥ λ_max``.
    """
    theta = 0.5 * (lmax + lmin)
    delta = 0.5 * (lmax - lmin)
    sigma = theta / delta
    d = dinv * r / theta
    rho = 1.0 / sigma

    def body(_, state):
        x, r, d, rho = state
        x = x + d
        r = r - A(d)
        rho_new = 1.0 / (2.0 * sigma - rho)
        d = (rho_new * rho) * d + (2.0 * rho_new / delta) * (dinv * r)
        return x, r, d, rho_new

    x, _, d, _ = lax.fori_loop(0, degree - 1, body, (jnp.zeros_like(r), r, d, rho))
    return x + d


def lanczos(A: Callable, dinv, r, dot: Callable, steps: int):
    """The Lanczos tridiagonal of D⁻¹A after ``steps`` Jacobi-PCG steps from ``r``: ``(diag, off)``,
    ``(steps,)`` and ``(steps − 1,)``; its eigenvalues are the Ritz values (:func:`ritz_bounds`).

    From the CG coefficients (Saad, *Iterative Methods*, §6.7): T_jj = 1/α_j + β_{j−1}/α_{j−1},
    T_j,j+1 = √β_j/α_j. Steps after an exact breakdown (a residual or curvature of 0: the
    Krylov space is exhausted) are dropped (decoupled rows repeating the first diagonal entry,
    a value inside the spectrum). ``dot``: the global inner product of continuous E-vectors
    (all ranks).
    """
    z = dinv * r
    rz = dot(r, z)
    dt = rz.dtype

    def body(state, _):
        r, p, rz, ok = state
        w = A(p)
        pw = dot(p, w)
        ok = ok & (pw > 0) & (rz > 0)
        alpha = jnp.where(ok, rz / jnp.where(ok, pw, 1), 0)
        r = r - alpha * w
        z = dinv * r
        rz_new = dot(r, z)
        beta = jnp.where(ok, rz_new / jnp.where(ok, rz, 1), 0)
        p = z + beta * p
        return (r, p, rz_new, ok), (alpha, beta, ok)

    _, (alpha, beta, ok) = lax.scan(body, (r, z, rz, jnp.asarray(True)), None, length=steps)
    inv = jnp.where(ok, 1 / jnp.where(ok, alpha, 1), 0)
    prev = jnp.concatenate([jnp.zeros((1,), dt), beta[:-1] * inv[:-1]])
    diag = jnp.where(ok, inv + prev, inv[0] + prev[0])
    off = jnp.where(ok[1:], jnp.sqrt(jnp.maximum(beta[:-1], 0)) * inv[:-1], 0)
    return diag, off


def ritz_bounds(A: Callable, dinv, r, dot: Callable, steps: int):
    """``(λ_min, λ_max)`` Ritz values of D⁻¹A after ``steps`` Jacobi-PCG (Lanczos) steps from ``r``
    (:func:`lanczos`). λ_max is approached from below (multiply by a safety factor before using
    it as a bound), λ_min from above."""
    diag, off = lanczos(A, dinv, r, dot, steps)
    lam = jnp.linalg.eigvalsh(jnp.diag(diag) + jnp.diag(off, 1) + jnp.diag(off, -1))
    return lam[0], lam[-1]


def steps_for(kappa: float, reduction: float) -> int:
    """Chebyshev steps that reduce the error by ``reduction`` for condition number ``kappa``:
    the least k with 2((√κ−1)/(√κ+1))^k ≤ reduction."""
    s = math.sqrt(max(kappa, 1.0))
    if s <= 1.0 + 1e-12:
        return 1
    rate = (s - 1.0) / (s + 1.0)
    return max(1, math.ceil(math.log(reduction / 2.0) / math.log(rate)))
