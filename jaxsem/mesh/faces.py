"""Face connectivity of a hexahedral mesh: every element face point numbered so that the two
coinciding points of a shared (or periodic) face share an id (the DG face exchange's plan).

The orientation of the neighbour's face is found from the element-to-vertex table (8
possible relative orientations); periodic pairs are translations (node (u, v) ↔ node (u, v),
:class:`jaxsem.mesh.Mesh`). Host-side NumPy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .box import Mesh
from .numbering import FACE_CORNERS, Numbering, number_nodes

__all__ = ["FaceConnectivity", "face_connectivity"]

# The 8 maps of the face-local index square onto itself, (u, v) -> (u', v'):
# (swap, flip_u, flip_v) applied as: swap axes, then flip.
_ORIENTATIONS = [(s, fu, fv) for s in (0, 1) for fu in (0, 1) for fv in (0, 1)]


def _orient(u, v, N, o):
    s, fu, fv = o
    if s:
        u, v = v, u
    if fu:
        u = N - u
    if fv:
        v = N - v
    return u, v


@dataclasses.dataclass(frozen=True, eq=False)
class FaceConnectivity:
    """Face-to-face connectivity of a DG mesh (host-side, NumPy).

    Attributes (E elements, n = N + 1 points per direction):
      neighbors: ``(E, 6, 2)`` ``(element, face)`` across each face, ``-1`` on the
        boundary (periodic pairs are neighbours).
      partner: ``(E, 6, n, n)`` flat index into ``(E, 6, n, n)`` face points of
        the coinciding point of the neighbour face, ``-1`` on the boundary.
      fid: ``(E, 6, n, n)`` face-point ids in ``[0, num_ids)``: a point and its
        partner share one id, every other id is private. Ids depend only on
        global element and face numbers, so a distributed plan can key on them.
      boundary: ``(E, 6)`` bool, the face is on the domain boundary.
      periodic: ``(E, 6)`` bool, the face is one side of a periodic pair.
      num_ids: number of distinct face-point ids.
    """

    neighbors: np.ndarray
    partner: np.ndarray
    fid: np.ndarray
    boundary: np.ndarray
    periodic: np.ndarray
    num_ids: int


def face_connectivity(mesh: Mesh, numbering: Numbering | None = None) -> FaceConnectivity:
    """Pair the face points of neighbouring elements (see module docstring).

    Interior faces are oriented by matching their corner vertex ids
    (``mesh.cells``); periodic pairs by the translation convention of
    ``mesh.periodic_faces``. Raises ``ValueError`` if a shared face's corners
    do not match under any of the 8 orientations.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    numbering = number_nodes(mesh) if numbering is None else numbering
    nb = np.asarray(numbering.face_neighbors, dtype=np.int64)
    E, N = mesh.num_elements, mesh.order
    n = N + 1
    cells = np.asarray(mesh.cells, dtype=np.int64)

    periodic = np.zeros((E, 6), dtype=bool)
    pf = np.asarray(mesh.periodic_faces, dtype=np.int64).reshape(-1, 4)
    periodic[pf[:, 0], pf[:, 1]] = True
    periodic[pf[:, 2], pf[:, 3]] = True

    # For each of the 8 orientations: where corner c of my face sits on the neighbour's
    # face, and the neighbour's flat (v, u) index of each of my nodes.
    vv, uu = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")  # [v, u]
    corner_of = np.array([[mu + 2 * mv for mu, mv in (_orient(cu, cv, 1, o) for cu, cv in
                                                       [(0, 0), (1, 0), (0, 1), (1, 1)])] for o in _ORIENTATIONS])
    node_of = np.stack([(lambda u2, v2: v2 * n + u2)(*_orient(uu, vv, N, o)) for o in _ORIENTATIONS])  # (8, n, n)

    has = nb[:, :, 0] >= 0
    e2, f2 = np.where(has, nb[:, :, 0], 0), np.where(has, nb[:, :, 1], 0)
    g = cells[:, FACE_CORNERS]  # (E, 6, 4) vertex ids, face-local corner order
    g2 = g[e2, f2]
    match = np.stack([np.all(g2[:, :, corner_of[o]] == g, axis=-1) for o in range(8)], axis=-1)  # (E, 6, 8)
    match[periodic] = False
    match[periodic, 0] = True  # periodic pairs: (u, v) ↔ (u, v), a translation
    bad = has & ~match.any(axis=-1)
    if bad.any():
        e, f = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"face {f} of element {e} and face {nb[e, f, 1]} of element {nb[e, f, 0]} are neighbours "
            f"but their corner vertices {g[e, f].tolist()} / {g2[e, f].tolist()} do not match"
        )
    o = np.argmax(match, axis=-1)  # (E, 6)
    partner = ((e2 * 6 + f2) * n * n)[:, :, None, None] + node_of[o]
    partner = np.where(has[:, :, None, None], partner, -1).astype(np.int64)

    # Ids: one per pair of partner points, keyed by the smaller flat index.
    flat = np.arange(E * 6 * n * n).reshape(E, 6, n, n)
    key = np.where(partner >= 0, np.minimum(flat, partner), flat)
    if np.any(partner >= 0):
        p = partner.ravel()
        has = p >= 0
        if not np.array_equal(p[p[has]], np.nonzero(has)[0]):
            raise ValueError("face connectivity is not symmetric (a face point's partner points elsewhere)")
    _, fid = np.unique(key.ravel(), return_inverse=True)
    fid = fid.reshape(E, 6, n, n)
    boundary = nb[:, :, 0] < 0
    return FaceConnectivity(nb, partner, fid, boundary, periodic, int(fid.max()) + 1)


# ----------------------------------------------------------------------------- face <-> volume
