"""A discretized mesh: numbering, geometry and gather–scatter plan in one pytree.

``sem = discretize(mesh)`` is what operators, solvers and models take. Arrays
are leaves (so ``jax.grad`` can reach the geometry); sizes and names are static.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..backends import Backend, resolve as resolve_backend
from ..core import basis
from ..core import geometry as geo
from ..core.reduce import weighted_dots
from ..parallel.comm import Comm, get_comm
from . import shard
from .base import Discretization, Source
from .assembled import Assembled, make_assembled
from .gather_scatter import GatherScatter, gs_apply, make_gs, make_gs_distributed
from ..mesh.box import Mesh
from ..mesh.numbering import Numbering, face_ids, face_slice, number_nodes
from ..mesh.partition import partition_mesh
from ..operators.stiffness import affine_factors

__all__ = ["SEM", "discretize", "with_dirichlet", "group_indicator", "memory_bytes", "STORAGES"]

STORAGES = ("auto", "local")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SEM(Discretization):
    """A spectral-element discretization (pytree).

    Attributes (E elements, n = N + 1 GLL points, q quadrature points per axis):
      x: ``(3, E, n, n, n)`` GLL node coordinates.
      D: ``(n, n)`` GLL derivative matrix.
      J, Dt: ``(q, n)`` interpolation/derivative to the operator's quadrature.
      geom: :class:`jaxsem.geometry.Geometry` on that quadrature.
      gs: :class:`jaxsem.gather_scatter.GatherScatter` plan.
      mask: ``(E, n, n, n)`` 1.0 inside, 0.0 on Dirichlet boundary nodes (all ones
        for Neumann problems).
      bmass: ``(E, n, n, n)`` assembled-ready diagonal GLL mass (w·jac on GLL nodes),
        used for L2 norms of E-vectors.
      elements: ``(E,)`` mesh indices of the elements held (−1: padding of a sharded SEM).
      w: ``(q,)`` weights of the operator's quadrature rule.
      order, quadrature, num_global (distinct nodes of the whole mesh), comm: static.
      backend: static :class:`jaxsem.backends.Backend`, the element kernels (and through
        ``gs``, the gather–scatter) chosen once by :func:`discretize`.
      assembled: the node map of assembled storage (:mod:`.assembled`), where solvers keep
        their Krylov vectors with one value per node (per rank's node when distributed, the
        interface nodes on each of their ranks); None (``storage="local"``): they keep
        E-vectors.
      affine: ``(6, E, 1, 1, 1)`` where every element is affine, the backend wants it
        (:attr:`jaxsem.backends.Backend.compact_affine`) and the operator's points are the GLL
        points: the geometric factors as constants, ``G = affine ⊙ w⊗w⊗w``
        (:func:`jaxsem.operators.stiffness.affine_factors`); else None. The element operators
        take :attr:`stiffness_factors`.
      source: static :class:`~jaxsem.discretization.base.Source`, the mesh and partition it
        was built from (for :func:`jaxsem.discretization.coarsen`).
      dirichlet: static, where the mask is 0: ``True`` every boundary face, ``False`` none, or
        a tuple of the mesh's boundary group names.

    Under MPI each rank holds only its elements; sharded over devices the arrays are
    global and split along the element axis (:mod:`jaxsem.discretization.shard`).
    Either way ``dot``, ``integrate`` and ``norm`` sum over everything and ``dssum``
    exchanges shared nodes.
    """

    x: jax.Array
    D: jax.Array
    J: jax.Array
    Dt: jax.Array
    geom: geo.Geometry
    gs: GatherScatter
    mask: jax.Array = dataclasses.field(metadata=dict(pad=0))
    bmass: jax.Array = dataclasses.field(metadata=dict(pad=0))
    elements: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    w: jax.Array
    order: int = dataclasses.field(metadata=dict(static=True))
    quadrature: str = dataclasses.field(metadata=dict(static=True))
    num_global: int = dataclasses.field(metadata=dict(static=True))
    comm: object = dataclasses.field(metadata=dict(static=True), default=Comm())
    backend: Backend = dataclasses.field(metadata=dict(static=True), default=Backend())
    assembled: Assembled | None = None
    source: Source | None = dataclasses.field(metadata=dict(static=True), default=None)
    dirichlet: bool | tuple = dataclasses.field(metadata=dict(static=True), default=True)
    affine: jax.Array | None = dataclasses.field(default=None, metadata=dict(pad=0))

    @property
    def stiffness_factors(self):
        """The factors the stiffness operators take: :attr:`affine` where set, else ``geom.G``."""
        return self.geom.G if self.affine is None else self.affine

    @property
    def weight(self):
        """``(E, n, n, n)`` GLL mass weights (:attr:`bmass`)."""
        return self.bmass

    @property
    def mult(self):
        """``(E, n, n, n)`` inverse multiplicity."""
        return self.gs.mult

    def with_coordinates(self, x):
        """The same discretization with node coordinates ``x: (3, E, n, n, n)``.

        Geometry (G, B, Jacobians, mass weights) is recomputed from ``x`` with
        ``jnp``, so ``jax.grad`` through a solve on the result gives shape
        derivatives. Topology, numbering and masks are kept. Raises ``ValueError`` for
        another shape or (concrete ``x``) an inverted element, naming it.
        """
        x = jnp.asarray(x, self.x.dtype)
        if x.shape != self.x.shape:
            raise ValueError(f"x must have shape {self.x.shape}, got {x.shape}")
        coll = self.quadrature == "gll"
        geom = geo.factors(x, self.J, self.Dt, self.w, coll)
        geo.check_orientation(geom.jac, None if isinstance(self.elements, jax.core.Tracer) else self.elements >= 0)
        if coll:
            bmass = geom.B
        else:
            wg = jnp.asarray(basis.gll_points(self.order)[1], x.dtype)
            bmass = geo.factors(x, jnp.eye(self.n, dtype=x.dtype), self.D, wg, True).B
        return dataclasses.replace(self, x=x, geom=geom, bmass=bmass, affine=None)

    def with_mask(self, mask, dirichlet) -> "SEM":
        """The same discretization with Dirichlet nodes where ``mask: (E, n, n, n)`` is 0 (a
        continuous 0/1 field; rank-local inside :meth:`local_map`, global outside) and the
        static ``dirichlet`` recorded; assembled storage drops the new Dirichlet nodes (global
        arrays, or rank-local ones under MPI)."""
        mask = jnp.asarray(mask, self.mask.dtype) * self.valid
        a = self.assembled
        if a is not None:
            idx = jnp.where(mask > 0, self.gs.gid.reshape(self.mask.shape), a.size).astype(jnp.int32)
            a = dataclasses.replace(a, idx=idx)
        return dataclasses.replace(self, mask=mask, assembled=a, dirichlet=dirichlet)

    def dssum(self, u):
        """QQᵀ u (direct stiffness summation) of ``u: (..., E, n, n, n)``."""
        return self.comm.local_map(gs_apply, self.gs, u)

    def dot(self, u, v):
        """Σ u·v/multiplicity: the global inner product of continuous E-vectors."""
        return self.comm.allreduce(jnp.sum(u * v * self.gs.mult))

    def dots(self, pairs):
        """Several weighted inner products ``[(u, v), …]`` with one all-reduce: ``(len(pairs),)``.

        One variadic reduction over all pairs, so PCG's (r, z) and (r, r) read r, z and
        the weights in one pass.
        """
        return weighted_dots(self.gs.mult, self.comm.allreduce)(pairs)

    def interpolate(self, f: Callable):
        """Nodal values ``f(x, y, z)`` at the GLL nodes: ``(E, n, n, n)`` or ``(k, E, n, n, n)``."""
        return jnp.asarray(f(self.x[0], self.x[1], self.x[2]))

    def norm(self, u):
        """L2 norm √∫|u|² with the GLL rule; ``u: (..., E, n, n, n)``."""
        return jnp.sqrt(self.integrate(u * u))


def discretize(
    mesh: Mesh,
    quadrature: str = "gll",
    dirichlet: bool = True,
    backend: str | Backend = "auto",
    dtype=jnp.float64,
    q: int | None = None,
    numbering: Numbering | None = None,
    comm: Comm | None = None,
    partition: np.ndarray | None = None,
    devices=None,
    storage: str = "auto",
) -> SEM:
    """Number, measure and plan a mesh.

    Args:
      mesh: a :class:`jaxsem.mesh.Mesh`.
      quadrature: ``"gll"`` (collocated, q = N + 1) or ``"gauss"`` (q = N + 2).
      dirichlet: where the mask is 0 (the Dirichlet nodes): ``True`` every boundary face,
        ``False`` none (Neumann), or a sequence of names of ``mesh.boundaries`` (the nodes of
        those groups' faces, edges and corners shared with other faces included).
      backend: ``"auto"`` (the fused CUDA kernels where they run this order and dtype,
        the einsum reference elsewhere), ``"einsum"`` or ``"cuda"``; see
        :mod:`jaxsem.backends`. Resolved here, once, and kept on the result.
      dtype: ``jnp.float64`` (default) or ``jnp.float32``.
      numbering: a :class:`Numbering` of ``mesh`` to reuse (computed if None).
      comm: MPI transport (default :func:`jaxsem.parallel.get_comm`: serial, or one
        process per device under ``mpirun``, each keeping only its own elements).
      partition: ``(E,)`` rank (or device) of each element (default
        :func:`jaxsem.mesh.partition_mesh`).
      devices: ``None`` (one device, or the MPI ranks of ``comm``), or several devices —
        an int P, a sequence of devices (of this process or, under ``jax.distributed``,
        of all processes) or a one-axis ``jax.sharding.Mesh``: then the arrays are global
        and split over the devices along the element axis (:mod:`.shard`), the transport
        is JAX's own (``psum``/``ppermute``), and everything else runs unchanged.
      storage: where solvers keep Krylov vectors: ``"auto"`` (assembled, one value per
        node and rank) or ``"local"`` (E-vectors: the reference).
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    if quadrature not in ("gll", "gauss"):
        raise ValueError(f"quadrature must be 'gll' or 'gauss', got {quadrature!r}")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    dirichlet = dirichlet_groups(mesh, dirichlet)
    if numbering is None:
        numbering = number_nodes(mesh)
    elif numbering.gid.shape != (mesh.num_elements,) + (mesh.n,) * 3:
        raise ValueError(f"numbering does not match the mesh: gid shape {numbering.gid.shape}")
    if devices is not None and not (isinstance(devices, (int, np.integer)) and devices == 1):
        if comm is not None:
            raise ValueError("give comm (MPI, one process per device) or devices (sharded), not both")
        return shard.distribute(
            lambda c, part: discretize(mesh, quadrature, dirichlet, backend, dtype, q, numbering, c, part,
                                       storage=storage),
            mesh, devices, partition)
    comm = get_comm() if comm is None else comm
    if not isinstance(comm, Comm):
        raise TypeError(f"comm must be a jaxsem.parallel.Comm, got {type(comm).__name__} "
                        "(for several devices use devices=)")
    quad = geo.quadrature(mesh.order, quadrature, q)
    kernels = resolve_backend(backend, mesh.order, int(quad.J.shape[0]), dtype)
    mask = np.ones(numbering.gid.shape)
    if dirichlet is True:
        mask[numbering.boundary_nodes()] = 0.0
    elif dirichlet:
        mask[group_nodes(mesh, numbering, dirichlet)] = 0.0
    if comm.size > 1:
        part = partition_mesh(mesh, comm.size) if partition is None else np.asarray(partition)
        if part.shape != (mesh.num_elements,) or part.min() < 0 or part.max() >= comm.size:
            raise ValueError(f"partition must be (E,) = ({mesh.num_elements},) ranks in [0, {comm.size})")
        plan, elements, holders = make_gs_distributed(numbering.gid, part, comm, dtype, kernels.gs_layout)
        local_gid = np.asarray(plan.gid).reshape((elements.size,) + numbering.gid.shape[1:])
        node_map = lambda: make_assembled(local_gid, mask[elements], plan.num_global, plan.exchange, holders, dtype)
    else:
        elements = np.arange(mesh.num_elements)
        plan = make_gs(numbering.gid, numbering.num_global, kernels.gs_layout, dtype)
        node_map = lambda: make_assembled(numbering.gid, mask, numbering.num_global)
    assembled = node_map() if storage == "auto" else None
    whole = elements.size == mesh.num_elements  # then elements == arange(E): no copies
    x = jnp.asarray(mesh.x if whole else mesh.x[:, elements], dtype=jnp.float64)
    geom = geo.geometric_factors(x, quad)
    gll = geom if quad.collocated else geo.geometric_factors(x, geo.quadrature(mesh.order, "gll"))
    cast = lambda a: jnp.asarray(a, dtype)
    affine = affine_factors(geom.G) if kernels.compact_affine and quad.collocated else None
    return SEM(
        x=cast(x),
        D=cast(geo.quadrature(mesh.order, "gll").Dt),
        J=cast(quad.J),
        Dt=cast(quad.Dt),
        geom=jax.tree_util.tree_map(cast, geom),
        gs=plan,
        mask=cast(mask if whole else mask[elements]),
        bmass=cast(gll.B),
        elements=jnp.asarray(elements),
        w=cast(quad.w),
        order=mesh.order,
        quadrature=quadrature,
        num_global=numbering.num_global,
        comm=comm,
        backend=kernels,
        assembled=assembled,
        source=Source(mesh, part if comm.size > 1 else None),
        dirichlet=dirichlet,
        affine=None if affine is None else cast(affine),
    )


def dirichlet_groups(mesh: Mesh, dirichlet) -> bool | tuple:
    """``dirichlet`` checked: True, False, or a tuple of ``mesh``'s boundary group names (an
    empty sequence is False). ``ValueError`` naming an unknown group and the mesh's groups."""
    if isinstance(dirichlet, (bool, np.bool_)):
        return bool(dirichlet)
    if isinstance(dirichlet, str):
        dirichlet = (dirichlet,)
    try:
        names = tuple(dirichlet)
    except TypeError:
        raise TypeError(f"dirichlet must be True, False or a sequence of boundary group names, "
                        f"got {dirichlet!r}") from None
    unknown = [g for g in names if g not in mesh.boundaries]
    if unknown:
        raise ValueError(f"dirichlet names boundary group(s) {unknown} the mesh does not have; "
                         f"its groups: {sorted(mesh.boundaries)}")
    return tuple(dict.fromkeys(names)) or False


def group_indicator(sem: SEM, groups) -> jax.Array:
    """``(E, n, n, n)``: 1.0 on the nodes of the boundary ``groups``' faces (their edges and
    corners too, on every element that touches them), 0.0 elsewhere — a continuous field,
    found by a gather–scatter of the faces' indicator (no renumbering; any transport).
    ``groups``: a sequence of names of ``sem.source.mesh.boundaries``."""
    if sem.source is None:
        raise ValueError("sem has no source mesh (it was not built by jaxsem.discretize)")
    mesh = sem.source.mesh
    groups = dirichlet_groups(mesh, tuple(groups)) or ()
    flag = np.zeros((mesh.num_elements + 1, 6))  # the last row: pads of a sharded block (element −1)
    for g in groups:
        rows = mesh.boundary(g)
        flag[rows[:, 0], rows[:, 1]] = 1.0
    flag = flag[sem.host_elements()]
    ind = np.zeros(sem.mask.shape)
    for f in range(6):
        at = face_slice(f, sem.order)
        ind[at] = np.maximum(ind[at], flag[:, f, None, None])
    ind = jax.device_put(jnp.asarray(ind, sem.mask.dtype), getattr(sem.mask, "sharding", None))
    return sem.local_map(lambda s, i: jnp.where(s.dssum(i) > 0, 1.0, 0.0).astype(i.dtype) * s.valid, ind)


def with_dirichlet(sem: SEM, dirichlet) -> SEM:
    """``sem`` with its Dirichlet nodes on the boundary groups ``dirichlet`` (a sequence of
    names of the mesh's groups, or False for none) instead (:func:`group_indicator`)."""
    if dirichlet is True:
        raise ValueError("with_dirichlet takes group names or False; for every boundary face use discretize")
    if sem.source is None:
        raise ValueError("sem has no source mesh (it was not built by jaxsem.discretize)")
    groups = dirichlet_groups(sem.source.mesh, dirichlet)
    return sem.with_mask(1.0 - group_indicator(sem, groups or ()), groups)


def group_nodes(mesh: Mesh, numbering: Numbering, groups) -> np.ndarray:
    """``(E, n, n, n)`` bool: the node lies on a face of one of the boundary ``groups`` (host).

    ``ValueError`` naming a group with a face that is not on the domain boundary (shared by
    two elements or periodic)."""
    boundary = set((numbering.boundary_faces[:, 0] * 6 + numbering.boundary_faces[:, 1]).tolist())
    flag = np.zeros(numbering.num_global, dtype=bool)
    for g in groups:
        rows = mesh.boundary(g)
        inner = [r for r in (rows[:, 0] * 6 + rows[:, 1]).tolist() if r not in boundary]
        if inner:
            raise ValueError(f"boundary group {g!r}: face {inner[0] % 6} of element {inner[0] // 6} is not on the "
                             f"domain boundary ({len(inner)} such faces)")
        if len(rows):
            flag[face_ids(numbering.gid, rows[:, 0], rows[:, 1])] = True
    return flag[numbering.gid]


def memory_bytes(num_elements: int, order: int, q: int | None = None, components: int = 1,
                 itemsize: int = 8) -> int:
    """Device memory a discretization and a Krylov solve on it take, in bytes (an estimate).

    Per element: coordinates, mask, GLL mass, inverse multiplicity and node ids on the
    ``n = order + 1`` GLL points (7 n³ values); geometric factors, mass weights,
    Jacobian, metric terms and coordinates on the ``q`` quadrature points (20 q³); six
    solver vectors per component (6 c n³). Good to within a factor of about two: a
    check before allocating, not an account. Raises ``ValueError`` naming a non-positive or
    non-integer argument.
    """
    for name, v in (("num_elements", num_elements), ("order", order), ("components", components),
                    ("itemsize", itemsize)) + ((("q", q),) if q is not None else ()):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    n = order + 1
    q = n if q is None else q
    return int(num_elements) * (7 * n**3 + 20 * q**3 + 6 * components * n**3) * itemsize

