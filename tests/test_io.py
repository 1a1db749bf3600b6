"""VTU output round-trips through meshio."""

import os

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


def test_check_writable_refuses_bad_paths_up_front(tmp_path):
    """A directory, a missing folder, a file used as a folder, an empty name: refused with the
    path named, before any work (the CLI calls this before the run); a good path is returned."""
    good = tmp_path / "out.vtu"
    assert io.check_writable(good) == str(good)
    assert sorted(os.listdir(tmp_path)) == []  # the probe file is gone
    with pytest.raises(ValueError, match=r"is a directory.*result\.vtu"):
        io.check_writable(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        io.check_writable(tmp_path / "no" / "such" / "u.vtu")
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError, match="plain.*not a folder"):
        io.check_writable(tmp_path / "plain" / "u.vtu")
    with pytest.raises(ValueError, match="non-empty"):
        io.check_writable("")
    # and write_vtu refuses the same paths before writing anything
    mesh = box_mesh((1, 1, 1), 2)
    with pytest.raises(ValueError, match="is a directory"):
        io.write_vtu(tmp_path, mesh, u=np.zeros((1, 3, 3, 3)))
    assert sorted(os.listdir(tmp_path)) == ["plain"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_check_writable_refuses_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot create files"):
            io.check_writable(ro / "u.vtu")
    finally:
        ro.chmod(0o700)


def test_check_writable_refuses_a_read_only_file_system():
    """/proc refuses new files even to root."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    with pytest.raises(ValueError, match="cannot create files"):
        io.check_writable("/proc/self/u.vtu")


def test_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or an error) during the write: the previous file is intact, no *.tmp.vtu remains."""
    mesh = box_mesh((1, 1, 1), 2)
    path = tmp_path / "f.vtu"
    io.write_vtu(path, mesh, u=np.ones((1, 3, 3, 3)))
    before = path.read_bytes()

    def partial_write(name, *args, **kwargs):
        with open(name, "w") as f:
            f.write("<VTKFile half")
        raise KeyboardInterrupt

    monkeypatch.setattr(meshio, "write", partial_write)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            io.write_vtu(path, mesh, u=np.zeros((1, 3, 3, 3)))
    monkeypatch.setattr(meshio, "write", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError, match="No space"):
        io.write_vtu(path, mesh, u=np.zeros((1, 3, 3, 3)))
    assert os.listdir(tmp_path) == ["f.vtu"]
    assert path.read_bytes() == before


def test_symlink_destinations_are_refused(tmp_path):
    """A symlink where the output goes (dangling, to a file, to a folder) is refused by name, up front
    and at the write, and nothing is written through it."""
    mesh = box_mesh((1, 1, 1), 2)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for target in (victim, tmp_path / "nowhere", tmp_path):
        link = tmp_path / "u.vtu"
        link.symlink_to(target)
        with pytest.raises(ValueError, match=r"output path '.*u\.vtu' is a symbolic link"):
            io.check_writable(link)
        with pytest.raises(ValueError, match="is a symbolic link"):
            io.write_vtu(link, mesh, u=np.zeros((1, 3, 3, 3)))
        assert link.is_symlink() and os.readlink(link) == str(target)
        link.unlink()
    assert victim.read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["victim.txt"]  # no temporary file left


def test_atomic_output_removes_its_file_on_failure_and_keeps_the_mode(tmp_path):
    """An error inside the block: the old file stays, no temporary file; a new file gets the umask's mode."""
    path = tmp_path / "a.bin"
    with io.atomic_output(path) as fh:
        fh.write(b"old")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    for exc in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with io.atomic_output(path) as fh:
                fh.write(b"half")
                raise exc
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.bin"]


def test_distributed_parts_get_a_pvtu_index(tmp_path):
    """Each rank of an MPI run writes PATH.rank<r>.vtu; rank 0 also writes PATH.pvtu naming every part
    and the point fields with their components, which the parts hold."""
    import types
    import xml.etree.ElementTree as ET

    from jaxsem.parallel.comm import Comm

    mesh = box_mesh((2, 1, 1), 2)
    base = str(tmp_path / "u.vtu")
    for rank in range(3):
        comm = Comm(rank=rank, size=3)
        part = types.SimpleNamespace(x=mesh.x, comm=comm)
        io.write_vtu(io.rank_path(base, comm), part, u=mesh.x[0], V=mesh.x)
    assert sorted(os.listdir(tmp_path)) == ["u.pvtu", "u.rank0.vtu", "u.rank1.vtu", "u.rank2.vtu"]
    root = ET.parse(tmp_path / "u.pvtu").getroot()
    assert root.get("type") == "PUnstructuredGrid"
    grid = root.find("PUnstructuredGrid")
    assert [p.get("Source") for p in grid.findall("Piece")] == ["u.rank0.vtu", "u.rank1.vtu", "u.rank2.vtu"]
    fields = {a.get("Name"): int(a.get("NumberOfComponents")) for a in grid.find("PPointData")}
    assert fields == {"u": 1, "V": 3}
    back = meshio.read(tmp_path / "u.rank1.vtu")
    assert back.point_data["u"].size == mesh.x[0].size and back.point_data["V"].shape[1] == 3
    # one process: no index
    io.write_vtu(tmp_path / "one.vtu", types.SimpleNamespace(x=mesh.x, comm=Comm()), u=mesh.x[0])
    assert not (tmp_path / "one.pvtu").exists()
