"""Fused DG right-hand sides: the dispatch and derivative rules every fused backend shares.

A backend with fused DG kernels (:class:`FusedDG`: the CUDA backend, and the emulated one that
runs the same rules with einsum values on any platform) supplies three kernels —
``maxwell_kernel``, ``maxwell_material_kernel_vjp`` and ``advection_kernel``, each the value of
the local operator of :mod:`._maxwell_ref` / :mod:`._advection_ref` (neighbours read through
``dg.nbr``) — and inherits from here when they run and how they are differentiated.

Maxwell. The operator is linear in q: rhs(q) = L q with L = M⁻¹K, M = diag(mass·ε, mass·μ) the
energy mass. On affine elements (chain = split curl) K = S + D, S the curl and central-flux
coupling (skew: E ← H and H ← E only) and D the upwind penalty (symmetric, E ← E and H ← H
only), so with P = diag(1, −1) flipping the sign of H, PKP = −S + D = Kᵀ and

    Lᵀ = Kᵀ M⁻¹ = M P L P M⁻¹,

i.e. the transpose is the same kernel between two pointwise scalings. The tangent in q is a
linear primitive (``_linear_p``) whose transpose rule is this identity, so reverse mode costs
one more kernel launch per stage; curved elements (chain form) keep the einsum form's tangent
in q. The tangent in ε, μ and the flux coefficients is another primitive, linear in them
(``_material_p``), whose transpose is one more kernel (the right-hand side computed in place
and contracted with the cotangent); reverse mode then keeps only q, not the right-hand side's
value. The tangent in the geometry (dg) is the einsum form's.

Distributed, the kernel reads the neighbours it has (``dg.nbr``) and mirrors q (Maxwell) or
counts 0 (advection) where the neighbour lives on another rank; the flux is linear in the
jump, so the remote neighbours' part is added on the halo elements afterwards (plain JAX ops
with the exchange, differentiated by JAX). A mirrored face is a boundary face, so the local
operator has the transpose identity above as it stands.

Advection: one kernel for every form and flux; its tangent is the einsum form's.
"""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import _advection_ref as adv_ref
from . import _maxwell_ref as mx_ref

# ----------------------------------------------------------------------------- symbolic zeros


def _symbolic(a) -> bool:
    return isinstance(a, jax.custom_derivatives.SymbolicZero)


def _is_zero(tangent) -> bool:
    """Whether every leaf of a custom_jvp rule's tangent is symbolically zero (``symbolic_zeros=True``)."""
    return all(_symbolic(a) for a in jax.tree_util.tree_leaves(tangent, is_leaf=_symbolic))


def _instantiate(tangent, like):
    """The tangent with its symbolic zeros made arrays shaped like ``like``'s leaves."""
    def zero(p):  # float0 for integer leaves (index maps), as JAX's tangents
        if jnp.issubdtype(p.dtype, jnp.inexact):
            return jnp.zeros_like(p)
        return np.zeros(np.shape(p), jax.dtypes.float0)

    return jax.tree_util.tree_map(lambda a, p: zero(p) if _symbolic(a) else a, tangent, like, is_leaf=_symbolic)


def _batch_by_map(prim):
    """vmap of ``prim``: one launch per batch member (as the kernels' own ``vmap_method="sequential"``)."""
    def batch(args, dims, **params):
        moved = [None if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]

        def one(xs):
            it = iter(xs)
            return prim.bind(*[a if m is None else next(it) for a, m in zip(args, moved)], **params)

        return jax.lax.map(one, [m for m in moved if m is not None]), 0

    return batch


# ----------------------------------------------------------------------------- Maxwell: L q


def _energy_mass(dg, mat):
    """``(6, E, n, n, n)``: M of the note above, mass·ε for E and mass·μ for H."""
    return jnp.stack([dg.mass * mat.eps] * 3 + [dg.mass * mat.mu] * 3)


def _flip_h(q):
    return q * jnp.asarray([1.0] * 3 + [-1.0] * 3, q.dtype)[:, None, None, None, None]


_linear_p = jax.extend.core.Primitive("jaxsem_maxwell_linear")


def _linear(dg, mat, q, flux, bc):
    """L q as the linear primitive (operands: q and the leaves of (dg, mat))."""
    leaves, tree = jax.tree_util.tree_flatten((dg, mat))
    return _linear_p.bind(q, *leaves, tree=tree, flux=flux, bc=bc)


def _linear_impl(q, *leaves, tree, flux, bc):
    dg, mat = jax.tree_util.tree_unflatten(tree, leaves)
    return dg.backend.maxwell_kernel(dg, mat, q, flux, bc)


def _linear_transpose(ct, q, *leaves, tree, flux, bc):
    if any(ad.is_undefined_primal(a) for a in leaves):
        raise NotImplementedError("the fused Maxwell operator is linear in q only")
    if type(ct) is ad.Zero:
        return [ad.Zero(q.aval)] + [None] * len(leaves)
    dg, mat = jax.tree_util.tree_unflatten(tree, leaves)
    m = _energy_mass(dg, mat)
    return [m * _flip_h(_linear(dg, mat, _flip_h(ct / m), flux, bc))] + [None] * len(leaves)


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


_linear_p.def_impl(_linear_impl)
_linear_p.def_abstract_eval(lambda q, *leaves, **params: q)
mlir.register_lowering(_linear_p, mlir.lower_fun(_linear_impl, False))
ad.primitive_jvps[_linear_p] = _linear_jvp
ad.primitive_transposes[_linear_p] = _linear_transpose
batching.primitive_batchers[_linear_p] = _batch_by_map(_linear_p)


# ----------------------------------------------------------------------------- Maxwell: material tangent

_material_p = jax.extend.core.Primitive("jaxsem_maxwell_material_tangent")


def _material_lin(dg, mat, q, dmat, flux, bc):
    """:func:`._maxwell_ref.material_tangent` (at the kernel's value) as the primitive
    (operands: dmat's leaves, q, the leaves of (dg, mat))."""
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
    out = dg.backend.maxwell_kernel(dg, mat, q, flux, bc)
    return mx_ref.material_tangent(dg, mat, q, out, dmat, flux, bc)


def _material_transpose(ct, *args, tree, dtree, flux, bc):
    dleaves, q, dg, mat = _material_args(args, tree, dtree)
    if ad.is_undefined_primal(q) or any(ad.is_undefined_primal(a) for a in args[dtree.num_leaves + 1:]):
        raise NotImplementedError("the fused Maxwell operator's material tangent is linear in the material only")
    rest = [None] * (len(args) - len(dleaves))
    if type(ct) is ad.Zero:
        return [ad.Zero(d.aval) if ad.is_undefined_primal(d) else None for d in dleaves] + rest
    g = jax.tree_util.tree_leaves(dg.backend.maxwell_material_kernel_vjp(dg, mat, q, ct, flux, bc))
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


# ----------------------------------------------------------------------------- Maxwell: the local operator


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _maxwell_local(dg, mat, q, flux, bc):
    """:func:`._maxwell_ref.rhs_local` as the backend's kernel, with the derivative rules above."""
    return dg.backend.maxwell_kernel(dg, mat, q, flux, bc)


def _maxwell_local_jvp(flux, bc, primals, tangents):
    dg, mat, q = primals
    ddg, dmat, dq = tangents
    parts = []
    if not _is_zero(dq):
        dq = _instantiate(dq, q)
        if dg.affine:
            parts.append(_linear(dg, mat, dq, flux, bc))
        else:
            parts.append(jax.jvp(lambda v: mx_ref.rhs_local(dg, mat, v, flux, bc), (q,), (dq,))[1])
    if not _is_zero(dmat):
        parts.append(_material_lin(dg, mat, q, _instantiate(dmat, mat), flux, bc))
    if not _is_zero(ddg):
        ddg = _instantiate(ddg, dg)
        parts.append(jax.jvp(lambda g: mx_ref.rhs_local(g, mat, q, flux, bc), (dg,), (ddg,))[1])
    out = _maxwell_local(dg, mat, q, flux, bc)
    return out, functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(out)


_maxwell_local.defjvp(_maxwell_local_jvp, symbolic_zeros=True)


# ----------------------------------------------------------------------------- advection


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _advection_local(dg, tr, u, flux, form):
    """:func:`._advection_ref.rhs_local` as the backend's kernel; its tangent is the einsum form's."""
    return dg.backend.advection_kernel(dg, tr, u, flux, form)


@_advection_local.defjvp
def _advection_local_jvp(flux, form, primals, tangents):
    _, dw = jax.jvp(lambda dg, tr, u: adv_ref.rhs_local(dg, tr, u, flux, form), primals, tangents)
    return _advection_local(*primals, flux, form), dw


# ----------------------------------------------------------------------------- the mixin


class FusedDG:
    """DG right-hand sides as one fused kernel each (a mixin before :class:`jaxsem.backends.Backend`).

    Maxwell runs fused where the kernel's chain-rule curl is the asked-for operator: the chain
    form, and the split form on affine meshes (``dg.affine``: there the two are the same
    operator); the split form on curved meshes is the einsum reference's. Advection runs fused
    for every form and flux. Distributed, the remote neighbours' flux is added on the halo.
    """

    def maxwell_rhs(self, dg, mat, q, flux, bc, form):
        if dg.nbr is None or not (form == "chain" or dg.affine):
            return super().maxwell_rhs(dg, mat, q, flux, bc, form)
        out = _maxwell_local(dg, mat, q, flux, bc)
        if dg.halo is None:
            return out
        return out.at[:, dg.halo].add(mx_ref.remote_flux(dg, mat, q, flux, bc))

    def advection_rhs(self, dg, tr, u, flux, form):
        if dg.nbr is None:
            return super().advection_rhs(dg, tr, u, flux, form)
        out = _advection_local(dg, tr, u, flux, form)
        if dg.halo is None:
            return out
        return out.at[dg.halo].add(adv_ref.remote_flux(dg, tr, u, flux))
