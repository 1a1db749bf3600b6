"""Writing results that ParaView opens: VTU files of element-local (E-vector) fields via meshio.

Each element's GLL nodes become points of their own (shared nodes are repeated,
so discontinuous DG fields are written exactly) and its (n−1)³ node cells become
linear hexahedra — the simplest ParaView-compatible picture of a high-order
field. A part of a distributed run writes its own ``PATH.rank<r>.vtu``
(:func:`rank_path`) and rank 0 also writes ``PATH.pvtu``, the index that opens
every rank's part at once. Checkpoints live in :mod:`jaxsem.solvers.timestepping`
(``save_checkpoint``).

Output paths are checked up front (:func:`check_writable`: call it before a long
run, so that a bad path fails before the results exist), and every file is
written through :func:`atomic_output`: to a new file with a unique name in the
same folder, created exclusively (no other writer and no planted symlink can
share it), then renamed into place; the temporary file is removed whatever
happens (an error, a full disk, Ctrl-C), so a reader never sees half a file and
no temporary file is left behind. A symlink at a destination is refused, never
written through or replaced.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from xml.sax.saxutils import quoteattr

import numpy as np

__all__ = ["write_vtu", "check_writable", "atomic_output", "rank_path", "vtu_cells", "vtu_points"]


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


def _refuse_link(path, what: str) -> str:
    """``os.fspath(path)``, refused with a ``ValueError`` naming it when it is a symbolic link."""
    p = os.fspath(path)
    if isinstance(p, str) and p and os.path.islink(p):
        raise ValueError(f"{what} {p!r} is a symbolic link (to {os.readlink(p)!r}); refusing to write "
                         "through or replace it: give the path of a regular file")
    return p


def _create_exclusive(path: str) -> tuple[int, str]:
    """A new, empty file beside ``path`` with a unique name: ``(fd, name)``.

    ``O_CREAT | O_EXCL | O_NOFOLLOW``: the name is ours alone, even against another
    writer of the same ``path`` or a symlink planted under that name; the same folder,
    so the final rename is atomic. Mode ``0o666`` less the umask, as ``open`` gives. The
    name, ``.<base>.<host>.<pid>.<random>.tmp``, tells :func:`_reap_stale` whose it is.
    """
    folder, base = os.path.split(os.path.abspath(path))
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    for _ in range(16):
        tmp = os.path.join(folder, f".{base}.{_HOST}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path!r} after 16 tries")


_HOST = socket.gethostname().replace(os.sep, "_") or "host"


def _reap_stale(path: str) -> None:
    """Remove the temporary files beside ``path`` left by writers on this host that no longer run
    (killed mid-write: SIGKILL, out of memory); those of live writers and of other hosts stay."""
    folder, base = os.path.split(os.path.abspath(path))
    prefix = f".{base}.{_HOST}."
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid, _, token = name[len(prefix):-4].partition(".")
        if not (pid.isdigit() and token) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        except OSError:  # alive under another user
            pass


@contextlib.contextmanager
def atomic_output(path, what: str = "output path"):
    """A binary file object whose contents become ``path`` when the block ends without an exception.

    The data go to a new file beside ``path`` (:func:`_create_exclusive`), are flushed to
    disk and renamed onto ``path``: a reader sees the old file or the whole new one, and
    two writers of one ``path`` never share a temporary file (the last rename wins). On
    any exception (an error, a full disk, ``KeyboardInterrupt``) the temporary file is
    removed and ``path`` is untouched; a writer killed outright (SIGKILL) leaves its temporary
    file, which the next successful write of ``path`` on this host removes (:func:`_reap_stale`).
    ``fh.name`` is the temporary file's name, for writers
    that take a name. Raises ``ValueError`` naming ``what`` and the path when ``path`` is a
    symbolic link.
    """
    p = _refuse_link(path, what)
    fd, tmp = _create_exclusive(p)
    try:
        with open(tmp, "wb", opener=lambda _name, _flags: fd) as fh:  # the exclusive fd, named
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(p)
    _reap_stale(p)


def _fsync_folder(path: str) -> None:
    """Make the rename onto ``path`` durable (its folder's entry), where the OS allows it."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder; the rename itself stands
        pass
    finally:
        os.close(fd)


def check_writable(path, what: str = "output path") -> str:
    """Refuse an output path that cannot be written, before any work: returns ``os.fspath(path)``.

    Raises ``ValueError`` naming ``what`` and the path for an empty path, a symbolic
    link, a directory, a folder that does not exist (or is not a folder), and a folder
    this process cannot create files in (tested by creating and removing a probe file
    there, the one test that sees permissions, ACLs and read-only file systems alike).
    """
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise ValueError(f"{what} must be a non-empty file name, got {path!r}")
    _refuse_link(p, what)
    if os.path.isdir(p):
        raise ValueError(f"{what} {p!r} is a directory; give a file name in it, e.g. "
                         f"{os.path.join(p, 'result.vtu')!r}")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise ValueError(f"{what} {p!r}: folder {folder!r} does not exist or is not a folder")
    probe = None
    try:
        fd, probe = _create_exclusive(p)
        os.close(fd)
    except OSError as err:
        raise ValueError(f"{what} {p!r}: cannot create files in {folder!r} ({err.strerror or err})") from None
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)
    return p


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
