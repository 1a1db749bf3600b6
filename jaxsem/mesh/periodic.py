"""Periodic meshes from boundary groups: pair the faces of one group with their translates in another."""

from __future__ import annotations

import dataclasses

import numpy as np

from .box import PERIODIC_TOL, Mesh, _box_periodic_faces
from .numbering import FACE_CORNERS

__all__ = ["make_periodic"]


def make_periodic(mesh: Mesh, a: str, b: str, shift=None) -> Mesh:
    """``mesh`` with the faces of boundary group ``a`` identified with those of group ``b``.

    Each face of ``a`` is paired with the face of ``b`` whose corners are its corners moved
    by one translation ``shift`` (m, ``(3,)``; default: the mean of ``b``'s face centres less
    that of ``a``'s), the pairs appended to ``Mesh.periodic_faces`` as rows
    ``(e_a, f_a, e_b, f_b)`` and the groups ``a`` and ``b`` removed from ``Mesh.boundaries``.
    Faces match within :data:`jaxsem.mesh.box.PERIODIC_TOL` times the diagonal of the two
    groups' corners.

    ``Mesh.periodic_faces`` identifies node (u, v) of one face with node (u, v) of the other in
    face-local order (:func:`jaxsem.mesh.numbering.face_slice`), so the two faces of a pair must
    have the same orientation: corner (u, v) of the ``a`` face moved by ``shift`` is corner
    (u, v) of the ``b`` face. Extruded meshes have it (the DFG meshes of
    :mod:`jaxsem.mesh.cylinder`, any ``box_mesh``); a pair whose corners match in another order
    (a rotated or mirrored element) is refused.

    A :func:`jaxsem.mesh.box_mesh` made periodic along one of its axes is the box mesh with
    that axis periodic (flag set, the box's pair order, numbered by formula); any other result
    keeps no element counts (``elements=None``).

    Raises ``ValueError`` naming the argument for: a name that is not one of the mesh's groups,
    ``a == b``, a bad ``shift``; and naming both groups for groups of different sizes or empty,
    a face of ``a`` that has no translate in ``b`` (or two faces with one), and a pair whose
    corners are matched in another face-local order.
    """
    for arg, name in (("a", a), ("b", b)):
        if not isinstance(name, str) or name not in mesh.boundaries:
            raise ValueError(f"{arg} must name one of the mesh's boundary groups {sorted(mesh.boundaries)}, "
                             f"got {name!r}")
    if a == b:
        raise ValueError(f"a and b must be two different boundary groups, got {a!r} twice")
    fa, fb = mesh.boundary(a), mesh.boundary(b)
    what = f"groups {a!r} ({len(fa)} faces) and {b!r} ({len(fb)} faces)"
    if len(fa) != len(fb) or not len(fa):
        raise ValueError(f"make_periodic: {what} cannot be paired one to one"
                         + ("" if len(fa) else ": they are empty"))
    ca = mesh.vertices[mesh.cells[fa[:, 0, None], FACE_CORNERS[fa[:, 1]]]]  # (F, 4, 3) in face-local order
    cb = mesh.vertices[mesh.cells[fb[:, 0, None], FACE_CORNERS[fb[:, 1]]]]
    if shift is None:
        t = cb.mean(axis=(0, 1)) - ca.mean(axis=(0, 1))
    else:
        t = np.asarray(shift, dtype=np.float64)
        if t.shape != (3,) or not np.isfinite(t).all():
            raise ValueError(f"shift must be 3 finite numbers (m) or None, got {shift!r}")
    both = np.concatenate([ca, cb]).reshape(-1, 3)
    tol = PERIODIC_TOL * float(np.linalg.norm(both.max(axis=0) - both.min(axis=0)))

    from scipy.spatial import cKDTree

    dist, match = cKDTree(cb.mean(axis=1)).query(ca.mean(axis=1) + t, p=np.inf)
    far = np.nonzero(dist > tol)[0]
    if far.size:
        p = int(far[0])
        raise ValueError(f"make_periodic: {what} do not match by the translation {_fmt(t)}: face {fa[p, 1]} of "
                         f"element {fa[p, 0]} (in {a!r}) has no translate in {b!r} (nearest {dist[p]:.3g} off, "
                         f"allowed {tol:.3g}); {far.size} such faces")
    taken, counts = np.unique(match, return_counts=True)
    if (counts > 1).any():
        q = int(taken[counts > 1][0])
        raise ValueError(f"make_periodic: {what} do not match one to one: face {fb[q, 1]} of element {fb[q, 0]} "
                         f"(in {b!r}) is the translate of {int(counts[counts > 1][0])} faces of {a!r}")
    off = np.abs(ca + t - cb[match]).max(axis=(1, 2))  # (F,) corner (u, v) against corner (u, v)
    bad = np.nonzero(off > tol)[0]
    if bad.size:
        p = int(bad[0])
        q = int(match[p])
        moved = np.abs(ca[p][:, None] + t - cb[q][None]).max(axis=2) <= tol  # (4, 4) corner of a at corner of b
        why = ("have other face-local orientations (corner (u, v) of one is not corner (u, v) of the other, "
               "which Mesh.periodic_faces requires)" if moved.any(axis=1).all()
               else "have the same centre but other corners")
        raise ValueError(f"make_periodic: {what}: face {fa[p, 1]} of element {fa[p, 0]} and its translate by "
                         f"{_fmt(t)}, face {fb[q, 1]} of element {fb[q, 0]}, {why}; {bad.size} such pairs")

    rows = np.concatenate([fa, fb[match]], axis=1).astype(np.int64)
    periodic_faces = np.concatenate([mesh.periodic_faces, rows])
    boundaries = {k: v for k, v in mesh.boundaries.items() if k not in (a, b)}
    box = _as_box(mesh, rows)
    if box is not None:
        return dataclasses.replace(mesh, periodic_faces=_box_periodic_faces(mesh.elements, box), periodic=box,
                                   boundaries=boundaries)
    return dataclasses.replace(mesh, periodic_faces=periodic_faces, elements=None, boundaries=boundaries)


def _as_box(mesh: Mesh, rows: np.ndarray) -> tuple | None:
    """The periodic flags of the box mesh that ``mesh`` with the pairs ``rows`` added is, or None."""
    ne = mesh.elements
    if ne is None or not np.array_equal(mesh.periodic_faces, _box_periodic_faces(ne, mesh.periodic)):
        return None
    key = lambda r: set(map(tuple, np.sort(np.stack([r[:, 0] * 6 + r[:, 1], r[:, 2] * 6 + r[:, 3]], 1), axis=1)))
    new = key(rows)
    for axis in range(3):
        if not mesh.periodic[axis] and key(_box_periodic_faces(ne, tuple(d == axis for d in range(3)))) == new:
            return tuple(p or d == axis for d, p in enumerate(mesh.periodic))
    return None


def _fmt(t) -> list:
    return [float(f"{c:.6g}") for c in t]
