"""Transports: how the processes and devices of a run talk (the only module that knows MPI).

Every exchange in jaxsem goes through one interface, :class:`Transport`: global
reductions (:meth:`~Transport.allreduce`), the packed neighbour messages of an
exchange plan (:meth:`~Transport.exchange`) and running a function on the local
block of elements (:meth:`~Transport.local_map`). Three implementations:

* ``Comm()`` — serial: every operation is the identity;
* ``Comm(rank, size)`` from :func:`get_comm` under ``mpirun`` — one process per
  device, each holding its own elements; reductions and ``sendrecv`` through
  mpi4jax (reverse-mode differentiable through its transpose rules);
* :class:`ShardComm` — devices of one process, or of many processes started with
  ``jax.distributed``, under JAX's own runtime (``psum``/``ppermute``, NCCL on
  GPUs); the discretization holds global arrays split over the devices.

The transport is chosen once, where a discretization is built, and kept static
on it. ``import jaxsem.parallel.comm`` never imports MPI: :func:`get_comm`
imports ``mpi4py`` only when an MPI launcher started this process (see
:func:`launcher_size`) and then wraps a private duplicate of ``COMM_WORLD``.
Every rank must call the same collective operations in the same order.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import operator
import os
import socket
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

__all__ = ["Transport", "Comm", "ShardComm", "COLLECTIVES", "resolve_collective", "Blocks", "element_specs", "init_distributed", "get_comm", "launcher_size", "launcher_rank", "local_rank", "bind_local_device",
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


_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> int | None:
    """This process's rank from the launcher's environment (None without a launcher); no MPI call."""
    return _int_from_env(_RANK_VARS) if launcher_size() is not None else None


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


class Transport:
    """How the processes or devices of a run talk: the one interface every exchange goes through.

    Three implementations, chosen once where a discretization is built and kept static
    on it (:class:`Comm` serial, :class:`Comm` over MPI with mpi4jax, :class:`ShardComm`
    over JAX's own runtime):

    * :meth:`allreduce` — global sums and maxima (inner products, norms, residuals);
    * :meth:`exchange` — the packed neighbour messages of one exchange plan (a
      :class:`jaxsem.discretization.gather_scatter.Exchange`), one per round;
    * :meth:`local_map` — run a function on this process's or device's block of
      elements (the identity for serial and MPI; ``jax.shard_map`` for sharded
      global arrays).

    Gather–scatter, the DG face exchange and the solvers are written once against
    these three; nothing above this module asks which transport it has.
    """

    size: int

    @property
    def distributed(self) -> bool:
        """True when more than one process or device takes part."""
        return self.size > 1

    @property
    def name(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def file_suffix(self) -> str:
        """Suffix that keeps per-process files apart (``""`` where one process writes)."""
        return ""

    @property
    def lead(self) -> bool:
        """Whether this process writes the files every process would write alike (a global
        time series, a plot): process 0 of a multi-controller run, rank 0 under MPI."""
        return jax.process_index() == 0

    def allreduce(self, x, op: str = "sum"):  # pragma: no cover - overridden
        raise NotImplementedError

    def exchange(self, ex, bufs):  # pragma: no cover - overridden
        raise NotImplementedError

    def local_map(self, fn, *args):
        """``fn(*args)`` on the local block of every element array (here: all of them)."""
        return fn(*args)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Comm(Transport):
    """Serial (``size == 1``) or MPI (one process per device, mpi4jax) transport.

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
    def name(self) -> str:
        return "mpi" if self.size > 1 else "serial"

    @property
    def file_suffix(self) -> str:
        return f".rank{self.rank}-of-{self.size}" if self.size > 1 else ""

    @property
    def lead(self) -> bool:
        return self.rank == 0 and jax.process_index() == 0

    def allreduce(self, x, op: str = "sum"):
        """Sum (``op="sum"``) or maximum (``"max"``) of ``x`` over all ranks (mpi4jax); identity on one."""
        _check_op(op)
        if self.size == 1:
            return x
        import mpi4jax
        from mpi4py import MPI

        return mpi4jax.allreduce(jnp.asarray(x), op=getattr(MPI, op.upper()), comm=_mpi_world())

    def exchange(self, ex, bufs):
        """One ``sendrecv`` per round with this rank's partner (None where it sits out)."""
        return [sendrecv(buf, buf, source=p, dest=p, comm=self) if p >= 0 else None
                for p, buf in zip(ex.partners, bufs)]


def init_distributed() -> bool:
    """Start multi-controller JAX when a launcher (``mpirun``, ``srun``) started several processes.

    Call it first thing, before any JAX computation: afterwards ``jax.devices()`` lists
    every process's devices, and ``discretize(mesh, devices=jax.devices())`` spans them
    all (NCCL between GPUs; gloo between CPU processes). Rank and size come from MPI
    through mpi4py (``cluster_detection_method="mpi4py"``); the coordinator's address is
    agreed over MPI (:func:`_coordinator`), and process 0 serves it on that address only,
    not on every interface of its host. Returns True when it initialized (or already
    had), False on a single process.
    """
    size = launcher_size()
    if size is None or size <= 1:
        return False
    if jax.distributed.is_initialized():
        return True
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # used only by CPU devices
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise RuntimeError(f"a launcher started {size} processes, but multi-controller JAX needs mpi4py "
                           "to find its peers: pip install mpi4py") from None
    # JAX's MPI detection would take GPU number <local rank> on each node, but a process bound to its GPU
    # (bind_local_device, or the user's CUDA_VISIBLE_DEVICES) sees its GPUs numbered from 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = list(range(len(visible.split(",")))) if visible else None
    from mpi4py import MPI

    address, bind = _coordinator(MPI.COMM_WORLD)
    jax.distributed.initialize(address, cluster_detection_method="mpi4py", local_device_ids=ids,
                               coordinator_bind_address=bind)
    return True


def _coordinator(world) -> tuple[str, str]:
    """``(address, bind)``: where every process reaches the ``jax.distributed`` coordinator, and
    the ``ip:port`` process 0 serves it on; decided by process 0 of the mpi4py communicator
    ``world`` and broadcast, so that every process gets the same answer or the same error.

    ``$JAX_COORDINATOR_ADDRESS`` (``host:port``), when set, is the address, served on that
    host's IP; else :func:`_coordinator_address` on ``$JAX_COORDINATOR_PORT`` or a port chosen
    from process 0's host name. ``$JAX_COORDINATOR_BIND_ADDRESS`` overrides the bind address.
    """
    hosts = world.allgather(socket.gethostname())
    answer = None
    if world.Get_rank() == 0:
        try:
            given = os.environ.get("JAX_COORDINATOR_ADDRESS")
            if given:
                host, port = given.rsplit(":", 1)
                answer = (given, f"{_host_ip(host.strip('[]'))}:{port}")
            else:
                # the range JAX's own mpi4py detection draws from; the host name keeps it stable
                port = os.environ.get("JAX_COORDINATOR_PORT") or str(61440 + zlib.crc32(hosts[0].encode()) % 4096)
                address = _coordinator_address(hosts, port)
                answer = (address, address)
        except (OSError, ValueError) as err:
            answer = f"{type(err).__name__}: {err}"
    answer = world.bcast(answer, root=0)
    if isinstance(answer, str):
        raise RuntimeError(f"jax.distributed: no coordinator address for process 0 on {hosts[0]} ({answer}); "
                           "set JAX_COORDINATOR_ADDRESS=<IP of that host on the network the processes "
                           "share>:<port>")
    address, bind = answer
    return address, os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or bind


def _host_ip(host: str) -> str:
    """``host`` if it is an IP address, else its IPv4 address."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return socket.gethostbyname(host)


def _route_ip(peer: str) -> str:
    """This host's address on the route to IP ``peer`` (connecting a UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def _coordinator_address(hosts, port, resolve=_host_ip, route=_route_ip) -> str:
    """``ip:port`` of the coordinator of processes on ``hosts`` (host names, process 0's first).

    All on one host: the loopback address, which no other machine can reach. Across hosts:
    process 0's host resolved, or, where that gives a loopback address (Debian's /etc/hosts
    maps the host name to 127.0.1.1), this host's address on the route to another host.
    ``ValueError`` when neither is an address the other hosts can reach.
    """
    if all(h == hosts[0] for h in hosts):
        return f"127.0.0.1:{port}"
    ip = resolve(hosts[0])
    if ipaddress.ip_address(ip).is_loopback:
        peer = next(h for h in hosts if h != hosts[0])
        ip = route(resolve(peer))
        if ipaddress.ip_address(ip).is_loopback:
            raise ValueError(f"host {hosts[0]} resolves to a loopback address, and so does its route to {peer}")
    return f"{ip}:{port}"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardComm(Transport):
    """Devices of one or many processes under JAX's own runtime (NCCL between GPUs).

    A discretization built with ``devices=`` holds *global* ``jax.Array``s whose
    element axis is split over the one axis ``axis_name`` of the device mesh
    ``mesh``. Outside ``jax.shard_map``, code sees those global arrays: sums over
    them are already global (:meth:`allreduce` is the identity) and
    :meth:`local_map` enters ``shard_map`` (element arrays split by
    :func:`element_specs`). Inside, each device sees its block: :meth:`allreduce`
    is ``psum``/``pmax`` and :meth:`exchange` one ``ppermute`` per round of rank
    pairs, or one ``all_to_all`` for all rounds (``collective``, static). Several
    processes (``jax.distributed``) share one global mesh, so the same program spans
    hosts. Static (no leaves).
    """

    axis_name: str = dataclasses.field(default="ranks", metadata=dict(static=True))
    size: int = dataclasses.field(default=1, metadata=dict(static=True))
    mesh: object = dataclasses.field(default=None, metadata=dict(static=True))
    collective: str = dataclasses.field(default="ppermute", metadata=dict(static=True))

    def __post_init__(self):
        if self.collective not in COLLECTIVES[1:]:
            raise ValueError(f"collective must be one of {COLLECTIVES[1:]}, got {self.collective!r}")

    @property
    def name(self) -> str:
        return "shard"

    def inside(self) -> bool:
        """Whether the caller runs inside ``shard_map`` over ``axis_name`` (its blocks are local)."""
        try:
            jax.lax.psum(1, self.axis_name)
        except NameError:
            return False
        return True

    def allreduce(self, x, op: str = "sum"):
        _check_op(op)
        if not self.inside():
            return x
        return (jax.lax.psum if op == "sum" else jax.lax.pmax)(x, self.axis_name)

    def exchange(self, ex, bufs):
        """Every round's messages: one ``ppermute`` per round (``collective="ppermute"``) or all
        rounds in one ``all_to_all`` (``"all_to_all"``; the same values, one collective)."""
        perms = [[(a, b) for a, b in rnd] + [(b, a) for a, b in rnd] for rnd in ex.rounds]
        if self.collective == "ppermute" or len(bufs) < 2:
            return [jax.lax.ppermute(buf, self.axis_name, perm) for perm, buf in zip(perms, bufs)]
        return _all_to_all_rounds(bufs, perms, self.axis_name, self.size)

    def local_map(self, fn, *args):
        """``fn(*args)`` on each device's block, as ``jax.shard_map`` (directly when already inside).

        ``args``: pytrees whose element arrays are split by :func:`element_specs`; leaves
        that are not arrays (Python numbers, functions) are passed as they are. ``fn``'s outputs: element fields (``ndim ≥ 4``,
        element axis ``ndim − 4``) and the arrays of a :class:`Blocks` come back as global
        arrays; every other output must be a global value (the same on every device, e.g. a
        ``psum``) and comes back once.
        """
        if self.inside() or self.mesh is None:
            return fn(*args)
        leaves, tree = jax.tree.flatten(args)
        is_array = [isinstance(v, (jax.Array, np.ndarray)) for v in leaves]
        arrays = [v for v, a in zip(leaves, is_array) if a]

        def call(*arrs):  # non-array leaves (Python numbers, callables) stay static
            it = iter(arrs)
            return fn(*jax.tree.unflatten(tree, [next(it) if a else v for v, a in zip(leaves, is_array)]))

        specs = jax.tree.leaves(element_specs(args, self.axis_name), is_leaf=lambda x: isinstance(x, PartitionSpec))
        in_specs = tuple(sp for sp, a in zip(specs, is_array) if a)
        kinds = []

        def probe(*a):  # records the output structure; the dummy outputs are never used
            out = call(*a)
            kinds.append(jax.tree.map(jnp.ndim, out))
            return jax.tree.map(lambda o: jnp.zeros((1,), jnp.float32), out)

        jax.eval_shape(_shard_map(probe, self.mesh, in_specs, PartitionSpec(self.axis_name)), *arrays)
        out_specs = element_specs(jax.tree.map(lambda nd: np.zeros((1,) * nd), kinds[0]), self.axis_name)
        # jitted: outside jit a shard_map runs its body op by op, one dispatch per operation
        return jax.jit(_shard_map(call, self.mesh, in_specs, out_specs))(*arrays)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Blocks:
    """Per-rank arrays that are not element fields (assembled vectors: one value per node of
    the rank), as one pytree: ``value``'s arrays are split along their first axis, one block
    per device, when they enter or leave :meth:`ShardComm.local_map` (the first axis of the
    global array is the blocks concatenated); serial and MPI hold them as they are."""

    value: object = dataclasses.field(metadata=dict(blocks=True))


COLLECTIVES = ("auto", "ppermute", "all_to_all")

# The sharded exchange's collective by device count P where "auto" is asked for (the faster of the
# two in the several-GPU runs, docs/multi-gpu.md); P not listed: "ppermute", the faster at every
# P measured so far.
_AUTO_COLLECTIVE: dict[int, str] = {}


def resolve_collective(collective: str, size: int) -> str:
    """``collective`` (one of :data:`COLLECTIVES`) for ``size`` devices, ``"auto"`` resolved."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    return _AUTO_COLLECTIVE.get(size, "ppermute") if collective == "auto" else collective


def _all_to_all_rounds(bufs, perms, axis_name: str, size: int):
    """The messages of every round in one ``lax.all_to_all`` (inside ``shard_map``).

    ``bufs[r]: (..., k_r)`` goes to this device's partner in round r (``perms[r]``: the
    round's (source, destination) pairs); what each partner sent comes back in the same
    order, zeros where this device sits out a round (as ``ppermute`` gives). Each message
    is padded to the longest, so the one collective moves ``size × max k_r`` values.
    """
    me = jax.lax.axis_index(axis_name)
    k = max(int(b.shape[-1]) for b in bufs)
    lead = bufs[0].shape[:-1]
    send = jnp.zeros(lead + (size + 1, k), bufs[0].dtype)  # row `size`: rounds this device sits out
    rows = []
    for perm, buf in zip(perms, bufs):
        dest = np.full(size, size, np.int32)
        for a, b in perm:
            dest[a] = b
        row = jnp.asarray(dest)[me]
        send = send.at[..., row, : buf.shape[-1]].set(buf)
        rows.append(row)
    axis = len(lead)
    recv = jax.lax.all_to_all(send[..., :size, :], axis_name, split_axis=axis, concat_axis=axis)
    recv = jnp.concatenate([recv, jnp.zeros(lead + (1, k), recv.dtype)], axis=axis)
    return [recv[..., row, : buf.shape[-1]] for row, buf in zip(rows, bufs)]


def _check_op(op):
    if op not in ("sum", "max"):
        raise ValueError(f"op must be 'sum' or 'max', got {op!r}")


def _field_spec(ndim: int, axis_name: str) -> PartitionSpec:
    """An element field ``(..., E, a, b, c)`` is split along ``E``; anything smaller is replicated."""
    return PartitionSpec(*([None] * (ndim - 4)), axis_name) if ndim >= 4 else PartitionSpec()


def element_specs(tree, axis_name: str):
    """``PartitionSpec``s splitting the element arrays of ``tree`` (a pytree) over ``axis_name``.

    Arrays of ``ndim ≥ 4`` are element fields ``(..., E, a, b, c)``, split along axis
    ``ndim − 4``; smaller arrays (operator matrices, scalars) are replicated. A dataclass
    field declared with ``metadata=dict(blocks=True)`` (gather–scatter ids, element
    indices: one block per device, concatenated) is split along its first axis.
    """
    def walk(node, blocks):
        if node is None:
            return None
        if jax.tree_util.treedef_is_leaf(jax.tree.structure(node)):
            if not isinstance(node, (jax.Array, np.ndarray)):
                return PartitionSpec()  # numbers, functions: not split (local_map keeps them static)
            return PartitionSpec(axis_name) if blocks else _field_spec(jnp.ndim(node), axis_name)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            kids = {f.name: walk(getattr(node, f.name), blocks or f.metadata.get("blocks", False))
                    for f in dataclasses.fields(node) if not f.metadata.get("static", False)}
            return dataclasses.replace(node, **kids)
        if isinstance(node, (tuple, list)) and not hasattr(node, "_fields"):
            return type(node)(walk(v, blocks) for v in node)
        if isinstance(node, tuple):  # NamedTuple
            return type(node)(*(walk(v, blocks) for v in node))
        if isinstance(node, dict):
            return {k: walk(v, blocks) for k, v in node.items()}
        raise TypeError(f"element_specs: unsupported pytree node {type(node).__name__}")

    return walk(tree, False)


def _shard_map(f, mesh, in_specs, out_specs):
    """``jax.shard_map`` with varying-axes checking off: the solvers return a sharded solution
    together with replicated (psum'd) info, which the checker rejects."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map as _sm  # pragma: no cover

    return _sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)  # pragma: no cover


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
    if not isinstance(comm, Transport):
        raise TypeError(f"comm must be a jaxsem transport (Comm, ShardComm; see get_comm()), got {type(comm).__name__}")


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
    return _allreduce(x, comm, "sum")


def _allreduce(x, comm, op: str):
    _check_comm(comm)
    return comm.allreduce(x, op)


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
    return _allreduce(x, comm, "max")


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
    if not isinstance(comm, Comm):
        raise TypeError("sendrecv needs an MPI Comm; a ShardComm exchanges with lax.ppermute")
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
