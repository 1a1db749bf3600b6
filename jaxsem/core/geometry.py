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
    return _along(J, _along(J, _along(J, u, 0), 1), 2)


def _along(M, u, axis: int):
    """``Σ_i M[a, i] u[..., i, ...]`` along node axis ``axis`` (0: i, 1: j, 2: k) of
    ``u: (..., k, j, i)``; ``M: (q, n)``.

    Written as n broadcast multiply-adds, which XLA fuses into one elementwise loop (a
    ``dot_general`` of a 4×4 matrix with a strided axis transposes the operand on a CPU).
    """
    ax = u.ndim - 1 - axis
    shape = [1] * u.ndim
    shape[ax] = M.shape[0]
    out = None
    for i in range(M.shape[1]):
        t = M[:, i].reshape(shape) * jax.lax.slice_in_dim(u, i, i + 1, axis=ax)
        out = t if out is None else out + t
    return out


def _grad_ref(x, J, Dt, collocated: bool):
    """∂x/∂(r, s, t) at quadrature points: ``(3 [r,s,t], 3 [x,y,z], E, q, q, q)`` (sum
    factorization; on the GLL rule J = I, one derivative per direction)."""
    if collocated:
        return jnp.stack([_along(Dt, x, a) for a in range(3)])
    xr = _along(J, _along(J, _along(Dt, x, 0), 1), 2)
    xs = _along(J, _along(Dt, _along(J, x, 0), 1), 2)
    xt = _along(Dt, _along(J, _along(J, x, 0), 1), 2)
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
    args = (jnp.asarray(quad.J, dt), jnp.asarray(quad.Dt, dt), jnp.asarray(quad.w, dt), quad.collocated)
    if isinstance(x, jax.core.Tracer):
        return factors(x, *args)
    platform = next(iter(x.devices())).platform
    geom, jmin = _factors_blocked(x, *args, _block_size(x.shape[1], quad.q, platform))
    if check:
        _check_min(np.asarray(jmin))
    return geom


def check_orientation(jac, valid=None) -> None:
    """Raise ``ValueError`` naming the first element whose Jacobian ``jac: (E, q, q, q)`` is ≤ 0
    somewhere (inverted or degenerate); ``valid: (E,)`` skips pad elements. Nothing when traced."""
    if isinstance(jac, jax.core.Tracer):
        return
    _check_min(np.asarray(jnp.min(jac.reshape(jac.shape[0], -1), axis=1)), valid)


def _check_min(jmin: np.ndarray, valid=None) -> None:
    """:func:`check_orientation` from the per-element minima ``jmin: (E,)``."""
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
    g = _grad_ref(x, J, Dt, collocated)  # g[a, d] = ∂x_d/∂r_a
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


def _block_size(E: int, q: int, platform: str) -> int:
    """Elements per block of :func:`_factors_blocked`, at most E: about 2¹² quadrature points
    on a CPU (each intermediate stays in cache; fastest of 2⁹–2²² at 32³ and 16³ elements,
    docs/performance.md), 2²² on an accelerator (a few dozen blocks per mesh)."""
    return max(1, min(E, (2**12 if platform == "cpu" else 2**22) // q**3))


@functools.partial(jax.jit, static_argnums=(4, 5))
def _factors_blocked(x, J, Dt, w, collocated, block):
    """:func:`factors` of ``x: (3, E, n, n, n)`` computed ``block`` elements at a time, and the
    minimum Jacobian per element ``(E,)``.

    The values of :func:`factors` (to round-off), in a loop that writes each block into the outputs
    (one allocation each): the whole-mesh form materialises every intermediate on all E·q³
    points, many GB at 84³ elements. The last block is shifted back to end at E (it
    recomputes a few elements). For concrete set-up; :func:`factors` is the one to
    differentiate.
    """
    E = x.shape[1]
    q = J.shape[0]
    dt = x.dtype
    out = Geometry(G=jnp.zeros((6, E, q, q, q), dt), B=jnp.zeros((E, q, q, q), dt),
                   jac=jnp.zeros((E, q, q, q), dt), rx=jnp.zeros((3, 3, E, q, q, q), dt),
                   xq=x if collocated else jnp.zeros((3, E, q, q, q), dt))
    jmin = jnp.zeros((E,), dt)

    def body(b, carry):
        out, jmin = carry
        e0 = jnp.minimum(b * block, E - block)
        g = factors(jax.lax.dynamic_slice_in_dim(x, e0, block, axis=1), J, Dt, w, collocated)
        put = lambda o, v: jax.lax.dynamic_update_slice_in_dim(o, v, e0, axis=o.ndim - 4)
        fields = ("G", "B", "jac", "rx") + (() if collocated else ("xq",))
        out = dataclasses.replace(out, **{f: put(getattr(out, f), getattr(g, f)) for f in fields})
        jmin = jax.lax.dynamic_update_slice(jmin, jnp.min(g.jac.reshape(block, -1), axis=1), (e0,))
        return out, jmin

    return jax.lax.fori_loop(0, -(-E // block), body, (out, jmin))
