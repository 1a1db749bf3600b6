"""Assembled storage: Krylov vectors with one value per node.

An E-vector ``u: (..., E, n, n, n)`` holds every shared node once per element
that touches it; an assembled vector ``x: (..., size)`` holds it once per rank.
A Krylov iteration on assembled vectors moves fewer bytes: the element kernel
gathers its input through the node map (``Q``), adds its output into the
vector (``Qᵀ``, the gather–scatter's sum), and dot products and vector updates
touch each node once. Dirichlet nodes keep their slot in ``x`` and stay zero:
the map sends them out of range, so a gather reads 0 there and a scatter drops
them.

Distributed (MPI ranks or sharded devices), each rank holds the nodes its
elements touch: a node on the interface between ranks has a copy on each of
them, all copies equal. ``Qᵀ`` then adds the neighbours' partial sums of the
interface nodes through the gather–scatter's :class:`~.gather_scatter.Exchange`
(the same messages as an E-vector gather–scatter), and inner products weight
each copy by 1/(ranks holding the node) before the all-reduce, so a node counts
once.

``Q`` here is :func:`to_local`, ``Qᵀ`` :func:`scatter`; an assembled E-vector
(every copy holding the node's value, as :func:`jaxsem.models.poisson.load`
returns) becomes an assembled vector by :func:`from_local`. Every function is a
linear map written with ``take``/``segment_sum`` and the transport's exchange,
so JAX differentiates and transposes it. Distributed, they run on a rank's
block (inside ``sem.local_map``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core.reduce import weighted_dots
from ..parallel.comm import Comm
from .gather_scatter import Exchange, exchange_add

__all__ = ["Assembled", "make_assembled", "to_local", "from_local", "scatter", "assemble", "dot", "dots"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Assembled:
    """The node map of assembled storage (pytree).

    ``idx: (E, n, n, n)`` int32: the (rank-local) node of each local node, ``size``
    (out of range) on Dirichlet nodes and on a sharded block's pad elements; ``size``:
    static, the length of an assembled vector (every node of the rank, Dirichlet ones
    included). Distributed (all None on one device): ``exchange``, the gather–scatter's
    neighbour exchange of the partial sums; ``weight: (size,)``, 1/(number of ranks
    holding the node) (0 on a sharded block's pad slots); ``shared: (k,)`` int32, the
    nodes held by several ranks, and ``excess: (k,)`` their 1 − weight (a sharded block's
    list padded with its pad slot and 0), so that :func:`dots` sums every node with
    weight 1 and takes the excess of the few shared ones off, without reading ``weight``.
    ``comm``: static, the transport of the all-reduce in :func:`dots`.
    """

    idx: jax.Array
    size: int = dataclasses.field(metadata=dict(static=True))
    exchange: Exchange | None = None
    weight: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    shared: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    excess: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    comm: object = dataclasses.field(default=Comm(), metadata=dict(static=True))


def make_assembled(gid: np.ndarray, mask: np.ndarray, num_global: int, exchange: Exchange | None = None,
                   holders: np.ndarray | None = None, dtype=jnp.float64) -> Assembled:
    """The map of ``gid: (E, n, n, n)`` node ids in ``[0, num_global)``, ``mask`` 0 on Dirichlet nodes.

    Distributed: ``gid`` holds a rank's local node ids, ``exchange`` is its gather–scatter
    exchange and ``holders: (num_global,)`` the number of ranks holding each of its nodes
    (the weights 1/holders get ``dtype``).
    Raises ``ValueError`` if the ids do not fit int32 or the shapes differ.
    """
    gid = np.asarray(gid)
    mask = np.asarray(mask)
    if gid.shape != mask.shape:
        raise ValueError(f"gid {gid.shape} and mask {mask.shape} must have the same shape")
    if num_global >= 2**31 - 1:
        raise ValueError(f"assembled storage needs fewer than 2**31 - 1 global nodes, got {num_global}")
    if (exchange is None) != (holders is None):
        raise ValueError("give both exchange and holders (distributed) or neither (one device)")
    idx = gid.astype(np.int32)
    idx[~(mask > 0)] = num_global
    if exchange is None:
        return Assembled(idx=jnp.asarray(idx), size=int(num_global))
    holders = np.asarray(holders)
    if holders.shape != (num_global,) or holders.min() < 1:
        raise ValueError(f"holders must be ({num_global},) counts >= 1, got shape {holders.shape}")
    shared = np.nonzero(holders > 1)[0]
    return Assembled(idx=jnp.asarray(idx), size=int(num_global), exchange=exchange,
                     weight=jnp.asarray(1.0 / holders, dtype), shared=jnp.asarray(shared.astype(np.int32)),
                     excess=jnp.asarray(1.0 - 1.0 / holders[shared], dtype), comm=exchange.comm)


def to_local(a: Assembled, x):
    """Q: the E-vector of ``x: (..., size)`` → ``(..., E, n, n, n)``, 0 on Dirichlet nodes."""
    return jnp.take(x, a.idx, axis=-1, mode="fill", fill_value=0)


def assemble(a: Assembled, s):
    """The whole sums of rank-local partial sums ``s: (..., size)``: the neighbours' parts of the
    interface nodes added (the identity on one device)."""
    return s if a.exchange is None else exchange_add(a.exchange, s)


def scatter(a: Assembled, u):
    """Qᵀ: the sums of the copies of ``u: (..., E, n, n, n)`` → ``(..., size)`` (Dirichlet nodes 0)."""
    return assemble(a, scatter_local(a, u))


def scatter_local(a: Assembled, u):
    """The sums of this rank's copies of ``u: (..., E, n, n, n)`` alone → ``(..., size)`` (no
    exchange: on an interface node, this rank's part of :func:`scatter`)."""
    lead = u.shape[: u.ndim - 4]
    ids = a.idx.reshape(-1)
    # one segment_sum per component: vmap would batch the scatter along a trailing axis and
    # make XLA transpose u first (an extra read and write of it)
    sums = [jax.ops.segment_sum(v, ids, num_segments=a.size) for v in u.reshape((-1, ids.size))]
    return jnp.stack(sums).reshape(lead + (a.size,))


def from_local(a: Assembled, u, mult):
    """The assembled vector of an assembled E-vector ``u`` (all copies of a node equal):
    ``Qᵀ(mult·u)`` with ``mult`` the inverse multiplicity, ``(..., size)``."""
    return scatter(a, u * mult)


def dot(a: Assembled, x, y):
    """Σ x·y over all nodes (each counted once over the ranks) and any leading axes."""
    return dots(a, [(x, y)])[0]


def dots(a: Assembled, pairs):
    """Several inner products ``[(x, y), …]`` as one variadic reduction and one all-reduce:
    ``(len(pairs),)``."""
    one = jnp.ones((), pairs[0][0].dtype)
    sums = weighted_dots(one)(pairs)
    if a.shared is None:
        return sums
    taken = weighted_dots(a.excess)([(x[..., a.shared], y[..., a.shared]) for x, y in pairs])
    return a.comm.allreduce(sums - taken)
