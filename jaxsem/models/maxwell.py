"""Source-free Maxwell equations in spectral-element DG (NekCEM).

    ε ∂E/∂t = ∇×H,    μ ∂H/∂t = −∇×E

on curvilinear hexahedra, strong form, GLL collocation (diagonal mass), after
Hesthaven & Warburton, *Nodal DG* §6.5 and NekCEM (Min & Fischer; Otten et al.
2016). With Δu = u⁺ − u⁻ (⁺ the neighbour, n the outward normal of the own side)
and impedance Z = √(μ/ε), admittance Y = 1/Z on each side:

    ε dE/dt = ∇×H + L[ n×(Z⁺ ΔH − α n×ΔE) / (Z⁻ + Z⁺) ]
    μ dH/dt = −∇×E − L[ n×(Y⁺ ΔE + α n×ΔH) / (Y⁻ + Y⁺) ]

``L`` the lift (:mod:`jaxsem.dg`); α = 1 is the upwind flux (the exact Riemann
solution), α = 0 the central flux (the impedance-weighted averages
H* = (Z⁻H⁻ + Z⁺H⁺)/(Z⁻ + Z⁺), E* = (Y⁻E⁻ + Y⁺E⁺)/(Y⁻ + Y⁺); the plain average in
a uniform medium). With the split-form curl below, the semi-discrete energy
½∫(ε|E|² + μ|H|²) is exactly conserved by the central flux and dissipated by the
upwind flux — on curved elements, with any ε, μ, PEC or periodic.

* Fields are packed as ``q: (6, E, n, n, n)``, components ``Ex Ey Ez Hx Hy Hz``.
* Faces: all six components go through ONE exchange (``exchange(faces(q))``
  returns own + neighbour per face point); pass ``exchange=`` to swap in a
  distributed one. NekCEM writes −n×E and −n×H; writing E and H themselves
  moves the same six words per point and lets the neighbour's impedance enter.
* Boundary faces (not shared, not periodic) are perfect electric conductors by
  mirror states E⁺ = −E⁻, H⁺ = H⁻ (so n×E⁺ = −n×E⁻), or perfect magnetic
  conductors with ``bc="pmc"`` (E⁺ = E⁻, H⁺ = −H⁻). Periodic axes come from the mesh.
* ε, μ: scalars, per element ``(E,)`` or per point ``(E, n, n, n)``; they are
  ordinary arrays, so ``jax.grad`` of any loss of the solution w.r.t. them works.
* The volume curl (``form=``): ``"split"`` (default), the average of the
  chain-rule form Σ_a ∇r_a × ∂_a F and the conservative form
  (1/J) Σ_a ∂_a(J∇r_a × F), energy-stable on curved elements (36 reference
  derivatives); ``"chain"``, NekCEM's chain rule (18 derivatives, as its work
  model counts), the same operator on affine elements but not energy-stable on
  curved ones (random data grows with it on a deformed mesh).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from ..solvers import timestepping as ts
from ..discretization.dg import (DG, Exchange, face_exchange, faces, lift_faces, local_neighbor_values,
                                 neighbor_values, remote_values)
from ..mesh.box import Mesh
from . import _dg_common as common
from ._dg_common import RHO_MARGIN, check_choice, instantiate as _instantiate, is_zero as _is_zero
from ._dg_common import ref_derivative, relative_error

# Source-free with a stable step, the energy (mass norm) does not grow: a thousandfold growth of the
# norm is instability, and ts.run stops there
GROWTH_LIMIT = 1e3

__all__ = [
    "FIELDS",
    "FLUXES",
    "BCS",
    "FORMS",
    "Scheme",
    "Material",
    "material",
    "curl",
    "rhs",
    "make_rhs",
    "energy",
    "spectral_radius",
    "stable_dt",
    "cavity_mode",
    "plane_wave",
    "relative_error",
    "simulate",
    "solve_mode",
    "ModeResult",
    "flops_per_step",
]

FIELDS = ("Ex", "Ey", "Ez", "Hx", "Hy", "Hz")
FLUXES = ("upwind", "central")
BCS = ("pec", "pmc")
FORMS = ("split", "chain")


@dataclasses.dataclass(frozen=True)
class Scheme(common.Scheme):
    """The numerics of a Maxwell run (static, hashable): flux, curl form, time stepper, step size.

    Attributes:
      flux: ``"upwind"`` (default) or ``"central"`` (:data:`FLUXES`).
      form: the volume curl, ``"split"`` (default, energy-stable on curved
        elements) or ``"chain"`` (:data:`FORMS`, see :func:`rhs`).
      method: the Runge–Kutta method (:data:`jaxsem.timestepping.METHODS`, default ``"lserk4"``).
      cfl: Δt as a fraction of the stable limit, 0 < cfl ≤ 1 (default 0.5; when ``dt`` is ``None``).
      dt: a fixed step > 0 that divides the run's ``t_final``, or ``None`` (default)
        for ``cfl`` × the limit, rounded down so that ``t_final`` is hit exactly.

    Raises ``ValueError`` naming the field, the value and what is allowed.
    """

    FLUXES: ClassVar[tuple] = FLUXES
    FORMS: ClassVar[tuple] = FORMS


# ----------------------------------------------------------------------------- material


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Material:
    """ε, μ on the nodes and the flux coefficients they imply (pytree).

    ``eps, mu: (E, n, n, n)``; face coefficients ``(E, 6, n, n)`` with the lift
    folded in: ``cE = L·Z⁺/(Z⁻+Z⁺)``, ``aE = L/(Z⁻+Z⁺)``, ``cH = L·Y⁺/(Y⁻+Y⁺)``,
    ``aH = L/(Y⁻+Y⁺)``.
    """

    eps: jax.Array
    mu: jax.Array
    cE: jax.Array
    aE: jax.Array
    cH: jax.Array
    aH: jax.Array


def _as_nodal(value, dg: DG, name: str):
    shape = (dg.num_elements,) + (dg.n,) * 3
    a = jnp.asarray(value, dg.jac.dtype)
    if a.ndim == 0:
        a = jnp.broadcast_to(a, shape)
    elif a.shape == (dg.num_elements,):
        a = jnp.broadcast_to(a[:, None, None, None], shape)
    elif a.shape != shape:
        raise ValueError(f"{name} must be a scalar, shape ({dg.num_elements},) per element or "
                         f"{shape} per node, got shape {a.shape}")
    # Pad elements of a sharded dg (from_mesh_order fills them with 0) get 1: a vacuum that
    # keeps their fields at 0 and every derivative there finite.
    a = jnp.where(dg.elements[:, None, None, None] >= 0, a, jnp.ones((), a.dtype))
    if not isinstance(a, jax.core.Tracer) and not bool(jnp.all(a > 0)):
        raise ValueError(f"{name} must be positive everywhere, got min {float(jnp.min(a))}")
    return a


def material(dg: DG, eps=1.0, mu=1.0, exchange: Exchange | None = None) -> Material:
    """Nodal ε, μ and the face flux coefficients (one exchange of Z and Y for the ⁺ side).

    On boundary faces the outside medium is the inside one (mirror states).
    """
    eps, mu = _as_nodal(eps, dg, "eps"), _as_nodal(mu, dg, "mu")
    return _material(dg, eps, mu, exchange)


@functools.partial(jax.jit, static_argnums=3)
def _material(dg, eps, mu, exchange):
    Z = jnp.sqrt(mu / eps)
    own = faces(jnp.stack([Z, 1.0 / Z]))  # (2, E, 6, n, n)
    nbr = neighbor_values(dg, own, exchange) + dg.boundary * own
    (Zm, Ym), (Zp, Yp) = own, nbr
    aE = dg.lift / (Zm + Zp)
    aH = dg.lift / (Ym + Yp)
    return Material(eps=eps, mu=mu, cE=Zp * aE, aE=aE, cH=Yp * aH, aH=aH)


# ----------------------------------------------------------------------------- operator


def _cross(a, b):
    return jnp.stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def _curls(dg: DG, q, form: str = "split"):
    """Curls of the two 3-vectors packed in ``q: (6, E, n, n, n)``: ``(∇×E, ∇×H)``.

    ``"chain"``: Σ_a ∇r_a × ∂_a F (the chain rule, NekCEM's form; 18 reference
    derivatives). ``"split"``: the average of that and the conservative form
    (1/J) Σ_a ∂_a(J∇r_a × F) (36 derivatives). By the SBP property of the GLL
    derivative, the split form makes ∫ E·∇×H − H·∇×E a pure surface term on
    curved elements too, so the central flux conserves and the upwind flux
    dissipates the discrete energy exactly; on affine elements (J∇r_a
    constant) both forms are the same operator.
    """
    g = jnp.stack([ref_derivative(dg.D, q, a) for a in range(3)])  # (3 a, 6 c, E, n, n, n)
    rx = dg.rx  # rx[a, d] = ∂r_a/∂x_d

    def chain(o):
        return sum(_cross(rx[a], g[a, o:o + 3]) for a in range(3))

    if form == "chain":
        return chain(0), chain(3)
    Ja = dg.jac * rx  # (3 a, 3 d, ...) = J ∇r_a
    V = [jnp.concatenate([_cross(Ja[a], q[:3]), _cross(Ja[a], q[3:])]) for a in range(3)]
    cons = (ref_derivative(dg.D, V[0], 0) + ref_derivative(dg.D, V[1], 1) + ref_derivative(dg.D, V[2], 2)) / dg.jac
    return 0.5 * (chain(0) + cons[:3]), 0.5 * (chain(3) + cons[3:])


def curl(dg: DG, F, form: str = "split"):
    """Pointwise curl of a 3-vector field ``F: (3, E, n, n, n)`` (no fluxes)."""
    check_choice(form, "form", FORMS)
    return _curls(dg, jnp.concatenate([F, F]), form)[0]


def rhs(dg: DG, mat: Material, q, flux: str = "upwind", bc: str = "pec",
        exchange: Exchange | None = None, form: str = "split"):
    """dq/dt of the semi-discrete Maxwell system, ``q: (6, E, n, n, n)`` → same shape.

    ``form``: the volume curl, ``"split"`` (energy-stable on curved elements,
    default) or ``"chain"`` (NekCEM's chain rule; identical on affine meshes,
    half the derivatives), see :func:`_curls`. The chain form with ``dg.backend`` CUDA and
    the built-in exchange runs as one fused kernel (curls, fluxes with the neighbours'
    values read in place, lift; :func:`jaxsem.backends.cuda.maxwell_rhs_cuda`) whose
    derivatives are those of the einsum form; distributed, the kernel mirrors q where the
    neighbour is remote and the remote neighbours' flux is added on the halo elements.
    """
    check_choice(flux, "flux", FLUXES)
    check_choice(bc, "bc", BCS)
    check_choice(form, "form", FORMS)
    if _fusable(dg, exchange, form):
        return _fused(dg, mat, q, flux, bc)
    return _rhs(dg, mat, q, flux, bc, exchange, form)


# --- the fused kernel and its derivatives ---------------------------------------------------
#
# The operator is linear in q: rhs(q) = L q with L = M⁻¹K, M = diag(mass·ε, mass·μ) the energy
# mass. On affine elements (chain = split curl) K = S + D, S the curl and central-flux coupling
# (skew: E ← H and H ← E only) and D the upwind penalty (symmetric, E ← E and H ← H only), so
# with P = diag(1, −1) flipping the sign of H, PKP = −S + D = Kᵀ and
#
#     Lᵀ = Kᵀ M⁻¹ = M P L P M⁻¹,
#
# i.e. the transpose is the same kernel between two pointwise scalings. Reverse mode through
# the fused operator is then one more kernel launch per stage instead of the einsum form's
# derivative: the tangent in q is a linear primitive (_linear_p) whose transpose rule is this
# identity. Curved elements keep the einsum form's tangent in q. The tangent in ε, μ and the
# flux coefficients is another primitive, linear in them, whose transpose is one more kernel
# (_material_p below); the one in the geometry (dg) is the einsum form's.
#
# Distributed, the kernel reads the neighbours it has (dg.nbr) and mirrors q where the
# neighbour lives on another rank, as on a boundary face of the same kind; the flux is linear
# in the jump, so the remote neighbours' part is added on the halo elements afterwards
# (_remote_flux, plain JAX ops with the exchange: differentiated by JAX). The local operator
# has the transpose identity above as it stands (a mirrored face is a boundary face).


def _kernel_value(dg: DG, mat: Material, q, flux, bc):
    """The operator's value: the fused kernel with ``dg.backend`` CUDA (what :func:`rhs` runs),
    else the einsum form (with which the derivative rules below are tested without a GPU)."""
    if dg.backend.name != "cuda":
        return _rhs_local(dg, mat, q, flux, bc)
    from ..backends import cuda

    return cuda.maxwell_rhs_cuda(q, dg.D, dg.rx, mat.eps, mat.mu, dg.normal, mat.cE, mat.aE, mat.cH, mat.aH,
                                 dg.nbr, flux == "upwind", bc == "pmc")


def _energy_mass(dg: DG, mat: Material):
    """``(6, E, n, n, n)``: M of the note above, mass·ε for E and mass·μ for H."""
    return jnp.stack([dg.mass * mat.eps] * 3 + [dg.mass * mat.mu] * 3)


def _flip_h(q):
    return q * jnp.asarray([1.0] * 3 + [-1.0] * 3, q.dtype)[:, None, None, None, None]


_linear_p = jax.extend.core.Primitive("jaxsem_maxwell_linear")


def _linear(dg: DG, mat: Material, q, flux, bc):
    """L q as the linear primitive (operands: q and the leaves of (dg, mat))."""
    leaves, tree = jax.tree_util.tree_flatten((dg, mat))
    return _linear_p.bind(q, *leaves, tree=tree, flux=flux, bc=bc)


def _linear_impl(q, *leaves, tree, flux, bc):
    dg, mat = jax.tree_util.tree_unflatten(tree, leaves)
    return _kernel_value(dg, mat, q, flux, bc)


def _linear_transpose(ct, q, *leaves, tree, flux, bc):
    if any(ad.is_undefined_primal(a) for a in leaves):
        raise NotImplementedError("the fused Maxwell operator is linear in q only")
    if type(ct) is ad.Zero:
        return [ad.Zero(q.aval)] + [None] * len(leaves)
    dg, mat = jax.tree_util.tree_unflatten(tree, leaves)
    m = _energy_mass(dg, mat)
    ct_q = m * _flip_h(_linear(dg, mat, _flip_h(ct / m), flux, bc))
    return [ct_q] + [None] * len(leaves)


def _linear_jvp(primals, tangents, *, tree, flux, bc):
    if any(type(t) is not ad.Zero for t in tangents[1:]):
        raise NotImplementedError(
            "second derivatives w.r.t. ε, μ or the geometry through the fused Maxwell kernel are not "
            "implemented: discretize_dg(..., backend='einsum') differentiates to any order")
    q, *leaves = primals
    out = _linear_p.bind(q, *leaves, tree=tree, flux=flux, bc=bc)
    dq = tangents[0]
    if type(dq) is ad.Zero:
        return out, jnp.zeros_like(out)
    return out, _linear_p.bind(dq, *leaves, tree=tree, flux=flux, bc=bc)


def _batch_by_map(prim):
    """vmap of ``prim``: one launch per batch member (as the kernel's own ``vmap_method="sequential"``)."""
    def batch(args, dims, **params):
        moved = [None if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]

        def one(xs):
            it = iter(xs)
            return prim.bind(*[a if m is None else next(it) for a, m in zip(args, moved)], **params)

        return jax.lax.map(one, [m for m in moved if m is not None]), 0

    return batch


_linear_p.def_impl(_linear_impl)
_linear_p.def_abstract_eval(lambda q, *leaves, **params: q)
mlir.register_lowering(_linear_p, mlir.lower_fun(_linear_impl, False))
ad.primitive_jvps[_linear_p] = _linear_jvp
ad.primitive_transposes[_linear_p] = _linear_transpose
batching.primitive_batchers[_linear_p] = _batch_by_map(_linear_p)


# The tangent in the material at fixed q, d rhs = M(dmat), is linear in dmat: a primitive too
# (operands: dmat's leaves, q, the leaves of (dg, mat)), so that its transpose, the cotangents of
# ε, μ and the flux coefficients, is one more kernel (cuda.maxwell_material_vjp_cuda: the
# right-hand side computed in place and contracted with the cotangent) instead of the dozens of
# XLA passes JAX's transpose of the written-out form takes; and reverse mode keeps only q, not
# the right-hand side's value. Off the GPU the transpose is JAX's of :func:`_material_tangent`.

_material_p = jax.extend.core.Primitive("jaxsem_maxwell_material_tangent")


def _material_lin(dg: DG, mat: Material, q, dmat: Material, flux, bc):
    """:func:`_material_tangent` (with ``out`` the operator's value at ``q``) as the primitive."""
    dleaves, dtree = jax.tree_util.tree_flatten(dmat)
    leaves, tree = jax.tree_util.tree_flatten((dg, mat))
    return _material_p.bind(*dleaves, q, *leaves, tree=tree, dtree=dtree, flux=flux, bc=bc)


def _material_args(args, tree, dtree):
    nd = dtree.num_leaves
    dg, mat = jax.tree_util.tree_unflatten(tree, args[nd + 1:])
    return args[:nd], args[nd], dg, mat


def _material_impl(*args, tree, dtree, flux, bc):
    dleaves, q, dg, mat = _material_args(args, tree, dtree)
    dmat = jax.tree_util.tree_unflatten(dtree, dleaves)
    return _material_tangent(dg, mat, q, _kernel_value(dg, mat, q, flux, bc), dmat, flux, bc)


def _material_vjp(dg: DG, mat: Material, q, ct, flux, bc) -> Material:
    """The cotangents of the material's fields for a cotangent ``ct`` of rhs at fixed ``q``."""
    if dg.backend.name == "cuda":
        from ..backends import cuda

        gn, gf = cuda.maxwell_material_vjp_cuda(q, ct, dg.D, dg.rx, mat.eps, mat.mu, dg.normal, mat.cE, mat.aE,
                                                mat.cH, mat.aH, dg.nbr, flux == "upwind", bc == "pmc")
        return Material(eps=gn[0], mu=gn[1], cE=gf[0], aE=gf[1], cH=gf[2], aH=gf[3])
    out = _rhs_local(dg, mat, q, flux, bc)
    return jax.linear_transpose(lambda dm: _material_tangent(dg, mat, q, out, dm, flux, bc), mat)(ct)[0]


def _material_transpose(ct, *args, tree, dtree, flux, bc):
    dleaves, q, dg, mat = _material_args(args, tree, dtree)
    if ad.is_undefined_primal(q) or any(ad.is_undefined_primal(a) for a in args[dtree.num_leaves + 1:]):
        raise NotImplementedError("the fused Maxwell operator's material tangent is linear in the material only")
    rest = [None] * (len(args) - len(dleaves))
    if type(ct) is ad.Zero:
        return [ad.Zero(d.aval) if ad.is_undefined_primal(d) else None for d in dleaves] + rest
    g = jax.tree_util.tree_leaves(_material_vjp(dg, mat, q, ct, flux, bc))
    return [gi if ad.is_undefined_primal(d) else None for gi, d in zip(g, dleaves)] + rest


def _material_jvp(primals, tangents, *, tree, dtree, flux, bc):
    nd = dtree.num_leaves
    if any(type(t) is not ad.Zero for t in tangents[nd:]):
        raise NotImplementedError(
            "second derivatives through the fused Maxwell kernel are not implemented: "
            "discretize_dg(..., backend='einsum') differentiates to any order")
    params = dict(tree=tree, dtree=dtree, flux=flux, bc=bc)
    out = _material_p.bind(*primals, **params)
    dts = tangents[:nd]
    if all(type(t) is ad.Zero for t in dts):
        return out, jnp.zeros_like(out)
    dts = [jnp.zeros(p.shape, p.dtype) if type(t) is ad.Zero else t for t, p in zip(dts, primals)]
    return out, _material_p.bind(*dts, *primals[nd:], **params)


_material_p.def_impl(_material_impl)
_material_p.def_abstract_eval(lambda *args, dtree, **params: args[dtree.num_leaves])
mlir.register_lowering(_material_p, mlir.lower_fun(_material_impl, False))
ad.primitive_jvps[_material_p] = _material_jvp
ad.primitive_transposes[_material_p] = _material_transpose
batching.primitive_batchers[_material_p] = _batch_by_map(_material_p)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _fused_rhs(dg: DG, mat: Material, q, flux, bc):
    """:func:`_rhs_local` (chain form; distributed, a rank's part) as :func:`_kernel_value`, with the derivative rules
    of the note above."""
    return _kernel_value(dg, mat, q, flux, bc)


def _tangent(dg: DG, mat: Material, q, tangents, flux, bc):
    """d rhs along ``tangents = (ddg, dmat, dq)`` (SymbolicZero leaves where not perturbed), or
    ``None`` if all are zero."""
    ddg, dmat, dq = tangents
    parts = []
    if not _is_zero(dq):
        dq = _instantiate(dq, q)
        if dg.affine:
            parts.append(_linear(dg, mat, dq, flux, bc))
        else:
            parts.append(jax.jvp(lambda v: _rhs_local(dg, mat, v, flux, bc), (q,), (dq,))[1])
    if not _is_zero(dmat):
        parts.append(_material_lin(dg, mat, q, _instantiate(dmat, mat), flux, bc))
    if not _is_zero(ddg):
        ddg = _instantiate(ddg, dg)
        parts.append(jax.jvp(lambda g: _rhs_local(g, mat, q, flux, bc), (dg,), (ddg,))[1])
    return functools.reduce(jnp.add, parts) if parts else None


def _fused_rhs_jvp(flux, bc, primals, tangents):
    dg, mat, q = primals
    out = _fused_rhs(dg, mat, q, flux, bc)
    tan = _tangent(dg, mat, q, tangents, flux, bc)
    return out, jnp.zeros_like(out) if tan is None else tan


_fused_rhs.defjvp(_fused_rhs_jvp, symbolic_zeros=True)


def _fused(dg: DG, mat: Material, q, flux, bc):
    """The fused kernel, plus on a distributed ``dg`` the remote neighbours' flux on its halo."""
    out = _fused_rhs(dg, mat, q, flux, bc)
    if dg.halo is None:
        return out
    return out.at[:, dg.halo].add(_remote_flux(dg, mat, q, flux, bc))


def _remote_flux(dg: DG, mat: Material, q, flux, bc):
    """``(6, H, n, n, n)``: what the halo elements' right-hand side lacks where the kernel mirrored
    q for a remote neighbour: the lifted flux of the jump's change (remote − mirror)."""
    h = dg.halo
    rem, is_remote = remote_values(dg, q)  # (6, H, 6, n, n)
    qf = faces(q[:, h])
    dq = jnp.where(is_remote, rem - _mirror_sign(bc, q.dtype) * qf, jnp.zeros((), q.dtype))
    normal = dg.normal[:, h]
    c = jax.tree_util.tree_map(lambda a: a[h], mat)
    lifted = _lifted_flux(normal, c, _cross(normal, dq[:3]), _cross(normal, dq[3:]), flux)
    return jnp.concatenate([lifted[:3] / c.eps, lifted[3:] / c.mu])


def _fusable(dg: DG, exchange, form) -> bool:
    """Whether :func:`rhs` runs as the fused kernel for this ``dg`` and options."""
    return form == "chain" and exchange is None and dg.nbr is not None and dg.backend.name == "cuda"


def _material_tangent(dg: DG, mat: Material, q, out, dmat: Material, flux, bc):
    """d rhs along a change ``dmat`` of ε, μ and the flux coefficients at fixed q; ``out`` = rhs(q).

    rhs_E = (∇×H + L f_E)/ε and rhs_H = (L f_H − ∇×E)/μ with f linear in the coefficients, so
    d rhs_E = −rhs_E dε/ε + L(df_E)/ε (and the same for H with μ).
    """
    lifted = _lifted_flux(dg.normal, dmat, *_local_jumps(dg, q, bc), flux)
    return jnp.concatenate([(lifted[:3] - out[:3] * dmat.eps) / mat.eps,
                            (lifted[3:] - out[3:] * dmat.mu) / mat.mu])


def _mirror_sign(bc, dtype):
    """``(6, 1, 1, 1, 1)``: the mirror state on a boundary face is this times the own state."""
    sgn = jnp.asarray([-1.0] * 3 + [1.0] * 3 if bc == "pec" else [1.0] * 3 + [-1.0] * 3, dtype)
    return sgn[:, None, None, None, None]


def _face_jumps(dg: DG, q, bc, exchange):
    """n × ΔE and n × ΔH on the faces ``(3, E, 6, n, n)`` each (Δ = neighbour − own; mirror
    states on the boundary)."""
    ex = (lambda v: face_exchange(dg, v)) if exchange is None else exchange
    qf = faces(q)  # (6, E, 6, n, n): one packed exchange for all components
    dq = ex(qf) - 2.0 * qf + dg.boundary * _mirror_sign(bc, q.dtype) * qf  # neighbour − own
    return _cross(dg.normal, dq[:3]), _cross(dg.normal, dq[3:])


def _local_jumps(dg: DG, q, bc):
    """:func:`_face_jumps` with the neighbours read through ``dg.nbr`` and mirror states where
    ``nbr < 0`` (what the fused kernel computes: distributed, remote neighbours are mirrored)."""
    qf = faces(q)
    nb = jnp.where(dg.nbr >= 0, local_neighbor_values(dg, q), _mirror_sign(bc, q.dtype) * qf)
    dq = nb - qf
    return _cross(dg.normal, dq[:3]), _cross(dg.normal, dq[3:])


def _lifted_flux(normal, c: Material, nxdE, nxdH, flux):
    """The lifted flux terms ``(6, E, n, n, n)`` [E rows, H rows] from the face jumps, the outward
    ``normal: (3, E, 6, n, n)`` and the coefficients ``c.cE, c.aE, c.cH, c.aH`` (the material's,
    or a change of them: the terms are linear in both)."""
    fE = c.cE * nxdH
    fH = -c.cH * nxdE
    if flux == "upwind":
        fE = fE - c.aE * _cross(normal, nxdE)
        fH = fH - c.aH * _cross(normal, nxdH)
    return lift_faces(jnp.concatenate([fE, fH]))


def _rhs(dg: DG, mat: Material, q, flux, bc, exchange, form):
    """:func:`rhs` with einsum contractions and the face exchange (the reference)."""
    curlE, curlH = _curls(dg, q, form)
    lifted = _lifted_flux(dg.normal, mat, *_face_jumps(dg, q, bc, exchange), flux)
    return jnp.concatenate([(curlH + lifted[:3]) / mat.eps, (lifted[3:] - curlE) / mat.mu])


def _rhs_local(dg: DG, mat: Material, q, flux, bc):
    """The fused kernel's operator in einsum form (chain-rule curls, :func:`_local_jumps`): on one
    device :func:`_rhs` itself; distributed, the rank's part with remote neighbours mirrored."""
    curlE, curlH = _curls(dg, q, "chain")
    lifted = _lifted_flux(dg.normal, mat, *_local_jumps(dg, q, bc), flux)
    return jnp.concatenate([(curlH + lifted[:3]) / mat.eps, (lifted[3:] - curlE) / mat.mu])


@functools.lru_cache(maxsize=None)
def make_rhs(flux: str = "upwind", bc: str = "pec", exchange: Callable | None = None, form: str = "split"):
    """``f(t, q, (dg, mat))`` for :func:`jaxsem.timestepping.run` (cached: one object per options).

    ``exchange`` here is a function ``(dg, fu) -> Σ copies`` (default
    :func:`jaxsem.dg.face_exchange`).
    """
    check_choice(flux, "flux", FLUXES)
    check_choice(bc, "bc", BCS)
    check_choice(form, "form", FORMS)
    return common.rhs_fn(rhs, exchange, flux=flux, bc=bc, form=form)


@jax.jit
def energy(dg: DG, mat: Material, q):
    """Electromagnetic energy ½ ∫ (ε|E|² + μ|H|²) dx with the GLL rule (summed over all ranks)."""
    local = jnp.sum(dg.mass * (mat.eps * jnp.sum(q[:3] ** 2, 0) + mat.mu * jnp.sum(q[3:] ** 2, 0)))
    return 0.5 * dg.comm.allreduce(local)


def _energy_inner(u, v, args):
    dg, mat = args
    local = jnp.sum(dg.mass * (mat.eps * jnp.sum(u[:3] * v[:3], 0) + mat.mu * jnp.sum(u[3:] * v[3:], 0)))
    return dg.comm.allreduce(local)


def spectral_radius(dg: DG, mat: Material, flux: str = "upwind", bc: str = "pec", iterations: int = 60,
                    form: str = "split") -> float:
    """Power-iteration estimate of ρ of the semi-discrete operator, in the energy norm.

    Distributed, each rank starts from its elements' part of the serial start
    vector and the inner products all-reduce, so every rank gets the serial ρ
    (up to the order of the sums).
    """
    return common.spectral_radius(dg, make_rhs(flux, bc, None, form), (dg, mat), _energy_inner, lead=(6,),
                                  iterations=iterations)


def stable_dt(dg: DG, mat: Material, flux: str = "upwind", bc: str = "pec", method: str = "lserk4",
              rho: float | None = None, form: str = "split") -> float:
    """The stable time-step limit ``stability_radius(method) / (1.05 ρ)``.

    The split-form operator is dissipative (upwind) or skew (central) in the
    energy norm, so its spectrum lies in the closed left half-plane and the
    half-disk radius of :func:`jaxsem.timestepping.stability_radius` applies.
    """
    rho = spectral_radius(dg, mat, flux, bc, form=form) if rho is None else rho
    return ts.cfl_dt(RHO_MARGIN * rho, method, 1.0)


# ----------------------------------------------------------------------------- exact solutions


def _hashable(*vals):
    return tuple(tuple(float(a) for a in v) if np.ndim(v) else float(v) for v in vals)


def cavity_mode(x, t, lengths=(1.0, 1.0, 1.0), mode=(1, 1, 1), amplitude=(1.0, 1.0, -2.0),
                eps=1.0, mu=1.0):
    """A standing mode of the PEC box ``[0, L]³``: ``(6, ...)`` fields at ``x: (3, ...)``.

    k = π(m/Lx, n/Ly, p/Lz), E = A ⊙ (cos sin sin, sin cos sin, sin sin cos)(k·x) cos ωt
    with A ⊥ k (the given amplitude minus its k component), H = −(∇×E₀) sin ωt / (μω),
    ω = |k|/√(εμ). Default: the (1,1,1) mode with A = (1, 1, −2), all six
    components non-zero.
    """
    return _cavity_mode(x, t, *_hashable(lengths, mode, amplitude, eps, mu))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _cavity_mode(x, t, lengths, mode, amplitude, eps, mu):
    k = np.pi * np.asarray(mode, float) / np.asarray(lengths, float)
    A = np.asarray(amplitude, float)
    A = A - (A @ k) / (k @ k) * k
    w = math.sqrt(k @ k / (eps * mu))
    s = [jnp.sin(k[d] * x[d]) for d in range(3)]
    c = [jnp.cos(k[d] * x[d]) for d in range(3)]
    E0 = jnp.stack([A[0] * c[0] * s[1] * s[2], A[1] * s[0] * c[1] * s[2], A[2] * s[0] * s[1] * c[2]])
    kA = np.cross(k, A)  # ∇×E₀ = (k×A) ⊙ (sin cos cos, cos sin cos, cos cos sin)
    cE0 = jnp.stack([kA[0] * s[0] * c[1] * c[2], kA[1] * c[0] * s[1] * c[2], kA[2] * c[0] * c[1] * s[2]])
    return jnp.concatenate([E0 * jnp.cos(w * t), -cE0 * jnp.sin(w * t) / (mu * w)])


def plane_wave(x, t, lengths=(1.0, 1.0, 1.0), wavenumber=(1, 1, 0), amplitude=(1.0, -1.0, 1.0),
               eps=1.0, mu=1.0):
    """A plane wave in the periodic box: ``E = A sin(k·x − ωt)``, ``H = k̂×E / Z``.

    k = 2π(m/Lx, n/Ly, p/Lz), A made ⊥ k, ω = |k|/√(εμ), Z = √(μ/ε).
    """
    return _plane_wave(x, t, *_hashable(lengths, wavenumber, amplitude, eps, mu))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _plane_wave(x, t, lengths, wavenumber, amplitude, eps, mu):
    k = 2 * np.pi * np.asarray(wavenumber, float) / np.asarray(lengths, float)
    A = np.asarray(amplitude, float)
    A = A - (A @ k) / (k @ k) * k
    w = math.sqrt(k @ k / (eps * mu))
    Z = math.sqrt(mu / eps)
    ph = jnp.sin(k[0] * x[0] + k[1] * x[1] + k[2] * x[2] - w * t)
    B = np.cross(k / np.linalg.norm(k), A) / Z
    return jnp.stack([A[0] * ph, A[1] * ph, A[2] * ph, B[0] * ph, B[1] * ph, B[2] * ph])


# ----------------------------------------------------------------------------- drivers


def flops_per_step(order: int, num_elements: int) -> float:
    """NekCEM's work model (Otten et al. 2016, eq. 16): [180(N+1) + 420]·n, n = E(N+1)³."""
    return (180.0 * (order + 1) + 420.0) * num_elements * (order + 1) ** 3


def simulate(dg: DG, mat: Material, q0, t_final: float, *, scheme: Scheme = Scheme(), bc: str = "pec",
             rho: float | None = None, options: ts.RunOptions = ts.RunOptions()):
    """Advance ``q0: (6, E, n, n, n)`` to ``t_final`` with the guarded driver; return ``(q, RunInfo, dt)``.

    Δt = ``scheme.cfl`` × the stable limit (rounded down so that ``t_final`` is
    hit exactly) unless ``scheme.dt`` is given; a ``dt`` above the limit is
    refused with the limit in the message. ``rho``: the spectral radius, if
    known (else a power iteration finds it). ``options``: chunks, progress and
    checkpoint files (:class:`jaxsem.timestepping.RunOptions`); checkpoints carry
    flux, form, bc, order, dtype, element count and fingerprints of the mesh and
    of ε, μ, and a resume under any other value is refused.
    """
    common.check_scheme(scheme, Scheme)
    check_choice(bc, "bc", BCS)
    common.check_t_final(t_final)
    limit = stable_dt(dg, mat, scheme.flux, bc, scheme.method, rho, scheme.form)
    dt, steps = ts.plan_steps(t_final, limit, scheme.method, scheme.cfl, scheme.dt)

    def meta():
        return dict(flux=scheme.flux, form=scheme.form, bc=bc, **common.dg_meta(dg),
                    material=common.fingerprint(dg.host(mat.eps), dg.host(mat.mu)))

    options = common.run_options(options, limit, "maxwell", meta)
    q, info = ts.run(make_rhs(scheme.flux, bc, None, scheme.form), q0, dt, steps, args=(dg, mat),
                     method=scheme.method, options=options, comm=dg.comm,
                     growth_limit=GROWTH_LIMIT, norm=common.mass_norm(dg))
    return q, info, dt


class ModeResult(NamedTuple):
    """Outcome of :func:`solve_mode`: global error, steps, Δt and its limit, stepping seconds, energies, mesh size."""

    error_l2: float
    steps: int
    dt: float
    dt_limit: float
    seconds: float
    energy0: float
    energy: float
    num_elements: int
    order: int


def solve_mode(mesh: Mesh, t_final: float = 0.5, *, mode=None, scheme: Scheme = Scheme(), dtype=jnp.float64,
               options: ts.RunOptions = ts.RunOptions(), **place):
    """Exact-mode verification run in a box: PEC cavity mode or periodic plane wave; ``(dg, q, ModeResult)``.

    ``mesh``: a :func:`jaxsem.box_mesh` filling ``[0, L]³`` (any order, elements,
    deform). Closed on every axis: the PEC cavity mode :func:`cavity_mode`
    (``mode`` default (1, 1, 1)); periodic on every axis: the plane wave
    :func:`plane_wave` (``mode`` = wavenumber, default (1, 1, 0)).
    ``place``: ``comm=``, ``partition=`` or ``devices=`` of
    :func:`jaxsem.discretize_dg` (a distributed run: ``q`` is this rank's part,
    the error and energies are global). ``seconds`` counts the time stepping
    only (compiled beforehand).
    """
    lengths = common.box_lengths(mesh, "solve_mode")
    if len(set(mesh.periodic)) != 1:
        raise ValueError(f"solve_mode: mesh must be closed (PEC cavity) or periodic (plane wave) on every axis, "
                         f"got periodic={mesh.periodic}")
    common.check_scheme(scheme, Scheme)
    dg = common.discretize(mesh, dtype, place, "solve_mode")
    mat = material(dg)
    if mesh.periodic[0]:
        exact = functools.partial(plane_wave, lengths=lengths, wavenumber=mode or (1, 1, 0))
    else:
        exact = functools.partial(cavity_mode, lengths=lengths, mode=mode or (1, 1, 1))
    q0 = exact(dg.x, 0.0).astype(dg.jac.dtype)
    rho = spectral_radius(dg, mat, scheme.flux, form=scheme.form)
    limit = stable_dt(dg, mat, scheme.flux, method=scheme.method, rho=rho)
    # Compile the stepping loop (one step, same function and shapes) so ``seconds`` is pure stepping.
    ts.run(make_rhs(scheme.flux, "pec", None, scheme.form), q0, limit / 2, 1, args=(dg, mat), method=scheme.method)
    q, info, dt = simulate(dg, mat, q0, t_final, scheme=scheme, rho=rho, options=options)
    err = relative_error(dg, q, exact(dg.x, t_final))
    return dg, q, ModeResult(err, info.steps, dt, limit, info.seconds, float(energy(dg, mat, q0)),
                             float(energy(dg, mat, q)), mesh.num_elements, dg.order)
