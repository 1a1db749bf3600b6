"""The DFG cylinder meshes (jaxsem.mesh.cylinder): valid, curved, named, the benchmark's constants."""

import sys

import meshio
import numpy as np
import pytest

import jaxsem
from jaxsem.core.geometry import geometric_factors, quadrature
from jaxsem.mesh import (DFG_2D, DFG_2D_1, DFG_2D_2, DFG_3D, DFG_3D_1Z, dfg_2d, dfg_3d, dfg_mesh, make_periodic,
                         read_gmsh)
from jaxsem.mesh.box import _face_nodes
from jaxsem.mesh.numbering import number_nodes

gmsh = pytest.importorskip("gmsh")

R = 0.05
# Radial gap of the geometry: on an arc of angle 2α (α = π/16 at level 0: a quarter in 4), the
# quadratic interpolant of the circle through its ends and midpoint has
# |x(ξ)|² = R² (1 − c² ξ² (1 − ξ²)), c = 1 − cos α, so it lies inside the circle by at most
# R c²/8 (at ξ² = 1/2) and, in the mean over the arc, R c²/2 · 2/15: the hole's area is smaller
# by 2π R² c²/15 (to a relative O(c)).
C0 = 1 - np.cos(np.pi / 16)
GAP = R * C0**2 / 8  # 2.3e-6 m = 4.6e-5 R
AREA_GAP = 2 * np.pi * R**2 * C0**2 / 15


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dfg")
    return {"2D": dfg_2d(tmp / "dfg2d.msh"), "3D": dfg_3d(tmp / "dfg3d.msh")}


@pytest.fixture(scope="module")
def meshes(files):
    return {"2D": make_periodic(read_gmsh(files["2D"], 4), "front", "back"), "3D": read_gmsh(files["3D"], 4)}


def _r(x, geometry):
    cx, cy = geometry.centre
    return np.hypot(x[0] - cx, x[1] - cy)


@pytest.mark.parametrize("case, E", [("2D", 176), ("3D", 736)])
def test_valid_with_the_named_groups(meshes, case, E):
    mesh = meshes[case]
    assert mesh.num_elements == E
    assert sorted(mesh.boundaries) == ["cylinder", "inlet", "outlet", "walls"]
    jac = np.asarray(geometric_factors(mesh.x, quadrature(4)).jac)
    assert jac.min() > 0 and jac.max() / jac.min() < 100  # graded, not degenerate
    sem = jaxsem.discretize(mesh, dirichlet=["inlet", "walls", "cylinder"])
    # the groups are the whole boundary (2-D: front and back are periodic), each face once
    bf = number_nodes(mesh).boundary_faces
    groups = np.concatenate(list(mesh.boundaries.values()))
    assert sorted(map(tuple, groups.tolist())) == sorted(map(tuple, bf.tolist()))
    assert sem.num_global == number_nodes(mesh).num_global


@pytest.mark.parametrize("case", ["2D", "3D"])
def test_groups_lie_on_their_sides(meshes, case):
    mesh, g = meshes[case], DFG_2D if case == "2D" else DFG_3D
    at = lambda name: _face_nodes(mesh.x, mesh.boundary(name)[:, 0], mesh.boundary(name)[:, 1])  # (3, F, n, n)
    assert np.abs(at("inlet")[0]).max() < 1e-14
    assert np.abs(at("outlet")[0] - g.length).max() < 1e-14
    walls = at("walls")
    dist = np.minimum(np.abs(walls[1]), np.abs(walls[1] - g.height))
    if case == "3D":
        dist = np.minimum(dist, np.minimum(np.abs(walls[2]), np.abs(walls[2] - g.height)))
    assert dist.max() < 1e-14
    walls_per_face = {"2D": 2 * 18, "3D": 2 * 19 * 4 + 2 * 184}[case]  # y walls (and z walls in 3-D)
    assert len(mesh.boundary("walls")) == walls_per_face
    assert len(mesh.boundary("inlet")) == len(mesh.boundary("outlet")) == (8 if case == "2D" else 32)
    assert len(mesh.boundary("cylinder")) == (16 if case == "2D" else 64)
    assert np.abs(_r(at("cylinder"), g) - R).max() < 1e-5


@pytest.mark.parametrize("case", ["2D", "3D"])
def test_cylinder_is_curved_to_second_order(files, case):
    """The file's quad9 nodes of the cylinder lie on the circle (round-off); so do the GLL nodes at
    order 2 (the geometry nodes); at order 4 the GLL nodes sample the quadratic geometry, within
    GAP = R c²/8 of the circle and reaching 0.9 of it (a straight-sided mesh: R c = 0.019 R off)."""
    g = DFG_2D if case == "2D" else DFG_3D
    msh = meshio.read(files[case])
    quads = np.concatenate([msh.cells[b].data[rows] for b, rows in enumerate(msh.cell_sets["cylinder"])
                            if rows is not None and len(rows)])
    assert quads.shape[1] == 9
    assert np.abs(_r(msh.points[quads].T, g) - R).max() < 1e-15
    for order in (2, 4):
        mesh = read_gmsh(files[case], order)
        rows = mesh.boundary("cylinder")
        gap = np.abs(_r(_face_nodes(mesh.x, rows[:, 0], rows[:, 1]), g) - R).max()
        if order == 2:
            assert gap < 1e-15
        else:
            assert 0.9 * GAP < gap < GAP * (1 + 1e-9)


@pytest.mark.parametrize("case", ["2D", "3D"])
def test_volume_is_the_channel_less_the_cylinder(meshes, case):
    """∫ 1 = the fluid volume plus the hole's geometric deficit AREA_GAP × depth (GLL at order 4 is
    exact on the triquadratic elements): the deficit matches to 1 % (it is 4e-7 of the volume)."""
    g = DFG_2D if case == "2D" else DFG_3D
    depth = 0.1 if case == "2D" else g.height
    volume = float(np.sum(geometric_factors(meshes[case].x, quadrature(4)).B))
    exact = g.volume * (depth if case == "2D" else 1.0)
    assert abs((volume - exact) / (AREA_GAP * depth) - 1) < 0.01


def test_2d_is_one_element_deep_and_periodic(files, meshes):
    mesh = meshes["2D"]
    pf = mesh.periodic_faces
    assert len(pf) == 176 and np.array_equal(pf[:, 0], pf[:, 2])  # each element's front and back
    assert set(pf[:, 1].tolist()) == {4} and set(pf[:, 3].tolist()) == {5}
    z = mesh.x[2]
    assert np.abs(z[:, 0] - 0).max() < 1e-15 and np.abs(z[:, -1] - 0.1).max() < 1e-15
    plain = read_gmsh(files["2D"], 4)
    assert number_nodes(mesh).num_global * 5 == number_nodes(plain).num_global * 4  # 5 node planes → 4
    assert sorted(plain.boundaries) == ["back", "cylinder", "front", "inlet", "outlet", "walls"]


def test_dfg_mesh_and_levels(tmp_path):
    mesh = dfg_mesh("2D", 3, path=tmp_path / "kept.msh")
    assert (tmp_path / "kept.msh").exists() and mesh.num_elements == 176 and mesh.order == 3
    assert sorted(mesh.boundaries) == ["cylinder", "inlet", "outlet", "walls"] and len(mesh.periodic_faces) == 176
    fine = read_gmsh(dfg_2d(tmp_path / "l1.msh", level=1, depth=0.05), 2)
    assert fine.num_elements == 4 * 176 and len(fine.boundary("cylinder")) == 32
    assert np.abs(fine.x[2].max() - 0.05) < 1e-15
    rows = fine.boundary("cylinder")
    gap = np.abs(_r(_face_nodes(fine.x, rows[:, 0], rows[:, 1]), DFG_2D) - R).max()
    assert gap < 1e-15
    with pytest.raises(ValueError, match="case must be '2D' or '3D', got '2d'"):
        dfg_mesh("2d", 4)
    with pytest.raises(ValueError, match=r"level must be an int in \[0, 6\].*got -1"):
        dfg_2d(tmp_path / "x.msh", level=-1)
    with pytest.raises(ValueError, match="depth must be a positive number"):
        dfg_2d(tmp_path / "x.msh", depth=0)


def test_version_2_and_4_files_give_the_same_groups(files, tmp_path):
    """meshio reads groups from $PhysicalNames + cell data (v2.2) and from cell_sets (v4.1)."""
    v22 = str(tmp_path / "dfg2d_v22.msh")
    gmsh.initialize(readConfigFiles=False, interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.open(str(files["2D"]))
        gmsh.option.setNumber("Mesh.MshFileVersion", 2.2)
        gmsh.write(v22)
    finally:
        gmsh.finalize()
    a, b = read_gmsh(files["2D"], 2), read_gmsh(v22, 2)
    assert sorted(a.boundaries) == sorted(b.boundaries)
    for name in a.boundaries:  # node ids and element order may differ: compare the faces' nodes
        fa = _face_nodes(a.x, a.boundary(name)[:, 0], a.boundary(name)[:, 1]).reshape(3, -1)
        fb = _face_nodes(b.x, b.boundary(name)[:, 0], b.boundary(name)[:, 1]).reshape(3, -1)
        assert np.allclose(np.sort(fa, axis=1), np.sort(fb, axis=1), atol=1e-15), name


def test_missing_gmsh_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gmsh", None)  # `import gmsh` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'jaxsem\[gmsh\]'"):
        dfg_3d(tmp_path / "x.msh")


def test_case_constants():
    """Re = Ū D / ν = 20, 100, 20; Ū is the mean of the inflow profile; c = 2F/(Ū² D (H))."""
    assert [round(c.reynolds, 12) for c in (DFG_2D_1, DFG_2D_2, DFG_3D_1Z)] == [20, 100, 20]
    H = 0.41
    x, w = np.polynomial.legendre.leggauss(6)  # exact for the quartic profiles
    y, w = H * (x + 1) / 2, w * H / 2
    for case in (DFG_2D_1, DFG_2D_2):
        assert abs(w @ case.inflow(y) / H - case.mean_velocity) < 1e-14
        assert abs(case.inflow(H / 2) - case.um) < 1e-15
        assert case.coefficient_scale == pytest.approx(2 / (case.mean_velocity**2 * 0.1))
    c = DFG_3D_1Z
    assert abs(w @ c.inflow(y[:, None], y[None, :]) @ w / H**2 - c.mean_velocity) < 1e-14
    assert c.coefficient_scale == pytest.approx(2 / (0.2**2 * 0.1 * 0.41))
    with pytest.raises(ValueError, match="needs z"):
        c.inflow(0.2)
    assert DFG_2D_2.reference["St"] == (0.295, 0.305) and DFG_3D_1Z.reference["c_D"] == (6.18533, 6.18533)
    assert set(DFG_2D_1.reference) == {"c_D", "c_L", "dp"}
    assert DFG_2D.volume == pytest.approx(2.2 * 0.41 - np.pi * R**2)


def test_a_callers_gmsh_session_is_left_as_it_was(tmp_path):
    gmsh.initialize(readConfigFiles=False, interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("mine")
        gmsh.model.geo.addPoint(0, 0, 0)
        gmsh.model.geo.synchronize()
        gmsh.option.setNumber("Mesh.ElementOrder", 3)
        dfg_2d(tmp_path / "x.msh")
        assert gmsh.isInitialized() and gmsh.model.getCurrent() == "mine"
        assert gmsh.model.getEntities() == [(0, 1)] and gmsh.option.getNumber("Mesh.ElementOrder") == 3
    finally:
        gmsh.finalize()
