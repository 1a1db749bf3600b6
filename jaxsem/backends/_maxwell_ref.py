"""The SEDG Maxwell right-hand side in einsum form: the reference every backend is tested against.

``q: (6, E, n, n, n)`` [Ex Ey Ez Hx Hy Hz]; ``mat`` the model's material pytree (fields
``eps, mu: (E, n, n, n)`` and the flux coefficients ``cE, aE, cH, aH: (E, 6, n, n)`` with the
lift folded in, :class:`jaxsem.models.maxwell.Material`); ``dg`` a
:class:`jaxsem.discretization.dg.DG`, read through its arrays and face methods. The physics
(fluxes, forms, boundary states) is documented in :mod:`jaxsem.models.maxwell`:

    ε dE/dt = ∇×H + L[ n×(Z⁺ ΔH − α n×ΔE) / (Z⁻ + Z⁺) ]
    μ dH/dt = −∇×E − L[ n×(Y⁺ ΔE + α n×ΔH) / (Y⁻ + Y⁺) ]

Two ways to get the neighbour values:

* :func:`rhs`: the face exchange (``dg.face_exchange``, own + neighbour per face point; one
  packed exchange for all six components), then everything — bulk-synchronous, the faster
  structure for einsum contractions (``docs/multi-gpu.md``, "overlapping communication");
* :func:`rhs_local` + :func:`remote_flux`: the neighbours this rank holds read in place
  through ``dg.nbr`` (remote ones mirrored, as on a boundary face), then the remote
  neighbours' flux added on the halo elements — what a fused kernel computes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..operators.tensor import grad_gll


def ref_derivative(D, u, a):
    """Reference derivative along axis ``a`` (0: r, 1: s, 2: t) of ``u: (..., E, n, n, n)``."""
    return grad_gll(u, D)[a]  # XLA drops the two directions not asked for


def cross(a, b):
    return jnp.stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def curls(dg, q, form: str = "split"):
    """Curls of the two 3-vectors packed in ``q: (6, E, n, n, n)``: ``(∇×E, ∇×H)``.

    ``"chain"``: Σ_a ∇r_a × ∂_a F (the chain rule, NekCEM's form; 18 reference
    derivatives). ``"split"``: the average of that and the conservative form
    (1/J) Σ_a ∂_a(J∇r_a × F) (36 derivatives). By the SBP property of the GLL
    derivative, the split form makes ∫ E·∇×H − H·∇×E a pure surface term on
    curved elements too, so the central flux conserves and the upwind flux
    dissipates the discrete energy exactly; on affine elements (J∇r_a
    constant) both forms are the same operator.
    """
    g = jnp.stack(grad_gll(q, dg.D))  # (3 a, 6 c, E, n, n, n)
    rx = dg.rx  # rx[a, d] = ∂r_a/∂x_d

    def chain(o):
        return sum(cross(rx[a], g[a, o:o + 3]) for a in range(3))

    if form == "chain":
        return chain(0), chain(3)
    Ja = dg.jac * rx  # (3 a, 3 d, ...) = J ∇r_a
    V = [jnp.concatenate([cross(Ja[a], q[:3]), cross(Ja[a], q[3:])]) for a in range(3)]
    cons = sum(ref_derivative(dg.D, V[a], a) for a in range(3)) / dg.jac
    return 0.5 * (chain(0) + cons[:3]), 0.5 * (chain(3) + cons[3:])


def mirror_sign(bc, dtype):
    """``(6, 1, 1, 1, 1)``: the mirror state on a boundary face is this times the own state
    (PEC: E⁺ = −E⁻, H⁺ = H⁻; PMC: E⁺ = E⁻, H⁺ = −H⁻)."""
    sgn = jnp.asarray([-1.0] * 3 + [1.0] * 3 if bc == "pec" else [1.0] * 3 + [-1.0] * 3, dtype)
    return sgn[:, None, None, None, None]


def _face_jumps(dg, q, bc):
    """n × ΔE and n × ΔH on the faces ``(3, E, 6, n, n)`` each (Δ = neighbour − own; mirror
    states on the boundary), the neighbours from the face exchange."""
    qf = dg.faces(q)  # (6, E, 6, n, n): one packed exchange for all components
    dq = dg.face_exchange(qf) - 2.0 * qf + dg.boundary * mirror_sign(bc, q.dtype) * qf
    return cross(dg.normal, dq[:3]), cross(dg.normal, dq[3:])


def local_jumps(dg, q, bc):
    """:func:`_face_jumps` with the neighbours read through ``dg.nbr`` and mirror states where
    ``nbr < 0`` (what the fused kernel computes: distributed, remote neighbours are mirrored)."""
    qf = dg.faces(q)
    nb = jnp.where(dg.nbr >= 0, dg.local_neighbors(q), mirror_sign(bc, q.dtype) * qf)
    dq = nb - qf
    return cross(dg.normal, dq[:3]), cross(dg.normal, dq[3:])


def lifted_flux(dg, normal, c, nxdE, nxdH, flux):
    """The lifted flux terms ``(6, E, n, n, n)`` [E rows, H rows] from the face jumps, the outward
    ``normal: (3, E, 6, n, n)`` and the coefficients ``c.cE, c.aE, c.cH, c.aH`` (the material's,
    or a change of them: the terms are linear in both)."""
    fE = c.cE * nxdH
    fH = -c.cH * nxdE
    if flux == "upwind":
        fE = fE - c.aE * cross(normal, nxdE)
        fH = fH - c.aH * cross(normal, nxdH)
    return dg.lift_faces(jnp.concatenate([fE, fH]))


def _combine(curlE, curlH, lifted, mat):
    return jnp.concatenate([(curlH + lifted[:3]) / mat.eps, (lifted[3:] - curlE) / mat.mu])


def rhs(dg, mat, q, flux, bc, form):
    """dq/dt with the face exchange (bulk-synchronous): the reference right-hand side."""
    curlE, curlH = curls(dg, q, form)
    return _combine(curlE, curlH, lifted_flux(dg, dg.normal, mat, *_face_jumps(dg, q, bc), flux), mat)


def rhs_local(dg, mat, q, flux, bc):
    """The fused kernel's operator in einsum form (chain-rule curls, :func:`local_jumps`): on one
    device :func:`rhs` itself (chain form); distributed, the rank's part with remote neighbours
    mirrored."""
    curlE, curlH = curls(dg, q, "chain")
    return _combine(curlE, curlH, lifted_flux(dg, dg.normal, mat, *local_jumps(dg, q, bc), flux), mat)


def remote_flux(dg, mat, q, flux, bc):
    """``(6, H, n, n, n)``: what the halo elements' right-hand side lacks where
    :func:`rhs_local` mirrored q for a remote neighbour: the lifted flux of the jump's change
    (remote − mirror). One message per neighbour rank (``dg.remote_values``)."""
    h = dg.halo
    rem, is_remote = dg.remote_values(q)  # (6, H, 6, n, n)
    qf = dg.faces(q[:, h])
    dq = jnp.where(is_remote, rem - mirror_sign(bc, q.dtype) * qf, jnp.zeros((), q.dtype))
    normal = dg.normal[:, h]
    c = jax.tree_util.tree_map(lambda a: a[h], mat)
    lifted = lifted_flux(dg, normal, c, cross(normal, dq[:3]), cross(normal, dq[3:]), flux)
    return jnp.concatenate([lifted[:3] / c.eps, lifted[3:] / c.mu])


def material_tangent(dg, mat, q, out, dmat, flux, bc):
    """d :func:`rhs_local` along a change ``dmat`` of ε, μ and the flux coefficients at fixed q;
    ``out`` = rhs_local(q).

    rhs_E = (∇×H + L f_E)/ε and rhs_H = (L f_H − ∇×E)/μ with f linear in the coefficients, so
    d rhs_E = −rhs_E dε/ε + L(df_E)/ε (and the same for H with μ).
    """
    lifted = lifted_flux(dg, dg.normal, dmat, *local_jumps(dg, q, bc), flux)
    return jnp.concatenate([(lifted[:3] - out[:3] * dmat.eps) / mat.eps,
                            (lifted[3:] - out[3:] * dmat.mu) / mat.mu])


def material_vjp(dg, mat, q, ct, flux, bc):
    """The cotangents of ``mat``'s fields (a pytree like ``mat``) for a cotangent ``ct`` of
    :func:`rhs_local` at fixed ``q``: JAX's transpose of :func:`material_tangent`."""
    out = rhs_local(dg, mat, q, flux, bc)
    return jax.linear_transpose(lambda dm: material_tangent(dg, mat, q, out, dm, flux, bc), mat)(ct)[0]


def material_from(mat, g_nodes, g_faces):
    """``mat``'s type holding the kernel's cotangents ``g_nodes: (2, ...)`` (ε, μ) and
    ``g_faces: (4, ...)`` (cE, aE, cH, aH)."""
    return dataclasses.replace(mat, eps=g_nodes[0], mu=g_nodes[1], cE=g_faces[0], aE=g_faces[1],
                               cH=g_faces[2], aH=g_faces[3])
