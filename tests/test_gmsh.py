"""Gmsh import: corner orders, hex27 node order, rotated elements, errors."""

import itertools
import struct
import sys
import tracemalloc
import warnings

import meshio
import numpy as np
import pytest

import jaxsem
from jaxsem import basis
from jaxsem.core.geometry import geometric_factors, quadrature
from jaxsem.mesh.gmsh import read_gmsh
from jaxsem.mesh import box_mesh, element_nodes, make_periodic
from jaxsem.mesh.numbering import FACE_CORNERS, number_nodes

# Lexicographic corner c = a + 2b + 4c3 → VTK/meshio hexahedron corner (independent
# of the table in jaxsem.mesh.gmsh: VTK corners go counter-clockwise around t = -1, then t = +1).
LEX_TO_VTK8 = np.array([0, 1, 3, 2, 4, 5, 7, 6])
CORNER_SIGN = np.array([[2 * (c & 1) - 1, 2 * ((c >> 1) & 1) - 1, 2 * ((c >> 2) & 1) - 1] for c in range(8)])


def _rotations():
    """The 24 proper rotations of the cube as signed permutation matrices (det +1)."""
    out = []
    for p in itertools.permutations(range(3)):
        for s in itertools.product((-1, 1), repeat=3):
            R = np.zeros((3, 3), dtype=np.int64)
            R[np.arange(3), p] = s
            if round(np.linalg.det(R)) == 1:
                out.append(R)
    assert len(out) == 24
    return out


ROTATIONS = _rotations()


def _corner_of(sign):
    a, b, c3 = (np.asarray(sign) + 1) // 2
    return int(a + 2 * b + 4 * c3)


def _corner_perm(R):
    """new corner c' takes old corner perm[c'] (the one at reference point R·s(c'))."""
    return np.array([_corner_of(R @ CORNER_SIGN[c]) for c in range(8)])


def _rotate_nodes(x_e, R):
    """GLL nodes (3, n, n, n) of the element re-parametrized as ξ ↦ x(Rξ)."""
    N = x_e.shape[-1] - 1
    k, j, i = np.meshgrid(*(np.arange(N + 1),) * 3, indexing="ij")
    ijk = np.stack([i, j, k])  # (3, n, n, n), index along r, s, t
    src = np.empty_like(ijk)
    for a in range(3):
        b = int(np.nonzero(R[a])[0][0])
        src[a] = ijk[b] if R[a, b] > 0 else N - ijk[b]
    return x_e[:, src[2], src[1], src[0]]


def _msh(points, cells):
    """meshio.Mesh with Gmsh physical/geometrical tags (1) on every block."""
    tags = [np.ones(len(c[1]), dtype=int) for c in cells]
    return meshio.Mesh(points, cells, cell_data={"gmsh:physical": tags, "gmsh:geometrical": tags})


def _write_hex8(path, points, cells_lex, fmt, extra=None):
    cells = [("hexahedron", cells_lex[:, LEX_TO_VTK8])] + (extra or [])
    meshio.write(path, _msh(points, cells), file_format=fmt, binary=False)


def _square_symmetries():
    """The 8 symmetries of a face as permutations of its corners q = u + 2v."""
    out = set()
    for swap, fu, fv in itertools.product((0, 1), repeat=3):
        perm = []
        for q in range(4):
            u, v = q & 1, q >> 1
            u, v = (v, u) if swap else (u, v)
            perm.append((u ^ fu) + 2 * (v ^ fv))
        out.add(tuple(perm))
    assert len(out) == 8
    return out


SQUARE_SYMMETRIES = _square_symmetries()


def _face_orientation(g1, g2):
    """Relative orientation of a shared face: position in g2 of each corner of g1."""
    return tuple(int(np.nonzero(g2 == v)[0][0]) for v in g1)


def _rotated_file(tmp_path, ne, order, fmt, seed, perturb=0.0):
    """Write a box mesh with rotated, shuffled elements and permuted vertex ids."""
    rng = np.random.default_rng(seed)
    box = box_mesh(ne, order=order)
    verts = box.vertices.copy()
    if perturb:
        interior = np.all((verts > 1e-12) & (verts < 1 - 1e-12), axis=1)
        verts[interior] += perturb * rng.uniform(-1, 1, (int(interior.sum()), 3))
        box = box.__class__(order, box.cells, verts, element_nodes(verts[box.cells].reshape(-1, 2, 2, 2, 3), order),
                            box.periodic_faces, box.elements)
    E, V = box.num_elements, len(verts)
    eorder = rng.permutation(E)  # file element e' is box element eorder[e']
    rot = rng.permutation(24)[:E] if E <= 24 else rng.integers(0, 24, E)
    vperm = rng.permutation(V + 3)[:V]  # box vertex v → file node id vperm[v] (3 stray nodes)
    points = rng.uniform(-5, 5, (V + 3, 3))
    points[vperm] = verts
    cells = np.stack([vperm[box.cells[eorder[e]][_corner_perm(ROTATIONS[rot[e]])]] for e in range(E)])
    # Boundary quads and lines: lower-dimensional cells the reader must ignore (meshio's
    # gmsh 4.1 writer needs entity tags for several cell types, so only in gmsh22).
    quads = vperm[box.cells[:, FACE_CORNERS[0]][:, [0, 1, 3, 2]]]
    extra = [("quad", quads), ("line", quads[:, :2])] if fmt == "gmsh22" else None
    path = tmp_path / f"rot_{fmt}_{seed}.msh"
    _write_hex8(str(path), points, cells, fmt, extra)
    return path, box, eorder, rot, cells


@pytest.mark.parametrize("fmt,perturb", [("gmsh22", 0.0), ("gmsh", 0.0), ("gmsh22", 0.08)])
def test_rotated_elements_number_like_box(tmp_path, fmt, perturb):
    ne, N = (3, 2, 2), 4
    path, box, eorder, rot, file_cells = _rotated_file(tmp_path, ne, N, fmt, seed=2, perturb=perturb)
    mesh = read_gmsh(path, order=N)
    E = box.num_elements
    assert mesh.x.shape == (3, E, N + 1, N + 1, N + 1)
    assert mesh.vertices.shape == box.vertices.shape  # stray nodes dropped, ids compact
    assert mesh.cells.min() == 0 and mesh.cells.max() == len(box.vertices) - 1

    # Geometry: each element is the box element re-parametrized by its rotation.
    expect = np.stack([_rotate_nodes(box.x[:, eorder[e]], ROTATIONS[rot[e]]) for e in range(E)], axis=1)
    assert np.max(np.abs(mesh.x - expect)) <= 1e-13

    # Same global node count, and the same partition of physical points.
    nb, nr = number_nodes(box), number_nodes(mesh)
    assert nb.num_global == nr.num_global == np.prod([n * N + 1 for n in ne])
    lookup = {}
    for key, g in zip(map(tuple, np.round(box.x.reshape(3, -1).T, 9)), nb.gid.ravel()):
        assert lookup.setdefault(key, g) == g  # box numbering: one id per point
    assert len(lookup) == nb.num_global
    g_box = np.array([lookup[key] for key in map(tuple, np.round(mesh.x.reshape(3, -1).T, 9))])
    pairs = np.unique(np.stack([nr.gid.ravel(), g_box], 1), axis=0)
    assert len(pairs) == nr.num_global  # read id ↔ box id is a bijection

    # Positive Jacobians and the same volume.
    quad = quadrature(N)
    vol_box = float(np.sum(geometric_factors(box.x, quad).B))
    geo = geometric_factors(mesh.x, quad)
    assert float(np.min(geo.jac)) > 0
    assert abs(float(np.sum(geo.B)) - vol_box) <= 1e-13
    assert abs(vol_box - 1.0) <= 1e-13

    # Shared faces meet in all 8 relative orientations.
    faces = {}
    for e in range(E):
        for f in range(6):
            g = file_cells[e, FACE_CORNERS[f]]
            faces.setdefault(tuple(sorted(g)), []).append(g)
    shared = [v for v in faces.values() if len(v) == 2]
    assert len(shared) == 20  # (3,2,2): 8 + 6 + 6 interior faces
    orients = {_face_orientation(g1, g2) for g1, g2 in shared}
    assert orients == SQUARE_SYMMETRIES


def test_binary_gmsh22(tmp_path):
    box = box_mesh((2, 1, 1), order=2)
    path = str(tmp_path / "bin.msh")
    meshio.write(path, _msh(box.vertices, [("hexahedron", box.cells[:, LEX_TO_VTK8])]),
                 file_format="gmsh22", binary=True)
    mesh = read_gmsh(path, 3)
    assert np.array_equal(mesh.cells, box.cells)
    assert np.max(np.abs(mesh.x - box_mesh((2, 1, 1), order=3).x)) <= 1e-14


# Gmsh's own hex27 node order (gmsh manual, "Node ordering"), as reference points:
# corners; edges (0,1) (0,3) (0,4) (1,2) (1,5) (2,3) (2,6) (3,7) (4,5) (4,7) (5,6) (6,7);
# faces (0,1,2,3) (0,1,5,4) (0,3,7,4) (1,2,6,5) (2,3,7,6) (4,5,6,7); centre.
_GMSH27_CORNER = [[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1], [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1]]
_GMSH27_EDGES = [(0, 1), (0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (2, 6), (3, 7), (4, 5), (4, 7), (5, 6), (6, 7)]
_GMSH27_FACES = [(0, 1, 2, 3), (0, 1, 5, 4), (0, 3, 7, 4), (1, 2, 6, 5), (2, 3, 7, 6), (4, 5, 6, 7)]
GMSH27_REF = np.array(
    _GMSH27_CORNER
    + [np.add(_GMSH27_CORNER[a], _GMSH27_CORNER[b]) // 2 for a, b in _GMSH27_EDGES]
    + [np.sum([_GMSH27_CORNER[c] for c in f], axis=0) // 4 for f in _GMSH27_FACES]
    + [[0, 0, 0]]
)


def _curve(p):
    x, y, z = p[..., 0], p[..., 1], p[..., 2]
    s = 0.05 * np.sin(np.pi * x) * np.sin(np.pi * y) * np.sin(np.pi * z)
    return np.stack([x + s + 0.1 * y * y, y + s + 0.08 * z * x, z + s + 0.1 * np.sin(x)], axis=-1)


def _write_hex27_native(path, ne):
    """Hand-written Gmsh 2.2 ASCII file of curved hex27 elements in Gmsh's node order."""
    nx, ny, nz = ne
    gid = np.arange((2 * nx + 1) * (2 * ny + 1) * (2 * nz + 1)).reshape(2 * nz + 1, 2 * ny + 1, 2 * nx + 1)
    gz, gy, gx = np.meshgrid(*(np.linspace(0, 1, 2 * n + 1) for n in (nz, ny, nx)), indexing="ij")
    pts = _curve(np.stack([gx.ravel(), gy.ravel(), gz.ravel()], 1))
    elems, lex_nodes = [], []
    for ez, ey, ex in itertools.product(range(nz), range(ny), range(nx)):
        node = lambda r, s, t: gid[2 * ez + 1 + t, 2 * ey + 1 + s, 2 * ex + 1 + r]  # noqa: E731
        elems.append([node(*p) for p in GMSH27_REF])
        lex_nodes.append([node(r, s, t) for t in (-1, 0, 1) for s in (-1, 0, 1) for r in (-1, 0, 1)])
    lines = ["$MeshFormat", "2.2 0 8", "$EndMeshFormat", "$Nodes", str(len(pts))]
    lines += [f"{i + 1} {float(p[0])!r} {float(p[1])!r} {float(p[2])!r}" for i, p in enumerate(pts)]
    lines += ["$EndNodes", "$Elements", str(len(elems))]
    lines += [f"{i + 1} 12 2 1 1 " + " ".join(str(v + 1) for v in el) for i, el in enumerate(elems)]
    lines += ["$EndElements", ""]
    path.write_text("\n".join(lines))
    return pts, np.array(lex_nodes)


def _quadratic_volumes(nodes):
    """Per-element volume of the triquadratic map on (-1, 0, 1), Gauss 6³ (exact)."""
    xq, wq = np.polynomial.legendre.leggauss(6)
    L = np.stack([xq * (xq - 1) / 2, 1 - xq * xq, xq * (xq + 1) / 2], 1)  # (q, 3)
    dL = np.stack([xq - 0.5, -2 * xq, xq + 0.5], 1)
    X = nodes.reshape(-1, 3, 3, 3, 3)  # [e, t, s, r, c]
    xr = np.einsum("Ct,Bs,Ar,etsrc->eCBAc", L, L, dL, X)
    xs = np.einsum("Ct,Bs,Ar,etsrc->eCBAc", L, dL, L, X)
    xt = np.einsum("Ct,Bs,Ar,etsrc->eCBAc", dL, L, L, X)
    det = np.einsum("...c,...c->...", xr, np.cross(xs, xt))
    return np.einsum("eCBA,C,B,A->e", det, wq, wq, wq)


def test_hex27_curved(tmp_path):
    ne = (2, 2, 1)
    path = tmp_path / "curved27.msh"
    pts, lex_nodes = _write_hex27_native(path, ne)
    m2 = read_gmsh(path, order=2)  # GLL points of order 2 are -1, 0, 1
    expect = np.moveaxis(pts[lex_nodes].reshape(-1, 3, 3, 3, 3), -1, 0)
    assert np.max(np.abs(m2.x - expect)) <= 1e-14
    assert m2.vertices.shape == (np.prod([n + 1 for n in ne]), 3)
    assert number_nodes(m2).num_global == np.prod([2 * n + 1 for n in ne])

    # The same file through meshio's writer (meshio node order) and gmsh 4.1 reads the same.
    msh = meshio.read(path)
    path41 = tmp_path / "curved27_41.msh"
    meshio.write(path41, msh, file_format="gmsh", binary=False)
    assert np.max(np.abs(read_gmsh(path41, order=2).x - m2.x)) <= 1e-14

    m5 = read_gmsh(path, order=5)
    B = np.asarray(geometric_factors(m5.x, quadrature(5)).B)
    ref = _quadratic_volumes(pts[lex_nodes])
    assert np.max(np.abs(B.sum(axis=(1, 2, 3)) - ref)) <= 1e-12
    assert abs(B.sum() - ref.sum()) <= 1e-12


def test_mirrored_element_raises(tmp_path):
    box = box_mesh((2, 2, 1), order=2)
    cells = box.cells.copy()
    cells[3] = cells[3][[1, 0, 3, 2, 5, 4, 7, 6]]  # reflection r → -r
    path = str(tmp_path / "mirror.msh")
    _write_hex8(path, box.vertices, cells, "gmsh22")
    mesh = read_gmsh(path, order=3)
    assert number_nodes(mesh).num_global == 7 * 7 * 4
    with pytest.raises(ValueError, match=r"element 3\b"):
        geometric_factors(mesh.x, quadrature(3))


def test_unsupported_cells_and_order(tmp_path):
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1.0]])
    tet = str(tmp_path / "tet.msh")
    meshio.write(tet, _msh(pts, [("tetra", np.array([[0, 1, 2, 3], [1, 2, 3, 4]]))]), file_format="gmsh22")
    with pytest.raises(ValueError, match="tetra"):
        read_gmsh(tet, order=2)

    quad = str(tmp_path / "quad.msh")
    meshio.write(quad, _msh(pts, [("quad", np.array([[0, 1, 4, 2]]))]), file_format="gmsh22")
    with pytest.raises(ValueError, match="no hexahedra"):
        read_gmsh(quad, order=2)

    box = box_mesh((2, 1, 1), order=1)
    hexes = box.cells[:, LEX_TO_VTK8]
    wedge = np.array([[0, 1, 3, 4, 5, 7]])
    both = str(tmp_path / "hexwedge.msh")
    meshio.write(both, _msh(box.vertices, [("hexahedron", hexes), ("wedge", wedge)]), file_format="gmsh22")
    with pytest.raises(ValueError, match="wedge"):
        read_gmsh(both, order=2)

    good = str(tmp_path / "good.msh")
    _write_hex8(good, box.vertices, box.cells, "gmsh22")
    with pytest.raises(ValueError, match="order"):
        read_gmsh(good, order=0)
    with pytest.raises(ValueError, match="order"):
        read_gmsh(good, order=basis.MAX_ORDER + 1)
    with pytest.raises(TypeError, match="order"):
        read_gmsh(good, order=2.0)


def test_mixed_hex8_hex27_raises(tmp_path):
    path = tmp_path / "mixed.msh"
    pts, _ = _write_hex27_native(path, (1, 1, 1))
    msh = meshio.read(path)
    h27 = msh.cells_dict["hexahedron27"]
    mixed = str(tmp_path / "mixed2.msh")
    meshio.write(mixed, _msh(pts, [("hexahedron27", h27), ("hexahedron", h27[:, :8])]), file_format="gmsh22")
    with pytest.raises(ValueError, match="mixed"):
        read_gmsh(mixed, order=2)


# ---------------------------------------------------------------- bad files


def _good_file(tmp_path, fmt="gmsh22", binary=False, ne=(2, 1, 1)):
    box = box_mesh(ne, order=1)
    path = tmp_path / f"good_{fmt}_{int(binary)}.msh"
    meshio.write(str(path), _msh(box.vertices, [("hexahedron", box.cells[:, LEX_TO_VTK8])]),
                 file_format=fmt, binary=binary)
    return path, box


def _edited(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_text_and_garbage_files_are_value_errors_naming_the_file(tmp_path, monkeypatch):
    """meshio calls sys.exit(1) on a text file, which ended the caller's Python: now a ValueError."""
    text = _edited(tmp_path, "notes.msh", "hello world\nthis is not a mesh\n")
    with pytest.raises(ValueError, match=r"notes\.msh: not a readable Gmsh .msh mesh.*\$MeshFormat"):
        read_gmsh(text, order=2)
    garbage = tmp_path / "garbage.msh"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match=r"garbage\.msh: not a readable"):
        read_gmsh(garbage, order=2)
    empty = _edited(tmp_path, "empty.msh", "")
    with pytest.raises(ValueError, match=r"empty\.msh: the file is empty"):
        read_gmsh(empty, order=2)
    with pytest.raises(FileNotFoundError, match=r"missing\.msh"):
        read_gmsh(tmp_path / "missing.msh", order=2)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        read_gmsh(tmp_path, order=2)
    # whatever meshio does on a file it cannot parse (here: its sys.exit), the caller gets a ValueError
    good, _ = _good_file(tmp_path)
    monkeypatch.setattr(meshio, "read", lambda *a, **k: sys.exit(1))
    with pytest.raises(ValueError, match=r"good_gmsh22_0\.msh: not a readable"):
        read_gmsh(good, order=2)


@pytest.mark.parametrize("fmt, binary", [("gmsh22", False), ("gmsh22", True), ("gmsh", False), ("gmsh", True)])
@pytest.mark.parametrize("keep", [0.3, 0.7])
def test_truncated_files_name_the_file(tmp_path, fmt, binary, keep):
    good, _ = _good_file(tmp_path, fmt, binary)
    data = good.read_bytes()
    cut = tmp_path / "cut.msh"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.msh: .*(truncated|malformed)"):
        read_gmsh(cut, order=2)


ELEMENT_1 = "1 5 2 1 1 1 2 5 4 7 8 11 10"  # element 1 of the (2, 1, 1) box as meshio writes it (gmsh 2.2)


@pytest.mark.parametrize("bad, match", [
    ("99", r"element 1 uses node id 99, which \$Nodes does not define"),
    ("0", "element 1 uses node id 0"),      # meshio wrapped it silently to the last node
    ("-3", "element 1 uses node id -3"),
])
def test_bad_node_ids_are_named(tmp_path, bad, match):
    good, _ = _good_file(tmp_path)
    text = good.read_text()
    assert ELEMENT_1 in text
    path = _edited(tmp_path, "badid.msh", text.replace(ELEMENT_1, ELEMENT_1[:-2] + bad))
    with pytest.raises(ValueError, match=r"badid\.msh: " + match):
        read_gmsh(path, order=2)


def test_bad_node_ids_v41_and_redefined_ids(tmp_path):
    good, _ = _good_file(tmp_path, "gmsh")
    text = good.read_text()
    assert "\n1 1 2 5 4 7 8 11 10\n" in text
    path = _edited(tmp_path, "badid41.msh", text.replace("\n1 1 2 5 4 7 8 11 10\n", "\n1 1 2 5 4 7 8 11 0\n"))
    with pytest.raises(ValueError, match=r"badid41\.msh: element 1 uses node id 0"):
        read_gmsh(path, order=2)
    # node 5 defined twice (meshio silently kept the second definition)
    good22, _ = _good_file(tmp_path)
    text = good22.read_text().replace("$Nodes\n12\n", "$Nodes\n13\n").replace("$EndNodes", "5 9.0 9.0 9.0\n$EndNodes")
    with pytest.raises(ValueError, match=r"dup\.msh: node id 5 is defined more than once"):
        read_gmsh(_edited(tmp_path, "dup.msh", text), order=2)
    # announced and listed counts differ
    text = good22.read_text().replace("$Nodes\n12\n", "$Nodes\n14\n")
    with pytest.raises(ValueError, match=r"count\.msh: .*announces 14 nodes and lists 12"):
        read_gmsh(_edited(tmp_path, "count.msh", text), order=2)


def test_non_finite_coordinates_and_repeated_corners(tmp_path):
    good, _ = _good_file(tmp_path)
    text = good.read_text()
    line2 = next(r for r in text.splitlines() if r.startswith("2 "))
    nan = _edited(tmp_path, "nan.msh", text.replace(line2, "2 nan " + line2.split(None, 2)[2]))
    with pytest.raises(ValueError, match=r"nan\.msh: node 2 has non-finite coordinates"):
        read_gmsh(nan, order=2)
    rep = _edited(tmp_path, "rep.msh", text.replace(ELEMENT_1, "1 5 2 1 1 1 1 5 4 7 8 11 10"))
    with pytest.raises(ValueError, match=r"rep\.msh: hexahedron number 1 \(in file order\) repeats a corner node"):
        read_gmsh(rep, order=2)


def _duplicated_node_file(tmp_path, offset=0.0):
    """The (2, 1, 1) box with its shared face's 4 nodes duplicated (ids 13–16) for element 2."""
    good, box = _good_file(tmp_path)
    text = good.read_text()
    pts = box.vertices
    shared = [2, 5, 8, 11]  # file ids of the x = 0.5 face
    extra = "".join(f"{13 + k} {float(pts[i - 1][0]) + offset!r} {float(pts[i - 1][1])!r} {float(pts[i - 1][2])!r}\n"
                    for k, i in enumerate(shared))
    text = text.replace("$Nodes\n12\n", "$Nodes\n16\n").replace("$EndNodes", extra + "$EndNodes")
    e2 = next(r for r in text.splitlines() if r.startswith("2 5 2 "))
    head, nodes = e2.split()[:5], e2.split()[5:]
    nodes = [str(13 + shared.index(int(v))) if int(v) in shared else v for v in nodes]
    path = _edited(tmp_path, "dupnodes.msh", text.replace(e2, " ".join(head + nodes)))
    return path, box


def test_coincident_duplicate_nodes_are_merged(tmp_path):
    """Two node ids at one point made two disconnected elements (an internal Dirichlet wall):
    they are merged (with a warning naming them), so the mesh numbers like the box."""
    path, box = _duplicated_node_file(tmp_path, offset=1e-14)
    with pytest.warns(UserWarning, match=r"dupnodes\.msh: merged 4 corner node\(s\).*13→2"):
        mesh = read_gmsh(path, order=3)
    assert len(mesh.vertices) == 12
    assert number_nodes(mesh).num_global == number_nodes(box_mesh((2, 1, 1), order=3)).num_global == 7 * 4 * 4
    assert np.max(np.abs(mesh.x - box_mesh((2, 1, 1), order=3).x)) <= 1e-13
    with pytest.raises(ValueError,
                       match=r"dupnodes\.msh: 4 pair\(s\) of corner nodes coincide, e\.g\. node ids \d+ and \d+"):
        read_gmsh(path, order=3, merge_tol=None)
    with pytest.raises(ValueError, match="merge_tol"):
        read_gmsh(path, order=3, merge_tol=-1.0)
    # nodes a visible distance apart are distinct nodes (here: a gap, two separate elements)
    path, _ = _duplicated_node_file(tmp_path, offset=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mesh = read_gmsh(path, order=3)
    assert len(mesh.vertices) == 16 and number_nodes(mesh).num_global == 2 * 4**3


# ---------------------------------------------------------------- counts a binary file cannot hold


def _binary_file(tmp_path, version):
    """The (3, 3, 3) box as a binary .msh of ``version`` (64 nodes, 27 hexahedra, one entity block each)."""
    box = box_mesh((3, 3, 3), order=1)
    path = tmp_path / f"box{version}.msh"
    meshio.gmsh.write(str(path), _msh(box.vertices, [("hexahedron", box.cells[:, LEX_TO_VTK8])]),
                      fmt_version=version, binary=True)
    return path.read_bytes()


# Where each count sits, in bytes after its section's "$Nodes\n" / "$Elements\n" line (version 2:
# after the count line that follows it), and its struct format; None: that ASCII count line.
# 4.0: (blocks, total) then blocks of (tag, dim, parametric/type, count); 4.1: (blocks, total,
# min tag, max tag) then blocks of (dim, tag, parametric/type, count).
_COUNTS = {
    ("2.2", "nodes"): ("Nodes", None), ("2.2", "elements"): ("Elements", None),
    ("2.2", "element block"): ("Elements", (4, "=i")),
    ("4.0", "nodes"): ("Nodes", (8, "=Q")), ("4.0", "node block"): ("Nodes", (16 + 12, "=Q")),
    ("4.0", "element block"): ("Elements", (16 + 12, "=Q")), ("4.0", "entity blocks"): ("Nodes", (0, "=Q")),
    ("4.1", "nodes"): ("Nodes", (8, "=Q")), ("4.1", "node block"): ("Nodes", (32 + 12, "=Q")),
    ("4.1", "elements"): ("Elements", (8, "=Q")), ("4.1", "element block"): ("Elements", (32 + 12, "=Q")),
    ("4.1", "entity blocks"): ("Elements", (0, "=Q")),
}
_CLAIM = {"nodes": r"\$Nodes claims {} nodes", "elements": r"\$Elements claims {} elements",
          "node block": r"\$Nodes entity block 1 of 1 claims {} nodes",
          "element block": r"\$Elements (entity )?block 1 (of 1|\(type 5\)) claims {} elements",
          "entity blocks": r"\$(Nodes|Elements) claims {} entity blocks"}


def _inflated(data, version, count_name, count, cut):
    """``data`` with one count set to ``count``; ``cut``: the file ends 40 bytes after that count."""
    section, where = _COUNTS[version, count_name]
    head = data.index(f"\n${section}\n".encode()) + len(section) + 3
    if where is None:  # version 2: "count\n" before the binary records
        end = data.index(b"\n", head)
        data, after = data[:head] + str(count).encode() + data[end:], head + len(str(count))
    else:
        if version == "2.2":  # the binary blocks follow the count line
            head = data.index(b"\n", head) + 1
        at = head + where[0]
        data = data[:at] + struct.pack(where[1], count) + data[at + struct.calcsize(where[1]):]
        after = at + struct.calcsize(where[1])
    return data[:after + 40] if cut else data


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("version, count_name", sorted(_COUNTS))
def test_binary_counts_larger_than_the_file_are_refused_before_allocating(tmp_path, version, count_name, cut):
    """A count of 10⁷ (hundreds of MB) in a file of a few KB: refused naming the file and the count,
    with less than 8 MB allocated while reading (before: meshio allocated for the count, 0.3–0.4 GB)."""
    path = tmp_path / "inflated.msh"
    path.write_bytes(_inflated(_binary_file(tmp_path, version), version, count_name, 10**7, cut))
    tracemalloc.start()
    try:
        # cut, the file may end before a total it states truly: then that total is the count refused
        claim = r"\$\w+ .*claims \d+ [a-z ]+" if cut else _CLAIM[count_name].format(10**7)
        with pytest.raises(ValueError, match=r"inflated\.msh: " + claim
                           + r" \(at least \d+ bytes, \d+ each\) but only \d+ bytes follow in the \d+-byte file"):
            read_gmsh(path, order=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MB allocated"


@pytest.mark.parametrize("version, count_name", [("2.2", "nodes"), ("4.1", "nodes"), ("4.0", "node block"),
                                                 ("4.1", "element block")])
def test_terabyte_counts_are_value_errors_not_memory_errors(tmp_path, version, count_name):
    path = tmp_path / "huge.msh"
    path.write_bytes(_inflated(_binary_file(tmp_path, version), version, count_name, 10**12, cut=False))
    with pytest.raises(ValueError, match=r"huge\.msh: " + _CLAIM[count_name].format(10**12)):
        read_gmsh(path, order=2)


@pytest.mark.parametrize("version", ["2.2", "4.0", "4.1"])
def test_binary_files_with_true_counts_still_read(tmp_path, version):
    path = tmp_path / "box.msh"
    path.write_bytes(_binary_file(tmp_path, version))
    mesh = read_gmsh(path, order=2)
    assert mesh.num_elements == 27 and np.abs(mesh.x - box_mesh((3, 3, 3), order=2).x).max() < 1e-14


def test_ascii_v41_node_total_larger_than_listed_is_refused(tmp_path):
    """meshio allocates for $Nodes' total in ASCII 4.1 files too (before: a MemoryError for 10¹²)."""
    good, _ = _good_file(tmp_path, "gmsh")
    text = good.read_text()
    assert "$Nodes\n1 12 1 12\n" in text
    for total in (13, 10**12):
        path = _edited(tmp_path, "total.msh", text.replace("$Nodes\n1 12 1 12\n", f"$Nodes\n1 {total} 1 12\n"))
        with pytest.raises(ValueError, match=rf"total\.msh: .*\$Nodes announces {total} nodes and lists 12"):
            read_gmsh(path, order=2)


# ---------------------------------------------------------------- physical surface groups


def _grouped_file(tmp_path, ne, groups, seed=0, rotate=True, binary=False, names=True):
    """The box ``ne`` as a hex8 file with shuffled, (optionally) rotated elements and permuted node
    ids, and one physical surface group of quads per entry of ``groups``: a box side's name, or
    ``(name, rows)`` with rows (box element, local face). Tags 11, 12, …; named unless ``names`` is
    False. Returns the path, the box and ``eorder`` (file element → box element)."""
    rng = np.random.default_rng(seed)
    box = box_mesh(ne, order=1)
    E, V = box.num_elements, len(box.vertices)
    eorder = rng.permutation(E)
    identity = next(k for k, R in enumerate(ROTATIONS) if np.array_equal(R, np.eye(3)))
    rot = rng.integers(0, 24, E) if rotate else np.full(E, identity)
    vperm = rng.permutation(V)
    cells = np.stack([vperm[box.cells[eorder[e]][_corner_perm(ROTATIONS[rot[e]])]] for e in range(E)])
    blocks = [("hexahedron", cells[:, LEX_TO_VTK8])]
    tags = [np.ones(E, dtype=int)]
    field = {"fluid": np.array([1, 3])}
    for k, g in enumerate(groups):
        g, rows = (g, box.boundary(g)) if isinstance(g, str) else g
        quads = vperm[box.cells[rows[:, 0, None], FACE_CORNERS[rows[:, 1]]][:, [0, 1, 3, 2]]]  # counter-clockwise
        blocks.append(("quad", quads))
        tags.append(np.full(len(quads), 11 + k))
        if names:
            field[g] = np.array([11 + k, 2])
    msh = meshio.Mesh(box.vertices[np.argsort(vperm)], blocks, field_data=field,
                      cell_data={"gmsh:physical": tags, "gmsh:geometrical": tags})
    path = tmp_path / f"grouped_{seed}_{int(rotate)}_{int(binary)}.msh"
    meshio.write(str(path), msh, file_format="gmsh22", binary=binary)
    return path, box, eorder


def _face_points(mesh, rows):
    """GLL node coordinates of the faces ``rows`` (element, local face): (3, F, n, n)."""
    from jaxsem.mesh.box import _face_nodes

    return _face_nodes(mesh.x, rows[:, 0], rows[:, 1])


@pytest.mark.parametrize("binary", [False, True])
def test_physical_surfaces_become_boundary_groups(tmp_path, binary):
    """Every side of a (3, 3, 4) box in rotated, shuffled elements: each group holds exactly the
    box's faces of that side (same elements, mapped through the shuffle), its nodes on the side."""
    sides = ["xmin", "xmax", "ymin", "ymax", "zmin", "zmax"]
    path, box, eorder = _grouped_file(tmp_path, (3, 3, 4), sides, binary=binary)
    mesh = read_gmsh(path, order=3)
    assert sorted(mesh.boundaries) == sorted(sides)
    for k, side in enumerate(sides):
        rows = mesh.boundary(side)
        assert sorted(eorder[rows[:, 0]].tolist()) == sorted(box.boundary(side)[:, 0].tolist())
        x = _face_points(mesh, rows)[k // 2]
        assert np.abs(x - (0.0 if k % 2 == 0 else 1.0)).max() < 1e-14, side
    # the groups cover the boundary faces the numbering finds, each once
    faces = np.concatenate(list(mesh.boundaries.values()))
    bf = number_nodes(mesh).boundary_faces
    assert sorted(map(tuple, faces.tolist())) == sorted(map(tuple, bf.tolist()))


def test_unnamed_groups_and_interior_quads(tmp_path):
    """A group without a $PhysicalNames entry is "surface_<tag>"; a quad on a face of two
    hexahedra gives both (element, face) rows (and is refused as a Dirichlet group)."""
    path, box, eorder = _grouped_file(tmp_path, (3, 2, 2), ["xmin", "ymax"], names=False)
    mesh = read_gmsh(path, order=2)
    assert sorted(mesh.boundaries) == ["surface_11", "surface_12"]
    assert len(mesh.boundary("surface_11")) == 4 and len(mesh.boundary("surface_12")) == 6
    # the (3, 2, 2) box's internal plane x = 1/3 as a group: 4 quads, 8 rows
    plane = np.array([[e, 1] for e in range(12) if e % 3 == 0])
    inner, box, eorder = _grouped_file(tmp_path, (3, 2, 2), ["xmin", ("plane", plane)], seed=1)
    mesh = read_gmsh(inner, order=2)
    rows = mesh.boundary("plane")
    assert sorted(eorder[rows[:, 0]].tolist()) == [0, 1, 3, 4, 6, 7, 9, 10]
    assert np.abs(_face_points(mesh, rows)[0] - 1 / 3).max() < 1e-14
    with pytest.raises(ValueError, match="boundary group 'plane': face .* is not on the domain boundary"):
        jaxsem.discretize(mesh, dirichlet=["plane"])


def test_group_quads_that_are_no_face_are_refused(tmp_path):
    path, box, eorder = _grouped_file(tmp_path, (2, 2, 2), ["zmin"])
    msh = meshio.read(path)
    hexa = msh.cells_dict["hexahedron"]
    cells = [("hexahedron", hexa), ("quad", np.array([hexa[0, [0, 1, 6, 7]]]))]  # a diagonal plane of element 1
    bad = meshio.Mesh(msh.points, cells, field_data={"cut": np.array([5, 2])},
                      cell_data={"gmsh:physical": [np.ones(8, int), np.array([5])],
                                 "gmsh:geometrical": [np.ones(8, int), np.array([5])]})
    meshio.write(str(tmp_path / "cut.msh"), bad, file_format="gmsh22", binary=False)
    ids = [int(i) + 1 for i in hexa[0, [0, 1, 6, 7]]]
    with pytest.raises(ValueError, match=rf"cut\.msh: physical surface group 'cut': quad 1 of the group "
                                         rf"\(corner node ids \[{ids[0]}, {ids[1]}, {ids[2]}, {ids[3]}\]\) "
                                         r"is no face of a hexahedron"):
        read_gmsh(tmp_path / "cut.msh", order=2)
    tri = meshio.Mesh(msh.points, [("hexahedron", hexa), ("triangle", np.array([hexa[0, :3]]))],
                      field_data={"tri": np.array([5, 2])},
                      cell_data={"gmsh:physical": [np.ones(8, int), np.array([5])],
                                 "gmsh:geometrical": [np.ones(8, int), np.array([5])]})
    meshio.write(str(tmp_path / "tri.msh"), tri, file_format="gmsh22", binary=False)
    with pytest.raises(ValueError, match=r"tri\.msh: physical surface group 'tri' holds \['triangle'\] cells"):
        read_gmsh(tmp_path / "tri.msh", order=2)


# ---------------------------------------------------------------- make_periodic


def _same_classes(gid_a, gid_b):
    """The two numberings identify the same nodes (equal up to relabelling)."""
    pairs = np.unique(np.stack([gid_a.ravel(), gid_b.ravel()]), axis=1)
    return len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]


@pytest.mark.parametrize("ne", [(3, 3, 3), (3, 4, 1)])
def test_make_periodic_box_equals_the_periodic_box(ne):
    """A box made periodic in z by its zmin/zmax groups numbers and discretizes as box_mesh with
    periodic z, on the formula path (box kept) and the general one (elements=None)."""
    import dataclasses

    kw = dict(order=3, lengths=(1.0, 2.0, 0.5), deform=0.1)
    ref = box_mesh(ne, periodic=(False, False, True), **kw)
    made = make_periodic(box_mesh(ne, **kw), "zmin", "zmax")
    assert made.periodic == (False, False, True) and made.elements == ne
    assert np.array_equal(made.periodic_faces, ref.periodic_faces)
    assert sorted(made.boundaries) == ["xmax", "xmin", "ymax", "ymin"]
    general = make_periodic(dataclasses.replace(box_mesh(ne, **kw), elements=None), "zmax", "zmin")
    assert general.elements is None and len(general.periodic_faces) == ne[0] * ne[1]
    n_ref = number_nodes(ref)
    for mesh in (made, general):
        n = number_nodes(mesh)
        assert n.num_global == n_ref.num_global
        assert np.array_equal(n.gid, n_ref.gid)
        assert np.array_equal(np.sort(n.boundary_faces, axis=0), np.sort(n_ref.boundary_faces, axis=0))
    s_ref = jaxsem.discretize(ref)
    s = jaxsem.discretize(general)
    assert s.num_global == s_ref.num_global
    assert np.array_equal(np.asarray(s.mask), np.asarray(s_ref.mask))
    u = np.random.default_rng(1).standard_normal(s.x.shape[1:])
    assert np.abs(np.asarray(s.dssum(u)) - np.asarray(s_ref.dssum(u))).max() < 1e-13


def test_make_periodic_of_a_gmsh_file(tmp_path):
    """Shuffled elements and node ids, orientation kept: the same identifications as the periodic box;
    rotated elements (face-local orders that differ): refused, naming both groups."""
    path, box, eorder = _grouped_file(tmp_path, (3, 3, 3), ["zmin", "zmax", "xmin"], rotate=False)
    mesh = make_periodic(read_gmsh(path, order=3), "zmin", "zmax")
    assert sorted(mesh.boundaries) == ["xmin"] and len(mesh.periodic_faces) == 9
    ref = number_nodes(box_mesh((3, 3, 3), order=3, periodic=(False, False, True)))
    assert number_nodes(mesh).num_global == ref.num_global
    assert _same_classes(number_nodes(mesh).gid, ref.gid[eorder])

    path, _, _ = _grouped_file(tmp_path, (3, 3, 3), ["zmin", "zmax"], seed=3, rotate=True)
    with pytest.raises(ValueError, match=r"groups 'zmin' \(9 faces\) and 'zmax' \(9 faces\): face \d of element "
                                         r"\d+ and its translate .* have other face-local orientations"):
        make_periodic(read_gmsh(path, order=3), "zmin", "zmax")


def test_make_periodic_errors():
    box = box_mesh((3, 3, 2), order=2)
    with pytest.raises(ValueError, match=r"a must name one of the mesh's boundary groups \[.*\], got 'front'"):
        make_periodic(box, "front", "zmax")
    with pytest.raises(ValueError, match="b must name one of"):
        make_periodic(box, "zmin", 3)
    with pytest.raises(ValueError, match="a and b must be two different boundary groups, got 'zmin' twice"):
        make_periodic(box, "zmin", "zmin")
    with pytest.raises(ValueError, match=r"groups 'zmin' \(9 faces\) and 'xmax' \(6 faces\) cannot be paired"):
        make_periodic(box, "zmin", "xmax")
    with pytest.raises(ValueError, match=r"'xmin' \(6 faces\) and 'ymin' \(6 faces\) do not match by the translation"):
        make_periodic(box_mesh((3, 3, 2), order=2), "xmin", "ymin")
    with pytest.raises(ValueError, match=r"do not match by the translation \[0.0, 0.0, 0.5\]: face 4 of element 0"):
        make_periodic(box, "zmin", "zmax", shift=(0, 0, 0.5))
    with pytest.raises(ValueError, match="shift must be 3 finite numbers"):
        make_periodic(box, "zmin", "zmax", shift=(0, 1))
    periodic = make_periodic(box, "zmin", "zmax", shift=(0, 0, 1.0))
    with pytest.raises(ValueError, match="a must name one of the mesh's boundary groups"):
        make_periodic(periodic, "zmin", "zmax")
