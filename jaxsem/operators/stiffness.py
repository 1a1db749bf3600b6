"""Stiffness (Laplacian) and Helmholtz operators on curvilinear hexes.

A_e u = Σ_ab D_aᵀ (h₁ G_ab) D_b u with the six symmetric factors
``G: (6, E, q, q, q)`` in the order rr, rs, rt, ss, st, tt (geometry.py).
BK3/BK4 use q = N + 2 Gauss points, BK5/BK6 the collocated GLL points.

On the GLL points of affine elements the factors are constants times the weights:
``G = c ⊙ (w⊗w⊗w)`` with ``c: (6, E, 1, 1, 1)``. The collocated operators take that compact
``c`` in place of ``G`` (:func:`affine_factors`; :func:`full_factors` expands it), so a kernel
need not read 6 values per node.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis

from .mass import mass, mass_diagonal
from .tensor import grad_gll, grad_gll_t, grad_ref, grad_ref_t, interp_t


def _apply_G(G, ur, us, ut, h1):
    if h1 is not None:
        G = G * h1
    wr = G[0] * ur + G[1] * us + G[2] * ut
    ws = G[1] * ur + G[3] * us + G[4] * ut
    wt = G[2] * ur + G[4] * us + G[5] * ut
    return wr, ws, wt


def is_compact(G) -> bool:
    """Whether ``G`` is the compact affine form ``(6, E, 1, 1, 1)`` (:func:`affine_factors`)."""
    return G.shape[-3:] == (1, 1, 1)


def gll_weights3(n: int, dtype) -> jax.Array:
    """``w⊗w⊗w: (n, n, n)``, the products of the ``n`` GLL weights (a constant)."""
    w = basis.gll_points(n - 1)[1]
    return jnp.asarray(np.einsum("k,j,i->kji", w, w, w), dtype)


def full_factors(G, n: int):
    """The factors ``(6, E, n, n, n)`` on the GLL points: ``G`` itself, or the compact affine
    ``c: (6, E, 1, 1, 1)`` times ``w⊗w⊗w``."""
    return G * gll_weights3(n, G.dtype) if is_compact(G) and n > 1 else G


def affine_factors(G, rtol: float = 1e-12):
    """The compact form ``c: (6, E, 1, 1, 1)`` of GLL factors ``G: (6, E, n, n, n)`` (concrete)
    when every element's factors are constants times ``w⊗w⊗w`` (affine elements) to ``rtol``
    of the largest; else None. Computed where ``G`` lives; one number comes to the host."""
    n = G.shape[-1]
    if G.size == 0 or n < 2:
        return None
    w3 = gll_weights3(n, G.dtype)
    c = G[..., :1, :1, :1] / w3[0, 0, 0]
    off, scale = jax.device_get((jnp.max(jnp.abs(G - c * w3)), jnp.max(jnp.abs(G))))
    return c if 0.0 < scale and off <= rtol * scale else None


def with_coefficient(G, h1, n: int):
    """``h₁ G`` keeping the compact affine form where ``h1`` is a scalar or per element
    ``(E, 1, 1, 1)``; a per-node ``h1`` expands it first."""
    if h1 is None:
        return G
    h1 = jnp.asarray(h1)
    if is_compact(G) and h1.ndim >= 3 and h1.shape[-3:] != (1, 1, 1):
        G = full_factors(G, n)
    return G * h1


def stiffness(u, J, Dt, G, h1=None):
    """w = A_e u with quadrature ``J, Dt: (q, n)``; ``u: (..., E, n, n, n)``."""
    return grad_ref_t(*_apply_G(G, *grad_ref(u, J, Dt), h1), J, Dt)


def stiffness_gll(u, D, G, h1=None):
    """w = A_e u collocated on GLL points (BK5): ``D: (n, n)``, ``G: (6, E, n, n, n)`` or the
    compact affine ``(6, E, 1, 1, 1)`` (:func:`full_factors`)."""
    return grad_gll_t(*_apply_G(full_factors(G, u.shape[-1]), *grad_gll(u, D), h1), D)


def _on_assembled(x, idx, element_op):
    """``Qᵀ element_op(Q x)`` for ``x: (..., nf)``: ``Q x`` takes ``x`` at ``idx: (E, n, n, n)``
    (0 where ``idx`` is out of range, the Dirichlet nodes), ``Qᵀ`` sums the copies of each node
    (one ``segment_sum`` per component, dropping out-of-range ids)."""
    u = jnp.take(x, idx, axis=-1, mode="fill", fill_value=0)
    w = element_op(u)
    ids = idx.reshape(-1)
    sums = [jax.ops.segment_sum(v, ids, num_segments=x.shape[-1]) for v in w.reshape((-1, ids.size))]
    return jnp.stack(sums).reshape(x.shape)


def stiffness_gll_assembled(x, idx, D, G, h1=None):
    """BK5 on assembled vectors: ``Qᵀ stiffness_gll(Q x)`` for ``x: (..., nf)``, ``(..., nf)``
    (``Q``, ``Qᵀ`` as in :func:`stiffness_assembled`)."""
    return _on_assembled(x, idx, lambda u: stiffness_gll(u, D, G, h1))


def stiffness_assembled(x, idx, J, Dt, G, h1=None):
    """BK3 on assembled vectors: ``Qᵀ stiffness(Q x)`` for ``x: (..., nf)``, ``(..., nf)``.

    ``Q x`` takes ``x`` at ``idx: (E, n, n, n)`` (the global node of each local node; 0
    where ``idx`` is out of range, the Dirichlet nodes), ``Qᵀ`` sums the copies of each node;
    ``J, Dt: (q, n)``, ``G: (6, E, q, q, q)`` as for :func:`stiffness`.
    """
    return _on_assembled(x, idx, lambda u: stiffness(u, J, Dt, G, h1))


def stiffness_diagonal(J, Dt, G, h1=None):
    """Exact diagonal of :func:`stiffness` (also valid for GLL with J = I, Dt = D).

    diag_m = Σ_ab c_ab Σ_q G_ab(q) (D_a)_qm (D_b)_qm, with each (D_a)_qm(D_b)_qm a
    tensor product of elementwise products of J and Dt columns; c = 2 off the diagonal.
    """
    if h1 is not None:
        G = G * h1
    mats = lambda a: [Dt if d == a else J for d in range(3)]  # along (i, j, k)
    pairs = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))
    out = 0.0
    for g, (a, b) in enumerate(pairs):
        Ma, Mb = mats(a), mats(b)
        Xi, Xj, Xk = (Ma[d] * Mb[d] for d in range(3))
        c = 1.0 if a == b else 2.0
        term = jnp.einsum("ck,bj,ai,ecba->ekji", Xk, Xj, Xi, G[g])
        out = out + c * term
    return out


def helmholtz(u, J, Dt, G, B, h1=1.0, h2=0.0, collocated=False):
    """w = h₁ A_e u + h₂ B_e u (h₁, h₂ scalars or fields at the quadrature points)."""
    if collocated:
        w = stiffness_gll(u, Dt, G, h1)
        return w + (B * h2) * u
    return stiffness(u, J, Dt, G, h1) + mass(u, J, B, h2)


def helmholtz_diagonal(J, Dt, G, B, h1=1.0, h2=0.0):
    """Exact diagonal of :func:`helmholtz`: ``(E, n, n, n)``."""
    return stiffness_diagonal(J, Dt, G, h1) + mass_diagonal(J, B, h2)
