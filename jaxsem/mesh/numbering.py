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
element. No coordinates are compared anywhere. The ids are then numbered in order of
first appearance in ``gid`` (locality for the gather–scatter).

A mesh with :func:`jaxsem.mesh.box_mesh`'s topology gets the same ids by formula, in time
linear in the nodes (no sort): see :func:`_number_box`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .box import Mesh, _box_cells, _box_periodic_faces

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
        flag = np.zeros(self.num_global, dtype=bool)
        flag[face_ids(self.gid, self.boundary_faces[:, 0], self.boundary_faces[:, 1])] = True
        return flag[self.gid]


def face_ids(gid: np.ndarray, e: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``gid`` values on face ``f[p]`` of element ``e[p]``: ``(P, n, n)`` in face-local ``[v, u]`` order.

    ``gid: (E, n, n, n)``; one gather per local face (no loop over the P faces).
    """
    N = gid.shape[-1] - 1
    out = np.empty((len(e), N + 1, N + 1), gid.dtype)
    for face in range(6):
        sel = f == face
        if sel.any():
            out[sel] = gid[face_slice(face, N)][e[sel]]  # a view of every element's face f, then the P picked
    return out


def _merge(pairs_a: np.ndarray, pairs_b: np.ndarray, size: int) -> np.ndarray:
    """Union of id classes: a label per id in ``[0, size)``, equal within merged classes."""
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


def _first_appearance(key: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """Class ids ``0..num-1`` of ``key`` (values in ``[0, size)``) in order of first appearance
    in ``key.ravel()``, and ``num``. Linear: a scatter-min of positions, no sort."""
    flat = key.reshape(-1)
    first = np.full(size, flat.size, np.int64)
    np.minimum.at(first, flat, np.arange(flat.size))
    is_first = np.zeros(flat.size, bool)
    is_first[first[first < flat.size]] = True
    rank = np.cumsum(is_first) - 1
    return rank[first[flat]].reshape(key.shape), int(rank[-1]) + 1


def _unique_rows(rows: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True, return_counts=True)[1:]`` for ``rows: (R, k)``
    of ints in ``[0, bound)``, by 1-D sorts of packed int64 keys (lexicographic order kept)."""
    key = rows[:, 0].astype(np.int64)
    top = bound
    for c in range(1, rows.shape[1]):
        if top * bound >= 2**62:  # repack: the rank of the prefix among the distinct prefixes
            _, key = np.unique(key, return_inverse=True)
            top = int(key.max()) + 1
        key = key * bound + rows[:, c]
        top *= bound
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    return inverse.reshape(-1), counts


def _is_box(mesh: Mesh) -> bool:
    """The mesh is :func:`jaxsem.mesh.box_mesh`'s topology: its cells and periodic pairs."""
    ne = mesh.elements
    return (ne is not None and np.array_equal(mesh.cells, _box_cells(ne))
            and np.array_equal(mesh.periodic_faces, _box_periodic_faces(ne, mesh.periodic)))


def number_nodes(mesh: Mesh) -> Numbering:
    """Number the GLL nodes of ``mesh`` from its topology (see module docstring).

    A box mesh (:func:`jaxsem.mesh.box_mesh`'s cells and periodic pairs) is numbered by
    formula, in time linear in the nodes; any other mesh by vertex keys. Both give the same
    ids: nodes are numbered in order of first appearance in ``gid``.
    """
    return _number_box(mesh) if _is_box(mesh) else _number_general(mesh)


def _number_box(mesh: Mesh) -> Numbering:
    """:func:`number_nodes` of a box mesh by formula.

    Along axis d a node sits at layer e_d, local index i_d; its copy that appears first in
    the E-vector is, per axis, the one in the lowest layer (then the lowest local index),
    because elements run x fastest and every copy combines one choice per axis. So the
    first positions and the first-copy flags are sums and products of (E_d, n) tables, and
    the ids are the running count of the flags.
    """
    ne, per, N = mesh.elements, mesh.periodic, mesh.order
    n = N + 1
    E = int(np.prod(ne))
    flag, pos = [], []
    for d in range(3):
        e = np.arange(ne[d])[:, None]
        i = np.arange(n)[None, :]
        seam = (i == 0) & (e > 0)  # also local N of layer e − 1
        fe, fi = np.where(seam, e - 1, e), np.where(seam, N, i)
        if per[d]:
            wrap = (i == N) & (e == ne[d] - 1)  # also local 0 of layer 0
            fe, fi = np.where(wrap, 0, fe), np.where(wrap, 0, fi)
        flag.append((fe == e) & (fi == i))
        pos.append(fe * (int(np.prod(ne[:d])) * n**3) + fi * n**d)
    # (E_d, n) tables broadcast into [ez, ey, ex, k, j, i]
    at = lambda t, d: t[tuple(slice(None) if a in (2 - d, 5 - d) else None for a in range(6))]
    rank = (at(flag[0], 0) & at(flag[1], 1) & at(flag[2], 2)).reshape(-1).astype(np.int64)
    np.cumsum(rank, out=rank)  # in place, on int64: a bool cumsum casts element by element
    rank -= 1
    first = np.empty((ne[2], ne[1], ne[0], n, n, n), np.int64)
    np.add(at(pos[0], 0), at(pos[1], 1), out=first)
    first += at(pos[2], 2)
    gid = rank[first.reshape(-1)].reshape(E, n, n, n)
    num = int(rank[-1]) + 1
    del rank, first

    eid = np.arange(E).reshape(ne[2], ne[1], ne[0])
    neighbors = np.full((ne[2], ne[1], ne[0], 6, 2), -1, dtype=np.int64)
    for d in range(3):
        ax = 2 - d
        layer = np.arange(ne[d]).reshape([-1 if a == ax else 1 for a in range(3)])
        for f, step, inside in ((2 * d, 1, layer > 0), (2 * d + 1, -1, layer < ne[d] - 1)):
            has = inside | per[d]
            neighbors[..., f, 0] = np.where(has, np.roll(eid, step, axis=ax), -1)
            neighbors[..., f, 1] = np.where(has, f ^ 1, -1)
    neighbors = neighbors.reshape(E, 6, 2)
    boundary = np.argwhere(neighbors[:, :, 0] < 0).astype(np.int64)
    return Numbering(gid, num, boundary, neighbors)


def _number_general(mesh: Mesh) -> Numbering:
    """:func:`number_nodes` of any conforming mesh, from vertex keys."""
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
    face_index, face_count = _unique_rows(np.sort(fc, axis=2).reshape(-1, 4), V)
    face_index = face_index.reshape(E, 6)
    num_faces = int(face_index.max()) + 1

    if m > 0:
        # Edges: identity from the sorted vertex pair; position counted from the smaller id.
        ga, gb = cells[:, EDGES[:, 0]], cells[:, EDGES[:, 1]]  # (E, 12)
        _, edge_index = np.unique(np.minimum(ga, gb) * V + np.maximum(ga, gb), return_inverse=True)
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
        offset += E * m**3

    assert key.min() >= 0

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
        label = _merge(face_ids(key, ea, fa).ravel(), face_ids(key, eb, fb).ravel(), offset)
        key = label[key]

    # Number in order of first appearance (locality for the gather–scatter).
    gid, num = _first_appearance(key, offset)
    boundary = np.argwhere(neighbors[:, :, 0] < 0).astype(np.int64)
    return Numbering(gid, num, boundary, neighbors)
