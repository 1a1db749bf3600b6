"""Parameter studies: an elliptic adjoint that reports itself, point observations, field parametrizations.

:func:`jaxsem.models.poisson.solve` is already differentiable: it wraps PCG in
``lax.custom_linear_solve``, so ``jax.grad`` runs one adjoint (transpose)
solve. But JAX's transpose rule for ``custom_linear_solve`` drops the
auxiliary output of ``transpose_solve``, so the adjoint's :class:`PCGInfo`
never reaches the caller: a non-converged adjoint would give a wrong gradient
silently. :func:`solve` here has the same forward pass and a ``jax.custom_vjp``
whose backward pass runs the adjoint PCG itself and

* reports its info as the *cotangent of a probe argument* (a :class:`PCGInfo`
  of float zeros from :func:`adjoint_probe`): differentiate the loss with
  respect to the probe too and read the adjoint's info with
  :func:`adjoint_info` — pure, works under ``jit`` and ``vmap`` (one info per
  batch member);
* warns (:class:`AdjointNotConvergedWarning`, through ``jax.debug.callback``)
  when the adjoint misses its tolerance, unless ``check=False``.

The gradient is the implicit-function one: for A(p) u = b(p),
p̄ = (∂b/∂p − ∂(A u)/∂p)ᵀ λ with the adjoint λ = Sᵀ ū, S the projected solve
of :func:`jaxsem.solvers.pcg.linear_solve` and Sᵀ c = w·pcg(A, mask·gs(c))
(:func:`jaxsem.elliptic.transpose_solve_local`).
Only reverse mode: use :func:`jaxsem.models.poisson.solve` for ``jvp``.

Field parametrizations for inverse problems: :func:`grid_field` (trilinear
interpolation of values on a coarse uniform grid) and :func:`grid_gradient_penalty`
(its discrete ∫|∇h|²).

Point observations (time-domain problems, e.g. Maxwell): :func:`probe_nodes`
picks the GLL node nearest each probe point (averaging its coincident copies,
which a DG field holds once per element that shares the node) and
:func:`sample` reads a field there — linear, so gradients flow through it;
pass ``lambda q: sample(q, probes)`` as ``observe`` to
:func:`jaxsem.timestepping.integrate` to record time series.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..discretization.sem import SEM
from . import poisson
from ..elliptic import Helmholtz, transpose_solve_local
from ..solvers.pcg import AdjointNotConvergedWarning, PCGInfo, warn_adjoint

__all__ = [
    "AdjointNotConvergedWarning", "adjoint_probe", "adjoint_info", "solve",
    "grid_field", "grid_gradient_penalty", "Probes", "probe_nodes", "sample",
]


def adjoint_probe(maxiter: int = 1000, dtype=jnp.float64) -> PCGInfo:
    """Zeros shaped like a :class:`PCGInfo` (all float): pass to :func:`solve` as ``probe``.

    Its gradient (``jax.grad(loss, argnums=…)``) is the adjoint solve's info in
    float form; convert with :func:`adjoint_info`. ``maxiter`` must match the solve's.
    """
    z = jnp.zeros((), dtype)
    return PCGInfo(z, z, z, z, jnp.zeros((maxiter + 1,), dtype), z, z)


def adjoint_info(probe_grad: PCGInfo) -> PCGInfo:
    """The adjoint :class:`PCGInfo` from the gradient of a probe (integer iterations, bool converged).

    A probe used by several solves in one loss receives the sum of their infos;
    use one probe per solve.
    """
    return probe_grad._replace(iterations=jnp.round(probe_grad.iterations).astype(jnp.int32),
                               converged=probe_grad.converged > 0.5, breakdown=probe_grad.breakdown > 0.5)


def solve(sem: SEM, f=None, h1=1.0, h2=0.0, tol: float = 1e-10, maxiter: int = 1000, *, rhs=None,
          method: str = "classic", probe: PCGInfo | None = None, check: bool = True):
    """:func:`jaxsem.models.poisson.solve` whose backward pass reports the adjoint solve.

    Args: as :func:`jaxsem.models.poisson.solve` (``f`` a callable or values at
      the quadrature points ``(E, q, q, q)``, or ``rhs`` an assembled E-vector;
      ``h1, h2`` scalars, ``(E, 1, 1, 1)`` per element or ``(E, q, q, q)`` per
      point); ``probe``: from :func:`adjoint_probe`, receives the adjoint's
      info as its gradient; ``check``: warn when the adjoint does not converge
      (skipped in fixed-iteration mode, ``tol=0``). The forward and adjoint PCG run
      ``sem.backend``'s kernels; the one residual derivative runs the einsum reference.
    Returns ``(u, PCGInfo)`` of the forward solve. Differentiable (reverse mode)
    w.r.t. ``f``/``rhs``, ``h1``, ``h2``, the arrays of ``sem`` (hence node
    coordinates through :meth:`SEM.with_coordinates`) and ``probe``.
    """
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
        raise ValueError(f"maxiter must be an integer >= 1, got {maxiter!r}")
    if (f is None) == (rhs is None):
        raise ValueError("give exactly one of f (a source) and rhs (an assembled E-vector)")
    # the load is ordinary JAX code: its derivatives (source, geometry) need no adjoint
    b = poisson.load(sem, f) if rhs is None else jnp.asarray(rhs, sem.x.dtype)
    dt = sem.x.dtype
    if probe is None:
        probe = adjoint_probe(maxiter, dt)
    elif probe.history.shape != (maxiter + 1,):
        raise ValueError(f"probe must come from adjoint_probe(maxiter={maxiter}), "
                         f"got history shape {probe.history.shape}")
    # a literal 0 stays static (None) so the operator skips that term
    h1, h2 = (None if _is_literal_zero(h) else jnp.asarray(h, dt) for h in (h1, h2))
    return _solve(tol, maxiter, method, check, sem, b, h1, h2, probe)


def _residual(sem, b, h1, h2, u):
    """b − A(h₁, h₂; geometry) u: the equation whose implicit derivative is the gradient."""
    return b - poisson.operator(sem, _c(h1), _c(h2))(u)


def _is_literal_zero(h):
    return isinstance(h, (int, float)) and not isinstance(h, bool) and h == 0


def _c(h):
    return 0.0 if h is None else h


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _solve(tol, maxiter, method, check, sem, b, h1, h2, probe):
    return poisson.solve(sem, None, _c(h1), _c(h2), tol=tol, maxiter=maxiter, rhs=b, method=method)


def _solve_fwd(tol, maxiter, method, check, sem, b, h1, h2, probe):
    u, info = _solve(tol, maxiter, method, check, sem, b, h1, h2, probe)
    return (u, info), (sem, b, h1, h2, u)


def _solve_bwd(tol, maxiter, method, check, res, cts):
    sem, b, h1, h2, u = res
    ubar = cts[0]  # the info's cotangents are zero (integers, or unused floats)
    lam, info = transpose_solve_local(Helmholtz.of(sem, _c(h1), _c(h2)), ubar, tol=tol, maxiter=maxiter,
                                      method=method)
    if check and tol > 0:
        jax.debug.callback(warn_adjoint, info.converged, info.iterations, info.true_relative_residual)
    _, vjp = jax.vjp(lambda s, b_, a1, a2: _residual(s, b_, a1, a2, u), sem, b, h1, h2)
    sem_bar, b_bar, h1_bar, h2_bar = vjp(lam)
    dt = u.dtype
    probe_bar = PCGInfo(*(a.astype(dt) for a in info))
    return sem_bar, b_bar, h1_bar, h2_bar, probe_bar


_solve.defvjp(_solve_fwd, _solve_bwd)


def grid_field(theta, x, lower=(0.0, 0.0, 0.0), upper=(1.0, 1.0, 1.0)):
    """Trilinear interpolation of grid values to points.

    ``theta: (mx, my, mz)`` values at the nodes of a uniform grid spanning the
    box ``[lower, upper]`` (each m ≥ 2; ``theta[i, j, k]`` at
    ``lower + (i, j, k)·spacing``); ``x: (3, ...)`` points (clamped to the box).
    Returns ``(...)``. Linear in ``theta``; piecewise smooth in ``x``.
    """
    theta = jnp.asarray(theta)
    if theta.ndim != 3 or min(theta.shape) < 2:
        raise ValueError(f"theta must have shape (mx, my, mz) with every m >= 2, got {theta.shape}")
    idx, frac = [], []
    for d in range(3):
        s = (x[d] - lower[d]) / (upper[d] - lower[d]) * (theta.shape[d] - 1)
        s = jnp.clip(s, 0.0, theta.shape[d] - 1)
        i = jnp.clip(jnp.floor(s).astype(jnp.int32), 0, theta.shape[d] - 2)
        idx.append(i)
        frac.append(s - i)
    out = 0.0
    for a in (0, 1):
        for b in (0, 1):
            for c in (0, 1):
                w = ((frac[0] if a else 1 - frac[0]) * (frac[1] if b else 1 - frac[1])
                     * (frac[2] if c else 1 - frac[2]))
                out = out + w * theta[idx[0] + a, idx[1] + b, idx[2] + c]
    return out


def grid_gradient_penalty(theta, lower=(0.0, 0.0, 0.0), upper=(1.0, 1.0, 1.0)):
    """Discrete ∫|∇h|² of grid values ``theta: (mx, my, mz)``: Σ_d Σ (Δ_d θ / h_d)² · cell volume.

    Forward differences along each axis, averaged over the other axes'
    nodes (trapezoid weights omitted: a Tikhonov seminorm, not an exact integral).
    """
    theta = jnp.asarray(theta)
    h = [(upper[d] - lower[d]) / (theta.shape[d] - 1) for d in range(3)]
    vol = h[0] * h[1] * h[2]
    return sum(jnp.sum((jnp.diff(theta, axis=d) / h[d]) ** 2) for d in range(3)) * vol


class Probes(NamedTuple):
    """Observation nodes of :func:`probe_nodes` for ``P`` probe points (K: most coincident copies).

    ``index: (P, K)`` flat node indices into ``(E·n³)``; ``weight: (P, K)``
    (each row sums to 1, 0 on padding); ``distance: (P,)`` from each probe
    point to its node (length units of the coordinates).
    """

    index: np.ndarray
    weight: np.ndarray
    distance: np.ndarray


def probe_nodes(x, points, tol: float = 1e-9) -> Probes:
    """The node nearest each probe point, with all of its coincident copies (NumPy, host side).

    ``x: (3, E, n, n, n)`` node coordinates (e.g. ``dg.x``); ``points: (P, 3)``.
    A node on an element face, edge or vertex exists once per element sharing
    it; every copy (within ``tol`` of the chosen node) gets the same weight,
    so a discontinuous (DG) field is averaged over the elements that meet there.
    Probes on element vertices are nodes of every order: data from one order
    and a model of another observe the same points.
    """
    xs = np.asarray(x, np.float64).reshape(3, -1).T  # (E·n³, 3)
    pts = np.asarray(points, np.float64)
    if pts.ndim != 2 or pts.shape[1] != 3 or pts.shape[0] < 1 or not np.all(np.isfinite(pts)):
        raise ValueError(f"points must be a (P, 3) array of finite coordinates, got shape {pts.shape}")
    d = np.linalg.norm(xs[None, :, :] - pts[:, None, :], axis=-1)  # (P, E·n³)
    nearest = xs[np.argmin(d, axis=1)]  # (P, 3): the chosen node; then all copies of it
    near = np.linalg.norm(xs[None, :, :] - nearest[:, None, :], axis=-1) <= tol
    dmin = np.linalg.norm(nearest - pts, axis=1)
    K = int(near.sum(axis=1).max())
    index = np.zeros((len(pts), K), np.int64)
    weight = np.zeros((len(pts), K))
    for p in range(len(pts)):
        ids = np.nonzero(near[p])[0]
        index[p, : len(ids)] = ids
        weight[p, : len(ids)] = 1.0 / len(ids)
    return Probes(index, weight, dmin)


def sample(u, probes: Probes):
    """Values of ``u: (..., E, n, n, n)`` at the probes: ``(..., P)`` (linear in ``u``)."""
    flat = u.reshape(u.shape[:-4] + (-1,))
    w = jnp.asarray(probes.weight, flat.dtype)
    return jnp.sum(flat[..., jnp.asarray(probes.index)] * w, axis=-1)
