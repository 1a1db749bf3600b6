"""Assembled storage: Krylov vectors with one value per global node (one device).

An E-vector ``u: (..., E, n, n, n)`` holds every shared node once per element
that touches it; an assembled vector ``x: (..., num_global)`` holds it once. A
Krylov iteration on assembled vectors moves fewer bytes: the element kernel
gathers its input through the node map (``Q``), adds its output into the global
vector (``Qᵀ``, the gather–scatter's sum), and dot products and vector updates
touch each node once. Dirichlet nodes keep their slot in ``x`` and stay zero:
the map sends them out of range, so a gather reads 0 there and a scatter drops
them.

``Q`` here is :func:`to_local`, ``Qᵀ`` :func:`scatter`; an assembled E-vector
(every copy holding the node's value, as :func:`jaxsem.models.poisson.load`
returns) becomes a global vector by :func:`from_local`. Every function is a
linear map written with ``take``/``segment_sum``, so JAX differentiates and
transposes it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core.reduce import weighted_dots

__all__ = ["Assembled", "make_assembled", "to_local", "from_local", "scatter", "dot", "dots"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Assembled:
    """The node map of assembled storage (pytree).

    ``idx: (E, n, n, n)`` int32: the global node of each local node, ``size``
    (out of range) on Dirichlet nodes; ``size``: static, the length of an
    assembled vector (every global node, Dirichlet ones included).
    """

    idx: jax.Array
    size: int = dataclasses.field(metadata=dict(static=True))


def make_assembled(gid: np.ndarray, mask: np.ndarray, num_global: int) -> Assembled:
    """The map of ``gid: (E, n, n, n)`` node ids in ``[0, num_global)``, ``mask`` 0 on Dirichlet nodes.

    Raises ``ValueError`` if the ids do not fit int32 or the shapes differ.
    """
    gid = np.asarray(gid)
    mask = np.asarray(mask)
    if gid.shape != mask.shape:
        raise ValueError(f"gid {gid.shape} and mask {mask.shape} must have the same shape")
    if num_global >= 2**31 - 1:
        raise ValueError(f"assembled storage needs fewer than 2**31 - 1 global nodes, got {num_global}")
    idx = np.where(mask > 0, gid, num_global).astype(np.int32)
    return Assembled(idx=jnp.asarray(idx), size=int(num_global))


def to_local(a: Assembled, x):
    """Q: the E-vector of ``x: (..., size)`` → ``(..., E, n, n, n)``, 0 on Dirichlet nodes."""
    return jnp.take(x, a.idx, axis=-1, mode="fill", fill_value=0)


def scatter(a: Assembled, u):
    """Qᵀ: the sums of the copies of ``u: (..., E, n, n, n)`` → ``(..., size)`` (Dirichlet nodes 0)."""
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


def dot(x, y):
    """Σ x·y over the last axis and any leading ones (assembled vectors need no weights)."""
    return jnp.sum(x * y)


def dots(pairs):
    """Several inner products ``[(x, y), …]`` as one variadic reduction: ``(len(pairs),)``."""
    return weighted_dots(jnp.ones((), pairs[0][0].dtype))(pairs)
