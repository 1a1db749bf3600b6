"""Sum-factorized tensor-product contractions on ``[..., e, k, j, i]`` arrays.

``J: (q, n)`` interpolation and ``Dt: (q, n)`` derivative matrices act along one
axis at a time (i is r, j is s, k is t): O(n⁴) work per element instead of n⁶.

:func:`grad_gll_sums` and :func:`grad_gll_t_sums` are :func:`grad_gll` and :func:`grad_gll_t`
written as unrolled sums of scaled slices (``Σ_j D[b, j] u[..., j, :]``) instead of einsums:
the same products summed in another order. On a GPU XLA compiles each direction to one
elementwise pass, where the einsum form becomes batched GEMMs with transposes; on a CPU the
einsum form is the faster. The CUDA backend uses the sums (:meth:`jaxsem.backends.Backend.grad_gll`).
"""

import jax.numpy as jnp


def _i(M, u):
    return jnp.einsum("ai,...kji->...kja", M, u)


def _j(M, u):
    return jnp.einsum("bj,...kji->...kbi", M, u)


def _k(M, u):
    return jnp.einsum("ck,...kji->...cji", M, u)


def interp(u, J):
    """(J ⊗ J ⊗ J) u: ``(..., E, n, n, n)`` → ``(..., E, q, q, q)``."""
    return _k(J, _j(J, _i(J, u)))


def interp_t(v, J):
    """(Jᵀ ⊗ Jᵀ ⊗ Jᵀ) v: ``(..., E, q, q, q)`` → ``(..., E, n, n, n)``."""
    return interp(v, J.T)


def grad_ref(u, J, Dt):
    """Reference gradient at quadrature points: ``(ur, us, ut)``, each ``(..., E, q, q, q)``.

    ur = (J ⊗ J ⊗ Dt) u, us = (J ⊗ Dt ⊗ J) u, ut = (Dt ⊗ J ⊗ J) u, sharing the
    partial contractions.
    """
    ui_J, ui_D = _i(J, u), _i(Dt, u)
    uJJ, uDJ, uJD = _j(J, ui_J), _j(Dt, ui_J), _j(J, ui_D)
    return _k(J, uJD), _k(J, uDJ), _k(Dt, uJJ)


def grad_ref_t(wr, ws, wt, J, Dt):
    """Transpose of :func:`grad_ref`: Σ_a D_aᵀ w_a, ``(..., E, q, q, q)`` → ``(..., E, n, n, n)``."""
    Jt, Dtt = J.T, Dt.T
    a = _k(Jt, wr)
    b = _k(Jt, ws)
    c = _k(Dtt, wt)
    x = _j(Jt, a)  # r-path after k, j
    y = _j(Dtt, b) + _j(Jt, c)
    return _i(Dtt, x) + _i(Jt, y)


def grad_gll(u, D):
    """Collocated reference gradient on GLL points (J = I): ``(ur, us, ut)``."""
    return _i(D, u), _j(D, u), _k(D, u)


def grad_gll_t(wr, ws, wt, D):
    """Transpose of :func:`grad_gll`."""
    Dt = D.T
    return _i(Dt, wr) + _j(Dt, ws) + _k(Dt, wt)


def _i_sums(M, u):
    return sum(M[:, m] * u[..., m:m + 1] for m in range(u.shape[-1]))


def _j_sums(M, u):
    return sum(M[:, m, None] * u[..., m:m + 1, :] for m in range(u.shape[-2]))


def _k_sums(M, u):
    return sum(M[:, m, None, None] * u[..., m:m + 1, :, :] for m in range(u.shape[-3]))


def grad_gll_sums(u, D):
    """:func:`grad_gll` as unrolled sums of scaled slices (one elementwise pass per direction on a GPU)."""
    return _i_sums(D, u), _j_sums(D, u), _k_sums(D, u)


def grad_gll_t_sums(wr, ws, wt, D):
    """:func:`grad_gll_t` as unrolled sums of scaled slices."""
    Dt = D.T
    return _i_sums(Dt, wr) + _j_sums(Dt, ws) + _k_sums(Dt, wt)
