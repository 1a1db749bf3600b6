"""Discontinuous-Galerkin building blocks on curvilinear hexahedra (GLL collocation).

Spectral-element DG as in NekCEM (Min & Fischer; Hesthaven & Warburton, *Nodal
DG*, §6): fields live on each element's GLL nodes with no continuity; elements
talk only through their faces.

* **Faces.** ``faces(u)`` extracts ``(..., E, n, n, n)`` volume fields to
  ``(..., E, 6, n, n)`` face points ``[e, f, v, u]`` (local faces ``0: r=-1,
  1: r=+1, 2: s=-1, 3: s=+1, 4: t=-1, 5: t=+1``; face-local axes as
  :func:`jaxsem.numbering.face_slice`). ``lift_faces`` is its transpose: it adds
  face values back into the volume (edge and corner nodes collect from every
  face they lie on).
* **Face-point numbering.** :func:`face_connectivity` (:mod:`jaxsem.mesh.faces`) gives every element face
  point an id such that exactly the two coinciding points of the two faces of a
  shared (or periodic) face share it; boundary points keep a private id. The
  orientation of the neighbour's face is found from the element-to-vertex
  table (8 possible relative orientations); periodic pairs are translations
  (node (u, v) ↔ node (u, v), :class:`jaxsem.mesh.Mesh`).
* **Exchange, NekCEM's way.** Each element writes its face values; an additive
  gather–scatter over the face-point ids returns, at every face point, own +
  neighbour (own alone on the boundary). All field components travel in ONE
  call on a ``(C, E, 6, n, n)`` stack (:func:`face_exchange`); distributed, one
  packed message per neighbour rank, with the physics unchanged.
* **Normals and lifting.** On the face of reference axis a at r_a = ±1 the
  area vector is ``n·sJ = ±jac·∇r_a`` (Nanson), so ``n = ±∇r_a/|∇r_a|`` and
  ``sJ = jac·|∇r_a|``. With GLL quadrature on the faces the surface integral
  lifted by the diagonal mass is, at a face node,
  ``lift = sJ·w_u·w_v / (jac·w_i·w_j·w_k) = sJ / (jac·w_end)``,
  ``w_end = 2/(N(N+1))`` the end-point GLL weight.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..backends import Backend, resolve as resolve_backend
from ..core import basis
from ..parallel.comm import Comm
from . import shard
from .base import Discretization
from .gather_scatter import (GatherScatter, exchange_received, gs_apply, make_gs, make_gs_distributed,
                             received_positions)
from ..core.geometry import geometric_factors, quadrature
from ..mesh.box import Mesh
from ..mesh.faces import FaceConnectivity, face_connectivity
from ..mesh.numbering import Numbering, face_slice
from ..mesh.partition import partition_mesh

__all__ = [
    "FaceConnectivity",
    "face_connectivity",
    "DG",
    "discretize_dg",
    "faces",
    "lift_faces",
    "face_exchange",
    "neighbor_values",
]

def faces(u):
    """Face values of volume fields: ``(..., E, n, n, n)`` → ``(..., E, 6, n, n)`` ``[v, u]``."""
    N = u.shape[-1] - 1
    return jnp.stack([u[face_slice(f, N)] for f in range(6)], axis=-3)


def lift_faces(fu):
    """Transpose of :func:`faces`: add face values ``(..., E, 6, n, n)`` into ``(..., E, n, n, n)``.

    Dense (pads with zeros, no scatter): nodes on several faces get every
    face's contribution.
    """
    n = fu.shape[-1]
    lead = fu.shape[:-3]
    z = jnp.zeros(lead + (n, n, max(n - 2, 0)), fu.dtype)

    def place(lo, hi):  # lo/hi: (..., v, w) planes at index 0 / N of the last axis
        if n == 1:
            return lo[..., None] + hi[..., None]
        return jnp.concatenate([lo[..., None], z, hi[..., None]], axis=-1)

    out_i = place(fu[..., 0, :, :], fu[..., 1, :, :])  # [k, j, i]
    out_j = jnp.swapaxes(place(fu[..., 2, :, :], fu[..., 3, :, :]), -1, -2)  # [k, i, j] -> [k, j, i]
    out_k = jnp.moveaxis(place(fu[..., 4, :, :], fu[..., 5, :, :]), -1, -3)  # [j, i, k] -> [k, j, i]
    return out_i + out_j + out_k


# ----------------------------------------------------------------------------- the DG plan


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DG(Discretization):
    """A DG discretization of a hex mesh on GLL nodes (pytree; arrays are leaves).

    Attributes (E elements, n = N + 1):
      x: ``(3, E, n, n, n)`` node coordinates.
      D: ``(n, n)`` GLL derivative matrix.
      rx: ``(3, 3, E, n, n, n)`` metric terms ``rx[a, d] = ∂r_a/∂x_d``.
      jac: ``(E, n, n, n)`` Jacobian determinant.
      mass: ``(E, n, n, n)`` diagonal GLL mass ``w_i w_j w_k jac``.
      normal: ``(3, E, 6, n, n)`` outward unit normals at face points.
      sJ: ``(E, 6, n, n)`` surface Jacobian.
      lift: ``(E, 6, n, n)`` ``sJ / (jac · w_end)``: face integral → nodal rate.
      boundary: ``(E, 6, 1, 1)`` 1.0 on domain-boundary faces, else 0.0.
      fgs: face-point gather–scatter plan (ids of :class:`FaceConnectivity`);
        distributed, it also exchanges the faces shared with other ranks.
      order: polynomial order N (static).
      elements: ``(E,)`` mesh indices of the elements held (−1: padding of a
        sharded DG).
      halo: ``(H,)`` int32 local indices of the elements with a face point
        shared with another rank (distributed only, else ``None``).
      halo_map: ``(H, 6, n, n)`` int32: for each face point of a halo element,
        its position in :func:`jaxsem.gather_scatter.exchange_received` (the
        zero slot K where the point is not shared), so the remote neighbour
        values arrive as ``received[halo_map]``.
      num_global_elements: elements of the whole mesh (static; 0: same as E).
      comm: the transport (static, :class:`jaxsem.parallel.comm.Transport`).
      backend: static :class:`jaxsem.backends.Backend` chosen by :func:`discretize_dg`: it
        computes the DG right-hand sides (with CUDA, each as one fused kernel).
      nbr: ``(E, 6, n, n)`` int32: the volume index ``e'·n³ + node`` (in this rank's
        elements) of the neighbour's node coinciding with each face point, −1 on the boundary
        and, distributed, where the neighbour lives on another rank (pads: −1), through which
        a fused kernel reads neighbour values without an exchange.
      face_vol: distributed only (else ``None``): ``(fgs.num_global,)`` int32, for each of the
        face plan's nodes the volume index of one of its copies here, so that the exchange's
        messages are gathered straight from a volume field (:func:`remote_values`).
      affine: static: every element of the whole mesh is an affine image of the reference
        cube (a parallelepiped; :func:`is_affine`), so the metric terms are constant per
        element and the chain-rule and split-form curls are the same operator.

    Distributed, ``boundary`` marks physical boundary faces only (faces shared
    with another rank or device are exchanged, not mirrored), and global
    reductions (:meth:`integrate`, Maxwell's energy, errors and Δt) sum over all.
    """

    x: jax.Array
    D: jax.Array
    rx: jax.Array
    jac: jax.Array
    mass: jax.Array = dataclasses.field(metadata=dict(pad=0))
    normal: jax.Array
    sJ: jax.Array
    lift: jax.Array
    boundary: jax.Array = dataclasses.field(metadata=dict(pad=0))
    fgs: GatherScatter
    order: int = dataclasses.field(metadata=dict(static=True))
    elements: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    halo: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    halo_map: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    num_global_elements: int = dataclasses.field(default=0, metadata=dict(static=True))
    comm: Comm = dataclasses.field(default=Comm(), metadata=dict(static=True))
    backend: Backend = dataclasses.field(default=Backend(), metadata=dict(static=True))
    nbr: jax.Array | None = dataclasses.field(default=None, metadata=dict(pad=-1))
    face_vol: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    affine: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def weight(self):
        """``(E, n, n, n)`` GLL mass weights (:attr:`mass`)."""
        return self.mass

    def faces(self, u):
        """:func:`faces`: ``(..., E, n, n, n)`` → ``(..., E, 6, n, n)``."""
        return faces(u)

    def lift_faces(self, fu):
        """:func:`lift_faces`: ``(..., E, 6, n, n)`` → ``(..., E, n, n, n)``."""
        return lift_faces(fu)

    def face_exchange(self, fu):
        """:func:`face_exchange`: Σ over the copies of each face point, ``fu: (C, E, 6, n, n)``."""
        return face_exchange(self, fu)

    def local_neighbors(self, u):
        """:func:`local_neighbor_values`: the neighbour values held here, read through :attr:`nbr`."""
        return local_neighbor_values(self, u)

    def remote_values(self, u):
        """:func:`remote_values`: the other ranks' values at the halo elements' face points."""
        return remote_values(self, u)


def discretize_dg(
    mesh: Mesh,
    dtype=jnp.float64,
    numbering: Numbering | None = None,
    connectivity: FaceConnectivity | None = None,
    comm: Comm | None = None,
    partition: np.ndarray | None = None,
    devices=None,
    backend: str | Backend = "auto",
) -> DG:
    """Metric terms, face normals, surface Jacobians, lift and face exchange plan of ``mesh``.

    ``comm``: ``None`` or a one-rank ``Comm()`` gives the serial DG of the whole
    mesh. With ``comm.size > 1`` (e.g. :func:`jaxsem.comm.get_comm` under
    mpirun) every rank passes the same global ``mesh`` and keeps only its
    elements (``partition``: ``(E,)`` rank of each element, default
    :func:`jaxsem.partition.partition_mesh`); the face exchange is the
    additive gather–scatter over the global face-point ids with one packed
    message per neighbour rank (:func:`jaxsem.gather_scatter.make_gs_distributed`).
    ``devices``: several devices (as :func:`jaxsem.discretize`): global arrays split
    over them along the element axis, JAX's own transport. ``backend``: ``"auto"`` (the fused
    CUDA kernels where they run), ``"einsum"``, ``"cuda"`` or a
    :class:`jaxsem.backends.Backend` (e.g. ``EMULATED``, see :mod:`jaxsem.backends`); resolved
    here, once.

    Raises ``ValueError`` for an inverted element (from
    :func:`jaxsem.geometry.geometric_factors`), a bad dtype or a bad partition.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    conn = face_connectivity(mesh, numbering) if connectivity is None else connectivity
    if devices is not None and not (isinstance(devices, (int, np.integer)) and devices == 1):
        if comm is not None:
            raise ValueError("give comm (MPI, one process per device) or devices (sharded), not both")
        return shard.distribute(
            lambda c, part: discretize_dg(mesh, dtype, numbering, conn, c, part, backend=backend), mesh, devices,
            partition,
            pad_extra=_pad_halo)
    comm = Comm() if comm is None else comm
    if not isinstance(comm, Comm):
        raise TypeError(f"comm must be a jaxsem.parallel.Comm, got {type(comm).__name__} "
                        "(for several devices use devices=)")
    N = mesh.order
    Eg = mesh.num_elements
    kernels = resolve_backend(backend, N, N + 1, dtype)
    nbr = None
    if comm.size > 1:
        part = partition_mesh(mesh, comm.size) if partition is None else np.asarray(partition)
        if part.shape != (Eg,) or part.min() < 0 or part.max() >= comm.size:
            raise ValueError(f"partition must be (E,) = ({Eg},) ranks in [0, {comm.size})")
        fgs, elements, _ = make_gs_distributed(conn.fid, part, comm, dtype=dtype)
        halo, halo_map = halo_plan(fgs, N)
        nbr, face_vol = _local_neighbors(conn.partner, elements, fgs, N)
    else:
        fgs, elements = make_gs(conn.fid, conn.num_ids, dtype=dtype), np.arange(Eg)
        halo = halo_map = face_vol = None
        nbr = _neighbor_nodes(conn.partner, N)
    x = np.asarray(mesh.x)[:, elements]
    geom = geometric_factors(jnp.asarray(x, jnp.float64), quadrature(N, "gll"))
    normal, sJ, lift = _face_geometry(geom.rx, geom.jac, N)
    xg, _ = basis.gll_points(N)
    cast = lambda a: jnp.asarray(a, dtype)
    return DG(
        x=cast(x), D=cast(basis.derivative_matrix(xg)), rx=cast(geom.rx), jac=cast(geom.jac),
        mass=cast(geom.B), normal=cast(normal), sJ=cast(sJ), lift=cast(lift),
        boundary=cast(conn.boundary[elements][:, :, None, None]), fgs=fgs, order=N,
        elements=jnp.asarray(elements, jnp.int32), num_global_elements=Eg, comm=comm,
        halo=None if halo is None else jnp.asarray(halo, jnp.int32),
        halo_map=None if halo_map is None else jnp.asarray(halo_map, jnp.int32),
        backend=kernels, nbr=jnp.asarray(nbr),
        face_vol=None if face_vol is None else jnp.asarray(face_vol), affine=is_affine(mesh.x),
    )


def is_affine(x, rtol: float = 1e-13) -> bool:
    """Whether every element's nodes ``x: (3, E, n, n, n)`` (GLL, float64) are an affine map of
    the reference nodes: x(r) = x₀ + Σ_a (r_a + 1)/2 · (x(corner a) − x₀), within
    ``rtol`` × the mesh's extent (from the corners (−1,−1,−1) and the three adjacent ones)."""
    x = np.asarray(x, np.float64)
    n = x.shape[-1]
    if n < 2:
        return True
    r = (np.asarray(basis.gll_points(n - 1)[0]) + 1.0) / 2.0  # (n,) in [0, 1]
    x0 = x[..., :1, :1, :1]
    ex = x[..., -1:, :1, :1] - x0  # axis order of the node array (i, j, k) = (r0, r1, r2)
    ey = x[..., :1, -1:, :1] - x0
    ez = x[..., :1, :1, -1:] - x0
    fit = x0 + ex * r[:, None, None] + ey * r[None, :, None] + ez * r[None, None, :]
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    return bool(x.size == 0 or np.max(np.abs(fit - x)) <= rtol * max(scale, np.finfo(float).tiny))


def _face_point_volume(p: np.ndarray, N: int) -> np.ndarray:
    """Volume index ``e·n³ + (k·n + j)·n + i`` (int64) of flat face-point indices
    ``p = ((e·6 + f)·n + v)·n + u`` (≥ 0), the layout of :func:`faces`."""
    n = N + 1
    p = p.astype(np.int64)
    e, f, v, u = p // (6 * n * n), (p // (n * n)) % 6, (p // n) % n, p % n
    end = np.where(f % 2 == 0, 0, N)
    axis = f // 2
    k = np.where(axis == 2, end, v)
    j = np.where(axis == 0, u, np.where(axis == 1, end, v))
    i = np.where(axis == 0, end, u)
    return e * n**3 + (k * n + j) * n + i


def _neighbor_nodes(partner: np.ndarray, N: int) -> np.ndarray:
    """``(E, 6, n, n)`` int32 volume index ``e'·n³ + (k·n + j)·n + i`` of the node behind each
    face point's partner (``partner``: flat face-point index, −1 on the boundary)."""
    n = N + 1
    if partner.size and int(partner.max()) // (6 * n * n) * n**3 + n**3 >= 2**31:
        raise ValueError("the fused DG kernels need fewer than 2**31 volume nodes")
    vol = _face_point_volume(np.maximum(partner, 0), N)
    return np.where(partner >= 0, vol, -1).astype(np.int32)


def _local_neighbors(partner: np.ndarray, elements: np.ndarray, fgs: GatherScatter, N: int):
    """A rank's ``(nbr, face_vol)`` (see :class:`DG`) from the whole mesh's ``partner`` (flat
    face-point index, −1 on the boundary), its ``elements`` (global, ascending) and face plan."""
    n2 = (N + 1) ** 2
    here = np.full(partner.shape[0], -1, np.int64)
    here[elements] = np.arange(elements.size)
    p = partner[elements].astype(np.int64)
    e_loc = here[np.maximum(p, 0) // (6 * n2)]
    local = np.where((p >= 0) & (e_loc >= 0), e_loc * 6 * n2 + p % (6 * n2), -1)
    face_vol = np.zeros(fgs.num_global, np.int64)
    face_vol[np.asarray(fgs.gid, np.int64)] = _face_point_volume(np.arange(local.size), N)
    return _neighbor_nodes(local, N), face_vol.astype(np.int32)


def _pad_halo(parts, padded, sizes: dict):
    """The ranks' halo lists padded to the longest (pad rows read the zero slot), with
    positions moved to the padded rounds' layout of :func:`exchange_received`."""
    if parts[0].halo is None:
        return padded
    H_max = max(int(np.shape(p.halo)[0]) for p in parts)
    return [_pad_halo_rank(p, q, sizes["rounds"][0], H_max) for p, q in zip(parts, padded)]


def _pad_halo_rank(part: DG, padded: DG, round_len, H_max: int) -> DG:
    lens = [int(np.shape(i)[0]) for i in part.fgs.exchange.idx]
    offs = np.concatenate([[0], np.cumsum(lens)])
    offs_p = np.concatenate([[0], np.cumsum(round_len)])
    hm = np.asarray(part.halo_map).astype(np.int64)
    r = np.clip(np.searchsorted(offs, hm, side="right") - 1, 0, len(lens) - 1)
    hm = np.where(hm < offs[-1], offs_p[r] + hm - offs[r], offs_p[-1])
    H = hm.shape[0]
    halo = np.concatenate([np.asarray(part.halo, np.int32), np.zeros(H_max - H, np.int32)])
    hm = np.concatenate([hm, np.full((H_max - H,) + hm.shape[1:], offs_p[-1])]).astype(np.int32)
    fv = np.asarray(part.face_vol)  # to the padded plan's nodes (the pads and trash slot: node 0)
    fv = np.concatenate([fv, np.zeros(padded.fgs.num_global - fv.size, np.int32)])
    return dataclasses.replace(padded, halo=halo, halo_map=hm, face_vol=fv)


def halo_plan(fgs: GatherScatter, N: int):
    """``(halo, halo_map)`` of a distributed face plan (see :class:`DG`), NumPy int64.

    A halo element has at least one face point whose other copy lives on
    another rank; ``halo_map`` gives each of its face points' position in the
    received messages, or the zero slot.
    """
    n = N + 1
    pos = received_positions(fgs.exchange, fgs.num_global)
    node_pos = pos[np.asarray(fgs.gid, np.int64)].reshape(-1, 6, n, n)
    K = sum(int(np.shape(i)[0]) for i in fgs.exchange.idx)
    halo = np.nonzero((node_pos < K).any(axis=(1, 2, 3)))[0]
    return halo, node_pos[halo]


@functools.partial(jax.jit, static_argnums=2)
def _face_geometry(rx, jac, N):
    """Outward normals ``(3, E, 6, n, n)``, sJ and lift ``(E, 6, n, n)`` from volume metrics."""
    w_end = float(basis.gll_points(N)[1][0])
    rxf = faces(rx)  # (3 a, 3 d, E, 6, n, n)
    jf = faces(jac)  # (E, 6, n, n)
    sign = jnp.asarray([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0], rx.dtype)[:, None, None]
    vec = jnp.stack([rxf[f // 2, :, :, f] for f in range(6)], axis=2) * sign  # (3 d, E, 6, n, n)
    mag = jnp.sqrt(jnp.sum(vec * vec, axis=0))
    normal = vec / mag
    sJ = jf * mag
    return normal, sJ, sJ / (jf * w_end)


# ----------------------------------------------------------------------------- exchange


def face_exchange(dg: DG, fu):
    """The face exchange: Σ over the copies of each face point, ``fu: (C, E, 6, n, n)``.

    One gather–scatter for all C components (one ``segment_sum`` batched over C);
    on a distributed DG, plus one packed message per neighbour rank for all C.
    """
    return dg.comm.local_map(gs_apply, dg.fgs, fu)


def local_neighbor_values(dg: DG, u):
    """Each face point's neighbour value read through ``dg.nbr``: ``u: (..., E, n, n, n)`` →
    ``(..., E, 6, n, n)``, 0 where ``nbr < 0`` (the boundary and, distributed, remote neighbours).
    What a fused kernel reads; no exchange."""
    flat = u.reshape(u.shape[:-4] + (-1,))
    vals = jnp.take(flat, jnp.maximum(dg.nbr, 0), axis=-1)
    return jnp.where(dg.nbr >= 0, vals, jnp.zeros((), u.dtype))


def remote_values(dg: DG, u):
    """The values other ranks hold at the halo elements' face points (distributed ``dg``).

    ``u: (..., E, n, n, n)`` → ``(rem, is_remote)``: ``rem: (..., H, 6, n, n)`` the remote
    neighbour's value at each face point of the halo elements ``dg.halo`` (0 where the
    neighbour is here or absent) and ``is_remote: (H, 6, n, n)`` bool. One message per
    neighbour rank, gathered straight from ``u`` through ``dg.face_vol``; what
    :func:`local_neighbor_values` leaves out.
    """
    ex = dg.fgs.exchange
    vol = dataclasses.replace(ex, idx=tuple(dg.face_vol[i] for i in ex.idx))  # messages from u
    received = exchange_received(vol, u.reshape(u.shape[:-4] + (-1,)))  # (..., K + 1)
    K = received.shape[-1] - 1
    return jnp.take(received, dg.halo_map, axis=-1), dg.halo_map < K


def neighbor_values(dg: DG, fu):
    """The neighbour's values at each face point ``fu: (C, E, 6, n, n)``: the face exchange
    minus own (0 on the boundary)."""
    return face_exchange(dg, fu) - fu
