"""MPI: the world communicator, mpi4jax loaded and mended, and the host-staging tuning of a run.

Imported only by :class:`jaxsem.parallel.Comm`'s operations, which import ``mpi4py``
and ``mpi4jax`` themselves only when an MPI launcher started several processes: a
plain ``python`` process never loads MPI.
"""

from __future__ import annotations

import functools
import os
import warnings

from .launch import launcher_size

__all__ = ["world", "mpi4jax_module", "HOST_STAGING_TUNED"]

# True once a distributed run has raised glibc's mmap threshold (see _tune_host_staging).
HOST_STAGING_TUNED = False


@functools.lru_cache(maxsize=1)
def world():
    """The cached MPI communicator (a duplicate of COMM_WORLD), or None on one process."""
    size = launcher_size()
    if size is None or size <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        warnings.warn(
            f"an MPI launcher started {size} processes but mpi4py is not installed: "
            "each process runs alone (size 1). Install mpi4py and mpi4jax "
            "(see tests/run.sh) to run distributed.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    if MPI.COMM_WORLD.Get_size() == 1:
        return None
    global HOST_STAGING_TUNED
    HOST_STAGING_TUNED = _tune_host_staging()
    return MPI.COMM_WORLD.Dup()


def _tune_host_staging() -> bool:
    """Keep mpi4jax's per-call host staging buffers off fresh mmap pages.

    Without CUDA-aware MPI, mpi4jax mallocs a host send and receive buffer on
    every call. glibc serves requests above its mmap threshold (128 KiB by
    default, raised dynamically up to 32 MiB) with a fresh ``mmap`` and returns
    them with ``munmap``, so every exchange page-faults its whole buffer again.
    Raising the threshold to its 32 MiB maximum and disabling trimming lets
    the heap reuse those pages (measured in docs/multi-gpu.md: 3.6× on a 16 MB
    exchange, nothing at ≤ 1 MB). On by default in a distributed run;
    ``JAXSEM_MALLOPT=0`` turns it off (it changes the whole process's
    allocator: freed memory up to 32 MiB per block stays in the heap).
    """
    if os.environ.get("JAXSEM_MALLOPT", "1") == "0":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20) and libc.mallopt(M_TRIM_THRESHOLD, 2**30)
        return bool(ok)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False


@functools.lru_cache(maxsize=1)
def mpi4jax_module():
    """Import mpi4jax once, mending its sendrecv transpose for symbolic-zero cotangents.

    mpi4jax 0.9's transpose rule binds the cotangent directly, which fails when
    JAX passes a symbolic ``Zero`` (it does inside the transpose of
    ``lax.custom_linear_solve``). The message must still be exchanged — the
    partner rank is waiting for it — so the zero is instantiated first.
    """
    import mpi4jax
    from jax.interpreters import ad

    try:
        from mpi4jax._src.collective_ops import sendrecv as _sr
    except ImportError:  # layout changed: leave mpi4jax as it is
        return mpi4jax
    rule = ad.primitive_transposes.get(_sr.mpi_sendrecv_p)
    if rule is not None and not getattr(rule, "_jaxsem_mended", False):

        def mended(out_tan, *args, **params):
            if type(out_tan) is ad.Zero:
                out_tan = ad.instantiate_zeros(out_tan)
            return rule(out_tan, *args, **params)

        mended._jaxsem_mended = True
        ad.primitive_transposes[_sr.mpi_sendrecv_p] = mended
    return mpi4jax
