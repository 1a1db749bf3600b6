"""Hexahedral meshes: the box generator, smooth deformations, GLL node coordinates.

A :class:`Mesh` is host-side static data (NumPy): element-to-vertex topology in
lexicographic corner order, the coordinates of every element's GLL nodes, and
the periodic face pairs the numbering must identify. Gmsh import lives in
:mod:`jaxsem.gmsh` and returns the same :class:`Mesh`.

Local conventions (used by numbering and geometry):

* corner ``c = a + 2 b + 4 c3`` for reference corner ``(r, s, t) = (±1, ±1, ±1)``
  with ``a, b, c3 ∈ {0, 1}`` (lexicographic, r fastest);
* local faces ``0: r = -1, 1: r = +1, 2: s = -1, 3: s = +1, 4: t = -1, 5: t = +1``;
* node arrays are ``[e, k, j, i]`` with i along r (fastest), j along s, k along t.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..core import basis
from .grading import axis_points

__all__ = ["Mesh", "box_mesh", "deform_box", "FACE_AXIS", "PERIODIC_TOL", "element_nodes", "BOX_FACES"]

# The names box_mesh gives its six sides (those of non-periodic axes), in local-face order.
BOX_FACES = ("xmin", "xmax", "ymin", "ymax", "zmin", "zmax")

# Local face f lies at r/s/t = (-1 if f even else +1) on axis FACE_AXIS[f].
FACE_AXIS = (0, 0, 1, 1, 2, 2)

# Paired periodic faces may depart from one translation by this times the bounding-box
# diagonal of the paired faces' nodes: far above the round-off of GLL coordinates, far below any element.
PERIODIC_TOL = 1e-9


@dataclasses.dataclass(frozen=True, eq=False)
class Mesh:
    """A conforming hexahedral spectral-element mesh (host-side, NumPy).

    Attributes:
      order: polynomial order N (n = N + 1 GLL points per direction).
      cells: ``(E, 8)`` int64 vertex ids per element, lexicographic corners.
      vertices: ``(V, 3)`` float64 vertex coordinates (topology only; the
        geometry is ``x``).
      x: ``(3, E, n, n, n)`` float64 coordinates of the GLL nodes, ``[c, e, k, j, i]``.
      periodic_faces: ``(P, 4)`` int64 rows ``(e_a, f_a, e_b, f_b)``: face f_a of
        element e_a is identified with face f_b of e_b, node (u, v) of one with
        node (u, v) of the other in face-local order. Checked: the nodes of the two
        faces must be one translation of each other (within :data:`PERIODIC_TOL`), and
        no face may be paired with itself or appear in two pairs.
      elements: element counts per axis for box meshes, else ``None``.
      periodic: periodic flag per axis for box meshes.
      boundaries: named boundary face groups, ``{name: (F, 2) int64 rows (element, local
        face)}`` (box meshes: :data:`BOX_FACES` of the non-periodic axes; Gmsh meshes: the
        physical surface groups). A face may be in one group; whether the faces lie on the
        domain boundary is checked where the mesh is numbered.
    """

    order: int
    cells: np.ndarray
    vertices: np.ndarray
    x: np.ndarray
    periodic_faces: np.ndarray
    elements: tuple | None = None
    lengths: tuple | None = None
    periodic: tuple = (False, False, False)
    deform: float = 0.0
    boundaries: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        order = basis.check_order(self.order)
        cells = _int_array(self.cells, "cells")
        if cells.ndim != 2 or cells.shape[1] != 8 or cells.shape[0] < 1:
            raise ValueError(f"cells must have shape (E, 8) with E >= 1, got {cells.shape}")
        E = cells.shape[0]
        vertices = _real_array(self.vertices, "vertices")
        if vertices.ndim != 2 or vertices.shape[1] != 3:
            raise ValueError(f"vertices must have shape (V, 3), got {vertices.shape}")
        if cells.min() < 0 or cells.max() >= len(vertices):
            raise ValueError(f"cells must hold vertex ids in [0, {len(vertices)}) (V = len(vertices)), "
                             f"got ids from {cells.min()} to {cells.max()}")
        x = _real_array(self.x, "x")
        n = order + 1
        if x.shape != (3, E, n, n, n):
            raise ValueError(f"x must have shape (3, E, n, n, n) = {(3, E, n, n, n)} (E = len(cells), "
                             f"n = order + 1), got {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError(f"x has {int(x.size - np.isfinite(x).sum())} non-finite coordinate(s) (NaN or Inf)")
        pf = _int_array(self.periodic_faces, "periodic_faces")
        if pf.ndim != 2 or pf.shape[1] != 4:
            raise ValueError(f"periodic_faces must have shape (P, 4), got {pf.shape}")
        if pf.size and (pf[:, [0, 2]].min() < 0 or pf[:, [0, 2]].max() >= E
                        or pf[:, [1, 3]].min() < 0 or pf[:, [1, 3]].max() > 5):
            raise ValueError(f"periodic_faces rows must be (element in [0, {E}), face in [0, 6), element, face), "
                             f"got {pf[:3].tolist()}…")
        _check_periodic(x, pf)
        if self.elements is not None and (len(self.elements) != 3 or int(np.prod(self.elements)) != E):
            raise ValueError(f"elements must be 3 counts whose product is E = {E}, got {self.elements!r}")
        for name, value in (("cells", cells), ("vertices", vertices), ("x", x), ("periodic_faces", pf),
                            ("boundaries", _check_boundaries(self.boundaries, E))):
            object.__setattr__(self, name, value)

    @property
    def n(self) -> int:
        return self.order + 1

    @property
    def num_elements(self) -> int:
        return int(self.cells.shape[0])

    def boundary(self, name: str) -> np.ndarray:
        """``(F, 2)`` rows (element, local face) of the boundary group ``name``; a
        ``KeyError`` naming the groups the mesh has for another name."""
        if name not in self.boundaries:
            raise KeyError(f"the mesh has no boundary group {name!r}; its groups: {sorted(self.boundaries)}")
        return self.boundaries[name]

    def __repr__(self):
        shape = f"elements={self.elements}, " if self.elements else f"E={self.num_elements}, "
        return f"Mesh({shape}order={self.order}, periodic={self.periodic}, deform={self.deform})"


def _face_nodes(x: np.ndarray, e: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Coordinates of face ``f[p]`` of element ``e[p]``: ``(3, P, n, n)`` ``[c, p, v, u]``.

    ``x: (3, E, n, n, n)``; the face-local order of :func:`jaxsem.mesh.numbering.face_slice`
    (the remaining node axes in ``[k, j, i]`` order), the order periodic pairs match in.
    """
    n = x.shape[-1]
    out = np.empty((3, len(e), n, n))
    for face in range(6):
        sel = f == face
        if sel.any():
            at = [slice(None)] * 5
            at[4 - FACE_AXIS[face]] = 0 if face % 2 == 0 else n - 1  # x's node axes are [k, j, i]
            out[:, sel] = x[tuple(at)][:, e[sel]]  # a view of the faces, then a copy of those paired
    return out


def _check_periodic(x: np.ndarray, pf: np.ndarray) -> None:
    """``ValueError`` naming the first pair of ``periodic_faces`` that is not a translation,
    pairs a face with itself, or reuses a face of another pair."""
    if not len(pf):
        return
    faces = np.concatenate([pf[:, 0] * 6 + pf[:, 1], pf[:, 2] * 6 + pf[:, 3]])
    uniq, counts = np.unique(faces, return_counts=True)
    if (counts > 1).any():
        face = int(uniq[counts > 1][0])
        rows = sorted({int(i) % len(pf) for i in np.nonzero(faces == face)[0]})
        what = (f"pairs face {face % 6} of element {face // 6} with itself" if len(rows) == 1
                else f"pair face {face % 6} of element {face // 6} more than once (rows {rows})")
        raise ValueError(f"periodic_faces {pf[rows].tolist()} {what}; a face may be in one pair, "
                         f"with another face")
    xa = _face_nodes(x, pf[:, 0], pf[:, 1])
    xb = _face_nodes(x, pf[:, 2], pf[:, 3])
    shift = xb - xa
    off = np.abs(shift - shift[:, :, :1, :1]).max(axis=0)  # (P, n, n): departure from node (0, 0)'s shift
    both = np.concatenate([xa, xb], axis=1).reshape(3, -1)  # spans the periodic directions
    tol = PERIODIC_TOL * float(np.linalg.norm(both.max(axis=1) - both.min(axis=1)))
    err = off.reshape(len(pf), -1).max(axis=1)
    bad = np.nonzero(err > tol)[0]
    if bad.size:
        p = int(bad[0])
        ea, fa, eb, fb = (int(v) for v in pf[p])
        v, u = np.unravel_index(int(np.argmax(off[p])), off[p].shape)
        t = [float(f"{c:.6g}") for c in shift[:, p, 0, 0]]
        raise ValueError(
            f"periodic_faces[{p}] = {pf[p].tolist()}: face {fa} of element {ea} and face {fb} of element {eb} "
            f"are not translates of each other: at face node (u, v) = ({u}, {v}) they are {err[p]:.3g} off "
            f"the translation {t} of node (0, 0) (allowed: PERIODIC_TOL * the faces' diagonal = {tol:.3g}); "
            f"{bad.size} of {len(pf)} pairs mismatch. Paired faces must match node for node in "
            f"face-local order, up to one translation")


def _check_boundaries(groups, E: int) -> dict:
    """The boundary groups as ``{str: (F, 2) int64}``; ``ValueError``/``TypeError`` naming a bad
    group, an element or face out of range, or a face in two groups."""
    if not isinstance(groups, dict):
        raise TypeError(f"boundaries must be a dict {{name: (F, 2) rows (element, face)}}, got {type(groups).__name__}")
    out, owner = {}, {}
    for name, rows in groups.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"boundaries: group names must be non-empty strings, got {name!r}")
        a = _int_array(rows, f"boundaries[{name!r}]").reshape(-1, 2) if np.size(rows) else np.zeros((0, 2), np.int64)
        if a.size and (a[:, 0].min() < 0 or a[:, 0].max() >= E or a[:, 1].min() < 0 or a[:, 1].max() > 5):
            raise ValueError(f"boundaries[{name!r}] rows must be (element in [0, {E}), face in [0, 6)), "
                             f"got rows from {a.min(axis=0).tolist()} to {a.max(axis=0).tolist()}")
        for key in (a[:, 0] * 6 + a[:, 1]).tolist():
            if key in owner:
                raise ValueError(f"boundaries: face {key % 6} of element {key // 6} is in groups "
                                 f"{owner[key]!r} and {name!r}; a face may be in one group")
            owner[key] = name
        out[name] = a
    return out


def _int_array(value, name) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def _real_array(value, name) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name} must be a real array, got dtype {a.dtype}")
    return a.astype(np.float64, copy=False)


def _check_int_triple(value, name, lo=1):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,) * 3
    try:
        vals = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of 3 ints, got {value!r}") from None
    if len(vals) != 3 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in vals):
        raise TypeError(f"{name} must be an int or a sequence of 3 ints, got {value!r}")
    if any(v < lo for v in vals):
        raise ValueError(f"{name} must be >= {lo} on every axis, got {vals}")
    return tuple(int(v) for v in vals)


def element_nodes(corner_xyz: np.ndarray, order: int, node_points=None) -> np.ndarray:
    """Isoparametric GLL node coordinates from element geometry nodes.

    ``corner_xyz: (E, m, m, m, 3)`` coordinates of the element's geometry nodes on
    the equispaced reference points ``linspace(-1, 1, m)`` (m = 2 for hex8, 3 for
    hex27), ``[e, k, j, i, c]``. Returns ``(3, E, n, n, n)``.
    """
    m = corner_xyz.shape[1]
    ref = np.linspace(-1.0, 1.0, m) if node_points is None else node_points
    xg, _ = basis.gll_points(order)
    J = basis.lagrange_matrix(ref, xg)  # (n, m)
    return np.einsum("ck,bj,ai,ekjid->decba", J, J, J, corner_xyz, optimize=True)


def deform_box(x: np.ndarray, amplitude: float, lengths, origin=(0.0, 0.0, 0.0)) -> np.ndarray:
    """Smooth interior deformation of a box that keeps its faces fixed.

    x_c ← x_c + a·L_c·sin(πξ) sin(πη) sin(πζ), with ξ, η, ζ the coordinates
    scaled to [0, 1]. The Jacobian determinant stays ≥ 1 − 1.16·π·|a| > 0 for
    |a| < 0.27, and the map is not trilinear, so elements are genuinely curved.
    Being zero on the boundary, it keeps periodic faces translates of each other.
    """
    x = np.asarray(x, dtype=np.float64)
    s = np.ones_like(x[0])
    for d in range(3):
        s = s * np.sin(np.pi * (x[d] - origin[d]) / lengths[d])
    return np.stack([x[d] + amplitude * lengths[d] * s for d in range(3)])


def box_mesh(
    elements=(2, 2, 2),
    order: int = 4,
    lengths=(1.0, 1.0, 1.0),
    periodic=(False, False, False),
    deform: float = 0.0,
    origin=(0.0, 0.0, 0.0),
    mapping: Callable | None = None,
    grading=None,
) -> Mesh:
    """A tensor-product box mesh of hexahedra, optionally periodic, graded and curved.

    Args:
      elements: element counts ``(Ex, Ey, Ez)`` (or one int for all axes), each ≥ 1.
      order: polynomial order N, 1 ≤ N ≤ 20.
      lengths: box side lengths ``(Lx, Ly, Lz)`` > 0.
      periodic: per-axis periodic flags.
      deform: amplitude a of :func:`deform_box` (0 = affine elements), |a| < 0.27.
      origin: the box's lower corner.
      mapping: optional ``f(x) -> x'`` applied to the ``(3, ...)`` GLL node
        coordinates after the deformation (must keep periodic faces translates).
      grading: the element boundaries per axis, ``(gx, gy, gz)``, each ``None`` (uniform), a
        :class:`jaxsem.mesh.Grading` (geometric or tanh spacing toward faces of that axis), or
        the ``(E_d + 1,)`` boundaries themselves, increasing from ``origin[d]`` to
        ``origin[d] + lengths[d]``; ``None`` for all (the default) is uniform. Elements stay
        affine images of the reference cube; ``deform``, then ``mapping``, act on the graded
        nodes. A periodic axis may be graded (its faces stay translates).

    Returns a :class:`Mesh` whose elements are ordered x fastest, then y, then z.
    """
    ne = _check_int_triple(elements, "elements")
    order = basis.check_order(order)
    try:
        L = tuple(float(v) for v in lengths)
    except TypeError:
        raise TypeError(f"lengths must be a sequence of 3 numbers, got {lengths!r}") from None
    if len(L) != 3 or not all(np.isfinite(v) and v > 0 for v in L):
        raise ValueError(f"lengths must be 3 positive numbers, got {lengths!r}")
    per = tuple(bool(p) for p in (periodic if not isinstance(periodic, bool) else (periodic,) * 3))
    if len(per) != 3:
        raise ValueError(f"periodic must have 3 flags, got {periodic!r}")
    deform = float(deform)
    if not abs(deform) < 0.27:
        raise ValueError(f"deform must satisfy |deform| < 0.27 (keeps the Jacobian positive), got {deform}")
    origin = tuple(float(v) for v in origin)
    if grading is None:
        grading = (None,) * 3
    if isinstance(grading, (str, dict)) or not hasattr(grading, "__len__") or len(grading) != 3:
        raise ValueError(f"grading must be None or one spec per axis (gx, gy, gz), each None, a Grading or "
                         f"the element boundaries, got {grading!r}")
    gx = [axis_points(grading[d], d, ne[d], L[d], origin[d]) for d in range(3)]

    # Vertices: the full (nx+1)(ny+1)(nz+1) grid; periodicity is a numbering concern.
    vz, vy, vx = np.meshgrid(gx[2], gx[1], gx[0], indexing="ij")
    vertices = np.stack([vx.ravel(), vy.ravel(), vz.ravel()], axis=1)
    cells = _box_cells(ne)
    E = cells.shape[0]

    # GLL nodes of the affine box, one axis at a time: x_d depends on (e_d, i_d) alone, so
    # the (3, E, n, n, n) array is three broadcasts of (E_d, n) tables (no E·n³ einsum).
    xg, _ = basis.gll_points(order)
    n = order + 1
    lin = basis.lagrange_matrix(np.array([-1.0, 1.0]), xg)  # (n, 2): hex8 → GLL
    table = [lin[None, :, 0] * g[:-1, None] + lin[None, :, 1] * g[1:, None] for g in gx]  # (E_d, n)
    at = lambda t, d: t[tuple(slice(None) if a in (2 - d, 5 - d) else None for a in range(6))]  # → [ez, ey, ex, k, j, i]
    x = np.empty((3, ne[2], ne[1], ne[0], n, n, n))
    if deform:
        # deform_box's x + a·L·sin(πξ) sin(πη) sin(πζ), from the same separable tables
        s = [at(np.sin(np.pi * (t - o) / length), d) for d, (t, o, length) in enumerate(zip(table, origin, L))]
        bump = s[0] * s[1] * s[2]
        for d in range(3):
            np.multiply(bump, deform * L[d], out=x[d])
            x[d] += at(table[d], d)  # x_d + (a·L_d)·bump, in deform_box's order of operations
        del bump
    else:
        for d in range(3):
            x[d] = at(table[d], d)
    x = x.reshape(3, E, n, n, n)
    if mapping is not None:
        x = np.asarray(mapping(x), dtype=np.float64)
        if x.shape != (3, E, n, n, n):
            raise ValueError(f"mapping must return an array of shape (3, E, n, n, n), got {x.shape}")
    return Mesh(order, cells, vertices, x, _box_periodic_faces(ne, per), ne, L, per, deform,
                _box_boundaries(ne, per))


def _box_boundaries(ne, per) -> dict:
    """:data:`BOX_FACES` groups of the non-periodic axes: the elements of the first (last)
    layer along the axis, their local face 2·axis (2·axis + 1)."""
    eid = np.arange(int(np.prod(ne))).reshape(ne[2], ne[1], ne[0])
    out = {}
    for axis in range(3):
        if per[axis]:
            continue
        for side, layer in ((0, 0), (1, ne[axis] - 1)):
            e = np.take(eid, layer, axis=2 - axis).ravel()
            out[BOX_FACES[2 * axis + side]] = np.stack([e, np.full_like(e, 2 * axis + side)], 1).astype(np.int64)
    return out


def _box_cells(ne) -> np.ndarray:
    """``(E, 8)`` vertex ids of :func:`box_mesh`'s elements (x fastest), lexicographic corners,
    on the ``(nx+1)(ny+1)(nz+1)`` vertex grid (x fastest)."""
    nx, ny, nz = ne
    vid = np.arange((nx + 1) * (ny + 1) * (nz + 1)).reshape(nz + 1, ny + 1, nx + 1)
    return np.stack([vid[c3:c3 + nz, b:b + ny, a:a + nx].ravel()
                     for c3 in (0, 1) for b in (0, 1) for a in (0, 1)], axis=1).astype(np.int64)


def _box_periodic_faces(ne, per) -> np.ndarray:
    """``(P, 4)`` periodic face pairs of :func:`box_mesh`: per periodic axis, face 2·axis+1 of
    the last layer with face 2·axis of the first."""
    eid = np.arange(int(np.prod(ne))).reshape(ne[2], ne[1], ne[0])
    pairs = []
    for axis, (count, is_per) in enumerate(zip(ne, per)):
        if not is_per:
            continue
        lo = np.take(eid, 0, axis=2 - axis).ravel()
        hi = np.take(eid, count - 1, axis=2 - axis).ravel()
        pairs.append(np.stack([hi, np.full_like(hi, 2 * axis + 1), lo, np.full_like(lo, 2 * axis)], 1))
    return np.concatenate(pairs).astype(np.int64) if pairs else np.zeros((0, 4), np.int64)
