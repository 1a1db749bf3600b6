"""Communication between processes: the only module of jaxsem that knows about MPI.

One process per device; every process holds its own block of elements and calls the
same jitted program. The few places where processes must talk to each other go
through the functions here:

* :func:`allreduce_sum` -- global sums (inner products, norms, residuals);
* :func:`sendrecv` -- one pairwise buffer swap (neighbour exchanges of the
  distributed gather--scatter).

Both are ordinary JAX functions: they work inside ``jax.jit``, ``lax.while_loop``,
``lax.scan`` / ``fori_loop`` and ``vmap``, and reverse-mode ``jax.grad`` goes through
them (via mpi4jax's transpose rules).

Single process
    ``import jaxsem.comm`` never imports MPI. :func:`get_comm` imports ``mpi4py`` only
    when an MPI launcher started this process (it looks for the environment variables
    that ``mpirun``/``mpiexec`` set, see :func:`launcher_size`). When there is no
    launcher, when ``mpi4py`` is not installed, or when the world has one process,
    the communicator has ``size == 1``, ``mpi4jax`` is never imported, and every
    operation is the identity. The same code path therefore runs on one process and
    on many.

Several processes
    ``mpirun -n 4 python script.py`` (with ``mpi4py`` and ``mpi4jax`` installed):
    :func:`get_comm` wraps a private duplicate of ``MPI.COMM_WORLD`` (so jaxsem's
    messages never mix with the user's own MPI traffic), and the operations call
    ``mpi4jax``. Every rank must call the same collective operations in the same
    order.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import warnings

import jax
import jax.numpy as jnp

__all__ = ["Comm", "ShardComm", "get_comm", "launcher_size", "local_rank", "bind_local_device",
           "allreduce_sum", "allreduce_max", "sendrecv"]

# Launchers' node-local rank variables: Open MPI, MPICH/Hydra, MVAPICH, Slurm.
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")

# Environment variables through which MPI launchers announce the world size:
# MPICH / Intel MPI (Hydra) and Slurm's PMI2 set PMI_SIZE; Open MPI sets
# OMPI_COMM_WORLD_SIZE; MVAPICH sets MV2_COMM_WORLD_SIZE.
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_size() -> int | None:
    """World size announced by the MPI launcher's environment, without importing MPI.

    Returns:
        The number of processes ``mpirun``/``mpiexec`` started (read from
        ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE`` or ``MV2_COMM_WORLD_SIZE``), or
        ``None`` when no launcher variable is set (a plain ``python`` process).
    """
    return _int_from_env(_LAUNCHER_SIZE_VARS)


def _int_from_env(names) -> int | None:
    """The first of the environment variables ``names`` that holds an integer."""
    for var in names:
        value = os.environ.get(var)
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def local_rank() -> int | None:
    """This process's rank on its node, from the launcher's environment (None without one)."""
    return _int_from_env(_LOCAL_RANK_VARS)


def bind_local_device() -> None:
    """One process per GPU: under an MPI launcher, restrict this process to GPU ``local_rank``.

    Sets ``CUDA_VISIBLE_DEVICES`` to the node-local rank unless the user set it
    (or no launcher started us). Must run before JAX initializes its GPU backend;
    ``import jaxsem`` calls it. Two processes on one GPU time-slice it, which
    makes every timing meaningless.
    """
    size = launcher_size()
    lr = local_rank()
    if size is None or size <= 1 or lr is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = str(lr)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Comm:
    """A communicator: this process's rank and the number of processes.

    A JAX pytree with no leaves (``rank`` and ``size`` are static metadata), so it
    can be passed to, or closed over by, jitted functions; a change of ``rank`` or
    ``size`` means a new trace. Obtain it with :func:`get_comm`; the MPI
    communicator itself stays cached inside this module.

    Attributes:
        rank: this process's rank, ``0 <= rank < size``.
        size: number of processes; ``1`` means no communication at all.
    """

    rank: int = dataclasses.field(default=0, metadata=dict(static=True))
    size: int = dataclasses.field(default=1, metadata=dict(static=True))

    def __post_init__(self):
        if not (isinstance(self.size, int) and self.size >= 1):
            raise ValueError(f"size must be an integer >= 1, got {self.size!r}")
        if not (isinstance(self.rank, int) and 0 <= self.rank < self.size):
            raise ValueError(f"rank must be an integer in [0, {self.size}), got {self.rank!r}")

    @property
    def distributed(self) -> bool:
        """True when there is more than one process (MPI calls really happen)."""
        return self.size > 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardComm:
    """The single-process, several-device backend: a named ``shard_map`` axis.

    Inside ``jax.shard_map`` over ``axis_name`` (``size`` devices), global sums
    are ``lax.psum`` and neighbour exchanges ``lax.ppermute`` (NCCL on GPUs).
    Static (no leaves). Functions of this module accept it wherever they accept
    a :class:`Comm`; point-to-point :func:`sendrecv` has no meaning here (the
    exchange of :mod:`jaxsem.discretization.gather_scatter` is one ``ppermute``
    per round of rank pairs).
    """

    axis_name: str = dataclasses.field(default="ranks", metadata=dict(static=True))
    size: int = dataclasses.field(default=1, metadata=dict(static=True))

    @property
    def distributed(self) -> bool:
        return self.size > 1


@functools.lru_cache(maxsize=1)
def _mpi_world():
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


# True once a distributed run has raised glibc's mmap threshold (see _tune_host_staging).
HOST_STAGING_TUNED = False


def _tune_host_staging() -> bool:
    """Keep mpi4jax's per-call host staging buffers off fresh mmap pages.

    Without CUDA-aware MPI, mpi4jax mallocs a host send and receive buffer on
    every call. glibc serves requests above its mmap threshold (128 KiB by
    default, raised dynamically up to 32 MiB) with a fresh ``mmap`` and returns
    them with ``munmap``, so every exchange page-faults its whole buffer again.
    Raising the threshold to its 32 MiB maximum and disabling trimming lets
    the heap reuse those pages. Measured on 4×H200 (mpi4jax 0.9.1, Open MPI
    4.1, not CUDA-aware; experiments/results/x4/exchange_mpi_*.json): a 16 MB
    exchange 25.3 ms → 7.0 ms, 4 MB 6.0 → 1.8 ms; ≤ 1 MB unchanged. On by
    default in a distributed run; ``JAXSEM_MALLOPT=0`` turns it off (it
    changes the whole process's allocator: freed memory up to 32 MiB per
    block stays in the heap).
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


def get_comm() -> Comm:
    """The world communicator of this run.

    The first call on a process started by an MPI launcher initialises MPI (through
    ``mpi4py``) and must be made by all ranks (it duplicates ``COMM_WORLD``, a
    collective operation). On a plain single process it imports nothing.

    Returns:
        :class:`Comm` with this process's ``rank`` and the world ``size``
        (``Comm(rank=0, size=1)`` on a single process).
    """
    world = _mpi_world()
    if world is None:
        return Comm(rank=0, size=1)
    return Comm(rank=world.Get_rank(), size=world.Get_size())


def _check_comm(comm) -> None:
    if not isinstance(comm, (Comm, ShardComm)):
        raise TypeError(f"comm must be a jaxsem.comm.Comm (see get_comm()), got {type(comm).__name__}")


def _rank_arg(name: str, value, comm: Comm) -> int:
    try:
        rank = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a Python integer rank, got {type(value).__name__}") from None
    if not 0 <= rank < comm.size:
        raise ValueError(f"{name} must be a rank in [0, {comm.size}), got {rank}")
    return rank


def allreduce_sum(x, comm: Comm):
    """Sum of ``x`` over all ranks, returned on every rank.

    Usable inside ``jit``, ``lax.while_loop``/``scan`` and ``vmap``. Differentiable:
    the forward derivative is the sum of the tangents; in reverse mode the result is
    treated as one value shared by all ranks, so for a global loss
    ``L = allreduce_sum(f(x_rank), comm)`` that every rank computes identically,
    ``jax.grad`` gives each rank ``df/dx_rank`` (its own part of the global gradient).

    Args:
        x: array of any shape ``S`` and numeric dtype (a scalar for dot products).
        comm: the communicator (:func:`get_comm`).

    Returns:
        Array of shape ``S`` and the dtype of ``x``: ``sum over ranks r of x_r``.
        On one rank, ``x`` itself.
    """
    return _allreduce(x, comm, "SUM")


def _allreduce(x, comm, op: str):
    """All-reduce with ``op`` in {"SUM", "MAX"}: psum/pmax on a ShardComm, mpi4jax on MPI."""
    _check_comm(comm)
    if isinstance(comm, ShardComm):
        return (jax.lax.psum if op == "SUM" else jax.lax.pmax)(x, comm.axis_name)
    if comm.size == 1:
        return x
    import mpi4jax
    from mpi4py import MPI

    return mpi4jax.allreduce(jnp.asarray(x), op=getattr(MPI, op), comm=_mpi_world())


@functools.lru_cache(maxsize=1)
def _mpi4jax():
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


def allreduce_max(x, comm: Comm):
    """Elementwise maximum of ``x`` over all ranks (not differentiable); identity on one rank."""
    return _allreduce(x, comm, "MAX")


def sendrecv(sendbuf, recvbuf_template, source: int, dest: int, comm: Comm):
    """Send ``sendbuf`` to rank ``dest`` and receive an array from rank ``source``.

    Both happen in one deadlock-free step (``MPI_Sendrecv``); the pairing of
    ``source``/``dest`` over all ranks must match (e.g. a ring shift: every rank
    sends to ``rank + 1`` and receives from ``rank - 1``). Usable inside ``jit``
    and loops; reverse-mode differentiable (the adjoint sends the cotangent back
    the other way). Forward mode (``jvp``) is not supported by mpi4jax.

    Args:
        sendbuf: array of shape ``S_send`` to send to ``dest``.
        recvbuf_template: array (or ``jax.ShapeDtypeStruct``) of shape ``S_recv``
            and dtype ``D`` describing what arrives from ``source``; its values are
            not used and it is not modified.
        source: rank to receive from, ``0 <= source < comm.size``.
        dest: rank to send to, ``0 <= dest < comm.size``.
        comm: the communicator (:func:`get_comm`).

    Returns:
        New array of shape ``S_recv`` and dtype ``D`` with the data sent by
        ``source``. On one rank (``source == dest == 0``) this is ``sendbuf``
        itself, which must then have shape ``S_recv`` (cast to ``D``).
    """
    _check_comm(comm)
    if isinstance(comm, ShardComm):
        raise TypeError("sendrecv needs an MPI Comm; with ShardComm exchange with lax.ppermute")
    source, dest = _rank_arg("source", source, comm), _rank_arg("dest", dest, comm)
    if not isinstance(recvbuf_template, jax.ShapeDtypeStruct):
        recvbuf_template = jnp.asarray(recvbuf_template)
    shape, dtype = tuple(recvbuf_template.shape), recvbuf_template.dtype
    if comm.size == 1:
        if jnp.shape(sendbuf) != shape:
            raise ValueError(
                f"sendbuf has shape {jnp.shape(sendbuf)} but recvbuf_template has shape {shape}; "
                "on one rank a process receives its own message, so they must agree"
            )
        return jnp.asarray(sendbuf, dtype=dtype)
    mpi4jax = _mpi4jax()

    if isinstance(recvbuf_template, jax.ShapeDtypeStruct):
        recvbuf_template = jnp.zeros(shape, dtype)
    sendbuf = jnp.asarray(sendbuf)
    return mpi4jax.sendrecv(sendbuf, recvbuf_template, source, dest, comm=_mpi_world())
