"""Mass operator B_e = Jᵀ diag(w·jac) J (BK1 scalar, BK2 vector with q = N + 2 Gauss)."""

import jax.numpy as jnp

from .tensor import interp, interp_t


def mass(u, J, B, h2=None):
    """w = Jᵀ (h₂ B ⊙ J u).

    ``u: (..., E, n, n, n)``, ``J: (q, n)``, ``B: (E, q, q, q)`` mass weights
    (quadrature weights × Jacobian), optional ``h2`` broadcastable to ``B``.
    With ``J = I`` (GLL collocation) this is the diagonal GLL mass.
    """
    Bh = B if h2 is None else B * h2
    return interp_t(Bh * interp(u, J), J)


def mass_diagonal(J, B, h2=None):
    """Exact diagonal of :func:`mass`: ``(E, n, n, n)``, Σ_q B_q J_qi² J_qj² J_qk²."""
    Bh = B if h2 is None else B * h2
    J2 = J * J
    return interp_t(Bh, J2)
