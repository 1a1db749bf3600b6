"""The CUDA kernels' source, tuning table, build and loading (nvcc, cache, XLA FFI registration).

``csrc/sem_kernels.cu`` holds the classic GPU layout of the spectral-element
operators (one element per N×N — or, on Gauss points, Q×Q — thread layer, the
k-column in registers) in a few variants (:data:`VARIANTS`); which one runs, and
whether it prefetches its block's data into L2, is read from one tuning table
(:data:`TUNING`, :func:`defaults`) per operator, order, vector form and dtype. The
table's provenance — which variant won where, and the measurement — is
``docs/kernels.md``. Nothing is padded to powers of two, so every order
p = 1…15 runs at its true size.


Build, on demand: the first call traced with an operator, dtype and order
compiles ``csrc/sem_kernels.cu`` for that key only (``-DJAXSEM_OP_…
-DJAXSEM_REAL=… -DJAXSEM_N=n``: one library holding that operator's variants at
that order; the gather–scatter has one library per dtype) with ``nvcc`` (found on
``PATH``, ``$CUDA_HOME/bin`` or ``$JAXSEM_NVCC``) for the GPU's own architecture,
against the XLA FFI headers that jaxlib ships, and registers it with XLA before
the call is lowered. One line on stderr says what is being built. Libraries are
cached in ``$JAXSEM_CUDA_CACHE`` (an absolute path; default ``~/.cache/jaxsem``), a
directory of the user's own that no one else can write (created 0700), under names
keyed by a hash of the source, the headers' path, the architecture and the compiler,
each with the sha256 of the file the build produced beside it; a library is loaded
only when its content matches that digest, and rebuilt otherwise
(:mod:`jaxsem.backends.cache`). :func:`build` compiles every library (or those asked
for) ahead of time, in parallel.

``$JAXSEM_CUDA_LIB``: a folder of libraries built elsewhere from this source, used
as they are and never compiled: ``sem_{op}_{f64|f32}_n{n}.so`` (op: one of
:data:`OPS`, :data:`DERIVATIVE_OPS` or :data:`TRANSFER_OPS`; n = order + 1) and ``sem_gs_{f64|f32}.so``,
each with its ``.so.sha256``; ``build(folder=…)`` writes such a folder. A kernel
whose file is missing there, or does not match its digest, raises when it is
first called.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import cache

__all__ = ["build", "cuda_available", "cuda_supported", "defaults", "libraries", "SOURCE", "MAX_N", "OPS",
           "DERIVATIVE_OPS", "TRANSFER_OPS", "VARIANTS", "TUNING", "DEFAULT", "PREFETCH_L2"]

SOURCE = Path(__file__).with_name("csrc") / "sem_kernels.cu"
MAX_N = 16
# BK5/BK6 (GLL, collocated), the same on assembled vectors, the DG Maxwell and advection
# right-hand sides, the Navier–Stokes convective term on the 3/2 rule, BK1/BK2, BK3/BK4
# (Gauss, q = n + 1) and the same on assembled vectors
OPS = ("bk5", "bk5a", "maxwell", "advection", "conv", "mass", "stiffness", "stiffnessa")
# Libraries of derivative kernels that run their operator's variant (TUNING has no row for them):
# maxwellm, the Maxwell right-hand side's material adjoint (maxwell_material_vjp_cuda); convt, the
# transpose of the convective term's linearization (convection_vjp_cuda).
DERIVATIVE_OPS = ("maxwellm", "convt")
# p-multigrid transfers (interp_cuda): one library per dtype and fine size n, every coarse m < n in it
TRANSFER_OPS = ("interp",)

# The variants each operator has (csrc/sem_kernels.cu: the `case` labels of launch_bk5,
# launch_mass, launch_stiffness; launch_maxwell and launch_advection, the DG right-hand sides,
# have one kernel each, variant 2: the three directions' derivatives in one loop, docs/kernels.md):
#   1     one k-slice per step through shared memory, two barriers per slice
#   2     the whole element through shared memory once per stage
#   3     as 2 with registers capped for two blocks per multiprocessor
#   4, 5  as 2 / as 3, with D's warp-uniform entries from constant memory, D rows in registers
#         (n <= 10) and the geometric factors loaded a slice ahead
#   6, 7  as 2 / as 3, with D's warp-uniform entries from constant memory
#   8     "by lines": each thread owns a whole line of the direction being contracted, the
#         operator matrices are constant-memory operands, shared memory only hands values between
#         line owners (BK5/BK6: the collocated stage; mass, BK3/BK4: the interpolations, BK3/BK4's
#         collocated stage as 6)
#   9     as 8 with registers capped for three blocks per multiprocessor
#   10    as 8 with registers capped for more blocks: two (BK5/BK6), four (mass)
#   11    as 8 with the collocated stage's D rows in registers, capped for two blocks
# bk5a (assembled storage) has element variants of bk5 (those the table selects), gathering its
# input through the node map and adding its output into the global vector with atomics;
# stiffnessa (BK3/BK4 on assembled vectors) likewise has stiffness's variants by lines.
VARIANTS = {"bk5": (1, 2, 4, 5, 6, 7, 8, 10), "bk5a": (2, 5, 6, 7), "maxwell": (2,), "advection": (2,), "conv": (2,),
            "mass": (8, 9, 10), "stiffness": (2, 3, 8, 9, 11), "stiffnessa": (8, 9, 11)}

# Bit of the FFI attribute "variant": at block start one thread per geometric factor and per
# component asks L2 for the block's elements (sm_90 bulk prefetch; a no-op on older GPUs and for
# variant 1). A hint: results are bit-identical with it on and off.
PREFETCH_L2 = 64

DEFAULT = (2, False)  # (variant, prefetch) for a key TUNING does not list

# The tuning table: per (operator, vector form, dtype), the kernel for n = p + 1 = 2 … 16, as
# "V" (variant V), "Vp" (variant V with the L2 prefetch) or "." (not listed: DEFAULT). The
# vector form is 3 components in one launch (BK2/BK4/BK6). The fastest measured on an H100
# (docs/kernels.md).
_ROWS = {  # n =                           2    3    4    5    6    7    8    9   10   11   12   13   14   15   16
    ("bk5", False, "float64"):        "    1    1    .    .    6    8    .    6    8    4    6    4    5    5    7",
    ("bk5", False, "float32"):        "    1    1    .    .    6    8    8    8    6    4    6    4    5    5    7",
    ("bk5", True, "float64"):         "    1    1    .  10p  10p   10    4   10    8    4    6    4    5    5    7",
    ("bk5", True, "float32"):         "    1    1  10p  10p  10p  10p  10p  10p  10p  10p  10p  10p    5    5    7",
    ("bk5a", False, "float64"):       "    .    .    .    .    6    .    6    .    6    .    6    .    .    .    7",
    ("bk5a", True, "float64"):        "    .    .    .    .    .    .    5    .    .    .    .    .    .    .    .",
    ("mass", False, "float64"):       "   8p   8p    8   8p   10   9p   9p  10p   9p   9p   9p   9p    8   8p    9",
    ("mass", False, "float32"):       "   8p   8p    8   8p   10   9p   9p  10p   9p   9p   9p   9p    8   8p    9",
    ("mass", True, "float64"):        "    8   8p    8   8p   8p   9p   10   10    9   9p    9    9    8    8    9",
    ("mass", True, "float32"):        "    8   8p    8   8p   8p   9p  10p   9p   9p   9p   9p    9    8    8    9",
    ("stiffness", False, "float64"):  "    .    .    8    9    9    9   8p  11p   11    8   8p    8   11    3    .",
    ("stiffness", False, "float32"):  "    .    .    8    9    9    9   8p  11p   11    8   8p    8   11    3    .",
    ("stiffness", True, "float64"):   "    .    .    8    9    9   11   11   11   11    8    8    8   11   11    .",
    ("stiffness", True, "float32"):   "   8p   8p    8   9p   8p   8p   8p   8p   11   9p   8p   8p   8p   8p    .",
}


def _parse(rows: dict) -> dict:
    """:data:`_ROWS` as ``{(op, n, vector, dtype): (variant, prefetch)}``, "." cells left out."""
    table = {}
    for (op, vector, dtype), row in rows.items():
        cells = row.split()
        if len(cells) != MAX_N - 1:
            raise ValueError(f"tuning row {op, vector, dtype} has {len(cells)} cells, not one per n = 2..{MAX_N}")
        for n, cell in zip(range(2, MAX_N + 1), cells):
            if cell != ".":
                table[op, n, vector, dtype] = (int(cell.rstrip("p")), cell.endswith("p"))
    return table


# (op, n, vector form, dtype name) -> (variant, prefetch); read by defaults() when a call is traced.
def _by_lines(row: str) -> str:
    """A stiffness row for stiffnessa: the same kernel where it is one by lines, else variant 8."""
    return " ".join(c if c.rstrip("p") in ("8", "9", "11") else "8" for c in row.split())


# stiffnessa, one component in FP64, is tuned on its own (BP3 on an H100, docs/kernels.md); its
# other forms run the kernel that stiffness's table picks at each n when that one is by lines
# (the only ones with an assembled form), else variant 8.
_ROWS.update({("stiffnessa", vector, dtype): _by_lines(row)
              for (op, vector, dtype), row in list(_ROWS.items()) if op == "stiffness"})
_ROWS[("stiffnessa", False, "float64")] = "    9    8    8    8    8    9   11   11   11    9    8   11   11   11    8"

TUNING: dict[tuple[str, int, bool, str], tuple[int, bool]] = _parse(_ROWS)


def defaults(op: str, u) -> tuple[int, bool]:
    """``(variant, prefetch)`` that ``op`` (``"bk5"``, ``"mass"``, ``"stiffness"``) runs for
    ``u: (..., E, n, n, n)``: :data:`TUNING` at u's n, vector form (more than one component in
    the leading axes) and dtype, else :data:`DEFAULT`. Read when a call is traced."""
    n = u.shape[-1]
    vector = math.prod(u.shape[:-4]) > 1
    return TUNING.get((op, n, vector, np.dtype(u.dtype).name), DEFAULT)


def _attr(op: str, u) -> int:
    """The FFI attribute ``variant``: the table's variant with bit :data:`PREFETCH_L2`."""
    variant, prefetch = defaults(op, u)
    if variant not in VARIANTS[op]:
        raise ValueError(f"TUNING gives variant {variant!r} for {op} at n = {u.shape[-1]}, {u.dtype}; "
                         f"{op} has variants {VARIANTS[op]}")
    return int(variant) | (PREFETCH_L2 if prefetch else 0)


# ----------------------------------------------------------------------------- build

DTYPES = {"float64": ("f64", "double"), "float32": ("f32", "float")}
_LOCK = threading.Lock()


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


def libraries() -> list[tuple[str, str, int | None]]:
    """Every library key: ``(op, dtype, n)`` for each operator, dtype and n = 2…16 (the
    transfers between orders, :data:`TRANSFER_OPS`: the fine n = 3…16), and
    ``("gs", dtype, None)`` for the gather–scatter."""
    return ([(op, dt, n) for op in OPS + DERIVATIVE_OPS for dt in DTYPES for n in range(2, MAX_N + 1)]
            + [(op, dt, n) for op in TRANSFER_OPS for dt in DTYPES for n in range(3, MAX_N + 1)]
            + [("gs", dt, None) for dt in DTYPES])


def _file_name(key) -> str:
    """Plain file name of library ``key`` (as in ``$JAXSEM_CUDA_LIB``)."""
    op, dt, n = key
    return f"sem_{op}_{DTYPES[dt][0]}" + ("" if n is None else f"_n{n}") + ".so"


@functools.cache
def _tag(arch: str, nvcc: str | None) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(jax.ffi.include_dir().encode())
    h.update(arch.encode())
    h.update(str(nvcc).encode())
    return f"sm{arch}_{h.hexdigest()[:16]}"


def _cached(key, device, root: Path | None = None) -> Path:
    """Library ``key`` in the cache (``root``, default: the checked cache directory), for this
    GPU, source and compiler."""
    root = cache.trusted_dir(cache.cache_dir()) if root is None else root
    return root / _file_name(key).replace(".so", f"_{_tag(_arch(device), _nvcc())}.so")


def _built(device) -> bool:
    """Whether every library for this GPU and source is in the cache with its digest (checked
    against the file when it is loaded)."""
    root = cache.trusted_dir(cache.cache_dir())
    paths = [_cached(k, device, root) for k in libraries()]
    return all(p.exists() and cache.digest_file(p).exists() for p in paths)


@functools.cache
def cuda_available() -> bool:
    """Whether the CUDA kernels can run here: a CUDA GPU as JAX's default backend and nvcc,
    every library built for this GPU, or ``$JAXSEM_CUDA_LIB`` (checked once)."""
    if jax.default_backend() not in ("gpu", "cuda") or _gpu() is None:
        return False
    return bool(os.environ.get("JAXSEM_CUDA_LIB")) or _nvcc() is not None or _built(_gpu())


def _compile(todo: dict, device, jobs: int) -> None:
    """nvcc for each ``{key: path}`` in ``todo``, ``jobs`` at a time, the largest n first; each
    library written beside its path and renamed into place."""
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("jaxsem CUDA kernels need nvcc: put it on PATH or set JAXSEM_NVCC")
    arch = _arch(device)

    def one(key):
        path = todo[key]
        op, dt, n = key
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = Path(tmp) / path.name
            cmd = [nvcc, "-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC",
                   f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{jax.ffi.include_dir()}",
                   f"-DJAXSEM_OP_{op.upper()}", f"-DJAXSEM_REAL={DTYPES[dt][1]}"]
            cmd += [] if n is None else [f"-DJAXSEM_N={n}"]
            proc = subprocess.run(cmd + [str(SOURCE), "-o", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
            cache.install(out, path)

    order = sorted(todo, key=lambda k: -(k[2] or 0))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for f in [pool.submit(one, k) for k in order]:
            f.result()


def build(keys=None, folder=None, jobs: int | None = None, verbose: bool = True) -> dict:
    """Compile the libraries ``keys`` (default: all of :func:`libraries`) not yet built, ``jobs``
    nvcc runs at a time (default: one per CPU), and return ``{key: path}``.

    ``folder``: write them there under the plain names ``$JAXSEM_CUDA_LIB`` reads, instead of
    the cache. With ``$JAXSEM_CUDA_LIB`` set (and no ``folder``) nothing is compiled: the paths
    there are returned.
    """
    keys = libraries() if keys is None else [tuple(k) for k in keys]
    bad = [k for k in keys if k not in libraries()]
    if bad:
        raise ValueError(f"keys must be (op, dtype, n) of jaxsem.backends.cuda.libraries(), got {bad[:3]}")
    prebuilt = os.environ.get("JAXSEM_CUDA_LIB")
    if prebuilt and folder is None:
        return {k: Path(prebuilt) / _file_name(k) for k in keys}
    device = _gpu()
    if device is None:
        raise RuntimeError("jaxsem CUDA kernels need a CUDA GPU (jax.devices('gpu') is empty)")
    root = Path(folder) if folder is not None else cache.trusted_dir(cache.cache_dir())
    paths = {k: root / _file_name(k) if folder is not None else _cached(k, device, root) for k in keys}
    todo = {k: p for k, p in paths.items() if cache.mismatch(p) is not None}
    if todo:
        if verbose:
            print(f"jaxsem: building {len(todo)} CUDA kernel libraries for sm_{_arch(device)} in "
                  f"{next(iter(todo.values())).parent}", file=sys.stderr, flush=True)
        _compile(todo, device, jobs or os.cpu_count() or 1)
    return paths


@functools.cache
def _target(op: str, dtype: str, n: int | None) -> str:
    """The FFI target of library ``(op, dtype, n)``, built if needed, loaded and registered."""
    key = (op, dtype, n)
    name = f"jaxsem_{op}_{DTYPES[dtype][0]}" + ("" if n is None else f"_n{n}")
    prebuilt = os.environ.get("JAXSEM_CUDA_LIB")
    if prebuilt:
        path = Path(prebuilt) / _file_name(key)
        if not path.exists():
            raise FileNotFoundError(f"$JAXSEM_CUDA_LIB={prebuilt} has no {path.name} ({op}, {dtype}, n = {n})")
        rebuild = None
    else:
        device = _gpu()
        path = _cached(key, device)

        def rebuild(reason):
            print(f"jaxsem: building the CUDA kernels {op}, {dtype}" + ("" if n is None else f", n = {n}")
                  + f" for sm_{_arch(device)} ({reason}; cached in {path.parent})", file=sys.stderr, flush=True)
            _compile({key: path}, device, 1)

    lib = cache.load_verified(path, rebuild)
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(lib.JaxsemKernel), platform="CUDA")
    return name


def _ffi_target(op: str, dtype, n: int | None = None) -> str:
    """The FFI target of ``op`` at ``dtype``, ``n``."""
    with _LOCK:  # one build and registration per library, also under threads
        return _target(op, np.dtype(dtype).name, n)


# ----------------------------------------------------------------------------- shapes


def cuda_supported(u, J=None) -> bool:
    """Whether the CUDA kernels handle these shapes/dtypes (Gauss kernels: ``J: (n + 1, n)``)."""
    if u.ndim < 4 or u.dtype not in (jnp.float32, jnp.float64):
        return False
    n = u.shape[-1]
    if u.shape[-3:] != (n, n, n) or not 2 <= n <= MAX_N:
        return False
    return J is None or tuple(J.shape) == (n + 1, n)
