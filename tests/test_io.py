"""VTU output round-trips through meshio."""

import meshio
import numpy as np
import pytest

from jaxsem import io
from jaxsem.mesh import box_mesh


def test_write_vtu_roundtrip(tmp_path):
    mesh = box_mesh((2, 1, 1), 3, deform=0.1)
    E, n = mesh.num_elements, mesh.n
    u = np.sin(mesh.x[0]) * mesh.x[1]
    vec = np.stack([mesh.x[0], 2 * mesh.x[1], -mesh.x[2]])
    path = io.write_vtu(tmp_path / "f.vtu", mesh, u=u, V=vec)
    back = meshio.read(path)
    assert np.allclose(back.points, mesh.x.reshape(3, -1).T)
    hexes = back.cells_dict["hexahedron"]
    assert hexes.shape == (E * (n - 1) ** 3, 8)
    assert np.allclose(back.point_data["u"].ravel(), u.ravel())
    assert np.allclose(back.point_data["V"], vec.reshape(3, -1).T)
    # Every sub-hex has positive volume (VTK corner order is right) and they tile the box.
    p = back.points[hexes]
    vol = np.einsum("ci,ci->c", np.cross(p[:, 1] - p[:, 0], p[:, 3] - p[:, 0]), p[:, 4] - p[:, 0])
    assert (vol > 0).all()
    assert not list(tmp_path.glob("*.tmp*"))


def test_write_vtu_bad_field(tmp_path):
    mesh = box_mesh((1, 1, 1), 2)
    with pytest.raises(ValueError, match="field 'u'"):
        io.write_vtu(tmp_path / "f.vtu", mesh, u=np.zeros(5))
    with pytest.raises(ValueError, match="coordinates"):
        io.write_vtu(tmp_path / "f.vtu", np.zeros((3, 2, 2)))


def test_rank_path():
    """One file per rank in a distributed run, the path itself on one process."""
    from jaxsem.parallel.comm import Comm

    assert io.rank_path("out/u.vtu", Comm()) == "out/u.vtu"
    assert io.rank_path("out/u.vtu", Comm(rank=1, size=2)) == "out/u.rank1.vtu"
    assert io.rank_path("out/u", Comm(rank=3, size=4)) == "out/u.rank3.vtu"
