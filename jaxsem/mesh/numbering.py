"""Global numbering of GLL nodes on a conforming hex mesh, from topology alone.

Every local node ``[e, k, j, i]`` gets a global id ``gid`` such that nodes that
coincide physically share an id. Ids come from the element-to-vertex table:

* corner nodes are the vertex ids;
* edge-interior nodes are keyed by the edge (its two vertex ids) and the
  position along it counted from the smaller vertex id, so two elements that
  traverse the edge in opposite directions agree;
* face-interior nodes are keyed by the face (its four vertex ids) and the
  position in a canonical face frame: origin at the smallest vertex id, first
  axis towards the smaller of its two neighbours — all 8 relative orientations
  of two hexes sharing a face map to the same frame;
* element-interior nodes are private.

Periodic identification is applied afterwards by merging the node ids of the
paired faces (``Mesh.periodic_faces``), so a periodic axis may have a single
element. No coordinates are compared anywhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .box import Mesh

__all__ = ["Numbering", "number_nodes", "face_slice", "FACE_CORNERS"]

# Corners of each local face in face-local (u, v) order: (0,0), (1,0), (0,1), (1,1).
# Face-local axes: faces 0/1 → (u, v) = (s, t) i.e. (j, k); faces 2/3 → (r, t); faces 4/5 → (r, s).
FACE_CORNERS = np.array(
    [
        [0, 2, 4, 6],  # r = -1: corners with a = 0, ordered by (b, c3)
        [1, 3, 5, 7],  # r = +1
        [0, 1, 4, 5],  # s = -1: (a, c3)
        [2, 3, 6, 7],  # s = +1
        [0, 1, 2, 3],  # t = -1: (a, b)
        [4, 5, 6, 7],  # t = +1
    ]
)
# Edges as (corner from, corner to, axis of travel).
EDGES = np.array(
    [[0, 1, 0], [2, 3, 0], [4, 5, 0], [6, 7, 0],
     [0, 2, 1], [1, 3, 1], [4, 6, 1], [5, 7, 1],
     [0, 4, 2], [1, 5, 2], [2, 6, 2], [3, 7, 2]]
)


def _corner_kji(c, N):
    return ((c >> 2) & 1) * N, ((c >> 1) & 1) * N, (c & 1) * N


def face_slice(f: int, N: int):
    """Index tuple selecting local face ``f`` of ``[..., k, j, i]`` arrays as ``[..., v, u]``."""
    end = 0 if f % 2 == 0 else N
    axis = f // 2
    if axis == 0:
        return (Ellipsis, slice(None), slice(None), end)
    if axis == 1:
        return (Ellipsis, slice(None), end, slice(None))
    return (Ellipsis, end, slice(None), slice(None))


@dataclasses.dataclass(frozen=True, eq=False)
class Numbering:
    """Global node ids of a mesh (host-side, NumPy).

    Attributes:
      gid: ``(E, n, n, n)`` int64 global id of each local node, ids in
        ``[0, num_global)`` numbered in order of first appearance.
      num_global: number of distinct nodes.
      boundary_faces: ``(B, 2)`` int64 ``(element, local face)`` on the domain
        boundary (faces neither shared nor periodic).
      face_neighbors: ``(E, 6, 2)`` int64 ``(element, face)`` across each local
        face, ``(-1, -1)`` on the boundary (periodic pairs count as neighbours).
    """

    gid: np.ndarray
    num_global: int
    boundary_faces: np.ndarray
    face_neighbors: np.ndarray

    def boundary_nodes(self) -> np.ndarray:
        """``(E, n, n, n)`` bool: the node lies on a boundary face (of any element)."""
        N = self.gid.shape[-1] - 1
        flag = np.zeros(self.num_global, dtype=bool)
        for e, f in self.boundary_faces:
            flag[self.gid[e][face_slice(int(f), N)[1:]]] = True
        return flag[self.gid]


def _merge(ids: np.ndarray, pairs_a: np.ndarray, pairs_b: np.ndarray, size: int) -> np.ndarray:
    """Union of id classes: returns a label per id, equal within merged classes."""
    label = np.arange(size)
    while True:
        la, lb = label[pairs_a], label[pairs_b]
        m = np.minimum(la, lb)
        new = label.copy()
        np.minimum.at(new, pairs_a, m)
        np.minimum.at(new, pairs_b, m)
        new = new[new]  # pointer jumping
        if np.array_equal(new, label):
            return label
        label = new


def number_nodes(mesh: Mesh) -> Numbering:
    """Number the GLL nodes of ``mesh`` from its topology (see module docstring)."""
    cells = np.asarray(mesh.cells, dtype=np.int64)
    E = cells.shape[0]
    N = mesh.order
    n = N + 1
    m = N - 1  # interior points per edge
    if cells.ndim != 2 or cells.shape[1] != 8:
        raise ValueError(f"mesh.cells must have shape (E, 8), got {cells.shape}")
    if np.any(np.sort(cells, axis=1)[:, 1:] == np.sort(cells, axis=1)[:, :-1]):
        bad = int(np.nonzero(np.any(np.diff(np.sort(cells, axis=1), axis=1) == 0, axis=1))[0][0])
        raise ValueError(f"element {bad} repeats a vertex: {cells[bad].tolist()}")

    key = np.full((E, n, n, n), -1, dtype=np.int64)
    V = int(cells.max()) + 1
    offset = V
    for c in range(8):
        key[(slice(None),) + _corner_kji(c, N)] = cells[:, c]

    # Faces: identity from the sorted vertex quadruple.
    fc = cells[:, FACE_CORNERS]  # (E, 6, 4) vertex ids in face-local corner order
    fsorted = np.sort(fc, axis=2).reshape(-1, 4)
    _, face_index, face_count = np.unique(fsorted, axis=0, return_inverse=True, return_counts=True)
    face_index = face_index.reshape(E, 6)
    num_faces = int(face_index.max()) + 1

    if m > 0:
        # Edges: identity from the sorted vertex pair; position counted from the smaller id.
        ga, gb = cells[:, EDGES[:, 0]], cells[:, EDGES[:, 1]]  # (E, 12)
        pair = np.stack([np.minimum(ga, gb), np.maximum(ga, gb)], axis=-1).reshape(-1, 2)
        _, edge_index = np.unique(pair, axis=0, return_inverse=True)
        edge_index = edge_index.reshape(E, 12)
        t = np.arange(1, N)
        for q, (ca, cb, axis) in enumerate(EDGES):
            tt = np.where((ga[:, q] < gb[:, q])[:, None], t[None, :], N - t[None, :])  # (E, m)
            k0, j0, i0 = _corner_kji(ca, N)
            idx = [slice(None), k0, j0, i0]
            idx[3 - axis] = slice(1, N)
            key[tuple(idx)] = offset + edge_index[:, q, None] * m + (tt - 1)
        edge_block = offset + (int(edge_index.max()) + 1) * m

        # Face interiors in the canonical frame of each face.
        uu, vv = np.meshgrid(np.arange(1, N), np.arange(1, N), indexing="xy")  # [v, u]
        for f in range(6):
            g = fc[:, f, :]  # (E, 4): (0,0), (1,0), (0,1), (1,1)
            cmin = np.argmin(g, axis=1)
            u0, v0 = cmin & 1, cmin >> 1
            g_along_u = g[np.arange(E), (1 - u0) + 2 * v0]
            g_along_v = g[np.arange(E), u0 + 2 * (1 - v0)]
            swap = g_along_v < g_along_u
            up = np.where(u0[:, None, None] == 0, uu, N - uu)
            vp = np.where(v0[:, None, None] == 0, vv, N - vv)
            cu = np.where(swap[:, None, None], vp, up)
            cv = np.where(swap[:, None, None], up, vp)
            sl = face_slice(f, N)
            inner = list(sl)
            for a in range(1, 4):
                if inner[a] == slice(None):
                    inner[a] = slice(1, N)
            key[(slice(None),) + tuple(inner[1:])] = (
                edge_block + face_index[:, f, None, None] * m * m + (cv - 1) * m + (cu - 1)
            )
        offset = edge_block + num_faces * m * m
        key[:, 1:N, 1:N, 1:N] = offset + np.arange(E * m**3).reshape(E, m, m, m)

    assert key.min() >= 0
    # Compact the keys to 0..num-1 in ascending key order (np.unique's inverse), in linear
    # time: the keys are bounded by the node count, a sort of E·n³ of them is not needed.
    used = np.zeros(int(key.max()) + 1, bool)
    used[key.ravel()] = True
    rank = np.cumsum(used, dtype=np.int64) - 1
    num = int(rank[-1]) + 1
    gid = rank[key]

    # Face neighbours from shared face identity.
    neighbors = np.full((E, 6, 2), -1, dtype=np.int64)
    flat = face_index.ravel()
    order = np.argsort(flat, kind="stable")
    sf = flat[order]
    same = np.nonzero(sf[1:] == sf[:-1])[0]
    if np.any(face_count > 2):
        f = int(np.nonzero(face_count > 2)[0][0])
        raise ValueError(f"mesh is not conforming: a face is shared by {face_count[f]} elements")
    a, b = order[same], order[same + 1]
    neighbors[a // 6, a % 6] = np.stack([b // 6, b % 6], 1)
    neighbors[b // 6, b % 6] = np.stack([a // 6, a % 6], 1)

    pf = np.asarray(mesh.periodic_faces, dtype=np.int64).reshape(-1, 4)
    if len(pf):
        ea, fa, eb, fb = pf.T
        shared = (neighbors[ea, fa, 0] >= 0) | (neighbors[eb, fb, 0] >= 0)
        if shared.any():
            p = int(np.argmax(shared))
            e, f = (ea[p], fa[p]) if neighbors[ea[p], fa[p], 0] >= 0 else (eb[p], fb[p])
            raise ValueError(f"periodic_faces[{p}] = {pf[p].tolist()} pairs face {f} of element {e}, which element "
                             f"{neighbors[e, f, 0]} already shares (its face {neighbors[e, f, 1]}); only boundary "
                             f"faces may be paired")
        neighbors[ea, fa] = np.stack([eb, fb], 1)
        neighbors[eb, fb] = np.stack([ea, fa], 1)
        ids_a = np.stack([gid[e][face_slice(int(f), N)[1:]] for e, f in zip(ea, fa)]).ravel()
        ids_b = np.stack([gid[e][face_slice(int(f), N)[1:]] for e, f in zip(eb, fb)]).ravel()
        label = _merge(gid, ids_a, ids_b, num)
        _, gid_flat = np.unique(label[gid.ravel()], return_inverse=True)
        gid = gid_flat.reshape(E, n, n, n)
        num = int(gid.max()) + 1

    # Renumber in order of first appearance (locality for the gather–scatter).
    flat = gid.ravel()
    _, first = np.unique(flat, return_index=True)
    rank = np.empty(num, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(num)
    gid = rank[gid]

    boundary = np.argwhere(neighbors[:, :, 0] < 0).astype(np.int64)
    return Numbering(gid, num, boundary, neighbors)
