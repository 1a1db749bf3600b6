"""Stiffness (Laplacian) and Helmholtz operators on curvilinear hexes.

A_e u = Σ_ab D_aᵀ (h₁ G_ab) D_b u with the six symmetric factors
``G: (6, E, q, q, q)`` in the order rr, rs, rt, ss, st, tt (geometry.py).
BK3/BK4 use q = N + 2 Gauss points, BK5/BK6 the collocated GLL points.
"""

import jax
import jax.numpy as jnp

from .mass import mass, mass_diagonal
from .tensor import grad_gll, grad_gll_t, grad_ref, grad_ref_t, interp_t


def _apply_G(G, ur, us, ut, h1):
    if h1 is not None:
        G = G * h1
    wr = G[0] * ur + G[1] * us + G[2] * ut
    ws = G[1] * ur + G[3] * us + G[4] * ut
    wt = G[2] * ur + G[4] * us + G[5] * ut
    return wr, ws, wt


def stiffness(u, J, Dt, G, h1=None):
    """w = A_e u with quadrature ``J, Dt: (q, n)``; ``u: (..., E, n, n, n)``."""
    return grad_ref_t(*_apply_G(G, *grad_ref(u, J, Dt), h1), J, Dt)


def stiffness_gll(u, D, G, h1=None):
    """w = A_e u collocated on GLL points (BK5): ``D: (n, n)``, ``G: (6, E, n, n, n)``."""
    return grad_gll_t(*_apply_G(G, *grad_gll(u, D), h1), D)


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
