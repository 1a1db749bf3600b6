"""Hand-written CUDA kernels for BK1–BK6, called through the XLA FFI.

Sources, variants, tuning table, build and loading: :mod:`jaxsem.backends._cuda_build`.

Same contracts as the einsum references:

* :func:`stiffness_gll_cuda` — :func:`~jaxsem.operators.stiffness.stiffness_gll` (BK5/BK6)
* :func:`mass_cuda` — :func:`~jaxsem.operators.mass.mass` (BK1/BK2, q = n + 1)
* :func:`stiffness_cuda` — :func:`~jaxsem.operators.stiffness.stiffness` (BK3/BK4, q = n + 1)
* :func:`gs_csr_cuda` — the gather–scatter QQᵀ as one gather (layout ``"csr"`` of
  :mod:`jaxsem.discretization.gather_scatter`)
* :func:`interp_cuda` — :func:`~jaxsem.operators.tensor.interp` and ``interp_t`` between two
  orders (the p-multigrid transfers)

the dealiased Navier–Stokes convective term :func:`convection_cuda` —
:func:`~jaxsem.operators.convection.advection_local` — and the fused DG right-hand sides :func:`maxwell_rhs_cuda` (with its material adjoint
:func:`maxwell_material_vjp_cuda`) and :func:`advection_rhs_cuda`, whose derivative rules
are the backend's (:mod:`jaxsem.backends._fused_dg`).

``u: (..., E, n, n, n)`` float64 or float32 with 2 ≤ n ≤ 16; the leading axes
(vector components) run inside one launch, so the geometric factors leave
memory once per element.

Build, tuning and loading: :mod:`jaxsem.backends._cuda_build` (``$JAXSEM_CUDA_CACHE``,
``$JAXSEM_CUDA_LIB``, :func:`build`, :data:`TUNING`).

Differentiation: a custom JVP whose tangent is the einsum reference's, so forward
and reverse mode work and implicit solves can transpose it.
"""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from ..core import basis
from ..operators.convection import advection_local
from ._fused_dg import _batch_by_map, _symbolic
from ..operators.mass import mass
from ..operators.tensor import interp, interp_t
from ..operators.stiffness import (is_compact, stiffness, stiffness_assembled, stiffness_gll,
                                   stiffness_gll_assembled, with_coefficient)
from ._cuda_build import (DEFAULT, DERIVATIVE_OPS, MAX_N, OPS, PREFETCH_L2, SOURCE, TRANSFER_OPS, TUNING, VARIANTS, _attr,
                          _ffi_target, build, cuda_available, cuda_supported, defaults, libraries)
from ._cuda_build import _cached  # noqa: F401  (the cache's path, read by tests/test_kernel_cache.py)

__all__ = ["build", "cuda_available", "cuda_supported", "defaults", "stiffness_gll_cuda",
           "stiffness_gll_assembled_cuda", "maxwell_rhs_cuda", "advection_rhs_cuda", "mass_cuda",
           "stiffness_cuda", "stiffness_assembled_cuda", "gs_csr_cuda", "interp_cuda", "transfer_supported",
           "convection_cuda", "convection_vjp_cuda",
           "convection_vjp_reference", "convection_emulated", "convection_q", "maxwell_material_vjp_cuda", "libraries",
           "SOURCE", "MAX_N", "OPS", "DERIVATIVE_OPS", "TRANSFER_OPS", "VARIANTS", "TUNING", "DEFAULT", "PREFETCH_L2", "ADVECTION_FORMS"]


def _call(op: str, attr: int, u, *args):
    """One launch on ``u`` with its leading axes flattened into C components; ``attr``: the
    variant with bit :data:`PREFETCH_L2`."""
    E, n = u.shape[-4], u.shape[-1]
    u5 = u.reshape((-1, E, n, n, n))
    call = jax.ffi.ffi_call(_ffi_target(op, u.dtype, n), jax.ShapeDtypeStruct(u5.shape, u5.dtype),
                            vmap_method="sequential")
    return call(u5, *args, variant=np.int32(attr)).reshape(u.shape)


def _dq(J, Dt):
    """Collocated derivative on the Gauss points: ``D_q J = Dt``; full-precision products
    (XLA's default FP32 dot on a GPU is TF32)."""
    mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    return mm(Dt, jnp.linalg.solve(mm(J.T, J), J.T))


def _reference(op, u, M1, M2, data):
    if op == "bk5":
        return stiffness_gll(u, M2, data)
    if op == "mass":
        return mass(u, M1, data)
    return stiffness(u, M1, M2, data)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _apply(u, M1, M2, data, op, attr):
    if op == "stiffness":
        return _call(op, attr, u, M1, _dq(M1, M2), data)
    return _call(op, attr, u, M1, data)


@_apply.defjvp
def _apply_jvp(op, attr, primals, tangents):  # tangent: the einsum reference's (transposable)
    _, dw = jax.jvp(lambda *a: _reference(op, *a), primals, tangents)
    return _apply(*primals, op, attr), dw


def _entry(name, op, u, J) -> int:
    """Check the call, then return its FFI attribute (:func:`_attr`)."""
    if not cuda_supported(u, J):
        raise ValueError(f"{name} supports u: (..., E, n, n, n) float32/float64 with 2 <= n <= {MAX_N}"
                         + ("" if J is None else " and J: (n + 1, n)")
                         + f"; got u {u.shape} {u.dtype}" + ("" if J is None else f", J {J.shape}"))
    attr = _attr(op, u)
    if not cuda_available():
        raise ValueError(f"{name}: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use backend='einsum'")
    return attr


# Bit of the FFI attribute "variant": G is the compact affine form and D carries the GLL weights
# (csrc/sem_kernels.cu: bk5_element_kernel's AFF); the element variants only.
AFFINE = 128
_ELEMENT_VARIANTS = (2, 4, 5, 6, 7)


def _affine_operands(attr: int, D, n: int):
    """For compact affine factors: the attribute with bit :data:`AFFINE` (an element variant:
    the table's where it is one, else 2) and the kernel's ``D`` operand, D then the weights."""
    v = attr & ~PREFETCH_L2
    if v not in _ELEMENT_VARIANTS:
        attr = (attr & PREFETCH_L2) | 2
    w = jnp.asarray(basis.gll_points(n - 1)[1], D.dtype)
    return attr | AFFINE, jnp.concatenate([D.reshape(-1), w])


def stiffness_gll_cuda(u, D, G, h1=None):
    """BK5/BK6 ``w = Σ_ab D_aᵀ h₁G_ab D_b u`` on GLL points (same result as :func:`stiffness_gll`).

    ``u: (..., E, n, n, n)``, ``D: (n, n)``, ``G: (6, E, n, n, n)`` or the compact affine
    ``(6, E, 1, 1, 1)`` (then the kernel recomputes the factors from the weights instead of
    reading them); ``h1`` folded into G. The kernel: :func:`defaults` ``("bk5", u)``.
    """
    attr = _entry("stiffness_gll_cuda", "bk5", u, None)
    n = u.shape[-1]
    G = with_coefficient(G, h1, n).astype(u.dtype)
    D = D.astype(u.dtype)
    Dk = D
    if is_compact(G):
        attr, Dk = _affine_operands(attr, D, n)
    return _apply(u, Dk, D, G, "bk5", attr)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _apply_assembled(x, idx, Dk, D, G, attr):  # Dk: the kernel's D operand (with the weights if affine)
    x2 = x.reshape((-1, x.shape[-1]))
    call = jax.ffi.ffi_call(_ffi_target("bk5a", x.dtype, idx.shape[-1]), jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                            vmap_method="sequential")
    return call(x2, idx, Dk, G, variant=np.int32(attr)).reshape(x.shape)


@_apply_assembled.defjvp
def _apply_assembled_jvp(attr, primals, tangents):
    x, idx, Dk, D, G = primals
    dx, _, _, dD, dG = tangents
    _, dw = jax.jvp(lambda x, D, G: stiffness_gll_assembled(x, idx, D, G), (x, D, G), (dx, dD, dG))
    return _apply_assembled(x, idx, Dk, D, G, attr), dw


def stiffness_gll_assembled_cuda(x, idx, D, G, h1=None):
    """BK5/BK6 on assembled vectors: ``Qᵀ (Σ_ab D_aᵀ h₁G_ab D_b) Q x`` in one launch.

    ``x: (..., nf)`` one value per global node; ``idx: (E, n, n, n)`` int32, the global node of
    each local node (``nf`` or more: a Dirichlet node, read as 0 and never written);
    ``D: (n, n)``, ``G: (6, E, n, n, n)`` or the compact affine ``(6, E, 1, 1, 1)`` (as for
    :func:`stiffness_gll_cuda`). Returns ``(..., nf)``. The kernel adds element outputs with
    atomics, so the last bits of a result may differ from run to run.
    """
    n = idx.shape[-1]
    if x.dtype not in (jnp.float32, jnp.float64) or idx.dtype != jnp.int32 or idx.ndim != 4 or not 2 <= n <= MAX_N:
        raise ValueError(f"stiffness_gll_assembled_cuda supports x: (..., nf) float32/float64 and idx: (E, n, n, n) "
                         f"int32 with 2 <= n <= {MAX_N}; got x {x.shape} {x.dtype}, idx {idx.shape} {idx.dtype}")
    if not cuda_available():
        raise ValueError("stiffness_gll_assembled_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use backend='einsum'")
    u_like = jax.ShapeDtypeStruct(x.shape[:-1] + idx.shape, x.dtype)
    attr = _attr("bk5a", u_like)
    G = with_coefficient(G, h1, n).astype(x.dtype)
    D = D.astype(x.dtype)
    Dk = D
    if is_compact(G):
        attr, Dk = _affine_operands(attr, D, n)
    return _apply_assembled(x, idx, Dk, D, G, attr)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _apply_stiffness_assembled(x, idx, J, Dt, G, attr):
    x2 = x.reshape((-1, x.shape[-1]))
    call = jax.ffi.ffi_call(_ffi_target("stiffnessa", x.dtype, idx.shape[-1]),
                            jax.ShapeDtypeStruct(x2.shape, x2.dtype), vmap_method="sequential")
    return call(x2, idx, J, _dq(J, Dt), G, variant=np.int32(attr)).reshape(x.shape)


@_apply_stiffness_assembled.defjvp
def _apply_stiffness_assembled_jvp(attr, primals, tangents):
    x, idx, J, Dt, G = primals
    dx, _, dJ, dDt, dG = tangents
    _, dw = jax.jvp(lambda x, J, Dt, G: stiffness_assembled(x, idx, J, Dt, G), (x, J, Dt, G), (dx, dJ, dDt, dG))
    return _apply_stiffness_assembled(x, idx, J, Dt, G, attr), dw


def stiffness_assembled_cuda(x, idx, J, Dt, G, h1=None):
    """BK3/BK4 on assembled vectors: ``Qᵀ stiffness(Q x)`` on q = n + 1 Gauss points in one launch.

    ``x: (..., nf)`` one value per global node; ``idx: (E, n, n, n)`` int32 as for
    :func:`stiffness_gll_assembled_cuda`; ``J, Dt: (n + 1, n)``, ``G: (6, E, q, q, q)``.
    Returns ``(..., nf)``; as there, the last bits may differ from run to run (atomics).
    """
    n = idx.shape[-1]
    if x.dtype not in (jnp.float32, jnp.float64) or idx.dtype != jnp.int32 or idx.ndim != 4 or not 2 <= n <= MAX_N:
        raise ValueError(f"stiffness_assembled_cuda supports x: (..., nf) float32/float64 and idx: (E, n, n, n) "
                         f"int32 with 2 <= n <= {MAX_N}; got x {x.shape} {x.dtype}, idx {idx.shape} {idx.dtype}")
    if tuple(J.shape) != (n + 1, n) or tuple(Dt.shape) != (n + 1, n):
        raise ValueError(f"stiffness_assembled_cuda: J and Dt must be ({n + 1}, {n}) for n = {n}, "
                         f"got {J.shape}, {Dt.shape}")
    if not cuda_available():
        raise ValueError("stiffness_assembled_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use backend='einsum'")
    attr = _attr("stiffnessa", jax.ShapeDtypeStruct(x.shape[:-1] + idx.shape, x.dtype))
    if h1 is not None:
        G = G * h1
    return _apply_stiffness_assembled(x, idx, J.astype(x.dtype), Dt.astype(x.dtype), G.astype(x.dtype), attr)


def convection_q(n: int) -> int:
    """The rule size of :func:`convection_cuda` for ``n`` GLL points a direction: the 3/2 rule, ⌈3n/2⌉."""
    return (3 * n + 1) // 2


# attr < 0 (EMULATED): the kernels' values from the einsum form, the derivative rules unchanged
EMULATE = -1


def _conv_kernel(c, u, J, Dd, Brx, attr):
    if attr == EMULATE:
        return advection_local(c, u, J, Dd, Brx)
    call = jax.ffi.ffi_call(_ffi_target("conv", c.dtype, c.shape[-1]), jax.ShapeDtypeStruct(c.shape, c.dtype),
                            vmap_method="sequential")
    return call(c, u, J, Dd, Brx, variant=np.int32(attr))


def _convt_kernel(g, c, u, J, Dd, Brx, attr):
    if attr == EMULATE:
        return convection_vjp_reference(g, c, u, J, Dd, Brx)
    out = (jax.ShapeDtypeStruct(c.shape, c.dtype), jax.ShapeDtypeStruct(u.shape, u.dtype))
    call = jax.ffi.ffi_call(_ffi_target("convt", c.dtype, c.shape[-1]), out, vmap_method="sequential")
    return call(g, c, u, J, Dd, Brx, variant=np.int32(attr))


def convection_vjp_reference(g, c, u, J, Dd, Brx):
    """``(c̄, ū)``: the cotangents of ``c`` and ``u`` for a cotangent ``g`` of
    :func:`~jaxsem.operators.convection.advection_local` (its einsum VJP; what the kernel of
    :func:`convection_vjp_cuda` computes)."""
    return jax.vjp(lambda c, u: advection_local(c, u, J, Dd, Brx), c, u)[1](g)


def convection_vjp_cuda(g, c, u, J, Dd, Brx):
    """The convective term's VJP in ``(c, u)`` in one launch: for a cotangent ``g: (m, E, n, n, n)``
    of :func:`convection_cuda` ``(c, u, J, Dd, Brx)``, ``(c̄, ū)`` shaped like ``c`` and ``u``
    (equal to :func:`convection_vjp_reference`). The rule's fields stay on chip."""
    _convection_checks("convection_vjp_cuda", c, u, J, Dd, Brx)
    if g.shape != c.shape:
        raise ValueError(f"convection_vjp_cuda: g must be shaped like c {c.shape}, got {g.shape}")
    return _convt_kernel(g.astype(c.dtype), c, *(a.astype(c.dtype) for a in (u, J, Dd, Brx)), _attr("conv", c))


# The tangent of the convective term in (c, u), A(dc, u) + A(c, du), as a linear primitive whose
# transpose is the convt kernel (one launch for both cotangents); its operands (dc, du, c, u, J, Dd,
# Brx), ``live``: which of dc, du are tangents (a missing one is zeros and skipped).
_conv_lin_p = jax.extend.core.Primitive("jaxsem_convection_linear")


def _conv_lin_impl(dc, du, c, u, J, Dd, Brx, *, live, attr):
    out = None
    if live[0]:
        out = _conv_kernel(dc, u, J, Dd, Brx, attr)
    if live[1]:
        w = _conv_kernel(c, du, J, Dd, Brx, attr)
        out = w if out is None else out + w
    return out


def _conv_lin_reference(dc, du, c, u, J, Dd, Brx, live):
    out = 0
    if live[0]:
        out = out + advection_local(dc, u, J, Dd, Brx)
    if live[1]:
        out = out + advection_local(c, du, J, Dd, Brx)
    return out


def _conv_lin_transpose(ct, dc, du, c, u, J, Dd, Brx, *, live, attr):
    if any(ad.is_undefined_primal(a) for a in (c, u, J, Dd, Brx)):
        raise NotImplementedError("the convective term's tangent is linear in (dc, du) only")
    rest = [None] * 5
    lin = [ad.is_undefined_primal(dc) and live[0], ad.is_undefined_primal(du) and live[1]]
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in (dc, du)] + rest
    cbar, ubar = _convt_kernel(ct, c, u, J, Dd, Brx, attr)
    return [cbar if lin[0] else None, ubar if lin[1] else None] + rest


def _conv_lin_jvp(primals, tangents, *, live, attr):  # second derivatives: the einsum form's
    out = _conv_lin_p.bind(*primals, live=live, attr=attr)
    tangents = [jnp.zeros(p.shape, p.dtype) if type(t) is ad.Zero else t for t, p in zip(tangents, primals)]
    _, dw = jax.jvp(lambda *a: _conv_lin_reference(*a, live), primals, tangents)
    return out, dw


_conv_lin_p.def_impl(_conv_lin_impl)
_conv_lin_p.def_abstract_eval(lambda dc, du, c, *rest, **params: c)
mlir.register_lowering(_conv_lin_p, mlir.lower_fun(_conv_lin_impl, False))
ad.primitive_jvps[_conv_lin_p] = _conv_lin_jvp
ad.primitive_transposes[_conv_lin_p] = _conv_lin_transpose
batching.primitive_batchers[_conv_lin_p] = _batch_by_map(_conv_lin_p)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _convection(c, u, J, Dd, Brx, attr):
    return _conv_kernel(c, u, J, Dd, Brx, attr)


def _convection_jvp(attr, primals, tangents):
    """The tangent in (c, u): the linear primitive (kernels, its transpose the convt kernel); in
    J, Dd, Brx (shape derivatives): the einsum form's."""
    c, u, J, Dd, Brx = primals
    out = _convection(*primals, attr)
    live = (not _symbolic(tangents[0]), not _symbolic(tangents[1]))
    dw = jnp.zeros_like(out)
    if any(live):
        dc, du = (t if ok else jnp.zeros(p.shape, p.dtype) for t, ok, p in zip(tangents[:2], live, (c, u)))
        dw = _conv_lin_p.bind(dc, du, c, u, J, Dd, Brx, live=live, attr=attr)
    other = [i for i in (2, 3, 4) if not _symbolic(tangents[i])]
    if other:
        def ref(*xs):
            args = list(primals)
            for i, x in zip(other, xs):
                args[i] = x
            return advection_local(*args)

        dw = dw + jax.jvp(ref, [primals[i] for i in other], [tangents[i] for i in other])[1]
    return out, dw


_convection.defjvp(_convection_jvp, symbolic_zeros=True)


def _convection_checks(name, c, u, J, Dd, Brx, need_gpu=True):
    n = c.shape[-1]
    if c.ndim != 5 or c.dtype not in (jnp.float32, jnp.float64) or c.shape[2:] != (n, n, n) or not 2 <= n <= MAX_N:
        raise ValueError(f"{name}: c must be (m, E, n, n, n) float32/float64 with 2 <= n <= {MAX_N}, "
                         f"got {c.shape} {c.dtype}")
    E, q = c.shape[1], convection_q(n)
    shapes = dict(u=(3, E, n, n, n), J=(q, n), Dd=(q, n), Brx=(3, 3, E, q, q, q))
    for nm, a in zip(shapes, (u, J, Dd, Brx)):
        if tuple(a.shape) != shapes[nm]:
            raise ValueError(f"{name}: {nm} must be {shapes[nm]} for c {c.shape}, got {tuple(a.shape)}")
    if need_gpu and not cuda_available():
        raise ValueError(f"{name}: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use backend='einsum'")


def convection_cuda(c, u, J, Dd, Brx):
    """The element-local weak (u·∇)c on the 3/2 rule in one launch (same result as
    :func:`~jaxsem.operators.convection.advection_local`).

    ``c: (m, E, n, n, n)`` the carried fields, ``u: (3, E, n, n, n)`` the carrier, float32 or
    float64 with 2 ≤ n ≤ 16; ``J, Dd: (q, n)`` with q = :func:`convection_q` ``(n)``;
    ``Brx: (3, 3, E, q, q, q)``. Returns ``(m, E, n, n, n)``. The rule's fields stay on chip:
    c, u and Brx are read once, the result written once. Derivatives: the tangent in (c, u) is
    two launches of this kernel and its transpose one launch of :func:`convection_vjp_cuda`'s;
    the tangent in J, Dd and Brx (shape derivatives) is the einsum form's.
    """
    _convection_checks("convection_cuda", c, u, J, Dd, Brx)
    return _convection(c, *(a.astype(c.dtype) for a in (u, J, Dd, Brx)), _attr("conv", c))


def convection_emulated(c, u, J, Dd, Brx):
    """:func:`convection_cuda`'s derivative rules (the linear primitive, its transpose) with the
    kernels' values from the einsum form, on any platform (the emulated backend's)."""
    _convection_checks("convection_emulated", c, u, J, Dd, Brx, need_gpu=False)
    return _convection(c, *(a.astype(c.dtype) for a in (u, J, Dd, Brx)), EMULATE)


def maxwell_rhs_cuda(q, D, rx, eps, mu, normal, cE, aE, cH, aH, nbr, upwind: bool, pmc: bool):
    """The SEDG Maxwell right-hand side (chain-rule curl) in one launch; no derivative rule.

    ``q: (6, E, n, n, n)`` [Ex Ey Ez Hx Hy Hz], ``D: (n, n)``, ``rx: (3, 3, E, n, n, n)``,
    ``eps, mu: (E, n, n, n)``, ``normal: (3, E, 6, n, n)``, ``cE, aE, cH, aH: (E, 6, n, n)`` (the
    flux coefficients of :class:`jaxsem.models.maxwell.Material`), ``nbr: (E, 6, n, n)`` int32
    volume index of each face point's neighbour node (-1: boundary, mirror state). Returns
    dq/dt ``(6, E, n, n, n)``; :mod:`jaxsem.backends._fused_dg` supplies the derivatives.
    """
    n = q.shape[-1]
    if q.ndim != 5 or q.shape[0] != 6 or q.dtype not in (jnp.float32, jnp.float64) or not 2 <= n <= MAX_N:
        raise ValueError(f"maxwell_rhs_cuda: q must be (6, E, n, n, n) float32/float64 with 2 <= n <= {MAX_N}, "
                         f"got {q.shape} {q.dtype}")
    if nbr.dtype != jnp.int32 or nbr.shape != (q.shape[1], 6, n, n):
        raise ValueError(f"maxwell_rhs_cuda: nbr must be (E, 6, n, n) int32, got {nbr.shape} {nbr.dtype}")
    if not cuda_available():
        raise ValueError("maxwell_rhs_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc")
    attr = _attr("maxwell", jax.ShapeDtypeStruct(q.shape[1:], q.dtype))
    out = jax.ShapeDtypeStruct(q.shape, q.dtype)
    call = jax.ffi.ffi_call(_ffi_target("maxwell", q.dtype, n), out, vmap_method="sequential")
    args = [a.astype(q.dtype) for a in (D, rx, eps, mu, normal, cE, aE, cH, aH)]
    return call(q, *args, nbr, variant=np.int32(attr), upwind=np.int32(bool(upwind)), pmc=np.int32(bool(pmc)))


def maxwell_material_vjp_cuda(q, lam, D, rx, eps, mu, normal, cE, aE, cH, aH, nbr, upwind: bool, pmc: bool):
    """The cotangents of ε, μ and the flux coefficients for a cotangent ``lam`` of
    :func:`maxwell_rhs_cuda`'s result at fixed ``q``, in one launch (the right-hand side is
    computed in place and contracted with ``lam``, never written out).

    Arguments as :func:`maxwell_rhs_cuda`, ``lam: (6, E, n, n, n)``. Returns ``(g_eps, g_mu)``
    ``(2, E, n, n, n)`` and ``(g_cE, g_aE, g_cH, g_aH)`` ``(4, E, 6, n, n)`` (the a-terms 0 for
    the central flux). The kernel variant is the right-hand side's (:data:`TUNING`).
    """
    n = q.shape[-1]
    if q.ndim != 5 or q.shape[0] != 6 or q.dtype not in (jnp.float32, jnp.float64) or not 2 <= n <= MAX_N:
        raise ValueError(f"maxwell_material_vjp_cuda: q must be (6, E, n, n, n) float32/float64 with "
                         f"2 <= n <= {MAX_N}, got {q.shape} {q.dtype}")
    if lam.shape != q.shape:
        raise ValueError(f"maxwell_material_vjp_cuda: lam must be shaped as q {q.shape}, got {lam.shape}")
    if nbr.dtype != jnp.int32 or nbr.shape != (q.shape[1], 6, n, n):
        raise ValueError(f"maxwell_material_vjp_cuda: nbr must be (E, 6, n, n) int32, got {nbr.shape} {nbr.dtype}")
    if not cuda_available():
        raise ValueError("maxwell_material_vjp_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc")
    attr = _attr("maxwell", jax.ShapeDtypeStruct(q.shape[1:], q.dtype))
    E = q.shape[1]
    out = (jax.ShapeDtypeStruct((2,) + q.shape[1:], q.dtype), jax.ShapeDtypeStruct((4, E, 6, n, n), q.dtype))
    call = jax.ffi.ffi_call(_ffi_target("maxwellm", q.dtype, n), out, vmap_method="sequential")
    args = [a.astype(q.dtype) for a in (lam, D, rx, eps, mu, normal, cE, aE, cH, aH)]
    return call(q, *args, nbr, variant=np.int32(attr), upwind=np.int32(bool(upwind)), pmc=np.int32(bool(pmc)))


# the volume forms of advection_rhs_cuda, in the order of the kernel's `form` attribute
# (csrc/sem_kernels.cu: ADV_SPLIT, ADV_CONSERVATIVE, ADV_CHAIN)
ADVECTION_FORMS = ("split", "conservative", "chain")


def advection_rhs_cuda(u, D, A, jac, an, vn, lw, nbr, form: str, upwind: bool):
    """The DG advection right-hand side (one device, or a rank's part) in one launch; no derivative rule.

    ``u: (E, n, n, n)``, ``D: (n, n)``, ``A: (3, E, n, n, n)`` the contravariant velocity,
    ``jac: (E, n, n, n)``, ``an, vn, lw: (E, 6, n, n)`` (the face weights of
    :class:`jaxsem.models.advection.Transport`), ``nbr: (E, 6, n, n)`` int32 volume index of each
    face point's neighbour node (-1: boundary, inflow u⁺ = 0); ``form`` one of
    :data:`ADVECTION_FORMS`. Returns du/dt ``(E, n, n, n)``, as
    :func:`jaxsem.models.advection.rhs`; :mod:`jaxsem.backends._fused_dg` supplies the tangent.
    """
    n = u.shape[-1]
    if u.ndim != 4 or u.dtype not in (jnp.float32, jnp.float64) or not 2 <= n <= MAX_N or u.shape[1:] != (n, n, n):
        raise ValueError(f"advection_rhs_cuda: u must be (E, n, n, n) float32/float64 with 2 <= n <= {MAX_N}, "
                         f"got {u.shape} {u.dtype}")
    E = u.shape[0]
    shapes = dict(D=(n, n), A=(3,) + u.shape, jac=u.shape, an=(E, 6, n, n), vn=(E, 6, n, n), lw=(E, 6, n, n))
    for name, a in zip(shapes, (D, A, jac, an, vn, lw)):
        if tuple(a.shape) != shapes[name]:
            raise ValueError(f"advection_rhs_cuda: {name} must be {shapes[name]} for u {u.shape}, got {a.shape}")
    if nbr.dtype != jnp.int32 or nbr.shape != (E, 6, n, n):
        raise ValueError(f"advection_rhs_cuda: nbr must be (E, 6, n, n) int32, got {nbr.shape} {nbr.dtype}")
    if form not in ADVECTION_FORMS:
        raise ValueError(f"advection_rhs_cuda: form must be one of {ADVECTION_FORMS}, got {form!r}")
    if not cuda_available():
        raise ValueError("advection_rhs_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc")
    attr = _attr("advection", u)
    u5 = u[None]
    out = jax.ShapeDtypeStruct(u5.shape, u5.dtype)
    call = jax.ffi.ffi_call(_ffi_target("advection", u.dtype, n), out, vmap_method="sequential")
    args = [a.astype(u.dtype) for a in (D, A, jac, an, vn, lw)]
    return call(u5, *args, nbr, variant=np.int32(attr), upwind=np.int32(bool(upwind)),
                form=np.int32(ADVECTION_FORMS.index(form)))[0]


def mass_cuda(u, J, B, h2=None):
    """BK1/BK2 ``w = Jᵀ⊗Jᵀ⊗Jᵀ (h₂B ⊙ J⊗J⊗J u)`` (as :func:`mass`): ``J: (n + 1, n)``,
    ``B: (E, q, q, q)``. The kernel: :func:`defaults` ``("mass", u)``."""
    attr = _entry("mass_cuda", "mass", u, J)
    if h2 is not None:
        B = B * h2
    J = J.astype(u.dtype)
    return _apply(u, J, J, B.astype(u.dtype), "mass", attr)


def stiffness_cuda(u, J, Dt, G, h1=None):
    """BK3/BK4 stiffness on q = n + 1 Gauss points (as :func:`stiffness`): ``J, Dt: (q, n)``,
    ``G: (6, E, q, q, q)``. The kernel: :func:`defaults` ``("stiffness", u)``."""
    attr = _entry("stiffness_cuda", "stiffness", u, J)
    if h1 is not None:
        G = G * h1
    return _apply(u, J.astype(u.dtype), Dt.astype(u.dtype), G.astype(u.dtype), "stiffness", attr)


def _interp_reference(u, J, back):
    return interp_t(u, J) if back else interp(u, J)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _transfer(u, J, back):
    n, m = J.shape
    E, a = u.shape[-4], u.shape[-1]
    b = m if back else n
    u5 = u.reshape((-1, E, a, a, a))
    call = jax.ffi.ffi_call(_ffi_target("interp", u.dtype, n), jax.ShapeDtypeStruct(u5.shape[:2] + (b, b, b), u.dtype),
                            vmap_method="sequential")
    return call(u5, J, variant=np.int32(1 if back else 0)).reshape(u.shape[:-3] + (b, b, b))


@_transfer.defjvp
def _transfer_jvp(back, primals, tangents):  # tangent: the einsum reference's (transposable)
    _, dw = jax.jvp(lambda u, J: _interp_reference(u, J, back), primals, tangents)
    return _transfer(*primals, back), dw


def transfer_supported(u, J, back: bool) -> bool:
    """Whether :func:`interp_cuda` runs these shapes: ``J: (n, m)`` with 2 ≤ m < n ≤ 16, ``u``
    float32/float64 ``(..., E, a, a, a)`` with a = m (prolongation) or n (``back``)."""
    if J.ndim != 2 or u.ndim < 4 or u.dtype not in (jnp.float32, jnp.float64):
        return False
    n, m = J.shape
    a = n if back else m
    return 2 <= m < n <= MAX_N and u.shape[-3:] == (a, a, a)


def interp_cuda(u, J, back: bool = False):
    """The p-multigrid transfer between orders as one kernel: ``(J⊗J⊗J) u``, ``(..., E, m, m, m)``
    → ``(..., E, n, n, n)`` (:func:`~jaxsem.operators.tensor.interp`), or with ``back`` its
    transpose ``(Jᵀ⊗Jᵀ⊗Jᵀ) v``, ``(..., E, n, n, n)`` → ``(..., E, m, m, m)``
    (:func:`~jaxsem.operators.tensor.interp_t`); ``J: (n, m)``, 2 ≤ m < n ≤ 16. Leading axes
    run in one launch. Tangents: the einsum form's."""
    if not transfer_supported(u, J, back):
        raise ValueError(f"interp_cuda supports J: (n, m) with 2 <= m < n <= {MAX_N} and u: (..., E, a, a, a) "
                         f"float32/float64, a = {'n' if back else 'm'}; got u {u.shape} {u.dtype}, J {J.shape}")
    if not cuda_available():
        raise ValueError(f"interp_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use backend='einsum'")
    return _transfer(u, J.astype(u.dtype), bool(back))


def gs_csr_cuda(u, off, idx):
    """Gather–scatter QQᵀ as one gather (``csrc/sem_kernels.cu``, ``gs_csr_kernel``).

    ``u: (C, L)`` float32/float64 (C fields of L local nodes); ``off: (L + 1,)`` and ``idx: (nnz,)``
    int32: local node i sums ``u[:, idx[off[i]:off[i + 1]]]`` (all copies of its node, itself
    included, in one order for all copies) and keeps ``u[:, i]`` where ``off[i] == off[i + 1]``.
    Built by :func:`jaxsem.discretization.gather_scatter.make_gs` with ``layout="csr"``; no
    derivative rule of its own (:func:`jaxsem.discretization.gather_scatter.gs_apply` supplies it).
    """
    if u.ndim != 2 or u.dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"gs_csr_cuda: u must be (C, L) float32/float64, got {u.shape} {u.dtype}")
    if off.shape != (u.shape[1] + 1,) or off.dtype != jnp.int32 or idx.ndim != 1 or idx.dtype != jnp.int32:
        raise ValueError(f"gs_csr_cuda: off must be ({u.shape[1] + 1},) int32 and idx (nnz,) int32, "
                         f"got {off.shape} {off.dtype}, {idx.shape} {idx.dtype}")
    if not cuda_available():
        raise ValueError("gs_csr_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc")
    call = jax.ffi.ffi_call(_ffi_target("gs", u.dtype), jax.ShapeDtypeStruct(u.shape, u.dtype),
                            vmap_method="sequential")
    return call(u, off, idx, variant=np.int32(0))
