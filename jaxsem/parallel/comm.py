"""Transports: how the processes and devices of a run talk (the one interface every exchange uses).

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
:func:`jaxsem.parallel.launch.launcher_size`) and then wraps a private duplicate
of ``COMM_WORLD`` (:mod:`jaxsem.parallel.mpi`). Every rank must call the same
collective operations in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from . import mpi as _mpi

__all__ = ["Transport", "Comm", "ShardComm", "Blocks", "element_specs", "get_comm",
           "allreduce_sum", "allreduce_max", "sendrecv"]


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

        return mpi4jax.allreduce(jnp.asarray(x), op=getattr(MPI, op.upper()), comm=_mpi.world())

    def exchange(self, ex, bufs):
        """One ``sendrecv`` per round with this rank's partner (None where it sits out)."""
        return [sendrecv(buf, buf, source=p, dest=p, comm=self) if p >= 0 else None
                for p, buf in zip(ex.partners, bufs)]


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
    pairs. Several processes (``jax.distributed``) share one global mesh, so the
    same program spans hosts. Static (no leaves).
    """

    axis_name: str = dataclasses.field(default="ranks", metadata=dict(static=True))
    size: int = dataclasses.field(default=1, metadata=dict(static=True))
    mesh: object = dataclasses.field(default=None, metadata=dict(static=True))

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
        """Every round's messages: one ``ppermute`` per round, over the round's rank pairs in
        both directions (zeros where this device sits out the round)."""
        perms = [[(a, b) for a, b in rnd] + [(b, a) for a, b in rnd] for rnd in ex.rounds]
        return [jax.lax.ppermute(buf, self.axis_name, perm) for perm, buf in zip(perms, bufs)]

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


def _check_op(op):
    if op not in ("sum", "max"):
        raise ValueError(f"op must be 'sum' or 'max', got {op!r}")


def _field_spec(ndim: int, axis_name: str) -> PartitionSpec:
    """An element field ``(..., E, a, b, c)`` is split along ``E``; anything smaller is replicated."""
    return PartitionSpec(*([None] * (ndim - 4)), axis_name) if ndim >= 4 else PartitionSpec()


def put_sharded(x, sharding):
    """``x`` (host or device values) as a committed array laid out by ``sharding``, each device
    given its own slice (``jax.device_put`` of a host array would go through one device)."""
    v = np.asarray(x)
    return jax.make_array_from_callback(v.shape, sharding, lambda index: v[index])


def element_specs(tree, axis_name: str):
    """``PartitionSpec``s splitting the element arrays of ``tree`` (a pytree) over ``axis_name``.

    Arrays of ``ndim ≥ 4`` are element fields ``(..., E, a, b, c)``, split along axis
    ``ndim − 4``; smaller arrays (operator matrices, scalars) are replicated. A dataclass
    field declared with ``metadata=dict(blocks=True)`` (gather–scatter ids, element
    indices: one block per device, concatenated) is split along its first axis.
    """
    def walk(node, blocks):
        if node is None or (isinstance(node, (tuple, list, dict)) and not node):
            return node  # no leaves (an empty tuple is a leaf-less node, not a leaf)
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


def get_comm() -> Comm:
    """The world communicator of this run.

    The first call on a process started by an MPI launcher initialises MPI (through
    ``mpi4py``) and must be made by all ranks (it duplicates ``COMM_WORLD``, a
    collective operation). On a plain single process it imports nothing.

    Returns:
        :class:`Comm` with this process's ``rank`` and the world ``size``
        (``Comm(rank=0, size=1)`` on a single process).
    """
    world = _mpi.world()
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
    mpi4jax = _mpi.mpi4jax_module()

    if isinstance(recvbuf_template, jax.ShapeDtypeStruct):
        recvbuf_template = jnp.zeros(shape, dtype)
    sendbuf = jnp.asarray(sendbuf)
    return mpi4jax.sendrecv(sendbuf, recvbuf_template, source, dest, comm=_mpi.world())


def gpu_devices(comm) -> int:
    """How many GPUs ``comm`` (a :class:`ShardComm`) splits the elements over; 0 for any other
    transport, or devices of another platform."""
    mesh = getattr(comm, "mesh", None)
    if mesh is None:
        return 0
    devices = np.asarray(mesh.devices).ravel()
    return int(sum(d.platform == "gpu" for d in devices))


@contextlib.contextmanager
def gspmd_on_gpus(comm):
    """Compile what runs inside with XLA's GSPMD partitioner when ``comm`` splits the elements
    over several GPUs; elsewhere nothing changes.

    XLA's GPU compiler (jax 0.11.2) segfaults compiling a Navier–Stokes run sharded over GPUs
    under the default partitioner, Shardy: in its canonicalization of ``shard_map`` inputs
    (``ManualComputationUnusedInputsPattern``; docs/gradients.md). The same programs compile
    and run under GSPMD and equal the one-GPU run (experiments/results/shardy_crash_h200x4.json).
    A jitted function compiles when first called, so the calls must sit inside this scope.
    ``JAXSEM_SHARDY=1`` keeps Shardy (to check a newer JAX)."""
    if gpu_devices(comm) < 2 or os.environ.get("JAXSEM_SHARDY") == "1":
        yield
        return
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)

