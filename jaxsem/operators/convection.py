"""The dealiased convective operator, element by element (einsum reference).

For carried fields ``c`` and a carrier velocity ``u`` on GLL points, the element-local weak form
of (u·∇)c on a quadrature rule (the 3/2 rule of the Navier–Stokes convective term, or the GLL
points themselves)::

    w_m = Jᵀ⊗Jᵀ⊗Jᵀ [ Σ_a v_a ⊙ (∂_a c_m)_q ],    v_a = Σ_d Brx[a, d] ⊙ (J⊗J⊗J u_d),

with ``(∂_r c)_q = (J⊗J⊗Dd) c`` (and s, t alike): the reference-space gradient taken on the
rule directly, ``Dd`` the derivative of the GLL interpolant at the rule's points.
:mod:`jaxsem.models.navier_stokes` assembles it (gather–scatter) and divides by the mass.
The CUDA backend runs one fused kernel with this as its reference and derivative rule.
"""

import jax.numpy as jnp

from .tensor import interp_t


def on_rule(u, J, Dd):
    """``(uq, ur, us, ut)``: ``u: (..., E, n, n, n)`` interpolated to the rule and its reference
    gradient there, each ``(..., E, q, q, q)``, the partial contractions shared."""
    e = jnp.einsum
    iJ, iD = e("ai,...kji->...kja", J, u), e("ai,...kji->...kja", Dd, u)
    jJ_iJ, jD_iJ, jJ_iD = (e("bj,...kji->...kbi", M, x) for M, x in ((J, iJ), (Dd, iJ), (J, iD)))
    k = lambda M, x: e("ck,...kji->...cji", M, x)
    return k(J, jJ_iJ), k(J, jJ_iD), k(J, jD_iJ), k(Dd, jJ_iJ)


def advection_local(c, u, J, Dd, Brx):
    """The element-local weak (u·∇)c on the rule, not assembled: ``c: (m, E, n, n, n)`` carried
    by ``u: (3, E, n, n, n)``; ``J, Dd: (q, n)`` interpolation and derivative GLL → rule;
    ``Brx: (3, 3, E, q, q, q)`` B·∂r_a/∂x_d on the rule (weights times Jacobian included).
    Returns ``(m, E, n, n, n)``; linear in ``c``, bilinear in (``u``, ``Brx``)."""
    uq = on_rule(u, J, Dd)[0]
    _, cr, cs, ct = on_rule(c, J, Dd)
    v = [Brx[a, 0] * uq[0] + Brx[a, 1] * uq[1] + Brx[a, 2] * uq[2] for a in range(3)]
    return interp_t(v[0] * cr + v[1] * cs + v[2] * ct, J)
