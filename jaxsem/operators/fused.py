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

Differentiation: the operator is linear and symmetric in u, so the VJP w.r.t. u
applies the same kernel to the cotangent; the VJP w.r.t. D and G goes through
the einsum reference (under ``jit`` it is dropped when not needed).

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

from .stiffness import stiffness_gll

__all__ = ["FusedConfig", "DEFAULT_CONFIG", "stiffness_gll_fused", "stiffness_gll_auto",
           "fused_supported", "default_config"]

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


def _make_kernel(E, n, NP, eb, variant, poison=False, programs=0, precision=lax.Precision.HIGHEST):
    pow2 = n == NP
    n3 = n ** 3
    bcast = variant == "bcast"
    R, C = eb * NP, NP * NP
    tile = (eb, NP, NP, NP) if bcast else (R, C)

    # flat gather offsets reach 6·E·n³: 64-bit beyond int32 (needs jax_enable_x64)
    idx = jnp.int64 if 6 * E * n3 >= 2**31 else jnp.int32

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
            u = u_ref[sl]
            load_g = lambda a: g_ref[a, sl]
        else:
            off, valid = gather_offsets(e0)
            offc = jnp.where(valid, off, 0)  # in bounds everywhere; padding zeroed below
            zero = jnp.zeros(tile, o_ref.dtype)
            u = jnp.where(valid, u_ref[offc], zero)
            load_g = lambda a: jnp.where(valid, g_ref[offc + a * (E * n3)], zero)
        if bcast:
            w = _compute_bcast(u, load_g, mats[0])
        else:
            w = _compute_dots(u, load_g, mats, NP, eb, variant, precision)
        w = w.astype(o_ref.dtype)
        if pow2:
            if bcast:
                o_ref[pl.ds(e0, eb)] = w
            else:
                o_ref[pl.ds(e0 * n, R), :] = w
        else:
            _masked_store(o_ref, off, w, valid)

    return kernel


def _masked_store(ref, off, val, mask):
    if plgpu is not None and hasattr(plgpu, "store"):
        plgpu.store(ref.at[off], val, mask=mask)
    else:  # pragma: no cover - older/newer Pallas API
        pl.store(ref, (off,), val, mask=mask)


def _fused_apply(u, D, G, cfg: FusedConfig, interpret: bool, poison=None):
    """One pallas_call on ``u: (E, n, n, n)``.

    ``poison``: an optional fill value (e.g. NaN) for the output buffer before
    the kernel runs (aliased in and out), so unwritten points show up in tests.
    """
    E, n = u.shape[0], u.shape[-1]
    dtype = u.dtype
    NP = max(4, _np2(n))
    eb = cfg.elements_per_block
    G = G.astype(dtype)
    Ep = E
    if E < eb:  # tiny meshes: pad to one full block (cheap at this size)
        Ep = eb
        u = jnp.concatenate([u, jnp.zeros((eb - E,) + u.shape[1:], dtype)])
        G = jnp.concatenate([G, jnp.zeros((6, eb - E) + G.shape[2:], dtype)], axis=1)
    mats = _matrices(D, NP, eb, cfg.variant, dtype)
    precision = lax.Precision.HIGHEST
    if cfg.dot_precision == "tf32x3" and dtype == jnp.float32 and not interpret:
        precision = lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    pow2 = n == NP
    if pow2:
        if cfg.variant == "bcast":
            ui, gi = u, G
        else:
            ui, gi = u.reshape(Ep * n, n * n), G.reshape(6, Ep * n, n * n)
    else:
        ui, gi = u.reshape(-1), G.reshape(-1)
    nblocks = pl.cdiv(Ep, eb)
    programs = cfg.programs or cfg.programs_per_sm * (_sm_count() if not interpret else 1)
    programs = min(programs, nblocks)
    kernel = _make_kernel(Ep, n, NP, eb, cfg.variant, poison is not None, programs, precision)
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
        name=f"bk5_{cfg.variant}_n{n}_eb{eb}",
        **kw,
    )(ui, gi, *mats, *extra)
    w = out.reshape((Ep, n, n, n))
    return w[:E] if Ep != E else w


def _apply_batched(u, D, G, cfg, interpret):
    lead = u.shape[:-4]
    if not lead:
        return _fused_apply(u, D, G, cfg, interpret)
    flat = u.reshape((-1,) + u.shape[-4:])
    return jnp.stack([_fused_apply(x, D, G, cfg, interpret) for x in flat]).reshape(u.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused(u, D, G, cfg, interpret):
    return _apply_batched(u, D, G, cfg, interpret)


def _fused_fwd(u, D, G, cfg, interpret):
    return _apply_batched(u, D, G, cfg, interpret), (u, D, G)


def _fused_bwd(cfg, interpret, res, g):
    u, D, G = res
    gu = _fused(g, D, G, cfg, interpret)  # A_e is symmetric: Aᵀ g = A g
    _, vjp = jax.vjp(lambda D_, G_: stiffness_gll(u, D_, G_), D, G)
    gD, gG = vjp(g)
    return gu, gD, gG


_fused.defvjp(_fused_fwd, _fused_bwd)


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
    ``"pallas"`` (:func:`stiffness_gll_fused`) or ``"auto"``: Pallas on GPU
    for supported shapes/dtypes, the einsum reference otherwise (CPU)."""
    if impl not in ("auto", "einsum", "pallas"):
        raise ValueError(f"impl must be 'auto', 'einsum' or 'pallas', got {impl!r}")
    if impl == "auto":
        impl = "pallas" if (not _default_interpret() and fused_supported(u)) else "einsum"
    if impl == "einsum":
        return stiffness_gll(u, D, G, h1)
    return stiffness_gll_fused(u, D, G, h1, **kw)
