"""What every discretization (continuous SEM, DG) shares: sizes, integration, the transport."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np


class Discretization:
    """Mixin of :class:`jaxsem.discretization.SEM` and :class:`jaxsem.discretization.DG`.

    A subclass is a frozen pytree dataclass with ``x: (3, E, n, n, n)``, ``order``,
    ``elements: (E,)`` (mesh index of each element, −1 for the pad elements of a
    sharded discretization), a static ``comm`` (:class:`jaxsem.parallel.comm.Transport`)
    and an integration weight :attr:`weight` ``(E, n, n, n)`` (zero on pads).
    """

    @property
    def n(self) -> int:
        """GLL points per direction, ``order + 1``."""
        return self.order + 1

    @property
    def num_elements(self) -> int:
        """Elements held (all ranks' and the pads, for a sharded discretization)."""
        return int(self.x.shape[1])

    @property
    def weight(self):  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def valid(self):
        """``(E, 1, 1, 1)`` 1.0 on the mesh's elements, 0.0 on pads (for maxima over a field)."""
        return (self.elements >= 0).astype(self.x.dtype)[:, None, None, None]

    def host(self, u) -> np.ndarray:
        """A field of this discretization as one NumPy array on every process (in the
        discretization's element order, pads included; gathered when it spans processes)."""
        if isinstance(u, jax.Array) and not u.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(u, tiled=True))
        return np.asarray(u)

    def host_elements(self) -> np.ndarray:
        """:attr:`elements` as a NumPy array on every process."""
        return self.host(self.elements)

    def integrate(self, u):
        """∫ u dx with the GLL rule; ``u: (..., E, n, n, n)`` summed over everything (all ranks)."""
        return self.comm.allreduce(jnp.sum(self.weight * u))

    def local_map(self, fn, *args):
        """``fn(self, *args)`` on each device's block of elements (the transport's
        :meth:`~jaxsem.parallel.comm.Transport.local_map`; a plain call on one device)."""
        return self.comm.local_map(fn, self, *args)


class Source:
    """Where a discretization came from: its mesh and the partition it was split by (host data).

    Kept static on :class:`jaxsem.discretization.SEM` so that another discretization of the
    same elements (a coarser order for p-multigrid, :func:`jaxsem.discretization.hierarchy.coarsen`)
    needs neither the mesh nor the partition again. Two sources compare equal when their
    topologies (order, element-to-vertex table, periodic face pairs) and partitions are the
    same, whatever the coordinates: discretizations of one topology share compiled programs
    (nothing traced reads the source), and a program's output never carries another topology's.
    """

    __slots__ = ("mesh", "partition", "key")

    def __init__(self, mesh, partition=None):
        self.mesh = mesh
        self.partition = None if partition is None else np.asarray(partition)
        h = hashlib.sha1(np.int64(mesh.order).tobytes())
        for a in (mesh.cells, mesh.periodic_faces, self.partition):
            if a is not None:
                a = np.ascontiguousarray(a, dtype=np.int64)
                h.update(str(a.shape).encode())
                h.update(a.tobytes())
        self.key = h.hexdigest()

    def __eq__(self, other):
        return isinstance(other, Source) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"Source(mesh of {self.mesh.num_elements} elements, order {self.mesh.order})"
