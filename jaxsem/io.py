"""Writing results that ParaView opens: VTU files of element-local (E-vector) fields via meshio.

Each element's GLL nodes become points of their own (shared nodes are repeated,
so discontinuous DG fields are written exactly) and its (n−1)³ node cells become
linear hexahedra — the simplest ParaView-compatible picture of a high-order
field. Checkpoints live in :mod:`jaxsem.timestepping` (``save_checkpoint``).

Output paths are checked up front (:func:`check_writable`: call it before a long
run, so that a bad path fails before the results exist), and files are written
atomically: to a temporary file in the same folder, then renamed into place; the
temporary file is removed whatever happens (an error, Ctrl-C), so a reader never
sees half a file and no ``*.tmp.vtu`` is left behind.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import numpy as np

__all__ = ["write_vtu", "check_writable", "rank_path", "vtu_cells", "vtu_points"]


def _coords(mesh_or_x) -> np.ndarray:
    x = getattr(mesh_or_x, "x", mesh_or_x)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 5 or x.shape[0] != 3 or not (x.shape[2] == x.shape[3] == x.shape[4] >= 2):
        raise ValueError(f"coordinates must have shape (3, E, n, n, n) with n >= 2, got {x.shape}")
    return x


def vtu_points(x) -> np.ndarray:
    """``(E·n³, 3)`` points in E-vector order (``[e, k, j, i]``, i fastest)."""
    x = _coords(x)
    return np.ascontiguousarray(x.reshape(3, -1).T)


def vtu_cells(num_elements: int, n: int) -> np.ndarray:
    """``(E·(n−1)³, 8)`` VTK hexahedra (corner order of ``VTK_HEXAHEDRON``) over the nodes."""
    m = n - 1
    k, j, i = np.meshgrid(np.arange(m), np.arange(m), np.arange(m), indexing="ij")
    idx = lambda kk, jj, ii: (kk * n + jj) * n + ii
    local = np.stack([
        idx(k, j, i), idx(k, j, i + 1), idx(k, j + 1, i + 1), idx(k, j + 1, i),
        idx(k + 1, j, i), idx(k + 1, j, i + 1), idx(k + 1, j + 1, i + 1), idx(k + 1, j + 1, i),
    ], axis=-1).reshape(-1, 8)
    offsets = (np.arange(num_elements) * n**3)[:, None, None]
    return (local[None] + offsets).reshape(-1, 8).astype(np.int64)


def rank_path(path: str, comm) -> str:
    """``path`` on one process; ``PATH.rank{r}.vtu`` (``.vtu`` stripped first) on rank r of a distributed run."""
    if getattr(comm, "size", 1) <= 1:
        return path
    return f"{path[:-4] if path.endswith('.vtu') else path}.rank{comm.rank}.vtu"


def check_writable(path) -> str:
    """Refuse an output path that cannot be written, before any work: returns ``os.fspath(path)``.

    Raises ``ValueError`` naming the path for an empty path, a directory, a folder
    that does not exist (or is not a folder), and a folder this process cannot
    create files in (tested by creating and removing a probe file there, the one
    test that sees permissions, ACLs and read-only file systems alike).
    """
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise ValueError(f"output path must be a non-empty file name, got {path!r}")
    if os.path.isdir(p):
        raise ValueError(f"output path {p!r} is a directory; give a file name in it, e.g. "
                         f"{os.path.join(p, 'result.vtu')!r}")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise ValueError(f"output path {p!r}: folder {folder!r} does not exist or is not a folder")
    probe = _temp_name(p)
    try:
        with open(probe, "xb"):
            pass
    except OSError as err:
        raise ValueError(f"output path {p!r}: cannot create files in {folder!r} ({err.strerror or err})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return p


def _temp_name(path: str) -> str:
    """A fresh name beside ``path`` (same folder, so the final rename is atomic); unique per process."""
    folder, base = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{base}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.vtu")


def write_vtu(path, mesh_or_x, **fields) -> str:
    """Write node fields on a mesh's GLL nodes to a ``.vtu`` file; returns the path.

    Args:
      path: output file name (``.vtu``); checked by :func:`check_writable` first.
      mesh_or_x: a :class:`jaxsem.mesh.Mesh`, :class:`jaxsem.dg.DG`,
        :class:`jaxsem.discretization.SEM` (anything with ``.x``) or the
        coordinates ``(3, E, n, n, n)``.
      fields: name = array of shape ``(E, n, n, n)`` (scalar) or
        ``(c, E, n, n, n)`` (c components, e.g. ``E=q[:3]``); NumPy or JAX.

    The file is written to a temporary name in the same folder and renamed into
    place (atomic); the temporary file is removed on any failure or interrupt.
    """
    import meshio

    path = check_writable(path)
    x = _coords(mesh_or_x)
    E, n = x.shape[1], x.shape[2]
    point_data = {}
    for name, value in fields.items():
        a = np.asarray(value)
        if a.shape == (E, n, n, n):
            point_data[name] = a.reshape(-1).astype(np.float64)
        elif a.ndim == 5 and a.shape[1:] == (E, n, n, n):
            point_data[name] = np.ascontiguousarray(a.reshape(a.shape[0], -1).T).astype(np.float64)
        else:
            raise ValueError(f"field {name!r} must have shape (E, n, n, n) = {(E, n, n, n)} or "
                             f"(c, E, n, n, n), got {a.shape}")
    mesh = meshio.Mesh(vtu_points(x), [("hexahedron", vtu_cells(E, n))], point_data=point_data)
    tmp = _temp_name(path)
    try:
        meshio.write(tmp, mesh, file_format="vtu")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone after the rename; removes a partial file otherwise
    return path
