"""One-dimensional spectral bases: GLL and Gauss–Legendre rules, Lagrange matrices.

Everything here is NumPy float64 on the reference interval [-1, 1], cached by
(order, ...). No JAX state: callers convert with ``jnp.asarray`` where needed.

Conventions (Nek5000 / Deville–Fischer–Mund): ``order`` is the polynomial order
N; a GLL rule of order N has n = N + 1 points (exact for degree 2N − 1); a
Gauss–Legendre rule with q points is exact for degree 2q − 1.
"""

from __future__ import annotations

import functools

import numpy as np

MAX_ORDER = 20
# Gauss–Legendre rules are built to round-off far beyond the GLL orders (moments to
# 1e-15 at 64 points); error norms integrate with q = N + 4 up to N = MAX_ORDER.
MAX_GAUSS_POINTS = 64

__all__ = [
    "MAX_ORDER",
    "check_order",
    "MAX_GAUSS_POINTS",
    "gll_points",
    "gauss_points",
    "legendre",
    "lagrange_matrix",
    "derivative_matrix",
    "interp_matrix",
]


def check_order(order, name="order", lo=1, hi=MAX_ORDER):
    """``order`` as an int if it is an integer in ``[lo, hi]``; else an error naming ``name``."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {order!r}")
    if not lo <= order <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {order}")
    return int(order)


def legendre(n: int, x):
    """Legendre polynomial P_n and its derivative at x (arrays, float64)."""
    x = np.asarray(x, dtype=np.float64)
    p0, p1 = np.ones_like(x), x.copy()
    if n == 0:
        return p0, np.zeros_like(x)
    for k in range(2, n + 1):
        p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
    # P_n' from the standard relation (1 - x^2) P_n' = n (P_{n-1} - x P_n), safe off ±1.
    with np.errstate(divide="ignore", invalid="ignore"):
        dp = n * (p0 - x * p1) / (1.0 - x * x)
    end = np.isclose(np.abs(x), 1.0, rtol=0, atol=0)
    dp = np.where(end, np.sign(x) ** (n + 1) * n * (n + 1) / 2.0, dp)
    return p1, dp


@functools.lru_cache(maxsize=None)
def _gll(order: int):
    n = order + 1
    if order == 1:
        return np.array([-1.0, 1.0]), np.array([1.0, 1.0])
    # Interior points: roots of P_N'. Newton from Chebyshev–Gauss–Lobatto guesses.
    x = -np.cos(np.pi * np.arange(n) / order)
    for _ in range(100):
        p, _ = legendre(order, x)
        pm1, _ = legendre(order - 1, x)
        # Newton on (1 - x^2) P_N'(x) = N (P_{N-1} - x P_N) via the Nek/Trefethen iteration.
        x_old = x.copy()
        x = x_old - (x_old * p - pm1) / (n * p)
        x[0], x[-1] = -1.0, 1.0
        if np.max(np.abs(x - x_old)) < 1e-16:
            break
    p, _ = legendre(order, x)
    w = 2.0 / (order * n * p * p)
    x = 0.5 * (x - x[::-1])  # exact antisymmetry
    w = 0.5 * (w + w[::-1])
    return x, w


@functools.lru_cache(maxsize=None)
def _gauss(q: int):
    x, w = np.polynomial.legendre.leggauss(q)
    # Polish with Newton on P_q (leggauss is already close to round-off).
    for _ in range(3):
        p, dp = legendre(q, x)
        x = x - p / dp
    _, dp = legendre(q, x)
    w = 2.0 / ((1.0 - x * x) * dp * dp)
    x = 0.5 * (x - x[::-1])
    w = 0.5 * (w + w[::-1])
    return x, w


def gll_points(order: int):
    """Gauss–Lobatto–Legendre nodes and weights of polynomial order N.

    Returns ``(x, w)``, both ``(N + 1,)`` float64 on [-1, 1], ascending;
    the rule integrates polynomials of degree ≤ 2N − 1 exactly. 1 ≤ N ≤ 20.
    """
    order = check_order(order)
    x, w = _gll(order)
    return x.copy(), w.copy()


def gauss_points(q: int):
    """Gauss–Legendre nodes and weights with ``q`` points (exact to degree 2q − 1).

    Returns ``(x, w)``, both ``(q,)`` float64 on (-1, 1), ascending. 1 ≤ q ≤ 64
    (``MAX_GAUSS_POINTS``; the bake-off uses q = N + 2, the error norms q = N + 4, N ≤ 20).
    """
    q = check_order(q, "q", 1, MAX_GAUSS_POINTS)
    x, w = _gauss(q)
    return x.copy(), w.copy()


def _barycentric_weights(nodes):
    diff = nodes[:, None] - nodes[None, :]
    np.fill_diagonal(diff, 1.0)
    return 1.0 / np.prod(diff, axis=1)


def lagrange_matrix(nodes, x):
    """Values of the Lagrange basis on ``nodes`` at points ``x``.

    ``nodes: (n,)``, ``x: (m,)`` → ``J: (m, n)`` with ``J[a, b] = ℓ_b(x_a)``, so
    ``J @ u`` interpolates nodal values ``u`` to ``x``. Barycentric form, exact
    (to round-off) where x hits a node.
    """
    nodes = np.asarray(nodes, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if nodes.ndim != 1 or x.ndim != 1:
        raise ValueError("lagrange_matrix: nodes and x must be 1-D arrays")
    lam = _barycentric_weights(nodes)
    diff = x[:, None] - nodes[None, :]
    hit = diff == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = lam[None, :] / diff
        J = terms / terms.sum(axis=1, keepdims=True)
    rows = hit.any(axis=1)
    J[rows] = hit[rows].astype(np.float64)
    return J


def derivative_matrix(nodes, x=None):
    """Derivatives of the Lagrange basis on ``nodes``, evaluated at ``x``.

    ``D[a, b] = ℓ_b'(x_a)``; with ``x`` omitted, at the nodes themselves
    (``(n, n)``, the collocation derivative matrix: ``D @ u`` differentiates a
    nodal polynomial exactly). Built from the barycentric formula with the
    negative-sum trick for the diagonal (rows sum to zero to round-off).
    """
    nodes = np.asarray(nodes, dtype=np.float64)
    n = nodes.size
    lam = _barycentric_weights(nodes)
    diff = nodes[:, None] - nodes[None, :]
    np.fill_diagonal(diff, 1.0)
    D = (lam[None, :] / lam[:, None]) / diff
    np.fill_diagonal(D, 0.0)
    D[np.arange(n), np.arange(n)] = -D.sum(axis=1)
    if x is None:
        return D
    return lagrange_matrix(nodes, x) @ D


@functools.lru_cache(maxsize=None)
def _interp_cached(kind_from, n_from, kind_to, n_to):
    xf = _nodes(kind_from, n_from)
    xt = _nodes(kind_to, n_to)
    return lagrange_matrix(xf, xt), derivative_matrix(xf, xt)


def _nodes(kind, npts):
    if kind == "gll":
        return _gll(npts - 1)[0]
    if kind == "gauss":
        return _gauss(npts)[0]
    raise ValueError(f"node kind must be 'gll' or 'gauss', got {kind!r}")


def interp_matrix(n_from: int, n_to: int, kind_from="gll", kind_to="gauss"):
    """Cached ``(J, Dt)`` taking nodal values on ``n_from`` points to ``n_to`` points.

    ``J: (n_to, n_from)`` interpolates, ``Dt: (n_to, n_from)`` differentiates
    then interpolates. Node kinds: ``"gll"`` or ``"gauss"``.
    """
    J, D = _interp_cached(kind_from, int(n_from), kind_to, int(n_to))
    return J.copy(), D.copy()
