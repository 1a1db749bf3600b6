"""Files a reader never sees half written: atomic replacement and up-front checks of output paths.

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

__all__ = ["atomic_output", "check_writable"]


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
