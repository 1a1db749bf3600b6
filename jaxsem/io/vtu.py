"""Writing results that ParaView opens: VTU files of element-local (E-vector) fields via meshio.

Each element's GLL nodes become points of their own (shared nodes are repeated,
so discontinuous DG fields are written exactly) and its (n−1)³ node cells become
linear hexahedra — the simplest ParaView-compatible picture of a high-order
field. A part of a distributed run writes its own ``PATH.rank<r>.vtu``
(:func:`rank_path`) and rank 0 also writes ``PATH.pvtu``, the index that opens
every rank's part at once. Every file is written through
:func:`jaxsem.io.atomic.atomic_output`.
"""

from __future__ import annotations

import os
from xml.sax.saxutils import quoteattr

import numpy as np

from .atomic import atomic_output, check_writable

__all__ = ["write_vtu", "rank_path", "vtu_cells", "vtu_points"]


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


def _stem(path: str) -> str:
    return path[:-4] if path.endswith(".vtu") else path


def rank_path(path: str, comm) -> str:
    """``path`` on one process; ``PATH.rank{r}.vtu`` (``.vtu`` stripped first) on rank r of a distributed run."""
    if getattr(comm, "size", 1) <= 1:
        return path
    return f"{_stem(path)}.rank{comm.rank}.vtu"


def write_vtu(path, mesh_or_x, **fields) -> str:
    """Write node fields on a mesh's GLL nodes to a ``.vtu`` file; returns the path.

    Args:
      path: output file name (``.vtu``); checked by :func:`check_writable` first.
      mesh_or_x: a :class:`jaxsem.mesh.Mesh`, :class:`jaxsem.dg.DG`,
        :class:`jaxsem.discretization.SEM` (anything with ``.x``) or the
        coordinates ``(3, E, n, n, n)``.
      fields: name = array of shape ``(E, n, n, n)`` (scalar) or
        ``(c, E, n, n, n)`` (c components, e.g. ``E=q[:3]``); NumPy or JAX.

    Written through :func:`atomic_output`. A rank's part of a distributed discretization
    (``mesh_or_x.comm`` over several MPI ranks) written to its :func:`rank_path`: rank 0
    also writes ``PATH.pvtu``, naming every rank's file.
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
    with atomic_output(path) as fh:
        meshio.write(fh.name, mesh, file_format="vtu")  # meshio's XML writer takes a file name only
    comm = getattr(mesh_or_x, "comm", None)
    piece = f".rank{getattr(comm, 'rank', 0)}.vtu"
    if getattr(comm, "name", None) == "mpi" and comm.size > 1 and comm.rank == 0 and path.endswith(piece):
        _write_pvtu(path[: -len(piece)] + ".pvtu", [f"{path[: -len(piece)]}.rank{r}.vtu" for r in range(comm.size)],
                    {name: (1 if a.ndim == 1 else a.shape[1]) for name, a in point_data.items()})
    return path


def _write_pvtu(path: str, pieces: list[str], components: dict[str, int]) -> str:
    """The ParaView index of per-rank ``.vtu`` files: ``pieces`` (named relative to ``path``'s
    folder) with point fields ``components`` (name -> components), float64 as :func:`write_vtu` writes."""
    folder = os.path.dirname(os.path.abspath(path))
    arrays = "".join(f'      <PDataArray type="Float64" Name={quoteattr(name)} NumberOfComponents="{c}"/>\n'
                     for name, c in components.items())
    sources = "".join(f"    <Piece Source={quoteattr(os.path.relpath(os.path.abspath(p), folder))}/>\n"
                      for p in pieces)
    text = ('<?xml version="1.0"?>\n'
            '<VTKFile type="PUnstructuredGrid" version="0.1" byte_order="LittleEndian">\n'
            '  <PUnstructuredGrid GhostLevel="0">\n'
            f"    <PPointData>\n{arrays}    </PPointData>\n"
            '    <PPoints>\n      <PDataArray type="Float64" NumberOfComponents="3"/>\n    </PPoints>\n'
            f"{sources}"
            "  </PUnstructuredGrid>\n</VTKFile>\n")
    check_writable(path)
    with atomic_output(path) as fh:
        fh.write(text.encode("utf-8"))
    return path
