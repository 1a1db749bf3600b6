"""The same elements at lower orders: the level hierarchy of p-multigrid.

A coarse level is :func:`jaxsem.discretize` of the discretization's own mesh topology
(kept on it as :attr:`SEM.source`) at another order, its coordinates the finest level's
interpolated to the coarse GLL points (curved geometry stays consistent), its elements
where the fine ones are (same devices and blocks, or the same MPI ranks), its Dirichlet
nodes where the fine level has any (Lottes & Fischer, J. Sci. Comput. 2005). Coarser
levels keep E-vector storage; the finest, rebuilt in another floating-point type, keeps the
storage of the discretization (the V-cycle's finest level runs on assembled vectors where
the solve does).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp
import numpy as np

from ..core import basis
from .sem import SEM, discretize
from .shard import placement_of

__all__ = ["PMGScheduleWarning", "coarsen", "levels", "default_orders"]


class PMGScheduleWarning(UserWarning):
    """The default p-multigrid schedule was cut short: the geometry folds at a lower order."""


def default_orders(order: int) -> tuple:
    """Halving: ``(p, ⌈p/2⌉, …, 1)``; e.g. 7 → (7, 4, 2, 1), 8 → (8, 4, 2, 1)."""
    out = [int(order)]
    while out[-1] > 1:
        out.append((out[-1] + 1) // 2)
    return tuple(out)


def _source(sem: SEM):
    if not isinstance(sem, SEM):
        raise TypeError(f"sem must be a jaxsem SEM, got {type(sem).__name__}")
    if sem.source is None:
        raise ValueError("sem has no source mesh (it was not built by jaxsem.discretize); "
                         "coarser levels need the mesh topology it was built from")
    return sem.source


def _fine_coordinates(sem: SEM) -> np.ndarray:
    """``(3, E_mesh, n, n, n)`` float64: the mesh's node coordinates with the elements ``sem``
    holds taken from ``sem.x`` (coordinates set on ``sem`` itself win)."""
    mesh = sem.source.mesh
    x = np.array(mesh.x, dtype=np.float64)
    el = sem.host_elements()
    keep = el >= 0
    x[:, el[keep]] = np.asarray(sem.host(sem.x), dtype=np.float64)[:, keep]
    return x


def _has_dirichlet(sem: SEM) -> bool | tuple:
    """``sem.dirichlet`` where its mask has Dirichlet nodes (a mask replaced without them,
    as :func:`jaxsem.elliptic.pure_neumann` does, has none), else False."""
    has = float(sem.comm.allreduce(jnp.sum((sem.mask == 0) * sem.valid))) > 0
    return (sem.dirichlet or True) if has else False


def coarsen(sem: SEM, order: int, dtype=None, *, _x=None, _dirichlet=None, _storage="local") -> SEM:
    """``sem``'s elements at polynomial order ``order`` (≤ ``sem.order``), for p-multigrid.

    Same partition (devices and blocks, or MPI ranks), Dirichlet nodes on the boundary
    where ``sem`` has any, coordinates ``sem.x`` interpolated to the new GLL points,
    E-vector storage, ``sem``'s backend kind and quadrature kind; ``dtype``: the level's
    (default ``sem``'s). Raises ``ValueError`` if the interpolated geometry folds
    ("inverted" elements) or ``order`` is not in ``[1, sem.order]``.
    """
    src = _source(sem)
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= sem.order:
        raise ValueError(f"order must be an integer in [1, {sem.order}], got {order!r}")
    x = _fine_coordinates(sem) if _x is None else _x
    dirichlet = _has_dirichlet(sem) if _dirichlet is None else _dirichlet
    if order != sem.order:
        Jx = basis.interp_matrix(sem.n, order + 1, "gll", "gll")[0]
        x = np.einsum("ai,bj,ck,...kji->...cba", Jx, Jx, Jx, x, optimize=True)  # host: no compile
    mesh = dataclasses.replace(src.mesh, order=int(order), x=x)
    backend = "einsum" if sem.backend.name == "einsum" else "auto"
    c = discretize(mesh, quadrature=sem.quadrature, dirichlet=dirichlet, backend=backend,
                   dtype=sem.x.dtype if dtype is None else dtype, storage=_storage,
                   **placement_of(sem, src.mesh, src.partition))
    if not np.array_equal(c.host_elements(), sem.host_elements()):
        raise ValueError("the coarse level was split differently from sem")
    return c


def levels(sem: SEM, orders=None, dtype=None) -> tuple:
    """The p-multigrid hierarchy of ``sem``, finest first: ``(sem, coarsen(sem, o₁), …)``.

    ``orders``: the level orders, finest first (the fine order may be left out); None:
    :func:`default_orders`, ended early (with a :class:`PMGScheduleWarning`) at the lowest
    order whose interpolated geometry does not fold. Given orders whose geometry folds are
    refused (``ValueError``). ``dtype``: the levels' floating-point type (default ``sem``'s);
    another than ``sem``'s rebuilds the finest level in it too (with ``sem``'s storage).
    """
    _source(sem)  # a SEM without a source is refused before any work
    dtype = sem.x.dtype if dtype is None else jnp.dtype(dtype)
    schedule = _orders(sem.order, orders)
    x = _fine_coordinates(sem)
    dirichlet = _has_dirichlet(sem)
    storage = "local" if sem.assembled is None else "auto"
    out = [sem if dtype == sem.x.dtype else coarsen(sem, sem.order, dtype, _x=x, _dirichlet=dirichlet, _storage=storage)]
    for order in schedule[1:]:
        try:
            out.append(coarsen(sem, order, dtype, _x=x, _dirichlet=dirichlet))
        except ValueError as err:
            if "inverted" not in str(err):
                raise
            if orders is not None:
                raise ValueError(f"orders: the geometry interpolated to order {order} (levels {schedule}) "
                                 f"folds: {err}; end the schedule at a higher order") from err
            kept = schedule[: schedule.index(order)]
            warnings.warn(f"p-multigrid: the geometry folds at order {order}; levels {kept} instead of {schedule}",
                          PMGScheduleWarning, stacklevel=3)
            break
    return tuple(out)


def _orders(order: int, given) -> tuple:
    if given is None:
        return default_orders(order)
    given = tuple(int(o) for o in given)
    if given[0] != order:
        given = (order,) + given
    if any(a <= b for a, b in zip(given, given[1:])) or given[-1] < 1:
        raise ValueError(f"orders must decrease strictly from the fine order {order} to >= 1, got {given}")
    return given
