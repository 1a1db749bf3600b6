"""Geometric factors of curvilinear hexahedra on GLL or Gauss quadrature points.

From the GLL node coordinates ``x: (3, E, n, n, n)`` (any smooth isoparametric
map), at the quadrature points of a tensor rule with q points per direction:

* ``jac = det ∂x/∂r`` (must be > 0 everywhere: an inverted element is an error
  naming it),
* ``B = w_i w_j w_k · jac`` — the diagonal mass weights,
* ``G_ab = w_i w_j w_k · jac · ∇r_a · ∇r_b`` for (a, b) in rr, rs, rt, ss, st, tt,

so that the stiffness is ``A_e = Σ_ab D_aᵀ G_ab D_b`` (Deville, Fischer & Mund
§4.4; Nekbone's ``g1..g6``). Written in ``jnp``, so ``jax.grad`` flows from the
factors back to node coordinates (shape derivatives).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import basis

__all__ = ["Quadrature", "quadrature", "Geometry", "geometric_factors", "factors", "check_orientation", "to_quadrature", "G_PAIRS"]

G_PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # rr, rs, rt, ss, st, tt


@dataclasses.dataclass(frozen=True, eq=False)
class Quadrature:
    """A tensor quadrature rule seen from the GLL nodes of order N (NumPy).

    ``J: (q, n)`` interpolates GLL nodal values to the quadrature points,
    ``Dt: (q, n)`` differentiates then interpolates, ``w: (q,)`` weights,
    ``points: (q,)``. ``collocated`` is True for the GLL rule (J = I).
    """

    kind: str
    order: int
    points: np.ndarray
    w: np.ndarray
    J: np.ndarray
    Dt: np.ndarray

    @property
    def q(self) -> int:
        return int(self.points.size)

    @property
    def collocated(self) -> bool:
        return self.kind == "gll"


def quadrature(order: int, kind: str = "gll", q: int | None = None) -> Quadrature:
    """The quadrature for BK/BP operators: ``"gll"`` (q = N + 1, collocated) or
    ``"gauss"`` (q = N + 2 Gauss–Legendre unless ``q`` is given)."""
    order = basis.check_order(order)
    xg, _ = basis.gll_points(order)
    if kind == "gll":
        w = basis.gll_points(order)[1]
        return Quadrature("gll", order, xg, w, np.eye(order + 1), basis.derivative_matrix(xg))
    if kind == "gauss":
        q = order + 2 if q is None else int(q)
        xq, w = basis.gauss_points(q)
        return Quadrature("gauss", order, xq, w, basis.lagrange_matrix(xg, xq), basis.derivative_matrix(xg, xq))
    raise ValueError(f"quadrature kind must be 'gll' or 'gauss', got {kind!r}")


def to_quadrature(u, J):
    """Interpolate ``u: (..., E, n, n, n)`` to quadrature points: ``(..., E, q, q, q)``."""
    u = jnp.einsum("ai,...kji->...kja", J, u)
    u = jnp.einsum("bj,...kja->...kba", J, u)
    return jnp.einsum("ck,...kba->...cba", J, u)


def _grad_ref(x, J, Dt):
    """∂x/∂(r, s, t) at quadrature points: ``(3 [r,s,t], 3 [x,y,z], E, q, q, q)``."""
    xr = jnp.einsum("ck,bj,ai,dekji->decba", J, J, Dt, x)
    xs = jnp.einsum("ck,bj,ai,dekji->decba", J, Dt, J, x)
    xt = jnp.einsum("ck,bj,ai,dekji->decba", Dt, J, J, x)
    return jnp.stack([xr, xs, xt])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Geometry:
    """Geometric factors on a quadrature rule (a pytree of arrays).

    ``G: (6, E, q, q, q)`` (rr, rs, rt, ss, st, tt, weights and Jacobian folded in),
    ``B: (E, q, q, q)`` mass weights, ``jac: (E, q, q, q)`` Jacobian determinant,
    ``rx: (3, 3, E, q, q, q)`` with ``rx[a, d] = ∂r_a/∂x_d``, ``xq: (3, E, q, q, q)``
    physical coordinates of the quadrature points.
    """

    G: jax.Array = dataclasses.field(metadata=dict(pad=0))  # zero weights on the pads of a sharded run
    B: jax.Array = dataclasses.field(metadata=dict(pad=0))
    jac: jax.Array
    rx: jax.Array
    xq: jax.Array


def geometric_factors(x, quad: Quadrature, check: bool = True) -> Geometry:
    """Compute :class:`Geometry` from GLL coordinates ``x: (3, E, n, n, n)``.

    Raises ``ValueError`` naming the first element whose Jacobian is ≤ 0 at any
    quadrature point (when ``x`` is concrete and ``check`` is True).
    """
    x = jnp.asarray(x)
    if x.ndim != 5 or x.shape[0] != 3 or x.shape[2:] != (quad.order + 1,) * 3:
        n = quad.order + 1
        raise ValueError(f"x must have shape (3, E, {n}, {n}, {n}), got {tuple(x.shape)}")
    dt = x.dtype
    geom = factors(x, jnp.asarray(quad.J, dt), jnp.asarray(quad.Dt, dt), jnp.asarray(quad.w, dt), quad.collocated)
    if check:
        check_orientation(geom.jac)
    return geom


def check_orientation(jac, valid=None) -> None:
    """Raise ``ValueError`` naming the first element whose Jacobian ``jac: (E, q, q, q)`` is ≤ 0
    somewhere (inverted or degenerate); ``valid: (E,)`` skips pad elements. Nothing when traced."""
    if isinstance(jac, jax.core.Tracer):
        return
    jmin = np.asarray(jnp.min(jac.reshape(jac.shape[0], -1), axis=1))
    ok = jmin > 0 if valid is None else (jmin > 0) | ~np.asarray(valid, bool)
    bad = np.nonzero(~ok)[0]
    if bad.size:
        e = int(bad[0])
        raise ValueError(
            f"element {e} is inverted or degenerate: min Jacobian determinant {jmin[e]:.3e} <= 0 "
            f"({bad.size} bad element(s) in all)"
        )


@functools.partial(jax.jit, static_argnums=4)
def factors(x, J, Dt, w, collocated):
    """:class:`Geometry` of ``x: (3, E, n, n, n)`` from the rule's matrices, traceable (no checks).

    ``J, Dt: (q, n)`` interpolation and derivative to the quadrature points, ``w: (q,)``
    its weights, ``collocated`` (static) when the points are the GLL nodes themselves.
    What :func:`geometric_factors` computes, for callers that differentiate through the
    coordinates (``SEM.with_coordinates``) or hold the matrices already.
    """
    g = _grad_ref(x, J, Dt)  # g[a, d] = ∂x_d/∂r_a
    xr, xs, xt = g[0], g[1], g[2]
    cross = lambda a, b: jnp.stack(
        [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    )
    cst, ctr, crs = cross(xs, xt), cross(xt, xr), cross(xr, xs)
    jac = jnp.sum(xr * cst, axis=0)
    rx = jnp.stack([cst, ctr, crs]) / jac  # rx[a, d] = ∂r_a/∂x_d
    w3 = w[:, None, None] * w[None, :, None] * w[None, None, :]
    B = w3 * jac
    G = jnp.stack([B * jnp.sum(rx[a] * rx[b], axis=0) for a, b in G_PAIRS])
    xq = x if collocated else to_quadrature(x, J)
    return Geometry(G=G, B=B, jac=jac, rx=rx, xq=xq)
