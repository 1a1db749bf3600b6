"""Hand-written CUDA kernels for BK1–BK6, called through the XLA FFI.

``csrc/sem_kernels.cu`` holds the classic GPU layout of the spectral-element
operators (one element per N×N — or, on Gauss points, Q×Q — thread layer, the
k-column in registers, the other directions through shared memory) and variants
of it (:data:`VARIANTS`): operator matrices in constant memory, and kernels "by
lines" where each thread owns a whole line of the direction being contracted and
shared memory only hands values between owners; and an L2 prefetch of each block's
data at its start. The fastest variant per operator, order and precision measured on
an H100 is the default (:func:`default_variant`, :func:`default_prefetch`). Unlike
the Pallas/Triton kernels (:mod:`jaxsem.operators.fused`), nothing is padded to
powers of two, so every order p = 1…15 runs at its true size.

Same contracts as the einsum references:

* :func:`stiffness_gll_cuda` — :func:`~jaxsem.operators.stiffness.stiffness_gll` (BK5/BK6)
* :func:`mass_cuda` — :func:`~jaxsem.operators.mass.mass` (BK1/BK2, q = n + 1)
* :func:`stiffness_cuda` — :func:`~jaxsem.operators.stiffness.stiffness` (BK3/BK4, q = n + 1)
* :func:`gs_csr_cuda` — the gather–scatter QQᵀ as one gather (layout ``"csr"`` of
  :mod:`jaxsem.gather_scatter`)

``u: (..., E, n, n, n)`` float64 or float32 with 2 ≤ n ≤ 16; the leading axes
(vector components) run inside one launch, so the geometric factors leave
memory once per element.

Build: on first use the source is compiled with ``nvcc`` (found on ``PATH``,
``$CUDA_HOME/bin`` or ``$JAXSEM_NVCC``) for the GPU's own architecture against
the XLA FFI headers that jaxlib ships, one library per operator and dtype (eight
nvcc runs in parallel), into ``$JAXSEM_CUDA_CACHE`` (default ``~/.cache/jaxsem``),
keyed by a hash of source, headers' path, architecture and compiler; once (64–96 s on
the H100 machine before the variants 4–11 were added; about 6 min on a 2-core CPU
machine now). :func:`build` does it ahead of time.

Differentiation: a custom JVP whose tangent is the einsum reference's (as the
Pallas kernels), so forward and reverse mode work and implicit solves can
transpose it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..operators.mass import mass
from ..operators.stiffness import stiffness, stiffness_gll

__all__ = ["build", "cuda_available", "cuda_supported", "stiffness_gll_cuda", "mass_cuda",
           "stiffness_cuda", "gs_csr_cuda", "SOURCE", "MAX_N"]

SOURCE = Path(__file__).with_name("csrc") / "sem_kernels.cu"
MAX_N = 16


def _nvcc() -> str | None:
    for cand in (os.environ.get("JAXSEM_NVCC"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _gpu():
    try:
        devs = jax.devices("gpu")
    except RuntimeError:
        return None
    return devs[0] if devs and devs[0].platform in ("gpu", "cuda") else None


def _arch(device) -> str:
    cc = getattr(device, "compute_capability", None) or "9.0"
    major, minor = str(cc).split(".")[:2]
    return f"{major}{minor}"


@functools.cache
def cuda_available() -> bool:
    """Whether the CUDA kernels can run here: a CUDA GPU as JAX's default backend and nvcc,
    an already built library for this GPU, or ``$JAXSEM_CUDA_LIB`` (checked once)."""
    if jax.default_backend() not in ("gpu", "cuda") or _gpu() is None:
        return False
    return bool(os.environ.get("JAXSEM_CUDA_LIB")) or _nvcc() is not None or _built(_gpu())


OPS = ("bk5", "mass", "stiffness", "gs")
DTYPES = {"f64": "double", "f32": "float"}


def _key(device, nvcc: str | None) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(jax.ffi.include_dir().encode())
    h.update(_arch(device).encode())
    h.update(str(nvcc).encode())
    return h.hexdigest()[:16]


def _cache_dir() -> Path:
    return Path(os.environ.get("JAXSEM_CUDA_CACHE", Path.home() / ".cache" / "jaxsem"))


def _names(device, nvcc) -> dict:
    """Library file name per (op, dtype)."""
    tag = f"sm{_arch(device)}_{_key(device, nvcc)}"
    return {(op, dt): f"sem_{op}_{dt}_{tag}.so" for op in OPS for dt in DTYPES}


def _built(device) -> bool:
    """Whether every library for this GPU and source is in the cache."""
    return all((_cache_dir() / f).exists() for f in _names(device, _nvcc()).values())


def build(verbose: bool = True) -> dict:
    """Compile ``csrc/sem_kernels.cu`` for this GPU, once per operator and dtype (eight nvcc runs
    in parallel; cached), and return ``{(op, dtype): library path}``.

    ``$JAXSEM_CUDA_LIB``: a folder of libraries built elsewhere from this source, named
    ``sem_{op}_{f64|f32}.so``; used as they are.
    """
    prebuilt = os.environ.get("JAXSEM_CUDA_LIB")
    if prebuilt:
        return {(op, dt): Path(prebuilt) / f"sem_{op}_{dt}.so" for op in OPS for dt in DTYPES}
    device = _gpu()
    if device is None:
        raise RuntimeError("jaxsem CUDA kernels need a CUDA GPU (jax.devices('gpu') is empty)")
    nvcc = _nvcc()
    out_dir = _cache_dir()
    paths = {k: out_dir / name for k, name in _names(device, nvcc).items()}
    todo = {k: p for k, p in paths.items() if not p.exists()}
    if not todo:
        return paths
    if nvcc is None:
        raise RuntimeError("jaxsem CUDA kernels need nvcc: put it on PATH or set JAXSEM_NVCC")
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = _arch(device)
    if verbose:
        print(f"jaxsem: building CUDA kernels for sm_{arch} in {out_dir} (once, a few minutes)",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        procs = {}
        for (op, dt), path in todo.items():
            cmd = [nvcc, "-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC",
                   f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{jax.ffi.include_dir()}",
                   f"-DJAXSEM_OP_{op.upper()}", f"-DJAXSEM_REAL={DTYPES[dt]}",
                   str(SOURCE), "-o", str(Path(tmp) / path.name)]
            procs[op, dt] = (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   text=True))
        for (op, dt), (cmd, proc) in procs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{err[-4000:]}")
        for k, path in todo.items():
            os.replace(Path(tmp) / path.name, path)  # atomic: other processes never see half a file
    return paths


@functools.cache
def _register() -> None:
    for (op, dt), path in build().items():
        lib = ctypes.cdll.LoadLibrary(str(path))
        jax.ffi.register_ffi_target(f"jaxsem_{op}_{dt}", jax.ffi.pycapsule(lib.JaxsemKernel), platform="CUDA")


def cuda_supported(u, J=None) -> bool:
    """Whether the CUDA kernels handle these shapes/dtypes (Gauss kernels: ``J: (n + 1, n)``)."""
    if u.ndim < 4 or u.dtype not in (jnp.float32, jnp.float64):
        return False
    n = u.shape[-1]
    if u.shape[-3:] != (n, n, n) or not 2 <= n <= MAX_N:
        return False
    return J is None or tuple(J.shape) == (n + 1, n)


# 1: one k-slice per step (2 barriers per slice; BK5/BK6 and the mass only); 2: whole element
# per stage; 3: as 2 with registers capped for two blocks per multiprocessor; 4/5: as 2/3 with the
# operator matrices' uniform reads from constant memory, D rows in registers (n ≤ 10) and G
# prefetched a slice ahead; 6/7: as 2/3 with constant memory only (csrc/sem_kernels.cu). The mass
# has no collocated stage: 4 ≡ 6, 5 ≡ 7 there. 8 "by lines": one thread per line of the direction
# being contracted, operator matrices as constant-memory operands, shared memory only to hand values
# between line owners (mass: the interpolations; BK3/BK4: the interpolations, with the collocated
# stage as in 6; BK5/BK6: the collocated stage); 9 (Gauss kernels): as 8 with registers capped for
# three blocks per multiprocessor. 11 (BK3/BK4): as 8 with the collocated stage's D rows in
# registers, capped for two blocks. 10: as 8 with registers capped for more blocks per
# multiprocessor (BK5/BK6: two; mass: four). Measured and dropped (caps_{p7,bk5}_h100.json): BK5 7
# capped for three blocks, BK3 8 capped for four, the mass with B read once for all components;
# BK5/BK6 at n = 8 on the FP64 tensor cores (DMMA, one warp per element, commit 46c5484): BK5 at the
# copy ceiling like the default, BK6 30.4 against 36.2 GDOF/s (mma_p7_{a,b,c}_h100.json).
VARIANTS = tuple(range(1, 12))
_ALLOWED = {"bk5": (1, 2, 3, 4, 5, 6, 7, 8, 10), "mass": (1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
            "stiffness": (2, 3, 4, 5, 6, 7, 8, 9, 11)}


# Faster variant per (operator, n = p + 1) on an H100, FP64, where it is not 2. Variants 1-3 from
# experiments/results/cuda_kernels_v{2,3}_h100.json; 4-7 from cuda_variants_orders_h100.json (one
# sweep of 2-7 at p = 3…15, BK5/BK1/BK3); 8/9 (the Gauss kernels by lines) from
# cuda_lines_h100.json (the defaults then against 8 and 9, p = 1…15); BK5 8 from
# cuda_coll_lines_h100.json; BK3/BK4 11 from cuda_rows_h100.json; mass 10 from caps_{p7,mass}_h100.json
# (BK1 p = 5, 8: 43.4/46.3 GDOF/s against 41.0/42.2 with 9). A new variant is taken only
# where it beat the former default by > 5% (two identical kernels, mass 4 ≡ 6, differed by up to 7%
# at p = 3 and ≤ 4% elsewhere).
_VARIANT = {("bk5", 2): 1, ("bk5", 3): 1, ("bk5", 6): 6, ("bk5", 7): 8, ("bk5", 9): 6, ("bk5", 10): 8,
            ("bk5", 11): 4, ("bk5", 12): 6, ("bk5", 13): 4, ("bk5", 14): 5, ("bk5", 15): 5, ("bk5", 16): 7,
            ("mass", 2): 8, ("mass", 3): 8, ("mass", 4): 8, ("mass", 5): 8, ("mass", 6): 10, ("mass", 7): 9,
            ("mass", 8): 9, ("mass", 9): 10, ("mass", 10): 9, ("mass", 11): 9, ("mass", 12): 9,
            ("mass", 13): 9, ("mass", 14): 8, ("mass", 15): 8, ("mass", 16): 9,
            ("stiffness", 4): 8, ("stiffness", 5): 9, ("stiffness", 6): 9, ("stiffness", 7): 9,
            ("stiffness", 8): 8, ("stiffness", 9): 11, ("stiffness", 10): 11, ("stiffness", 11): 8,
            ("stiffness", 12): 8, ("stiffness", 13): 8, ("stiffness", 14): 11, ("stiffness", 15): 3}

# Where the vector forms (BK2/BK4/BK6: 3 components in one launch) want another variant
# (cuda_variants_p7_h100.json: BK6 p = 7 36.4 GDOF/s with 4 against 28.4 with 2;
# cuda_lines_h100.json: BK2 p = 5 50.8 with 8 against 46.6 with 9; cuda_rows_h100.json: BK4 p = 6,
# 7, 14 with 11 against 8/8/3; caps_{p7,bk5,bk6,mass}_h100.json: BK6 p = 4, 5, 6, 8 with 10,
# +7…34% over the former default (p = 4 in one run, the others in two); BK2 p = 7 with 10, 56.4/57.0 against 52.6/52.7 with 9; BK2 p = 8 (mass
# 10 as the scalar form) 53.0 against 47.9).
_VARIANT_VECTOR = {("bk5", 5): 10, ("bk5", 6): 10, ("bk5", 7): 10, ("bk5", 8): 4, ("bk5", 9): 10,
                   ("mass", 6): 8, ("mass", 8): 10, ("stiffness", 7): 11, ("stiffness", 8): 11,
                   ("stiffness", 15): 11}


# L2 prefetch (csrc/sem_kernels.cu, prefetch_block): at block start one thread per geometric
# factor and per component asks L2 for the block's elements (sm_90 bulk prefetch; a no-op on older
# GPUs and for variant 1). Bit PREFETCH_L2 of the FFI attribute "variant". On by default for the
# (operator, n, vector form) listed below: the default variant with it beat the same without it by > 5% in
# two A/B sweeps on an H100 (l2rt_orders_*_h100.json, l2rt2_orders_*_h100.json; BK1 and BK3 at
# p = 7 also in l2pf_p7_*_h100.json). It lost up to 20% elsewhere (BK3 p = 2-6, BK5 p = 6-8).
PREFETCH_L2 = 64
_PREFETCH = frozenset({("mass", n, False) for n in (2, 3, 5, 7, 8, 9, 10, 11, 12, 13, 15)}
                      | {("mass", n, True) for n in (3, 5, 6, 7, 11)}
                      | {("stiffness", n, False) for n in (8, 9, 12)}
                      | {("bk5", n, True) for n in (5, 6)})


# FP32 (operator, n, vector form) -> (variant, prefetch) where it differs from the FP64 tables: the
# one that beat the FP64 default by > 5% in two sweeps of p = 1…15 on an H100, FP32
# (f32_variants_r{1,2}_h100.json at p = 7 over every variant; f32_orders_bk{2,4,5,6}_r{1,2}_h100.json
# over the orders). FP32 halves the registers and shared memory per value, so the kernels by lines
# (8-10) win more often: BK6 p = 7 +28%, BK5 p = 7 +22%, BK4 p = 13-14 +65%.
_FP32 = {("bk5", 8, False): (8, False), ("bk5", 9, False): (8, False), ("bk5", 10, False): (6, False)}
_FP32.update({("bk5", n, True): (10, True) for n in (4, 7, 8, 9, 10, 11, 12, 13)})
_FP32.update({("stiffness", n, True): (8, True) for n in (2, 3, 6, 7, 8, 9, 12, 13, 14, 15)})
_FP32.update({("stiffness", 5, True): (9, True), ("stiffness", 11, True): (9, True)})
_FP32.update({("mass", 8, True): (10, True), ("mass", 9, True): (9, True), ("mass", 10, True): (9, True),
              ("mass", 12, True): (9, True)})


def _fp32(dtype) -> bool:
    return dtype is not None and np.dtype(dtype) == np.float32


def default_prefetch(op: str, n: int, components: int = 1, dtype="float64") -> bool:
    """Whether ``op`` at n = p + 1 prefetches into L2 by default (:data:`_PREFETCH`; FP32:
    :data:`_FP32` first)."""
    if _fp32(dtype) and (op, n, components > 1) in _FP32:
        return _FP32[op, n, components > 1][1]
    return (op, n, components > 1) in _PREFETCH


def default_variant(op: str, n: int, components: int = 1, dtype="float64") -> int:
    """Kernel variant for ``op`` ("bk5", "mass", "stiffness") at n = p + 1 with ``components``
    fields per launch: the faster one measured on an H100, FP64 (2 unless :data:`_VARIANT` or,
    for several components, :data:`_VARIANT_VECTOR` says otherwise); FP32 (``dtype``) takes
    :data:`_FP32` first."""
    if _fp32(dtype) and (op, n, components > 1) in _FP32:
        return _FP32[op, n, components > 1][0]
    if components > 1 and (op, n) in _VARIANT_VECTOR:
        return _VARIANT_VECTOR[op, n]
    return _VARIANT.get((op, n), 2)


def defaults(op: str, u) -> tuple[int, bool]:
    """``(variant, prefetch)`` the kernel functions take for ``u: (..., E, n, n, n)`` when not
    told: :func:`default_variant` and :func:`default_prefetch` at its n, components and dtype."""
    n = u.shape[-1]
    comps = int(np.prod(u.shape[:-4], dtype=int)) if u.ndim >= 4 else 1
    return default_variant(op, n, comps, u.dtype), default_prefetch(op, n, comps, u.dtype)


def _call(target: str, variant: int, u, *args):
    """One launch on ``u`` with its leading axes flattened into C components; ``variant`` may
    carry the bit :data:`PREFETCH_L2`."""
    _register()
    E, n = u.shape[-4], u.shape[-1]
    u5 = u.reshape((-1, E, n, n, n))
    dt = "f64" if u.dtype == jnp.float64 else "f32"
    call = jax.ffi.ffi_call(f"jaxsem_{target}_{dt}", jax.ShapeDtypeStruct(u5.shape, u5.dtype),
                            vmap_method="sequential")
    return call(u5, *args, variant=np.int32(variant)).reshape(u.shape)


def _dq(J, Dt):
    """Collocated derivative on the Gauss points: ``D_q J = Dt`` (as the Pallas kernels);
    full-precision products (XLA's default FP32 dot on a GPU is TF32)."""
    mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    return mm(Dt, jnp.linalg.solve(mm(J.T, J), J.T))


def _reference(op, u, M1, M2, data):
    if op == "bk5":
        return stiffness_gll(u, M1, data)
    if op == "mass":
        return mass(u, M1, data)
    return stiffness(u, M1, M2, data)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _apply(u, M1, M2, data, op, variant):
    if op == "bk5":
        return _call("bk5", variant, u, M1, data)
    if op == "mass":
        return _call("mass", variant, u, M1, data)
    return _call("stiffness", variant, u, M1, _dq(M1, M2), data)


@_apply.defjvp
def _apply_jvp(op, variant, primals, tangents):  # tangent: the einsum reference's (transposable)
    _, dw = jax.jvp(lambda *a: _reference(op, *a), primals, tangents)
    return _apply(*primals, op, variant), dw


def _variant(variant, prefetch, op, u):
    """The FFI attribute: the kernel variant (checked, or the default) with bit PREFETCH_L2."""
    default_v, default_pf = defaults(op, u) if u.ndim else (2, False)
    if variant is None:
        variant = default_v
    elif variant not in _ALLOWED[op]:  # BK3/BK4: no slice kernel (1) and no 10; BK5/BK6: no 9; mass: no 11
        raise ValueError(f"variant must be one of {_ALLOWED[op]} for {op}, got {variant!r}")
    if prefetch is None:
        prefetch = default_pf
    elif prefetch not in (True, False):
        raise ValueError(f"prefetch must be True, False or None, got {prefetch!r}")
    return int(variant) | (PREFETCH_L2 if prefetch else 0)


def _entry(name, u, J, op):
    if not cuda_supported(u, J):
        raise ValueError(f"{name} supports u: (..., E, n, n, n) float32/float64 with 2 <= n <= {MAX_N}"
                         + ("" if J is None else " and J: (n + 1, n)")
                         + f"; got u {u.shape} {u.dtype}" + ("" if J is None else f", J {J.shape}"))
    if not cuda_available():
        raise ValueError(f"{name}: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc "
                         f"(backend here: {jax.default_backend()}); use impl='einsum' or 'pallas'")


def stiffness_gll_cuda(u, D, G, h1=None, variant=None, prefetch=None):
    """BK5/BK6 ``w = Σ_ab D_aᵀ h₁G_ab D_b u`` on GLL points (same result as :func:`stiffness_gll`).

    ``u: (..., E, n, n, n)``, ``D: (n, n)``, ``G: (6, E, n, n, n)``; ``h1`` folded into G.
    ``variant``: one of :data:`VARIANTS` (default :func:`default_variant`); ``prefetch``: the
    L2 prefetch at block start on or off (default :func:`default_prefetch`).
    """
    v = _variant(variant, prefetch, "bk5", u)
    _entry("stiffness_gll_cuda", u, None, "bk5")
    if h1 is not None:
        G = G * h1
    return _apply(u, D.astype(u.dtype), D.astype(u.dtype), G.astype(u.dtype), "bk5", v)


def mass_cuda(u, J, B, h2=None, variant=None, prefetch=None):
    """BK1/BK2 ``w = Jᵀ⊗Jᵀ⊗Jᵀ (h₂B ⊙ J⊗J⊗J u)`` (as :func:`mass`): ``J: (n + 1, n)``,
    ``B: (E, q, q, q)``; ``variant``, ``prefetch`` as :func:`stiffness_gll_cuda`."""
    v = _variant(variant, prefetch, "mass", u)
    _entry("mass_cuda", u, J, "mass")
    if h2 is not None:
        B = B * h2
    J = J.astype(u.dtype)
    return _apply(u, J, J, B.astype(u.dtype), "mass", v)


def stiffness_cuda(u, J, Dt, G, h1=None, variant=None, prefetch=None):
    """BK3/BK4 stiffness on q = n + 1 Gauss points (as :func:`stiffness`): ``J, Dt: (q, n)``,
    ``G: (6, E, q, q, q)``; ``variant``, ``prefetch`` as :func:`stiffness_gll_cuda`."""
    v = _variant(variant, prefetch, "stiffness", u)
    _entry("stiffness_cuda", u, J, "stiffness")
    if h1 is not None:
        G = G * h1
    return _apply(u, J.astype(u.dtype), Dt.astype(u.dtype), G.astype(u.dtype), "stiffness", v)


def gs_csr_cuda(u, off, idx):
    """Gather–scatter QQᵀ as one gather (``csrc/sem_kernels.cu``, ``gs_csr_kernel``).

    ``u: (C, L)`` float32/float64 (C fields of L local nodes); ``off: (L + 1,)`` and ``idx: (nnz,)``
    int32: local node i sums ``u[:, idx[off[i]:off[i + 1]]]`` (all copies of its node, itself
    included, in one order for all copies) and keeps ``u[:, i]`` where ``off[i] == off[i + 1]``.
    Built by :func:`jaxsem.gather_scatter.make_gs` with ``layout="csr"``; no derivative rule
    of its own (:func:`jaxsem.gather_scatter.gs_apply` supplies it).
    """
    if u.ndim != 2 or u.dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"gs_csr_cuda: u must be (C, L) float32/float64, got {u.shape} {u.dtype}")
    if off.shape != (u.shape[1] + 1,) or off.dtype != jnp.int32 or idx.ndim != 1 or idx.dtype != jnp.int32:
        raise ValueError(f"gs_csr_cuda: off must be ({u.shape[1] + 1},) int32 and idx (nnz,) int32, "
                         f"got {off.shape} {off.dtype}, {idx.shape} {idx.dtype}")
    if not cuda_available():
        raise ValueError("gs_csr_cuda: the CUDA kernels need a CUDA GPU as JAX's backend and nvcc")
    _register()
    dt = "f64" if u.dtype == jnp.float64 else "f32"
    call = jax.ffi.ffi_call(f"jaxsem_gs_{dt}", jax.ShapeDtypeStruct(u.shape, u.dtype), vmap_method="sequential")
    return call(u, off, idx, variant=np.int32(0))
