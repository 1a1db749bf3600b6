"""Gmsh import: read a hexahedral ``.msh`` file (v2 or v4) into a :class:`Mesh`.

The file is parsed by ``meshio``, whose hexahedron node orders are VTK's (meshio
converts Gmsh's own order on reading). Those are converted here to the
lexicographic conventions of :mod:`jaxsem.mesh`:

* hex8 (VTK_HEXAHEDRON): corners 0–3 counter-clockwise on t = -1, 4–7 above them;
* hex27 (VTK_TRIQUADRATIC_HEXAHEDRON): 8 corners, 12 edge midpoints, 6 face
  centres (r = -1, r = +1, s = -1, s = +1, t = -1, t = +1), then the centre.

Only the corner nodes define the topology (``Mesh.cells``); hex27 mid-nodes only
shape the geometry, which is interpolated isoparametrically to the GLL nodes.
"""

from __future__ import annotations

import os

import numpy as np

from ..core import basis
from .box import Mesh, element_nodes

__all__ = ["read_gmsh", "SUPPORTED_CELLS"]

SUPPORTED_CELLS = ("hexahedron", "hexahedron27")

# Reference coordinates (r, s, t) of meshio's (VTK's) hexahedron27 nodes; the
# first 8 are also the hexahedron (hex8) corners.
_VTK_HEX27_REF = np.array(
    [
        # corners
        [-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1],
        [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1],
        # edge midpoints: (0,1) (1,2) (2,3) (3,0), (4,5) (5,6) (6,7) (7,4), (0,4) (1,5) (2,6) (3,7)
        [0, -1, -1], [1, 0, -1], [0, 1, -1], [-1, 0, -1],
        [0, -1, 1], [1, 0, 1], [0, 1, 1], [-1, 0, 1],
        [-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0],
        # face centres: r = -1, r = +1, s = -1, s = +1, t = -1, t = +1
        [-1, 0, 0], [1, 0, 0], [0, -1, 0], [0, 1, 0], [0, 0, -1], [0, 0, 1],
        # centre
        [0, 0, 0],
    ]
)


def _lex_from_vtk(ref: np.ndarray, m: int) -> np.ndarray:
    """``perm`` with ``lex_nodes = vtk_nodes[:, perm]`` on the m×m×m grid (i fastest)."""
    ijk = (ref + 1) * (m - 1) // 2  # (M, 3) grid indices (i, j, k)
    lex = ijk[:, 0] + m * ijk[:, 1] + m * m * ijk[:, 2]
    perm = np.empty(m**3, dtype=np.int64)
    perm[lex] = np.arange(m**3)
    return perm


# VTK → lexicographic: hex8 [0, 1, 3, 2, 4, 5, 7, 6]; hex27 on the 3×3×3 grid.
HEX8_VTK_TO_LEX = _lex_from_vtk(_VTK_HEX27_REF[:8], 2)
HEX27_VTK_TO_LEX = _lex_from_vtk(_VTK_HEX27_REF, 3)

# meshio cell types of dimension < 3 (boundary / physical-group entities): ignored.
_LOWER_DIM_PREFIXES = ("vertex", "line", "triangle", "quad", "polygon")


def read_gmsh(path: str | os.PathLike, order: int) -> Mesh:
    """Read a Gmsh hexahedral mesh (``.msh`` v2 or v4, ASCII or binary) as a :class:`Mesh`.

    Args:
      path: the ``.msh`` file.
      order: polynomial order N of the GLL nodes to build, 1 ≤ N ≤ 20.

    The volume cells must all be ``hexahedron`` (hex8, trilinear elements) or all
    ``hexahedron27`` (triquadratic elements); lower-dimensional cells (quads,
    triangles, lines, vertices of physical groups) are ignored. ``Mesh.cells``
    holds the file's corner node ids renumbered compactly (0, 1, … in
    increasing file id; mid-nodes and unused nodes dropped), ``Mesh.vertices`` their coordinates, and ``Mesh.x`` the
    isoparametric GLL node coordinates, ``(3, E, n, n, n)``. Element orientation
    is kept as in the file: a left-handed (mirrored) element is reported by
    :func:`jaxsem.geometry.geometric_factors`.

    Periodic Gmsh meshes are not supported: ``$Periodic`` sections are ignored
    and ``periodic_faces`` is empty, so a periodic box must come from
    :func:`jaxsem.mesh.box_mesh`.

    Raises ``ValueError`` for any other 3-D cell type (tetra, wedge, pyramid,
    hexahedron20, …), for a file without hexahedra, and for hex8 and hex27 mixed.
    """
    order = basis._check_order(order)
    import meshio  # optional dependency, only needed here

    msh = meshio.read(os.fspath(path))
    blocks: dict[str, list[np.ndarray]] = {}
    for block in msh.cells:
        blocks.setdefault(block.type, []).append(np.asarray(block.data, dtype=np.int64))
    volume_types = sorted(t for t in blocks if not t.startswith(_LOWER_DIM_PREFIXES))
    hex_types = [t for t in volume_types if t in SUPPORTED_CELLS]
    other = [t for t in volume_types if t not in SUPPORTED_CELLS]
    found = sorted(blocks) if blocks else ["no cells"]
    if other:
        raise ValueError(
            f"{os.fspath(path)}: unsupported cell type(s) {other} (cell types found: {found}); "
            f"read_gmsh supports only hexahedral meshes of {list(SUPPORTED_CELLS)} (hex8 or hex27)"
        )
    if not hex_types:
        raise ValueError(
            f"{os.fspath(path)}: no hexahedra found (cell types found: {found}); "
            f"read_gmsh supports only hexahedral meshes of {list(SUPPORTED_CELLS)}"
        )
    if len(hex_types) > 1:
        raise ValueError(
            f"{os.fspath(path)}: mixed hexahedron and hexahedron27 cells are not supported; "
            "use one geometric order for all elements"
        )
    kind = hex_types[0]
    conn = np.concatenate(blocks[kind], axis=0)
    m, perm = (2, HEX8_VTK_TO_LEX) if kind == "hexahedron" else (3, HEX27_VTK_TO_LEX)
    conn = conn[:, perm]  # lexicographic on the m×m×m grid, [e, k*m*m + j*m + i]

    points = np.asarray(msh.points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"{os.fspath(path)}: expected 3-D points, got shape {points.shape}")
    s = m - 1  # grid index of the +1 end
    corner_cols = [a * s + m * b * s + m * m * c3 * s for c3 in (0, 1) for b in (0, 1) for a in (0, 1)]
    corners = conn[:, corner_cols]  # (E, 8) file node ids, lexicographic corners
    used, cells = np.unique(corners, return_inverse=True)
    cells = cells.reshape(corners.shape).astype(np.int64)
    vertices = points[used]

    E = conn.shape[0]
    geom = points[conn].reshape(E, m, m, m, 3)
    x = element_nodes(geom, order)
    return Mesh(order, cells, vertices, x, np.zeros((0, 4), dtype=np.int64))
