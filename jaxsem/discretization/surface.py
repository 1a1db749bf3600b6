"""Boundary surfaces of a SEM: the faces of named boundary groups, their normals and area weights.

``surf = surface(sem, ("xmin", "zmax"))`` selects on the host which faces each rank (or
device block) holds and computes their geometry from the node coordinates ``sem.x`` with
``jnp`` (so ``jax.grad`` through :func:`integrate` gives shape derivatives). Faces are
grouped by local face number (``0: r=-1, 1: r=+1, 2: s=-1, 3: s=+1, 4: t=-1, 5: t=+1``):
face-local node order ``[v, u]`` is :func:`jaxsem.mesh.numbering.face_slice`'s, so a face's
values are a static slice of an E-vector, no gather by face number. Quantities on faces
are ``(..., F, n, n)``; every function here runs on global arrays (serial, sharded) or
rank-local ones (inside :meth:`SEM.local_map`, MPI).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis
from ..mesh.numbering import face_slice
from ..parallel.comm import Blocks, Comm, ShardComm
from .sem import SEM

__all__ = ["Surface", "surface", "face_values", "face_scatter", "integrate", "flux", "area", "element_blocks"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Surface:
    """Faces of boundary groups held by a SEM, with their geometry (pytree; :func:`surface` builds it).

    Attributes (F faces held per rank or device block, n = N + 1):
      element: ``(F,)`` int32 local element index of each face (pad faces: element 0).
      live: ``(F,)`` 1.0 on faces of the groups, 0.0 on pads (which keep equal shapes).
      group: ``(F,)`` int32 index in :attr:`groups` of each face's group (−1 on pads).
      weight: ``(F, n, n)`` area weights w_u w_v |∂x/∂u × ∂x/∂v| (0 on pads), length².
      unit_normal: ``(F, 3, n, n)`` outward unit normal (0 on pads); :attr:`normal` is
        ``(3, F, n, n)``.
      counts: static, faces per local face number (one block's; faces stored in that order).
      groups: static, the names of the boundary groups.
      comm: static transport of the SEM (blocks per device when sharded).
    Sharded, each array is the devices' blocks concatenated along its first axis.
    """

    element: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    live: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    group: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    weight: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    unit_normal: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    counts: tuple = dataclasses.field(metadata=dict(static=True))
    groups: tuple = dataclasses.field(metadata=dict(static=True))
    comm: object = dataclasses.field(metadata=dict(static=True), default=Comm())

    @property
    def normal(self):
        """``(3, F, n, n)`` outward unit normals."""
        return jnp.moveaxis(self.unit_normal, -3, 0)


def element_blocks(sem: SEM) -> list:
    """Mesh indices of the elements of each block ``sem`` holds, in local order (host, NumPy).

    One block serially or per MPI rank (this rank's); one per device when sharded (without the
    pads). Read from the static partition, so ``sem`` may be traced."""
    if sem.source is None:
        raise ValueError("sem has no source mesh (it was not built by jaxsem.discretize)")
    mesh, part = sem.source.mesh, sem.source.partition
    comm = sem.comm
    if isinstance(comm, ShardComm) and comm.size > 1:
        blocks = [np.flatnonzero(part == r) for r in range(comm.size)]
    elif comm.size > 1:
        blocks = [np.flatnonzero(part == comm.rank)]
    else:
        blocks = [np.arange(mesh.num_elements)]
    if not isinstance(sem.elements, jax.core.Tracer):
        el = sem.host_elements().reshape(len(blocks), -1)
        if any(not np.array_equal(b, e[: b.size]) for b, e in zip(blocks, el)):
            raise ValueError("sem holds its elements in an order its partition does not give")
    return blocks


def surface(sem: SEM, groups) -> Surface:
    """The faces of the boundary ``groups`` (a name or names of ``sem.source.mesh.boundaries``).

    Host selection of each block's faces, then geometry from ``sem.x`` with ``jnp`` (rank-local,
    differentiable w.r.t. the coordinates). A group with no face on a rank is fine. Raises
    ``ValueError`` naming unknown groups and listing the mesh's.
    """
    if not isinstance(sem, SEM):
        raise TypeError(f"sem must be a jaxsem SEM, got {type(sem).__name__}")
    blocks = element_blocks(sem)
    mesh = sem.source.mesh
    names = (groups,) if isinstance(groups, str) else tuple(groups)
    unknown = [g for g in names if g not in mesh.boundaries]
    if not names or unknown or not all(isinstance(g, str) for g in names):
        raise ValueError(f"groups must name one or more of the mesh's boundary groups "
                         f"{sorted(mesh.boundaries)}, got {groups!r}" + (f" (unknown: {unknown})" if unknown else ""))
    names = tuple(dict.fromkeys(names))
    rows = np.concatenate([mesh.boundary(g) for g in names])
    gid = np.concatenate([np.full(len(mesh.boundary(g)), k) for k, g in enumerate(names)])
    local = np.full(mesh.num_elements, -1, np.int64)
    per_block = []
    for b in blocks:
        local[:] = -1
        local[b] = np.arange(b.size)
        held = local[rows[:, 0]] >= 0
        faces = []
        for f in range(6):
            sel = held & (rows[:, 1] == f)
            e, k = local[rows[sel, 0]], gid[sel]
            order = np.argsort(e, kind="stable")
            faces.append((e[order], k[order]))
        per_block.append(faces)
    counts = tuple(max(len(p[f][0]) for p in per_block) for f in range(6))
    element, group = [], []
    for p in per_block:
        for f in range(6):
            pad = counts[f] - len(p[f][0])
            element.append(np.concatenate([p[f][0], np.zeros(pad, np.int64)]))
            group.append(np.concatenate([p[f][1], np.full(pad, -1)]))
    element = np.concatenate(element).astype(np.int32)
    group = np.concatenate(group).astype(np.int32)
    live = (group >= 0).astype(sem.x.dtype)
    out = sem.local_map(lambda s, b: Blocks(b.value + _geometry(s, *b.value[:2], counts)),
                        Blocks((element, live, group)))
    element, live, group, weight, unit_normal = (jnp.asarray(a) for a in out.value)
    return Surface(element=element, live=live, group=group, weight=weight, unit_normal=unit_normal, counts=counts,
                   groups=names, comm=sem.comm)


@functools.partial(jax.jit, static_argnums=3)
def _geometry(s: SEM, element, live, counts):
    """Rank-local area weights ``(F, n, n)`` and outward unit normals ``(F, 3, n, n)``."""
    N, D = s.order, s.D
    w = basis.gll_points(N)[1]
    wuv = jnp.asarray(np.outer(w, w), s.x.dtype)
    weights, normals, off = [], [], 0
    for f, c in enumerate(counts):
        if c == 0:
            continue
        xe = jnp.take(s.x, element[off:off + c], axis=1)  # (3, c, n, n, n)
        xf = xe[face_slice(f, N)]  # (3, c, v, u)
        xu = jnp.einsum("ij,...vj->...vi", D, xf)
        xv = jnp.einsum("ij,...ju->...iu", D, xf)
        a = jnp.cross(xu, xv, axis=0)
        # x_w, the derivative along the face's reference normal axis: a points out of the element
        # where it has x_w's sign at the +1 face (the sign of the Jacobian, whatever the handedness)
        end = 0 if f % 2 == 0 else N
        xw = jnp.tensordot(D[end], xe, axes=([0], [4 - f // 2]))  # (3, c, v, u)
        side = 1.0 if f % 2 else -1.0
        sign = side * jnp.sign(jnp.sum(a * xw, axis=0))
        norm = jnp.sqrt(jnp.sum(a * a, axis=0))
        lv = live[off:off + c, None, None]
        weights.append(wuv * norm * lv)
        normals.append(jnp.moveaxis(a * (sign * lv / norm), 0, 1))
        off += c
    return jnp.concatenate(weights), jnp.concatenate(normals)


def face_values(surf: Surface, u):
    """Values of an E-vector ``u: (..., E, n, n, n)`` on the faces: ``(..., F, n, n)`` (``[v, u]``)."""
    out = surf.comm.local_map(lambda s, u: Blocks(jnp.moveaxis(_face_values(s, u), -3, 0)), surf, u)
    return jnp.moveaxis(out.value, 0, -3)  # faces first across local_map: split by blocks


@jax.jit
def _face_values(surf: Surface, u):
    N = u.shape[-1] - 1
    out, off = [], 0
    for f, c in enumerate(surf.counts):
        if c:
            out.append(jnp.take(u, surf.element[off:off + c], axis=-4)[face_slice(f, N)])
            off += c
    return jnp.concatenate(out, axis=-3)


def face_scatter(surf: Surface, g, like):
    """The transpose of :func:`face_values`: ``g: (..., F, n, n)`` added onto the face nodes of
    an E-vector shaped like ``like: (..., E, n, n, n)`` (zeros elsewhere; not assembled)."""
    g = Blocks(jnp.moveaxis(g, -3, 0))  # faces first: split by blocks
    return surf.comm.local_map(lambda s, g, like: _face_scatter(s, jnp.moveaxis(g.value, 0, -3), like), surf, g, like)


@jax.jit
def _face_scatter(surf: Surface, g, like):
    N = like.shape[-1] - 1
    out, off = jnp.zeros(g.shape[:-3] + like.shape[-4:], g.dtype), 0
    for f, c in enumerate(surf.counts):
        if c:
            gf = jnp.zeros(g.shape[:-3] + (c,) + like.shape[-3:], g.dtype).at[face_slice(f, N)].set(
                g[..., off:off + c, :, :])
            out = out.at[..., surf.element[off:off + c], :, :, :].add(gf)
            off += c
    return out


def integrate(sem: SEM, surf: Surface, f):
    """∮ f dA over the faces of ``surf`` for ``f: (..., F, n, n)`` (summed over ranks): ``(...)``."""
    return sem.comm.allreduce(jnp.sum(surf.weight * f, axis=(-3, -2, -1)))


def flux(sem: SEM, surf: Surface, v):
    """∮ v·n dA, the outward flux of a vector E-vector ``v: (3, ..., E, n, n, n)``: ``(...)``."""
    vn = jnp.sum(face_values(surf, v) * jnp.expand_dims(surf.normal, tuple(range(1, v.ndim - 4))), axis=0)
    return integrate(sem, surf, vn)


def area(sem: SEM, surf: Surface):
    """∮ dA, the area of the faces of ``surf`` (summed over ranks), length²."""
    return sem.comm.allreduce(jnp.sum(surf.weight))
