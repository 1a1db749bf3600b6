"""Gmsh import: read a hexahedral ``.msh`` file (v2 or v4) into a :class:`Mesh`.

The file is parsed by ``meshio``, whose hexahedron node orders are VTK's (meshio
converts Gmsh's own order on reading). Those are converted here to the
lexicographic conventions of :mod:`jaxsem.mesh`:

* hex8 (VTK_HEXAHEDRON): corners 0–3 counter-clockwise on t = -1, 4–7 above them;
* hex27 (VTK_TRIQUADRATIC_HEXAHEDRON): 8 corners, 12 edge midpoints, 6 face
  centres (r = -1, r = +1, s = -1, s = +1, t = -1, t = +1), then the centre.

Only the corner nodes define the topology (``Mesh.cells``); hex27 mid-nodes only
shape the geometry, which is interpolated isoparametrically to the GLL nodes.

A file that cannot be a valid mesh is refused with a ``ValueError`` naming it and
saying what is wrong (meshio's own failures, including the ``sys.exit`` it calls on
unreadable files, are caught). Corner nodes that coincide are merged, so that a
file with duplicated nodes does not become a mesh split by an internal wall.

Physical surface groups become the mesh's named boundary groups (``Mesh.boundaries``),
each quad matched to the hexahedron face with its four corners.
"""

from __future__ import annotations

import mmap
import os
import struct
import warnings

import numpy as np

from ..core import basis
from .box import Mesh, element_nodes

__all__ = ["read_gmsh", "SUPPORTED_CELLS", "MERGE_TOL"]

SUPPORTED_CELLS = ("hexahedron", "hexahedron27")

# Corner nodes closer than this times the mesh's bounding-box diagonal are one node:
# far above the round-off of coordinates printed with 16 digits, far below any element.
MERGE_TOL = 1e-10

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


def read_gmsh(path: str | os.PathLike, order: int, *, merge_tol: float | None = MERGE_TOL) -> Mesh:
    """Read a Gmsh hexahedral mesh (``.msh`` v2 or v4, ASCII or binary) as a :class:`Mesh`.

    Args:
      path: the ``.msh`` file.
      order: polynomial order N of the GLL nodes to build, 1 ≤ N ≤ 20.
      merge_tol: corner nodes closer than ``merge_tol`` times the bounding-box
        diagonal of the corners are merged into one (with a warning naming them):
        two node ids at one point would otherwise disconnect the elements that use
        them; 0 merges exact copies only. ``None``: refuse a file with corner nodes
        closer than ``MERGE_TOL`` (1e-10) times the diagonal (``ValueError`` with the ids).

    The volume cells must all be ``hexahedron`` (hex8, trilinear elements) or all
    ``hexahedron27`` (triquadratic elements). ``Mesh.cells``
    holds the file's corner node ids renumbered compactly (0, 1, … in
    increasing file id; mid-nodes and unused nodes dropped), ``Mesh.vertices`` their coordinates, and ``Mesh.x`` the
    isoparametric GLL node coordinates, ``(3, E, n, n, n)``. Element orientation
    is kept as in the file: a left-handed (mirrored) element is reported by
    :func:`jaxsem.geometry.geometric_factors`.

    ``Mesh.boundaries`` holds the physical surface groups: each quad (quad4 or quad9) of a
    group becomes the row (element, local face) of the hexahedron face with its 4 corner
    nodes (compared after merging), in file order; a quad on a face of two hexahedra (an
    interior surface) gives both rows, and :func:`jaxsem.discretize` refuses such a group
    as a Dirichlet boundary. Groups are named by ``$PhysicalNames``; a group without a name
    is ``"surface_<tag>"`` (its physical tag). Physical volumes, lines and points, and
    2-D cells in no physical group, are ignored; so are all lower-dimensional cells
    for the topology. Versions 2 and 4.1 give every named group; meshio gives only the first
    group of each entity of a 4.0 file (and of a 4.1 file for unnamed groups), and none
    where some entity of a 4.x file is in no physical group.

    Periodic Gmsh meshes are not supported: ``$Periodic`` sections are ignored
    and ``periodic_faces`` is empty: pair two boundary groups with
    :func:`jaxsem.mesh.make_periodic`.

    Raises ``FileNotFoundError`` / ``IsADirectoryError`` for a missing path or a
    folder, and ``ValueError`` naming the file for: an empty, truncated or
    unparsable file (text that is not a mesh, binary garbage, an unknown format
    version, a binary header claiming more nodes or elements than the file holds: refused
    before anything is allocated for them); node ids that are not positive or are defined twice, and elements
    that use a node id the file does not define (checked on the node ids of ASCII
    files; in binary files as far as the parsed connectivity shows); non-finite
    coordinates; an element that repeats a corner; any other 3-D cell type (tetra,
    wedge, pyramid, hexahedron20, …), a file without hexahedra, and hex8 and hex27
    mixed; a physical surface group with a quad that is no face of a hexahedron (naming the
    group and the quad's node ids) or with triangles.
    """
    order = basis.check_order(order)
    if merge_tol is not None and not (isinstance(merge_tol, (int, float)) and not isinstance(merge_tol, bool)
                                      and 0 <= merge_tol < 1):
        raise ValueError(f"merge_tol must be a number in [0, 1) or None, got {merge_tol!r}")
    name = os.fspath(path)
    if not os.path.exists(name):
        raise FileNotFoundError(f"{name}: no such mesh file")
    if os.path.isdir(name):
        raise IsADirectoryError(f"{name}: is a directory, not a .msh file")
    if os.path.getsize(name) == 0:
        raise ValueError(f"{name}: the file is empty (expected a Gmsh .msh mesh)")
    tags = _check_ascii_node_ids(name)  # None for binary files
    _check_binary_counts(name)
    msh = _meshio_read(name)

    blocks: dict[str, list[np.ndarray]] = {}
    for block in msh.cells:
        blocks.setdefault(block.type, []).append(np.asarray(block.data, dtype=np.int64))
    volume_types = sorted(t for t in blocks if not t.startswith(_LOWER_DIM_PREFIXES))
    hex_types = [t for t in volume_types if t in SUPPORTED_CELLS]
    other = [t for t in volume_types if t not in SUPPORTED_CELLS]
    found = sorted(blocks) if blocks else ["no cells"]
    if other:
        raise ValueError(
            f"{name}: unsupported cell type(s) {other} (cell types found: {found}); "
            f"read_gmsh supports only hexahedral meshes of {list(SUPPORTED_CELLS)} (hex8 or hex27)"
        )
    if not hex_types:
        raise ValueError(
            f"{name}: no hexahedra found (cell types found: {found}); "
            f"read_gmsh supports only hexahedral meshes of {list(SUPPORTED_CELLS)}"
        )
    if len(hex_types) > 1:
        raise ValueError(
            f"{name}: mixed hexahedron and hexahedron27 cells are not supported; "
            "use one geometric order for all elements"
        )
    kind = hex_types[0]
    conn = np.concatenate(blocks[kind], axis=0)
    points = np.asarray(msh.points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"{name}: expected 3-D points, got shape {points.shape}")
    node_id = (lambda i: int(tags[i])) if tags is not None and len(tags) == len(points) else (lambda i: f"#{i + 1}")
    # meshio marks an id it could not map as -1 (and wraps other bad ids): the ASCII check
    # above names those; this catches what a binary file's parse shows
    bad = (conn < 0) | (conn >= len(points))
    if bad.any():
        e = int(np.nonzero(bad.any(axis=1))[0][0])
        raise ValueError(f"{name}: {kind} number {e + 1} (in file order) uses a node id that $Nodes does not define")
    used_nodes = np.unique(conn)
    finite = np.isfinite(points[used_nodes]).all(axis=1)
    if not finite.all():
        i = int(used_nodes[~finite][0])
        raise ValueError(f"{name}: node {node_id(i)} has non-finite coordinates {points[i].tolist()}")

    m, perm = (2, HEX8_VTK_TO_LEX) if kind == "hexahedron" else (3, HEX27_VTK_TO_LEX)
    conn = conn[:, perm]  # lexicographic on the m×m×m grid, [e, k*m*m + j*m + i]
    s = m - 1  # grid index of the +1 end
    corner_cols = [a * s + m * b * s + m * m * c3 * s for c3 in (0, 1) for b in (0, 1) for a in (0, 1)]
    corners = conn[:, corner_cols]  # (E, 8) file node indices, lexicographic corners
    merged = _merge_coincident(name, corners, points, merge_tol, node_id)
    merged_to = np.arange(len(points))
    merged_to[corners] = merged  # file node index → the index it was merged into
    corners = merged
    srt = np.sort(corners, axis=1)
    rep = np.any(srt[:, 1:] == srt[:, :-1], axis=1)
    if rep.any():
        e = int(np.nonzero(rep)[0][0])
        raise ValueError(f"{name}: {kind} number {e + 1} (in file order) repeats a corner node "
                         f"(corner node ids {[node_id(int(i)) for i in corners[e]]})")
    used, cells = np.unique(corners, return_inverse=True)
    cells = cells.reshape(corners.shape).astype(np.int64)
    vertices = points[used]

    E = conn.shape[0]
    geom = points[conn].reshape(E, m, m, m, 3)
    x = element_nodes(geom, order)
    vertex = np.full(len(points), -1, dtype=np.int64)
    vertex[used] = np.arange(len(used))
    boundaries = _match_faces(name, _surface_groups(name, msh), cells, vertex[merged_to], node_id)
    return Mesh(order, cells, vertices, x, np.zeros((0, 4), dtype=np.int64), boundaries=boundaries)


def _surface_groups(name: str, msh) -> dict:
    """``{group name: (Q, 4) file node indices of its quads' corners}``: the 2-D cells of each
    physical surface group, named by ``$PhysicalNames`` or ``surface_<tag>``, in file order.

    meshio gives each 2-D block's physical tag as ``gmsh:physical`` cell data (version 2: per
    element; version 4.1: the first physical group of the block's entity) and, in version 4.1,
    the named groups' members as ``cell_sets`` (every group of an entity): both are read.
    """
    named = {}
    for key, value in msh.field_data.items():
        tag, dim = (int(v) for v in np.asarray(value).ravel()[:2])
        if dim == 2:
            named[tag] = key
    members: dict[str, list] = {key: [] for key in named.values()}  # name → [(block, rows)]
    physical = msh.cell_data.get("gmsh:physical", [])
    for b, block in enumerate(msh.cells):
        if not block.type.startswith(("quad", "triangle", "polygon")):
            continue
        tags = np.asarray(physical[b]).ravel() if len(physical) == len(msh.cells) else np.zeros(0)
        if len(tags) == len(block.data):
            for tag in np.unique(tags[tags > 0]).tolist():
                members.setdefault(named.get(tag, f"surface_{tag}"), []).append((b, np.nonzero(tags == tag)[0]))
        for key in named.values():
            rows = msh.cell_sets[key][b] if key in msh.cell_sets else None
            if rows is not None and len(rows):
                members[key].append((b, np.asarray(rows, dtype=np.int64).ravel()))
    out = {}
    for key, parts in members.items():
        types = sorted({msh.cells[b].type for b, _ in parts if not msh.cells[b].type.startswith("quad")})
        if types:
            raise ValueError(f"{name}: physical surface group {key!r} holds {types} cells; boundary groups of a "
                             "hexahedral mesh must be quadrilaterals (quad or quad9)")
        # each cell once (a v4.1 group is in both sources), in file order
        cells = np.unique(np.concatenate([np.stack([np.full(len(r), b), r], 1) for b, r in parts]
                                         or [np.zeros((0, 2), np.int64)]), axis=0)
        out[key] = np.concatenate([np.asarray(msh.cells[b].data, dtype=np.int64)[cells[cells[:, 0] == b, 1], :4]
                                   for b in np.unique(cells[:, 0]).tolist()] or [np.zeros((0, 4), np.int64)])
    return out


def _match_faces(name: str, groups: dict, cells: np.ndarray, vertex: np.ndarray, node_id) -> dict:
    """``{group: (F, 2) rows (element, local face)}``: each quad of ``groups`` (file node
    indices) matched to the hexahedron faces with its 4 corners (``vertex``: file index →
    ``Mesh`` vertex id, -1 if no corner); a quad on a face of two hexahedra gives both rows.
    ``ValueError`` naming the file, the group and the quad for a quad that is no face."""
    from .numbering import FACE_CORNERS, _unique_rows

    faces = np.sort(cells[:, FACE_CORNERS].reshape(-1, 4), axis=1)  # (6E, 4), row e·6 + f
    out = {}
    for key, quads in groups.items():
        ok = (quads >= 0) & (quads < len(vertex))
        ids = np.where(ok, vertex[np.where(ok, quads, 0)], -1)
        srt = np.sort(ids, axis=1)
        valid = (srt[:, 0] >= 0) & (srt[:, 1:] != srt[:, :-1]).all(axis=1)
        inverse, _ = _unique_rows(np.concatenate([faces, srt[valid]]), max(len(vertex), 1))
        hit = np.full(len(quads), -1, dtype=np.int64)
        hit[valid] = inverse[len(faces):]
        order = np.argsort(inverse[:len(faces)], kind="stable")
        lo = np.searchsorted(inverse[:len(faces)][order], hit, "left")
        hi = np.searchsorted(inverse[:len(faces)][order], hit, "right")
        missing = np.nonzero((hi == lo) | (hit < 0))[0]
        if missing.size:
            q = int(missing[0])
            who = [node_id(int(i)) if 0 <= i < len(vertex) else "?" for i in quads[q]]
            raise ValueError(f"{name}: physical surface group {key!r}: quad {q + 1} of the group (corner node ids "
                             f"{who}) is no face of a hexahedron "
                             f"({missing.size} of its {len(quads)} quads are not)")
        count = hi - lo  # 1, or 2 for a face shared by two hexahedra
        start = np.cumsum(count) - count
        rows = order[np.repeat(lo, count) + np.arange(int(count.sum())) - np.repeat(start, count)]
        out[key] = np.stack([rows // 6, rows % 6], axis=1).astype(np.int64)
    return out


def _meshio_read(name: str):
    """``meshio.read`` as a Gmsh file, every failure a ``ValueError`` naming the file.

    meshio prints and calls ``sys.exit(1)`` when no reader accepts a file; that, its
    ``ReadError`` and the NumPy/Unicode errors of a truncated or garbled file are
    caught here so that nothing ends the caller's process.
    """
    import meshio  # optional dependency, only needed here

    def fail(why):
        return ValueError(f"{name}: not a readable Gmsh .msh mesh ({why})")

    with open(name, "rb") as f:
        first = f.readline(64).strip()
    if first not in (b"$MeshFormat", b"$Comments"):
        raise fail(f"it does not start with $MeshFormat; its first bytes are {first[:32]!r}")
    try:
        return meshio.read(name, file_format="gmsh")
    except SystemExit:
        raise fail("meshio could not parse it: truncated, or not in the Gmsh format") from None
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 -- meshio raises anything on a bad file
        why = str(err) or type(err).__name__
        raise fail(f"truncated or malformed: {type(err).__name__}: {why}") from None


def _check_ascii_node_ids(name: str):
    """Node ids of an ASCII ``.msh`` (v2 or v4.1) as written, checked; None for other files.

    meshio maps ids to indices by array lookups in which an id of 0 or below silently
    wraps to another node and a repeated id silently replaces the first one: these,
    and element node ids that ``$Nodes`` does not define, are a ``ValueError`` here.
    """
    fmt = _msh_format(name)
    if fmt is None:
        return None  # not a Gmsh header (meshio's parse names the problem) or comments > 4 KB
    version, file_type, _ = fmt
    if file_type != "0" or not (version.startswith("2") or version in ("4", "4.1")):
        return None  # binary, or v4.0: left to meshio's parse
    with open(name, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        if version.startswith("2"):
            tags, elements = _ascii_ids_v2(lines)
        else:
            tags, elements = _ascii_ids_v41(lines)
    except (ValueError, IndexError) as err:
        raise ValueError(f"{name}: malformed or truncated ASCII Gmsh file ({err})") from None
    if tags is None:
        return None
    if tags.size and tags.min() <= 0:
        raise ValueError(f"{name}: node id {int(tags.min())} in $Nodes: Gmsh node ids must be >= 1")
    uniq, counts = np.unique(tags, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{name}: node id {int(uniq[counts > 1][0])} is defined more than once in $Nodes")
    if elements:
        nodes = np.concatenate([v for _, v in elements])
        known = np.isin(nodes, uniq)
        if not known.all():
            k = int(np.argmin(known))
            elem = np.repeat([e for e, _ in elements], [len(v) for _, v in elements])[k]
            raise ValueError(f"{name}: element {elem} uses node id {int(nodes[k])}, which $Nodes does not define")
    return tags


def _msh_format(name: str):
    """``(version, file type, data size)`` of the ``$MeshFormat`` line in the first 4 KB of
    ``name`` (``"0"`` ASCII, ``"1"`` binary; data size 8 if absent), or None."""
    with open(name, "rb") as f:
        head = f.read(4096).decode("utf-8", errors="replace").splitlines()
    try:
        i = [line.strip() for line in head].index("$MeshFormat")
        words = head[i + 1].split()
        return words[0], words[1], int(words[2]) if len(words) > 2 else 8
    except (ValueError, IndexError):
        return None


def _layout_v4(version: str, data_size: int) -> dict | None:
    """The binary layout meshio reads a version-4 file with (struct formats, native byte order):
    the ``$Nodes`` and ``$Elements`` headers, their entity-block headers, the bytes of a node and
    of an integer. meshio reads "4.0" as 4.0 and any other "4…" as 4.1, whose size_t is the
    header's data size (None where meshio has no such integer)."""
    if version == "4.0":
        return dict(nodes="=2Q", node_block="=3iQ", node=4 + 24, elements="=2Q", element_block="=3iQ",
                    word=4, v41=False)
    st = {4: "I", 8: "Q"}.get(data_size)
    return None if st is None else dict(nodes="=4" + st, node_block="=3i" + st, node=data_size + 24,
                                        elements="=4" + st, element_block="=3i" + st, word=data_size, v41=True)


def _check_binary_counts(name: str) -> None:
    """``ValueError`` naming the file and the count when a binary ``.msh`` claims more nodes or
    elements than it holds.

    meshio allocates arrays for the counts a header claims before reading them, so one corrupt
    count could ask for terabytes (a ``MemoryError``, or a machine swapping). Every count, the
    section's total and each entity block's, is checked here against the bytes that follow it,
    at the fewest bytes a node or element of that block takes; nothing is allocated for it.
    """
    fmt = _msh_format(name)
    if fmt is None or fmt[1] != "1":
        return
    version, _, data_size = fmt
    layout = None if version.startswith("2") else _layout_v4(version, data_size)
    if not version.startswith(("2", "4")) or version.startswith("4") and layout is None:
        return  # meshio refuses these versions and sizes itself, before allocating
    size = os.path.getsize(name)
    with open(name, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:

        def fits(where, count, unit, each, pos):
            if count < 0 or count * each > size - pos:
                raise ValueError(f"{name}: {where} claims {count} {unit} (at least {count * each} bytes, "
                                 f"{each} each) but only {size - pos} bytes follow in the {size}-byte file: "
                                 f"truncated, or a corrupt count; refused before reading it")

        for section in ("Nodes", "Elements"):
            start = mm.find(f"\n${section}\n".encode())
            if start >= 0:
                pos = start + len(section) + 3
                if layout is None:
                    _walk_v2(mm, pos, section, fits)
                else:
                    _walk_v4(mm, pos, section, fits, layout)


def _ints(mm, fmt, pos):
    """``struct.unpack_from(fmt, mm, pos)`` and the position after it; None past the end."""
    if pos + struct.calcsize(fmt) > len(mm):
        return None, pos
    return struct.unpack_from(fmt, mm, pos), pos + struct.calcsize(fmt)


def _nodes_per(gmsh_type: int) -> int | None:
    """Nodes of a Gmsh element type as meshio reads it (None for a type meshio does not know)."""
    from meshio._common import num_nodes_per_cell
    from meshio.gmsh.common import _gmsh_to_meshio_type

    return num_nodes_per_cell.get(_gmsh_to_meshio_type.get(gmsh_type))


def _walk_v2(mm, pos, section, fits):
    """Check a version-2 binary section's counts (:func:`_check_binary_counts`)."""
    end = mm.find(b"\n", pos, pos + 32)
    try:
        total = int(mm[pos:end]) if end >= 0 else None
    except ValueError:
        total = None
    if total is None:
        return  # not a count: meshio's parse names it
    pos = end + 1
    if section == "Nodes":
        fits("$Nodes", total, "nodes", 4 + 24, pos)  # int tag, 3 doubles
        return
    fits("$Elements", total, "elements", 4 * 2, pos)  # an id and one node at the least
    seen, block = 0, 0
    while seen < total:
        head, pos = _ints(mm, "=3i", pos)
        block += 1
        if head is None:
            return
        kind, count, tags = head
        nodes = _nodes_per(kind)
        if nodes is None or tags < 0:
            return
        each = 4 * (1 + tags + nodes)
        fits(f"$Elements block {block} (type {kind})", count, "elements", each, pos)
        pos += count * each
        seen += count


def _walk_v4(mm, pos, section, fits, layout):
    """Check a version-4 binary section's counts (:func:`_check_binary_counts`)."""
    head, pos = _ints(mm, layout["nodes" if section == "Nodes" else "elements"], pos)
    if head is None:
        return
    blocks, total = head[:2]
    if section == "Nodes":
        each, unit = layout["node"], "nodes"
    else:
        each, unit = 2 * layout["word"], "elements"  # an id and one node at the least
    fits(f"${section}", total, unit, each, pos)
    fits(f"${section}", blocks, "entity blocks", struct.calcsize(layout["node_block"]), pos)
    for b in range(blocks):
        head, pos = _ints(mm, layout["node_block" if section == "Nodes" else "element_block"], pos)
        if head is None:
            return
        if section == "Nodes":
            if layout["v41"] and head[2] != 0:
                return  # parametric nodes (4.1): meshio refuses them itself
        else:
            nodes = _nodes_per(head[2])
            if nodes is None:
                return
            each = layout["word"] * (1 + nodes)
        fits(f"${section} entity block {b + 1} of {blocks}", head[3], unit, each, pos)
        pos += head[3] * each


def _section(lines, tag):
    """Index of the first line after ``$tag`` and of its ``$Endtag``; None if absent."""
    try:
        a = lines.index(f"${tag}")
    except ValueError:
        return None
    try:
        return a + 1, lines.index(f"$End{tag}", a)
    except ValueError:
        raise ValueError(f"${tag} has no $End{tag}") from None


def _ascii_ids_v2(lines):
    nodes, elems = _section(lines, "Nodes"), _section(lines, "Elements")
    if nodes is None or elems is None:
        return None, []
    a, b = nodes
    count = int(lines[a])
    rows = lines[a + 1:b]
    if len(rows) != count:
        raise ValueError(f"$Nodes announces {count} nodes and lists {len(rows)}")
    tags = np.array([int(r.split(None, 1)[0]) for r in rows], dtype=np.int64)
    a, b = elems
    count = int(lines[a])
    rows = lines[a + 1:b]
    if len(rows) != count:
        raise ValueError(f"$Elements announces {count} elements and lists {len(rows)}")
    out = []
    for r in rows:
        v = [int(t) for t in r.split()]
        out.append((v[0], np.array(v[3 + v[2]:], dtype=np.int64)))  # id, type, #tags, tags…, nodes…
    return tags, out


def _ascii_ids_v41(lines):
    nodes, elems = _section(lines, "Nodes"), _section(lines, "Elements")
    if nodes is None or elems is None:
        return None, []
    a, b = nodes
    nblocks, total = (int(t) for t in lines[a].split()[:2])
    k, tags = a + 1, []
    for _ in range(nblocks):
        dim, _, parametric, count = (int(t) for t in lines[k].split())
        tags += [int(t) for t in lines[k + 1:k + 1 + count]]
        k += 1 + 2 * count
        if k > b:
            raise ValueError("$Nodes ends inside a block")
    if len(tags) != total:  # meshio allocates for the announced count
        raise ValueError(f"$Nodes announces {total} nodes and lists {len(tags)}")
    a, b = elems
    nblocks = int(lines[a].split()[0])
    k, out = a + 1, []
    for _ in range(nblocks):
        count = int(lines[k].split()[3])
        for r in lines[k + 1:k + 1 + count]:
            v = [int(t) for t in r.split()]
            out.append((v[0], np.array(v[1:], dtype=np.int64)))
        k += 1 + count
        if k > b:
            raise ValueError("$Elements ends inside a block")
    return np.array(tags, dtype=np.int64), out


def _merge_coincident(name, corners, points, merge_tol, node_id):
    """Corner node indices with coincident nodes (within merge_tol·diagonal) replaced by the lowest."""
    used = np.unique(corners)
    p = points[used]
    diag = float(np.linalg.norm(p.max(axis=0) - p.min(axis=0)))
    tol = (MERGE_TOL if merge_tol is None else merge_tol) * diag
    from scipy.spatial import cKDTree

    pairs = cKDTree(p).query_pairs(tol, p=np.inf, output_type="ndarray")
    if not len(pairs):
        return corners
    if merge_tol is None:
        i, j = (int(used[v]) for v in pairs[0])
        raise ValueError(f"{name}: {len(pairs)} pair(s) of corner nodes coincide, e.g. node ids {node_id(i)} and "
                         f"{node_id(j)} at {points[i].tolist()} (they would disconnect the mesh); "
                         f"pass merge_tol to merge them")
    # union–find on the pairs: each group maps to its lowest index
    parent = np.arange(len(used))

    def root(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for u, v in pairs:
        ru, rv = root(u), root(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    rep = np.array([root(v) for v in range(len(used))])
    merged = np.nonzero(rep != np.arange(len(used)))[0]
    examples = ", ".join(f"{node_id(int(used[v]))}→{node_id(int(used[rep[v]]))}" for v in merged[:3])
    warnings.warn(f"{name}: merged {len(merged)} corner node(s) that coincide with another "
                  f"(within {merge_tol:g}·diagonal): {examples}{', …' if len(merged) > 3 else ''}",
                  stacklevel=3)
    lookup = np.empty(int(corners.max()) + 1, dtype=np.int64)
    lookup[used] = used[rep]
    return lookup[corners]
