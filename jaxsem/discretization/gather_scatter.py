"""Gather–scatter (direct stiffness summation) QQᵀ on E-vectors.

An E-vector ``u: (..., E, n, n, n)`` holds one value per local node. ``Qᵀ``
sums the copies of each global node, ``Q`` copies the sums back, so
``gs(u) = take(segment_sum(u, gid), gid)``. Two layouts compute the same sum:

* ``"segment"``: ``segment_sum`` over the E-vector order, then ``take`` (every
  platform, every transport);
* ``"csr"``: a gather only, no global array: each local node of a shared node
  reads the list of all its node's copies (compressed rows ``csr_off``,
  ``csr_idx``; the same order for every copy, so all copies get bit-identical
  sums) and a node with one copy keeps its value. It is one CUDA kernel
  (:func:`jaxsem.backends.cuda.gs_csr_cuda`): no zero fill of a global array, no
  atomics. The ``"cuda"`` backend takes it, on one device and for a distributed
  plan's own copies alike (without a CUDA GPU the same rows run as
  :func:`csr_gather`, the emulated backend's form).

Both are linear and their transposes are themselves (QQᵀ is symmetric), which
JAX's autodiff of ``segment_sum``/``take`` finds by itself; the CUDA form's
derivative is the ``"segment"`` form's.

Distributed (one process per device, each holding its own elements): the local
sums of the shared nodes are exchanged with each neighbour rank in one packed
message per neighbour (:class:`Exchange`), in an edge-coloured order of rounds
in which every rank has at most one partner, so the pairwise ``sendrecv`` calls
cannot deadlock; each rank adds what its neighbours sent (their own partial
sums), which gives the global sum on every copy. The exchange is ordered as
Neko's gather–scatter (``gs``): sum the shared nodes' local copies and
send them, do the whole local gather–scatter, which needs no message, then add
the received sums on the shared nodes' copies. A plan numbers its shared nodes
first (:func:`make_gs_distributed`), so that the messages come from a sum over
the shared copies alone, and the compiler is free to run the local part while
the messages travel. The transpose (``jax.grad``) is the same exchange through
mpi4jax's transpose rules.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..backends.cuda import cuda_available, gs_csr_cuda
from ..mesh.partition import rank_pairs
from ..parallel.comm import Comm

__all__ = ["GatherScatter", "Exchange", "make_gs", "make_gs_distributed", "gs_apply", "csr_gather",
           "exchange_received", "received_positions", "LAYOUTS"]

LAYOUTS = ("segment", "csr")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Exchange:
    """The neighbour exchange of a distributed gather–scatter (pytree).

    ``idx[r]: (k_r,)`` int32 positions (in this rank's node sums) of the nodes
    shared with ``partners[r]`` in round r, ascending in global id (the order
    both sides agree on); ``partners[r] = -1`` when this rank sits out round r.
    ``rounds[r]``: all rank pairs ``(a, b)`` exchanging in round r (the same on
    every rank). With a :class:`jaxsem.comm.ShardComm` the partners are not
    static per shard: each round is one ``lax.ppermute`` over ``rounds[r]`` in
    both directions, and ``idx[r]`` is padded per shard to a common length with
    positions of a zero slot (see :mod:`jaxsem.shard`).
    """

    idx: tuple = dataclasses.field(metadata=dict(blocks=True))
    partners: tuple = dataclasses.field(metadata=dict(static=True))
    comm: object = dataclasses.field(metadata=dict(static=True))
    rounds: tuple = dataclasses.field(metadata=dict(static=True), default=())

    @property
    def neighbors(self) -> tuple:
        return tuple(p for p in self.partners if p >= 0)


def _round_messages(ex: Exchange, s):
    """What arrives in each round, aligned with ``ex.idx`` (None where this rank sits out).

    All send buffers are packed from ``s: (..., num_nodes)`` before the first
    message, so every round depends on ``s`` alone.
    """
    return ex.comm.exchange(ex, [s[..., i] for i in ex.idx])


def exchange_add(ex: Exchange, s):
    """Add the neighbours' partial sums of shared nodes to ``s: (..., num_nodes)``."""
    out = s
    for i, recv in zip(ex.idx, _round_messages(ex, s)):
        if recv is not None:
            out = out.at[..., i].add(recv)
    return out


def exchange_received(ex: Exchange, s):
    """What the neighbours sent, without adding it: ``(..., K + 1)``.

    The received partial sums of every round, concatenated in round order
    (see :func:`received_positions`), then one zero slot at position ``K``.
    For operators that compute the purely local work and add the remote part
    afterwards (:func:`jaxsem.dg.remote_values`, with messages packed from a
    volume field).
    """
    empty = jnp.zeros(s.shape[:-1] + (0,), s.dtype)
    parts = [empty if r is None else r for r in _round_messages(ex, s)]
    return jnp.concatenate(parts + [jnp.zeros(s.shape[:-1] + (1,), s.dtype)], axis=-1)


def received_positions(ex: Exchange, num_nodes: int) -> np.ndarray:
    """``(num_nodes,)`` position of each node's message in :func:`exchange_received` (K: none).

    Raises ``ValueError`` if a node is shared with several ranks (then one
    position cannot hold its remote sum; true of DG face points, which have at
    most two copies, not of SEM corner nodes).
    """
    lens = [int(np.shape(i)[0]) for i in ex.idx]
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pos = np.full(num_nodes, offs[-1], np.int64)
    for r, i in enumerate(ex.idx):
        i = np.asarray(i, np.int64)
        if np.any(pos[i] != offs[-1]):
            raise ValueError("a node is shared with more than one rank: received_positions needs ≤ 2 copies")
        pos[i] = offs[r] + np.arange(i.size)
    return pos


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GatherScatter:
    """A gather–scatter plan (pytree; integer sizes are static).

    ``gid: (L,)`` int32 global id per local node (L = E·n³, E-vector order);
    ``mult: (E, n, n, n)`` inverse
    multiplicity 1/(number of copies, over all ranks); ``num_global``: the
    number of distinct nodes this plan sums into (on one rank, all nodes);
    ``exchange``: the neighbour exchange when distributed, else None; then the
    plan's nodes ``[0, num_shared)`` are those shared with other ranks and
    ``shared: (L_s,)`` int32 the positions of their copies in the E-vector
    (positions ≥ L: padding, ignored);
    ``csr_off: (L + 1,)``, ``csr_idx: (nnz,)`` int32 (``"csr"`` layout, else
    None): local node i sums the copies ``csr_idx[csr_off[i]:csr_off[i + 1]]``,
    an empty row keeps its value.
    """

    gid: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    mult: jax.Array
    num_global: int = dataclasses.field(metadata=dict(static=True))
    layout: str = dataclasses.field(metadata=dict(static=True), default="segment")
    exchange: Exchange | None = None
    csr_off: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    csr_idx: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    shared: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    num_shared: int = dataclasses.field(default=0, metadata=dict(static=True))

    def __call__(self, u):
        return gs_apply(self, u)


def make_gs(gid: np.ndarray, num_global: int, layout: str = "segment", dtype=jnp.float64,
            counts: np.ndarray | None = None, exchange: Exchange | None = None,
            num_shared: int = 0) -> GatherScatter:
    """Build a :class:`GatherScatter` from ``gid: (E, n, n, n)`` node ids in ``[0, num_global)``.

    ``counts`` (multiplicity per node, default: copies in ``gid``), ``exchange`` and
    ``num_shared`` (the nodes ``[0, num_shared)`` are shared with other ranks, every
    node ``exchange`` sends among them) are for distributed plans
    (:func:`make_gs_distributed`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    gid = np.asarray(gid)
    flat = gid.reshape(-1).astype(np.int64, copy=False)
    L = flat.size
    local_counts = np.bincount(flat, minlength=num_global)
    counts = local_counts if counts is None else np.asarray(counts)
    itype = np.int32 if L < 2**31 - 1 else np.int64
    gid_dev = jnp.asarray(flat.astype(itype))
    with np.errstate(divide="ignore"):  # a node with no copy here is never gathered
        inverse = jnp.asarray(1.0 / counts, dtype=dtype)
    mult = jnp.take(inverse, gid_dev).reshape(gid.shape)  # gathered where the plan lives: E·n³ values not sent
    csr_off = csr_idx = None
    if layout == "csr":
        shared_counts = local_counts[local_counts > 1]
        nnz = int(np.sum(shared_counts * shared_counts))  # each of a node's c copies lists all c
        if nnz >= 2**31 - 1 or L >= 2**31 - 1:
            raise ValueError(f"layout 'csr' needs fewer than 2**31 local nodes and copies, got L = {L}, nnz = {nnz}")
        csr_off, csr_idx = _csr_rows(gid_dev, jnp.asarray(local_counts.astype(np.int32)), nnz)
    shared = None
    if exchange is not None:
        if any(np.size(i) and int(np.max(i)) >= num_shared for i in exchange.idx):
            raise ValueError(f"exchange sends nodes outside the shared nodes [0, num_shared = {num_shared})")
        shared = jnp.asarray(np.nonzero(flat < num_shared)[0].astype(itype))
    return GatherScatter(
        gid=gid_dev,
        mult=mult,
        num_global=int(num_global),
        layout=layout,
        exchange=exchange,
        csr_off=csr_off,
        csr_idx=csr_idx,
        shared=shared,
        num_shared=int(num_shared) if exchange is not None else 0,
    )


@functools.partial(jax.jit, static_argnums=2)
def _csr_rows(flat, counts, nnz: int):
    """The ``"csr"`` rows of ids ``flat: (L,)`` int32 with ``counts: (N,)`` copies per id:
    ``(csr_off (L + 1,), csr_idx (nnz,))`` int32.

    Row i (a copy of a shared node g) lists all copies of g in ascending local position,
    ``perm[starts[g] : starts[g] + counts[g]]`` with ``perm`` the stable sort by id. On the
    device that holds the plan: a sort of the E·n³ ids there takes milliseconds on a GPU,
    seconds on the host.
    """
    L = flat.shape[0]
    perm = jnp.argsort(flat, stable=True).astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    c = counts[flat]
    deg = jnp.where(c > 1, c, 0)
    off = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(deg, dtype=jnp.int32)])
    row = jnp.repeat(jnp.arange(L, dtype=jnp.int32), deg, total_repeat_length=nnz)
    within = jnp.arange(nnz, dtype=jnp.int32) - off[row]
    return off, perm[starts[flat[row]] + within]


def make_gs_distributed(gid: np.ndarray, part: np.ndarray, comm: Comm, dtype=jnp.float64, layout: str = "segment"):
    """This rank's gather–scatter plan, from the global numbering and the partition.

    Args:
      gid: ``(E, n, n, n)`` global node ids of the WHOLE mesh (every rank has the
        same numbering).
      part: ``(E,)`` rank of each element.
      comm: the communicator; ``comm.rank`` picks this rank's elements.
      layout: how the rank sums its own copies (:data:`LAYOUTS`; ``"csr"``: the CUDA gather
        kernel, rows over this rank's copies); the exchange adds the other ranks' sums after.
    Returns ``(plan, elements, holders)``: the plan over this rank's elements, their
    global indices ``(E_local,)`` (ascending), and ``holders: (plan.num_global,)`` the
    number of ranks holding each of the plan's nodes (1 off the interfaces). The plan
    numbers this rank's nodes shared with other ranks first, then the others, each
    in ascending global id.
    """
    gid = np.asarray(gid)
    part = np.asarray(part, dtype=np.int64)
    P = comm.size
    num = int(gid.max()) + 1
    counts = np.bincount(gid.reshape(-1), minlength=num)
    # Which ranks hold each node (one boolean scatter per rank: linear, no sort).
    has = [np.zeros(num, bool) for _ in range(P)]
    for r in range(P):
        has[r][gid[part == r].reshape(-1)] = True
    edges = [(a, b) for a in range(P) for b in range(a + 1, P) if np.any(has[a] & has[b])]
    rounds = rank_pairs(edges)

    elements = np.nonzero(part == comm.rank)[0]
    if elements.size == 0:
        raise ValueError(f"rank {comm.rank} has no elements in the partition")
    local_gid = gid[elements]
    mine = has[comm.rank]
    holders_g = sum(h.astype(np.int32) for h in has)
    is_shared = mine & (holders_g > 1)
    # this rank's nodes, shared ones first (the messages read [0, num_shared) only), each ascending
    uniq = np.concatenate([np.nonzero(is_shared)[0], np.nonzero(mine & ~is_shared)[0]])
    local_of = np.full(num, -1, np.int64)
    local_of[uniq] = np.arange(uniq.size)
    lid = local_of[local_gid.reshape(-1)]
    idx, partners = [], []
    for rnd in rounds:
        partner = next((b if a == comm.rank else a for a, b in rnd if comm.rank in (a, b)), -1)
        partners.append(partner)
        if partner < 0:
            idx.append(jnp.zeros((0,), jnp.int32))
            continue
        shared = np.nonzero(mine & has[partner])[0]  # ascending global ids: the order both sides agree on
        idx.append(jnp.asarray(local_of[shared].astype(np.int32)))
    exchange = Exchange(idx=tuple(idx), partners=tuple(partners), comm=comm,
                        rounds=tuple(tuple(map(tuple, rnd)) for rnd in rounds))
    plan = make_gs(lid.reshape(local_gid.shape), uniq.size, layout, dtype, counts=counts[uniq], exchange=exchange,
                   num_shared=int(is_shared.sum()))
    return plan, elements, holders_g[uniq]


def _qt(plan: GatherScatter, v):
    """Qᵀ on a flat E-vector ``v: (L,)`` → ``(num_global,)``."""
    return jax.ops.segment_sum(v, plan.gid, num_segments=plan.num_global)


def gs_apply(plan: GatherScatter, u):
    """QQᵀ u for ``u: (..., E, n, n, n)``: each node gets the sum of its copies.

    Leading axes (vector components) share one exchange message per neighbour.
    """
    shape = u.shape
    lead = shape[: u.ndim - 4]
    C = int(np.prod(lead)) if lead else 1
    if plan.exchange is not None:
        return _gs_exchange(plan, u.reshape((C, -1))).reshape(shape)
    if plan.layout == "csr":
        return _gs_csr(u.reshape((C, -1)), plan.csr_off, plan.csr_idx, plan.gid, plan.num_global).reshape(shape)
    if lead:
        # one segment_sum over all components, component c's nodes shifted to [c·N, (c+1)·N):
        # vmap would batch the scatter along a trailing component axis, and XLA then transposes
        # u to (L, C) first, a full extra read and write of u (docs/performance.md, gather-scatter)
        s = _component_sums(u.reshape((int(np.prod(lead)), -1)), plan.gid, plan.num_global)
    else:
        s = _qt(plan, u.reshape(-1))
    return jnp.take(s, plan.gid, axis=-1).reshape(shape)


def _gs_exchange(plan: GatherScatter, u2):
    """QQᵀ of ``u2: (C, L)`` on a distributed plan, in Neko's order: the shared nodes' sums go
    out first, the local gather–scatter needs no message, the received sums come in last.

    The messages are packed from ``ss: (C, num_shared + 1)``, the local sums of the shared
    nodes alone (slot ``num_shared``: zero; padded message slots read and write it); what
    arrives is added on the shared nodes' copies (positions past the E-vector: dropped).
    """
    ns = plan.num_shared
    sid = jnp.take(plan.gid, plan.shared, mode="fill", fill_value=ns)  # padding → the zero slot
    ss = _sums(jnp.take(u2, plan.shared, axis=-1, mode="fill", fill_value=0), sid, ns + 1)
    slots = [jnp.minimum(i, ns) for i in plan.exchange.idx]  # padded rounds send the zero slot
    received = plan.exchange.comm.exchange(plan.exchange, [ss[..., i] for i in slots])
    if plan.layout == "csr":  # needs no message
        out = _gs_csr(u2, plan.csr_off, plan.csr_idx, plan.gid, plan.num_global)
    else:
        out = jnp.take(_sums(u2, plan.gid, plan.num_global), plan.gid, axis=-1)
    remote = jnp.zeros_like(ss)
    for i, recv in zip(slots, received):
        if recv is not None:
            remote = remote.at[..., i].add(recv)
    return out.at[..., plan.shared].add(jnp.take(remote, sid, axis=-1), mode="drop")


def _sums(u2, gid, N):
    """Qᵀ of ``u2: (C, L)`` → ``(C, N)``."""
    if u2.shape[0] == 1:
        return jax.ops.segment_sum(u2[0], gid, num_segments=N)[None]
    return _component_sums(u2, gid, N)


def _component_sums(u2, gid, N):
    """Qᵀ of ``u2: (C, L)`` → ``(C, N)`` as one ``segment_sum`` (component c's ids shifted by c·N)."""
    C = u2.shape[0]
    it = gid.dtype if C * N < 2**31 - 1 else jnp.int64
    idx = (gid.astype(it)[None, :] + (N * jnp.arange(C, dtype=it))[:, None]).reshape(-1)
    return jax.ops.segment_sum(u2.reshape(-1), idx, num_segments=C * N).reshape((C, N))


def _gs_segment(u2, gid, N):
    """QQᵀ of ``u2: (C, L)`` in the segment form (the CUDA gather's derivative)."""
    return jnp.take(_component_sums(u2, gid, N), gid, axis=-1)


def csr_gather(u2, off, idx):
    """What the CUDA kernel computes, in JAX (to check a plan's ``csr_off``/``csr_idx`` anywhere)."""
    L = u2.shape[1]
    deg = off[1:] - off[:-1]
    rows = jnp.repeat(jnp.arange(L), deg, total_repeat_length=idx.shape[0])
    s = jax.vmap(lambda v: jax.ops.segment_sum(v[idx], rows, num_segments=L))(u2)
    return jnp.where(deg > 0, s, u2)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _gs_csr(u2, off, idx, gid, N):
    """QQᵀ of ``u2: (C, L)`` by the CUDA gather kernel (without a CUDA GPU: its JAX form,
    :func:`csr_gather`, for the emulated backend's tests); its tangent is the segment form's."""
    return gs_csr_cuda(u2, off, idx) if cuda_available() else csr_gather(u2, off, idx)


@_gs_csr.defjvp
def _gs_csr_jvp(N, primals, tangents):
    u2, off, idx, gid = primals
    return _gs_csr(u2, off, idx, gid, N), _gs_segment(tangents[0], gid, N)
