"""Fused BK5 stiffness kernel (collocated GLL, scalar) in Pallas, Triton backend.

``w = Σ_ab D_aᵀ G_ab D_b u`` for a block of elements per program: u and the six
geometric factors are read once and w is written once; ur, us, ut and wr, ws, wt
live in registers/shared memory only. Same contract as
:func:`jaxsem.operators.stiffness.stiffness_gll` (``u: (E, n, n, n)`` [e, k, j, i],
``D: (n, n)``, ``G: (6, E, n, n, n)`` rr, rs, rt, ss, st, tt), FP64 or FP32.

Layout inside a program (n padded to NP = next power of two, a Triton rule): a
tile of ``eb`` elements is a 2-D array, rows (e, k), columns (j, i). The three
one-axis contractions become matrix products that Triton sends to the tensor
cores (FP64: mma m8n8k4, which needs M ≥ 16, K ≥ 16, N ≥ 8):

* ``t`` (rows): ``(I_eb ⊗ D) @ U`` — block-diagonal, K = eb·NP (taken as
  ``(Uᵀ (I_eb ⊗ Dᵀ))ᵀ`` when the tile has fewer rows than columns: see
  :func:`_compute_dots` on why every product needs M ≥ 16·num_warps).
* ``r`` (last axis), ``variant="chunk"``: U reshaped to rows (e, k, j_hi),
  columns (j_lo, i) times ``I_c ⊗ Dᵀ`` with c = 16/NP, so K = 16 (2·16 flops per
  point instead of 2·NP² with the dense Kronecker matrix); ``variant="kron"``:
  ``U @ (I_NP ⊗ Dᵀ)`` (K = NP²).
* ``s`` (middle axis): ``"chunk"`` transposes (j, i) → (i, j) in the tile and
  does as for r; ``"kron"``: ``U @ (Dᵀ ⊗ I_NP)``.
* ``variant="bcast"``: no dots, the contractions as broadcast-and-sum over 5-D
  temporaries (the naive kernel; kept for comparison).

Persistent grid (``programs_per_sm``, the FP64 default for n = 4 and 8): a fixed
number of programs loop over the blocks and, with ``num_stages=2``, Triton
prefetches the next block's u and G with cp.async while computing this one: on
an H100 this took p = 7 from 19.5 to 25.2 GDOF/s (95 % of the measured copy
ceiling; the einsum chain: 5.0).

Ragged E: the last program's block is shifted back to end at element E, so
some elements are computed twice and written twice with identical values; no
masks are needed when n is a power of two. Other n are loaded with masked
gathers into the padded tile (D zero-padded, padded points never stored).

Differentiation: a custom JVP whose tangent is the einsum reference's, so
forward and reverse mode work and ``lax.custom_linear_solve`` can transpose the
derivative (see :func:`_fused_jvp`); the kernel itself is only the primal.

Measured numbers and the reasoning: ``experiments/NOTES_speed.md``,
``experiments/bk5_kernels.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:  # Triton-specific API (jax >= 0.4.3x); absent on some builds
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
    plgpu = None

from ..backends import cuda as cuda_kernels
from .mass import mass
from .stiffness import stiffness, stiffness_gll

__all__ = ["FusedConfig", "DEFAULT_CONFIG", "stiffness_gll_fused", "stiffness_gll_auto",
           "fused_supported", "default_config", "mass_fused", "stiffness_fused", "mass_auto",
           "stiffness_auto", "gauss_fused_supported", "default_config_gauss", "AUTO_FUSED"]

VARIANTS = ("chunk", "kron", "mixed", "bcast")
MAX_N = 16  # n = p + 1 ≤ 16 (p ≤ 15); larger tiles do not fit in registers


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    """Static kernel parameters (hashable; part of the jit cache key).

    variant: "chunk" (K = 16 dots for r and s, the default), "kron" (dense
      Kronecker dots for r and s), "mixed" (r chunk, s kron), "bcast" (no dots).
    elements_per_block: elements per program (a power of two; the t-dot needs
      elements_per_block·NP ≥ 16).
    num_warps, num_stages: Triton launch parameters.
    programs: 0 for one block per program; P > 0 for a grid of P programs that
      loop over the blocks: with num_stages ≥ 2 Triton then prefetches the next
      block's u and G (cp.async into shared memory) while computing this one.
    programs_per_sm: the same, as a multiple of the device's multiprocessors.
    dot_precision: for FP32, "tf32x3" runs the products on the tensor cores
      with three TF32 passes (≈ FP32 accuracy); FP64 products are always exact.
    """

    variant: str = "chunk"
    elements_per_block: int = 2
    num_warps: int = 4
    num_stages: int = 1
    programs: int = 0  # > 0: a persistent grid of this many programs looping over blocks
    programs_per_sm: int = 0  # or this many per multiprocessor (used when programs == 0)
    dot_precision: str = "highest"  # FP32 only: "highest" (exact FMA dots) or "tf32x3"


def _np2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def default_config(n: int, dtype=jnp.float64) -> FusedConfig:
    """The measured-best configuration (experiments/results/bk5_kernels_h100.json).

    FP64, n = 8 (p = 7): K = 16 chunk dots, 2 elements per program, 4 warps, a
    persistent grid of 2 programs per SM with 2-stage prefetch (95% of the copy
    ceiling on an H100). n = 4: 8 elements, 2 warps, 8 programs per SM. Padded n
    (masked gathers) and FP32 lose with the persistent grid: one block per program.
    """
    NP = max(4, _np2(n))
    pow2 = n == NP
    f64 = jnp.dtype(dtype) == jnp.float64
    if NP == 4:
        return FusedConfig("chunk", 8, 2, num_stages=2, programs_per_sm=8) if (pow2 and f64) \
            else FusedConfig("chunk", 8, 2)
    if NP == 8:
        return FusedConfig("chunk", 2, 4, num_stages=2, programs_per_sm=2) if (pow2 and f64) \
            else FusedConfig("chunk", 2, 4)
    return FusedConfig("chunk", 1, 8)


DEFAULT_CONFIG = default_config(8)


def _sm_count() -> int:
    try:
        return int(getattr(jax.devices()[0], "core_count", 0)) or 132
    except Exception:  # pragma: no cover
        return 132


def fused_supported(u, D=None, G=None) -> bool:
    """Whether :func:`stiffness_gll_fused` handles these shapes/dtypes."""
    if u.ndim < 4 or u.shape[-1] != u.shape[-2] or u.shape[-1] != u.shape[-3]:
        return False
    n = u.shape[-1]
    return 2 <= n <= MAX_N and jnp.dtype(u.dtype) in (jnp.float64, jnp.float32)


def _check_config(cfg: FusedConfig, n: int):
    if cfg.variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {cfg.variant!r}")
    eb = cfg.elements_per_block
    if eb < 1 or eb & (eb - 1):
        raise ValueError(f"elements_per_block must be a power of two, got {eb}")
    NP = max(4, _np2(n))
    if cfg.variant != "bcast" and eb * NP < 16:
        raise ValueError(f"elements_per_block·NP must be >= 16 for the dot variants (NP = {NP}, eb = {eb})")
    if cfg.variant in ("kron", "mixed") and NP > 8:
        raise ValueError("the dense Kronecker variants are limited to n <= 8")
    if cfg.dot_precision not in ("highest", "tf32x3"):
        raise ValueError(f"dot_precision must be 'highest' or 'tf32x3', got {cfg.dot_precision!r}")


# ----------------------------------------------------------------------------- matrices

def _matrices(D, NP, eb, variant, dtype):
    """The small constant matrices each variant multiplies by (zero-padded D)."""
    n = D.shape[0]
    Dp = jnp.zeros((NP, NP), dtype).at[:n, :n].set(D.astype(dtype))
    Dpt = Dp.T
    if variant == "bcast":
        return (Dp,)
    c = max(1, 16 // NP)
    I_c, I_np, I_eb = (jnp.eye(m, dtype=dtype) for m in (c, NP, eb))
    chunk = (jnp.kron(I_c, Dpt), jnp.kron(I_c, Dp))        # r/s forward, transpose
    kr = (jnp.kron(I_np, Dpt), jnp.kron(I_np, Dp))         # r dense
    ks = (jnp.kron(Dpt, I_np), jnp.kron(Dp, I_np))         # s dense
    kt = (jnp.kron(I_eb, Dp), jnp.kron(I_eb, Dpt))         # t block-diagonal
    if variant == "chunk":
        return kt + chunk
    if variant == "kron":
        return kt + kr + ks
    return kt + chunk + ks  # mixed


# ----------------------------------------------------------------------------- kernel

def _dot(a, b, precision=lax.Precision.HIGHEST):
    return jnp.dot(a, b, precision=precision, preferred_element_type=a.dtype)


def _apply_G(g, ur, us, ut):
    wr = g[0] * ur + g[1] * us + g[2] * ut
    ws = g[1] * ur + g[3] * us + g[4] * ut
    wt = g[2] * ur + g[4] * us + g[5] * ut
    return wr, ws, wt


def _compute_dots(U, load_g, mats, NP, eb, variant, precision=lax.Precision.HIGHEST):
    """Tile ``U: (R, C)`` rows (e, k), cols (j, i) → w tile (same layout).

    Triton gives chained dots all warps along M, so a product with fewer than
    16·num_warps rows is computed redundantly by several warps. The t-product
    is therefore taken transposed, ``(Uᵀ (I ⊗ Dᵀ))ᵀ`` (M = NP²), when the tile
    has fewer rows than columns (n = 8, eb = 2: every product has M = 64).
    ``load_g(a)`` loads factor a; each is loaded just before its first use.
    """
    R, C = U.shape
    c = max(1, 16 // NP)
    Kt, Ktt = mats[0], mats[1]  # I ⊗ D, I ⊗ Dᵀ
    if variant in ("chunk", "mixed"):
        Bf, Bt = mats[2], mats[3]
    if variant == "kron":
        Krf, Krt, Ksf, Kst = mats[2:6]
    if variant == "mixed":
        Ksf, Kst = mats[4], mats[5]

    dot = functools.partial(_dot, precision=precision)

    def rdot(X, B):  # contract the last axis (i) with B = I_c ⊗ M
        return dot(X.reshape(R * NP // c, c * NP), B).reshape(R, C)

    def sdot(X, B):  # contract the middle axis (j): swap (j, i), as r, swap back
        Xt = jnp.transpose(X.reshape(R, NP, NP), (0, 2, 1)).reshape(R * NP // c, c * NP)
        Y = dot(Xt, B).reshape(R, NP, NP)
        return jnp.transpose(Y, (0, 2, 1)).reshape(R, C)

    def tdot(X, K):  # K @ X, as (Xᵀ Kᵀ)ᵀ when the tile has fewer rows than columns
        return dot(K, X) if R >= C else dot(X.T, K.T).T

    ut = tdot(U, Kt)
    if variant == "kron":
        ur, us = dot(U, Krf), dot(U, Ksf)
    elif variant == "mixed":
        ur, us = rdot(U, Bf), dot(U, Ksf)
    else:
        ur, us = rdot(U, Bf), sdot(U, Bf)
    g2, g4, g5 = load_g(2), load_g(4), load_g(5)
    w = tdot(g2 * ur + g4 * us + g5 * ut, Ktt)
    g0, g1 = load_g(0), load_g(1)
    wr = g0 * ur + g1 * us + g2 * ut
    w = w + (dot(wr, Krt) if variant == "kron" else rdot(wr, Bt))
    g3 = load_g(3)
    ws = g1 * ur + g3 * us + g4 * ut
    w = w + (sdot(ws, Bt) if variant == "chunk" else dot(ws, Kst))
    return w


def _compute_bcast(u, load_g, Dp):
    """Tile ``u: (eb, NP, NP, NP)`` [e, k, j, i]; broadcast-and-sum contractions."""
    Db = Dp  # [a, i]
    ur = jnp.sum(u[:, :, :, None, :] * Db[None, None, None, :, :], axis=4)   # [e,k,j,a]
    us = jnp.sum(u[:, :, None, :, :] * Db[None, None, :, :, None], axis=3)   # [e,k,b,i]
    ut = jnp.sum(u[:, None, :, :, :] * Db[None, :, :, None, None], axis=2)   # [e,c,j,i]
    wr, ws, wt = _apply_G([load_g(a) for a in range(6)], ur, us, ut)
    w = jnp.sum(wr[:, :, :, :, None] * Db[None, None, None, :, :], axis=3)   # Σ_a D[a,i] wr[..a]
    w = w + jnp.sum(ws[:, :, :, None, :] * Db[None, None, :, :, None], axis=2)
    w = w + jnp.sum(wt[:, :, None, :, :] * Db[None, :, :, None, None], axis=1)
    return w


def _make_kernel(E, n, NP, eb, variant, poison=False, programs=0, precision=lax.Precision.HIGHEST,
                 comps=1):
    """The BK5 kernel body; ``comps > 1`` (BK6): u and w hold ``comps`` stacked
    components (``(comps·E, …)``), each block computes them one after the other
    with the same G tile (re-loads of G hit the cache: G leaves DRAM once)."""
    pow2 = n == NP
    n3 = n ** 3
    bcast = variant == "bcast"
    R, C = eb * NP, NP * NP
    tile = (eb, NP, NP, NP) if bcast else (R, C)

    # flat gather offsets reach 6·E·n³: 64-bit beyond int32 (needs jax_enable_x64)
    idx = jnp.int64 if max(6, comps) * E * n3 >= 2**31 else jnp.int32

    def gather_offsets(e0):
        """Flat offsets and validity of the padded tile (n not a power of two)."""
        e0 = e0.astype(idx)
        if bcast:
            e = lax.broadcasted_iota(idx, tile, 0)
            k = lax.broadcasted_iota(idx, tile, 1)
            j = lax.broadcasted_iota(idx, tile, 2)
            i = lax.broadcasted_iota(idx, tile, 3)
            off = (e0 + e) * n3 + k * (n * n) + j * n + i
            valid = (k < n) & (j < n) & (i < n)
            return off, valid
        rr = lax.broadcasted_iota(idx, (R, 1), 0)
        cc = lax.broadcasted_iota(idx, (1, C), 1)
        e, k = rr // NP, rr % NP
        j, i = cc // NP, cc % NP
        off = (e0 + e) * n3 + k * (n * n) + (j * n + i)
        valid = (k < n) & ((j < n) & (i < n))
        return off, valid

    def kernel(u_ref, g_ref, *refs):
        *mat_refs, o_ref = refs
        if poison:
            mat_refs = mat_refs[:-1]  # the aliased output buffer
        mats = [m[...] for m in mat_refs]  # the small constant matrices, loaded once
        if programs:
            nblocks = -(-E // eb)
            iters = -(-nblocks // programs)
            pid = pl.program_id(0)

            def body(it, carry):
                b = jnp.minimum(pid + it * programs, nblocks - 1)
                block(u_ref, g_ref, mats, o_ref, b)
                return carry

            lax.fori_loop(0, iters, body, 0)
        else:
            block(u_ref, g_ref, mats, o_ref, pl.program_id(0))

    def block(u_ref, g_ref, mats, o_ref, b):
        e0 = jnp.minimum(b * eb, E - eb)  # last block shifted back: no ragged tail
        if pow2:
            sl = pl.ds(e0, eb) if bcast else pl.ds(e0 * n, R)
            load_g = lambda a: g_ref[a, sl]
        else:
            off, valid = gather_offsets(e0)
            offc = jnp.where(valid, off, 0)  # in bounds everywhere; padding zeroed below
            zero = jnp.zeros(tile, o_ref.dtype)
            load_g = lambda a: jnp.where(valid, g_ref[offc + a * (E * n3)], zero)
        def component(comp):
            if pow2:
                # component comp starts comp·E elements (comp·E·n rows) further on
                if comps == 1:
                    slc = sl
                else:
                    slc = pl.ds(e0 + comp * E, eb) if bcast else pl.ds(e0 * n + comp * (E * n), R)
                u = u_ref[slc]
            else:
                base = comp.astype(idx) * (E * n3) if comps > 1 else 0
                u = jnp.where(valid, u_ref[offc + base] if comps > 1 else u_ref[offc], zero)
            if bcast:
                w = _compute_bcast(u, load_g, mats[0])
            else:
                w = _compute_dots(u, load_g, mats, NP, eb, variant, precision)
            w = w.astype(o_ref.dtype)
            if pow2:
                if bcast:
                    o_ref[slc] = w
                else:
                    o_ref[slc, :] = w
            else:
                _masked_store(o_ref, off + base if comps > 1 else off, w, valid)

        if comps == 1:
            component(0)
        else:  # a loop, not unrolled: one component's temporaries live at a time
            lax.fori_loop(0, comps, lambda c, carry: (component(c), carry)[1], 0)

    return kernel


def _masked_store(ref, off, val, mask):
    if plgpu is not None and hasattr(plgpu, "store"):
        plgpu.store(ref.at[off], val, mask=mask)
    else:  # pragma: no cover - older/newer Pallas API
        pl.store(ref, (off,), val, mask=mask)


def _pad_elements(x, E, Ep, axis):
    """Zero-pad the element axis of ``x`` from E to Ep (tiny meshes: one full block)."""
    if Ep == E:
        return x
    shape = list(x.shape)
    shape[axis] = Ep - E
    return jnp.concatenate([x, jnp.zeros(shape, x.dtype)], axis=axis)


def _fused_apply(u, D, G, cfg: FusedConfig, interpret: bool, poison=None):
    """One pallas_call on ``u: (E, n, n, n)`` or ``(C, E, n, n, n)`` (C components, one G read).

    ``poison``: an optional fill value (e.g. NaN) for the output buffer before
    the kernel runs (aliased in and out), so unwritten points show up in tests.
    """
    vector = u.ndim == 5
    if not vector:
        u = u[None]
    C, E, n = u.shape[0], u.shape[1], u.shape[-1]
    dtype = u.dtype
    NP = max(4, _np2(n))
    eb = cfg.elements_per_block
    G = G.astype(dtype)
    Ep = max(E, eb)  # tiny meshes: pad to one full block (cheap at this size)
    u, G = _pad_elements(u, E, Ep, 1), _pad_elements(G, E, Ep, 1)
    mats = _matrices(D, NP, eb, cfg.variant, dtype)
    precision = lax.Precision.HIGHEST
    if cfg.dot_precision == "tf32x3" and dtype == jnp.float32 and not interpret:
        precision = lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    pow2 = n == NP
    if pow2:
        if cfg.variant == "bcast":
            ui, gi = u.reshape((C * Ep, n, n, n)), G
        else:
            ui, gi = u.reshape(C * Ep * n, n * n), G.reshape(6, Ep * n, n * n)
    else:
        ui, gi = u.reshape(-1), G.reshape(-1)
    nblocks = pl.cdiv(Ep, eb)
    programs = cfg.programs or cfg.programs_per_sm * (_sm_count() if not interpret else 1)
    programs = min(programs, nblocks)
    kernel = _make_kernel(Ep, n, NP, eb, cfg.variant, poison is not None, programs, precision, comps=C)
    kw = {}
    extra = ()
    if poison is not None:
        extra = (jnp.full(ui.shape, poison, dtype),)
        kw["input_output_aliases"] = {2 + len(mats): 0}
    if not interpret and plgpu is not None:
        kw["compiler_params"] = plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(ui.shape, dtype),
        grid=(programs or nblocks,),
        interpret=interpret,
        name=f"bk{6 if C > 1 else 5}_{cfg.variant}_n{n}_eb{eb}",
        **kw,
    )(ui, gi, *mats, *extra)
    w = out.reshape((C, Ep, n, n, n))[:, :E]
    return w if vector else w[0]


def _apply_batched(u, D, G, cfg, interpret):
    """Leading axes of ``u`` become components of one kernel call (G read once for all)."""
    lead = u.shape[:-4]
    if not lead:
        return _fused_apply(u, D, G, cfg, interpret)
    flat = u.reshape((-1,) + u.shape[-4:])
    return _fused_apply(flat, D, G, cfg, interpret).reshape(u.shape)


# Differentiation: a custom JVP whose tangent is the einsum reference's (the kernel is only
# the primal), so forward mode works and reverse mode transposes the reference's tangent.
# A custom_vjp (the kernel as its own VJP, as before) cannot be pushed forward, and
# jax.lax.custom_linear_solve needs the JVP of its matvec w.r.t. the coefficients and
# geometry. The matvec itself (a pallas_call) still has no transpose:
# jaxsem.solvers.pcg.linear_solve(transposable=False) avoids asking for one. Solves keep the
# kernel in every PCG iteration, forward and adjoint; only a gradient's extra operator
# application runs the reference.
@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _fused(u, D, G, cfg, interpret):
    return _apply_batched(u, D, G, cfg, interpret)


@_fused.defjvp
def _fused_jvp(cfg, interpret, primals, tangents):
    u, D, G = primals
    _, dw = jax.jvp(stiffness_gll, (u, D, G), tangents)
    return _fused(u, D, G, cfg, interpret), dw


def _default_interpret() -> bool:
    return jax.default_backend() not in ("gpu", "cuda", "rocm")


def stiffness_gll_fused(u, D, G, h1=None, *, interpret=None, elements_per_block=None,
                        variant=None, num_warps=None, num_stages=None, config=None):
    """Fused BK5 ``w = A_e u`` (same result as :func:`stiffness_gll`).

    Args:
      u: ``(..., E, n, n, n)`` float64 or float32 (leading axes applied one by one).
      D: ``(n, n)`` GLL derivative matrix. G: ``(6, E, n, n, n)``.
      h1: optional coefficient; folded into G first (one extra pass over G).
      interpret: run the Pallas interpreter (default: True off GPU).
      elements_per_block, variant, num_warps, num_stages: override the
        measured default (:func:`default_config`); or pass a whole ``config``.
    """
    if not fused_supported(u):
        raise ValueError(f"stiffness_gll_fused supports u: (..., E, n, n, n), 2 <= n <= {MAX_N}, "
                         f"float32/float64; got {u.shape} {u.dtype}")
    n = u.shape[-1]
    if config is None:
        config = default_config(n, u.dtype)
    over = dict(variant=variant, elements_per_block=elements_per_block, num_warps=num_warps,
                num_stages=num_stages)
    config = dataclasses.replace(config, **{k: v for k, v in over.items() if v is not None})
    _check_config(config, n)
    if interpret is None:
        interpret = _default_interpret()
    if h1 is not None:
        G = G * h1
    D = D.astype(u.dtype)
    G = G.astype(u.dtype)
    return _fused(u, D, G, config, bool(interpret))


def stiffness_gll_auto(u, D, G, h1=None, impl: str = "auto", **kw):
    """BK5 stiffness with the implementation chosen: ``"einsum"`` (reference),
    ``"pallas"`` or ``"fused"`` (:func:`stiffness_gll_fused`), ``"cuda"``
    (:func:`~jaxsem.operators.cuda_kernels.stiffness_gll_cuda`) or ``"auto"``: Pallas on GPU
    for supported shapes/dtypes, the einsum reference otherwise (CPU)."""
    which = _resolve(impl, "stiffness_gll", u)
    if which == "einsum":
        return stiffness_gll(u, D, G, h1)
    if which == "cuda":
        return cuda_kernels.stiffness_gll_cuda(u, D, G, h1)
    return stiffness_gll_fused(u, D, G, h1, **kw)


# ============================================================================= Gauss (BK1–BK4)
#
# BK1/BK2 (mass) and BK3/BK4 (stiffness) on q = p + 2 Gauss points, one pallas_call,
# same machinery as BK5: a tile of eb elements, rows (e, k), columns (j, i), n padded
# to NP and q to QP (powers of two); every one-axis contraction is a small dot.
#
# * mass:      w = Jᵀ⊗Jᵀ⊗Jᵀ (B ⊙ (J⊗J⊗J) u)
# * stiffness: u_q = (J⊗J⊗J) u, then the collocated derivative on the Gauss points,
#   ur = (I⊗I⊗D_q) u_q, us, ut likewise, the G stage, the transposed derivatives and
#   Jᵀ⊗Jᵀ⊗Jᵀ back (12 contractions instead of the reference's 16). D_q = Dt (JᵀJ)⁻¹Jᵀ
#   satisfies D_q J = Dt exactly (J has full column rank), so the operator is the
#   reference's in exact arithmetic (cond J ≈ 2.5 at p = 14: rounding ~1e-15).
#
# n and q are never both powers of two (q = n + 1), so one of u/w or B/G always moves
# through masked gathers: one block per program, no persistent grid (the BK5
# measurements: prefetch loses with gathers). Vector forms (BK2, BK4): the component
# loop runs inside the program, so B/G leave DRAM once per element.

GAUSS_OPS = ("mass", "stiffness")
MAX_Q = 16  # q ≤ 16 (p ≤ 14); a 32³-point padded tile does not fit


# Mass kernels whose best launch differs from the rule below, by (NP, QP): measured on an
# H100, FP64 (experiments/results/gauss_kernels*_h100.json): BK1 p = 3 (NP 4, QP 8) 8.9
# against 6.8 GDOF/s, p = 7 (NP 8, QP 16) 15.1 against 11.0. At p = 5, 9, 11 and for every
# stiffness order swept (3, 5, 7, 9, 11) the rule was best or within 2%.
MASS_CONFIGS = {(4, 8): (4, 4), (8, 16): (2, 4)}


def default_config_gauss(n: int, q: int, dtype=jnp.float64, op: str = "stiffness") -> FusedConfig:
    """Launch configuration of the Gauss kernels (``op``: "mass" or "stiffness").

    eb = 16 / QP elements per block (the smallest with the quadrature-side
    products' K = eb·QP ≥ 16; the u tile's k axis is padded to 16/eb when
    eb·NP < 16, see :func:`_kpad`); 4 warps up to a 2048-point quadrature tile
    eb·QP³, else 8; mass exceptions in :data:`MASS_CONFIGS`. Triton 3.6 for
    sm_90, FP64: no spills for p ≤ 7 (stiffness p = 7: 255 registers), small
    spills at p = 11, heavy at p = 14.
    """
    NP, QP = max(4, _np2(n)), max(4, _np2(q))
    if op == "mass" and (NP, QP) in MASS_CONFIGS:
        eb, warps = MASS_CONFIGS[NP, QP]
        return FusedConfig("chunk", eb, warps)
    eb = max(1, 16 // QP)
    return FusedConfig("chunk", eb, 4 if eb * QP**3 <= 2048 else 8)


def gauss_fused_supported(u, J=None) -> bool:
    """Whether :func:`mass_fused` / :func:`stiffness_fused` handle these shapes/dtypes."""
    if not fused_supported(u):
        return False
    n = u.shape[-1]
    q = n + 1 if J is None else J.shape[0]
    return (J is None or (J.ndim == 2 and J.shape[1] == n)) and 2 <= q <= MAX_Q


def _check_config_gauss(cfg: FusedConfig, n: int, q: int):
    if cfg.variant != "chunk":
        raise ValueError(f"the Gauss kernels have variant 'chunk' only, got {cfg.variant!r}")
    eb = cfg.elements_per_block
    if eb < 1 or eb & (eb - 1):
        raise ValueError(f"elements_per_block must be a power of two, got {eb}")
    QP = max(4, _np2(q))
    if eb * QP < 16:
        raise ValueError(f"elements_per_block·QP must be >= 16 (QP = {QP}, eb = {eb})")
    if cfg.programs or cfg.programs_per_sm:
        raise ValueError("the Gauss kernels run one block per program (programs = programs_per_sm = 0)")
    if cfg.dot_precision not in ("highest", "tf32x3"):
        raise ValueError(f"dot_precision must be 'highest' or 'tf32x3', got {cfg.dot_precision!r}")


def _kpad(NP: int, eb: int) -> int:
    """k padding of the u tile: NP, or more when eb·NP < 16 (the FP64 dot needs K ≥ 16)."""
    return max(NP, 16 // eb)


def _chunk(m: int) -> int:
    """Axis groups per row of a chunk product, so that its K = chunk·m is 16."""
    return max(1, 16 // m)


def _gauss_matrices(J, Dt, op, NP, QP, eb, dtype):
    """(I_c ⊗ Jᵀ, I_c ⊗ J, I_eb ⊗ J, I_eb ⊗ Jᵀ[, the same four for D_q]), zero-padded."""
    q, n = J.shape
    NK = _kpad(NP, eb)
    Jp = jnp.zeros((QP, NP), dtype).at[:q, :n].set(J.astype(dtype))
    Jk = jnp.zeros((QP, NK), dtype).at[:q, :n].set(J.astype(dtype))  # along k (rows)
    I = lambda m: jnp.eye(m, dtype=dtype)
    c1, c2 = _chunk(NP), _chunk(QP)
    mats = (jnp.kron(I(c1), Jp.T), jnp.kron(I(c2), Jp), jnp.kron(I(eb), Jk), jnp.kron(I(eb), Jk.T))
    if op == "mass":
        return mats
    Jh, Dh = J.astype(dtype), Dt.astype(dtype)
    Dq = Dh @ jnp.linalg.solve(Jh.T @ Jh, Jh.T)  # (q, q): D_q J = Dt
    Dp = jnp.zeros((QP, QP), dtype).at[:q, :q].set(Dq)
    return mats + (jnp.kron(I(c2), Dp.T), jnp.kron(I(c2), Dp), jnp.kron(I(eb), Dp), jnp.kron(I(eb), Dp.T))


def _compute_gauss(U, load_d, mats, op, NP, QP, precision):
    """Tile ``U: (eb·NK, NP²)`` rows (e, k), cols (j, i) → w tile, same layout (NK = :func:`_kpad`)."""
    dot = functools.partial(_dot, precision=precision)

    def rdot(X, B, NI, NO):  # contract the last axis (i, NI → NO) with B = I_c ⊗ M
        R, C = X.shape
        c = _chunk(NI)
        return dot(X.reshape(R * (C // NI) // c, c * NI), B).reshape(R, (C // NI) * NO)

    def sdot(X, B, NJ, NO):  # contract the middle axis (j, NJ → NO): swap (j, i), as r, swap back
        R, C = X.shape
        NI = C // NJ
        c = _chunk(NJ)
        Xt = jnp.transpose(X.reshape(R, NJ, NI), (0, 2, 1)).reshape(R * NI // c, c * NJ)
        Y = dot(Xt, B).reshape(R, NI, NO)
        return jnp.transpose(Y, (0, 2, 1)).reshape(R, NO * NI)

    def tdot(X, K):  # K @ X (rows (e, k)), as (Xᵀ Kᵀ)ᵀ when the tile has fewer rows than columns
        return dot(K, X) if X.shape[0] >= X.shape[1] else dot(X.T, K.T).T

    Bf, Bb, Kf, Kb = mats[:4]
    X = tdot(sdot(rdot(U, Bf, NP, QP), Bf, NP, QP), Kf)  # u on the quadrature points
    if op == "mass":
        X = load_d(0) * X
    else:
        Df, Db, Kdf, Kdb = mats[4:8]
        ur, us, ut = rdot(X, Df, QP, QP), sdot(X, Df, QP, QP), tdot(X, Kdf)
        g2, g4, g5 = load_d(2), load_d(4), load_d(5)
        X = tdot(g2 * ur + g4 * us + g5 * ut, Kdb)
        g0, g1 = load_d(0), load_d(1)
        X = X + rdot(g0 * ur + g1 * us + g2 * ut, Db, QP, QP)
        g3 = load_d(3)
        X = X + sdot(g1 * ur + g3 * us + g4 * ut, Db, QP, QP)
    return rdot(sdot(tdot(X, Kb), Bb, QP, NP), Bb, QP, NP)


def _tile_offsets(idx, e0, eb, m, MP, MK=None):
    """Flat offsets and validity of a padded ``(eb·MK, MP²)`` tile of an ``(E, m, m, m)`` array
    (k padded to MK, default MP; j, i to MP)."""
    MK = MK or MP
    e0 = e0.astype(idx)
    rr = lax.broadcasted_iota(idx, (eb * MK, 1), 0)
    cc = lax.broadcasted_iota(idx, (1, MP * MP), 1)
    e, k = rr // MK, rr % MK
    j, i = cc // MP, cc % MP
    off = (e0 + e) * m**3 + k * (m * m) + (j * m + i)
    valid = (k < m) & ((j < m) & (i < m))
    return off, valid


def _make_gauss_kernel(E, n, q, NP, QP, eb, op, comps, precision):
    NK = _kpad(NP, eb)  # rows of the u tile per element (k padded so that the t-product's K ≥ 16)
    npow2, qpow2 = n == NP == NK, q == QP
    n3, q3 = n**3, q**3
    R, Rq = eb * NK, eb * QP
    nfac = 1 if op == "mass" else 6
    idx = jnp.int64 if max(comps * E * n3, nfac * E * q3) >= 2**31 else jnp.int32

    def kernel(u_ref, d_ref, *refs):
        *mat_refs, o_ref = refs
        mats = [m[...] for m in mat_refs]
        e0 = jnp.minimum(pl.program_id(0) * eb, E - eb)  # last block shifted back
        dtype = o_ref.dtype
        if qpow2:
            slq = pl.ds(e0 * q, Rq)
            load_d = (lambda a: d_ref[slq]) if op == "mass" else (lambda a: d_ref[a, slq])
        else:
            offq, validq = _tile_offsets(idx, e0, eb, q, QP)
            offq = jnp.where(validq, offq, 0)
            zq = jnp.zeros((Rq, QP * QP), dtype)
            load_d = lambda a: jnp.where(validq, d_ref[offq + a * (E * q3) if a else offq], zq)
        if not npow2:
            off, valid = _tile_offsets(idx, e0, eb, n, NP, NK)
            offc = jnp.where(valid, off, 0)
            zn = jnp.zeros((R, NP * NP), dtype)
        def component(comp):
            if npow2:
                sl = pl.ds(e0 * n + comp * (E * n), R) if comps > 1 else pl.ds(e0 * n, R)
                u = u_ref[sl]
            else:
                base = comp.astype(idx) * (E * n3) if comps > 1 else 0
                u = jnp.where(valid, u_ref[offc + base], zn)
            w = _compute_gauss(u, load_d, mats, op, NP, QP, precision).astype(dtype)
            if npow2:
                o_ref[sl, :] = w
            else:
                _masked_store(o_ref, off + base, w, valid)

        if comps == 1:
            component(0)
        else:  # a loop, not unrolled: one component's temporaries live at a time
            lax.fori_loop(0, comps, lambda c, carry: (component(c), carry)[1], 0)

    return kernel


def _gauss_apply(u, J, Dt, data, op, cfg: FusedConfig, interpret: bool, poison=None):
    """One pallas_call on ``u: (E, n, n, n)`` or ``(C, E, n, n, n)``; ``data``: B ``(E, q, q, q)``
    (mass) or G ``(6, E, q, q, q)`` (stiffness)."""
    vector = u.ndim == 5
    if not vector:
        u = u[None]
    C, E, n = u.shape[0], u.shape[1], u.shape[-1]
    q = J.shape[0]
    dtype = u.dtype
    NP, QP = max(4, _np2(n)), max(4, _np2(q))
    eb = cfg.elements_per_block
    data = data.astype(dtype)
    if op == "mass":
        data = data[None]
    Ep = max(E, eb)
    u, data = _pad_elements(u, E, Ep, 1), _pad_elements(data, E, Ep, 1)
    mats = _gauss_matrices(J, Dt, op, NP, QP, eb, dtype)
    precision = lax.Precision.HIGHEST
    if cfg.dot_precision == "tf32x3" and dtype == jnp.float32 and not interpret:
        precision = lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    ui = u.reshape(C * Ep * n, n * n) if n == NP == _kpad(NP, eb) else u.reshape(-1)
    if q == QP:
        di = data.reshape(Ep * q, q * q) if op == "mass" else data.reshape(6, Ep * q, q * q)
    else:
        di = data.reshape(-1)
    kernel = _make_gauss_kernel(Ep, n, q, NP, QP, eb, op, C, precision)
    kw = {}
    extra = ()
    if poison is not None:
        extra = (jnp.full(ui.shape, poison, dtype),)
        kw["input_output_aliases"] = {2 + len(mats): 0}
        inner = kernel
        kernel = lambda u_ref, d_ref, *refs: inner(u_ref, d_ref, *refs[:len(mats)], refs[-1])
    if not interpret and plgpu is not None:
        kw["compiler_params"] = plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(ui.shape, dtype),
        grid=(pl.cdiv(Ep, eb),),
        interpret=interpret,
        name=f"bk{(1 if op == 'mass' else 3) + (C > 1)}_chunk_n{n}_q{q}_eb{eb}",
        **kw,
    )(ui, di, *mats, *extra)
    w = out.reshape((C, Ep, n, n, n))[:, :E]
    return w if vector else w[0]


def _gauss_batched(u, J, Dt, data, op, cfg, interpret):
    lead = u.shape[:-4]
    if len(lead) <= 1:
        return _gauss_apply(u, J, Dt, data, op, cfg, interpret)
    flat = u.reshape((-1,) + u.shape[-4:])
    return _gauss_apply(flat, J, Dt, data, op, cfg, interpret).reshape(u.shape)


def _gauss_reference(u, J, Dt, data, op):
    return mass(u, J, data) if op == "mass" else stiffness(u, J, Dt, data)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5, 6))
def _gauss(u, J, Dt, data, op, cfg, interpret):
    return _gauss_batched(u, J, Dt, data, op, cfg, interpret)


@_gauss.defjvp
def _gauss_jvp(op, cfg, interpret, primals, tangents):  # tangent: the reference's (see _fused)
    u, J, Dt, data = primals
    _, dw = jax.jvp(lambda *a: _gauss_reference(*a, op), primals, tangents)
    return _gauss(u, J, Dt, data, op, cfg, interpret), dw


def _gauss_entry(name, u, J, Dt, data, op, interpret, config, over):
    if not gauss_fused_supported(u, J):
        raise ValueError(f"{name} supports u: (..., E, n, n, n), 2 <= n, q = J.shape[0] <= {MAX_Q}, "
                         f"J: (q, n), float32/float64; got u {u.shape} {u.dtype}, J {J.shape}")
    n, q = u.shape[-1], J.shape[0]
    if config is None:
        config = default_config_gauss(n, q, u.dtype, op)
    config = dataclasses.replace(config, **{k: v for k, v in over.items() if v is not None})
    _check_config_gauss(config, n, q)
    if interpret is None:
        interpret = _default_interpret()
    J, Dt = J.astype(u.dtype), Dt.astype(u.dtype)
    return _gauss(u, J, Dt, data.astype(u.dtype), op, config, bool(interpret))


def mass_fused(u, J, B, h2=None, *, interpret=None, elements_per_block=None, num_warps=None,
               num_stages=None, config=None):
    """Fused BK1/BK2 mass ``w = Jᵀ⊗Jᵀ⊗Jᵀ (h₂B ⊙ J⊗J⊗J u)`` (same result as :func:`mass`).

    Args:
      u: ``(E, n, n, n)`` or ``(C, E, n, n, n)`` (C components in one kernel, B read once).
      J: ``(q, n)`` interpolation to the quadrature points (q ≤ 16). B: ``(E, q, q, q)``.
      h2: optional coefficient, folded into B first.
      interpret, elements_per_block, num_warps, num_stages, config: as
        :func:`stiffness_gll_fused` (default :func:`default_config_gauss`).
    """
    if h2 is not None:
        B = B * h2
    over = dict(elements_per_block=elements_per_block, num_warps=num_warps, num_stages=num_stages)
    return _gauss_entry("mass_fused", u, J, J, B, "mass", interpret, config, over)


def stiffness_fused(u, J, Dt, G, h1=None, *, interpret=None, elements_per_block=None, num_warps=None,
                    num_stages=None, config=None):
    """Fused BK3/BK4 stiffness ``w = Σ_ab D_aᵀ h₁G_ab D_b u`` on Gauss points (as :func:`stiffness`).

    Args:
      u: ``(E, n, n, n)`` or ``(C, E, n, n, n)``. J, Dt: ``(q, n)`` (q ≤ 16).
      G: ``(6, E, q, q, q)`` rr, rs, rt, ss, st, tt. h1: optional, folded into G.
      others: as :func:`mass_fused`.
    """
    if h1 is not None:
        G = G * h1
    over = dict(elements_per_block=elements_per_block, num_warps=num_warps, num_stages=num_stages)
    return _gauss_entry("stiffness_fused", u, J, Dt, G, "stiffness", interpret, config, over)


# Operators "auto" sends to a CUDA kernel (:func:`_resolve` says why never Pallas); others stay einsum.
AUTO_FUSED = frozenset({"mass", "stiffness", "stiffness_gll"})

IMPLS = ("auto", "einsum", "pallas", "fused", "cuda")


def _resolve(impl: str, operator: str, u, J=None) -> str:
    """Which kernel ``impl`` runs for ``operator`` on ``u`` (and Gauss ``J``) here:
    "einsum", "pallas" ("fused" is an alias) or "cuda" (:mod:`.cuda_kernels`).

    ``"auto"``: einsum off GPU; on a GPU the CUDA kernel where it builds and runs these
    shapes, else einsum. The Pallas kernels run only when asked for: the CUDA kernels were
    as fast or faster at every order measured on an H100 and run inside ``shard_map``, where a
    Pallas kernel crashed the process on two H200s (``experiments/results/shard_impl_*``), so
    ``"auto"`` is safe as a library default.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return "pallas" if impl == "fused" else impl
    if _default_interpret() or operator not in AUTO_FUSED:
        return "einsum"
    gll = operator == "stiffness_gll"
    if cuda_kernels.cuda_supported(u, None if gll else J) and cuda_kernels.cuda_available():
        return "cuda"
    return "einsum"


def mass_auto(u, J, B, h2=None, impl: str = "auto", **kw):
    """BK1/BK2 mass: ``"einsum"`` (:func:`mass`), ``"pallas"``/``"fused"`` (:func:`mass_fused`),
    ``"cuda"`` (:func:`~jaxsem.operators.cuda_kernels.mass_cuda`) or ``"auto"`` (the
    faster GPU kernel on a GPU, einsum otherwise: :func:`_resolve`)."""
    which = _resolve(impl, "mass", u, J)
    if which == "einsum":
        return mass(u, J, B, h2)
    if which == "cuda":
        return cuda_kernels.mass_cuda(u, J, B, h2)
    return mass_fused(u, J, B, h2, **kw)


def stiffness_auto(u, J, Dt, G, h1=None, impl: str = "auto", **kw):
    """BK3/BK4 stiffness on Gauss points, implementation chosen as :func:`mass_auto`."""
    which = _resolve(impl, "stiffness", u, J)
    if which == "einsum":
        return stiffness(u, J, Dt, G, h1)
    if which == "cuda":
        return cuda_kernels.stiffness_cuda(u, J, Dt, G, h1)
    return stiffness_fused(u, J, Dt, G, h1, **kw)
