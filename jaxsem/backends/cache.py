"""The CUDA kernel cache: a private directory, and libraries loaded only when their sha256 matches.

A kernel library is loaded into this process with ``ctypes``, so whoever can write the cache
can run code as its user. The cache (``$JAXSEM_CUDA_CACHE``, an absolute path; default
``~/.cache/jaxsem``) is therefore created with mode 0700 and used only while it is a directory
owned by the current user that neither group nor others can write (:func:`trusted_dir`).

Each library ``NAME.so`` is installed beside ``NAME.so.sha256``, the digest of the file the
build produced, in ``sha256sum`` format (``sha256sum -c NAME.so.sha256`` checks it); both are
written under temporary names and renamed into place (:func:`install`). A library is loaded only
when its content hashes to the recorded digest (:func:`load_verified`); a missing digest or a
mismatch (a truncated, replaced or stale file) means rebuild, or refuse where nothing can be
rebuilt.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["ENV", "cache_dir", "trusted_dir", "digest_file", "install", "mismatch", "load_verified"]

ENV = "JAXSEM_CUDA_CACHE"
_CHUNK = 1 << 20


def cache_dir(environ=os.environ) -> Path:
    """The cache directory named by ``environ[ENV]`` (``~`` expanded), or ``~/.cache/jaxsem`` if unset.

    ``ValueError`` naming the variable for an empty or relative value: a relative cache would
    move with the working directory, and an empty one would be the working directory itself.
    """
    value = environ.get(ENV)
    if value is None:
        return Path.home() / ".cache" / "jaxsem"
    path = Path(os.path.expanduser(value))  # unlike Path.expanduser, leaves an unknown ~user as is: refused below
    if not value.strip() or not path.is_absolute():
        raise ValueError(f"${ENV} must be an absolute path to a directory (or unset for ~/.cache/jaxsem), "
                         f"got {value!r}")
    return path


def trusted_dir(path: str | os.PathLike, uid: int | None = None) -> Path:
    """``path`` checked as a directory that only ``uid`` (default: this process's user) can write.

    A missing directory is created (parents with the usual mode, itself 0700). ``PermissionError``
    naming the directory, its owner and mode and the fix when it is owned by another user or is
    group- or world-writable; ``NotADirectoryError`` when it is something else.
    """
    path = Path(path)
    uid = os.getuid() if uid is None else uid
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask, which may also remove owner bits
        except FileExistsError:
            pass  # another process made it; checked below like any existing directory
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"the CUDA kernel cache {path} (${ENV}) is not a directory; "
                                 f"set ${ENV} to a directory of your own")
    mode = stat.S_IMODE(st.st_mode)
    problems = []
    if st.st_uid != uid:
        problems.append(f"is owned by uid {st.st_uid}, not by this user (uid {uid})")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit)
        problems.append(f"has mode {mode:04o} (writable by {who})")
    if problems:
        fix = (f"chmod go-w {path}" if st.st_uid == uid
               else f"set ${ENV} to a directory of your own (it is created with mode 0700)")
        raise PermissionError(f"the CUDA kernel cache {path} (${ENV}) {' and '.join(problems)}; a library "
                              f"there would be loaded into this process, so it must be a directory owned "
                              f"by you that only you can write. Fix: {fix}")
    return path


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest_file(lib: str | os.PathLike) -> Path:
    """Where the digest of library ``lib`` is recorded: ``NAME.so.sha256`` beside it."""
    lib = Path(lib)
    return lib.with_name(lib.name + ".sha256")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # readers see the old file or the whole new one
    except BaseException:
        os.unlink(tmp)
        raise


def install(built: str | os.PathLike, dest: str | os.PathLike) -> str:
    """Move the freshly built library ``built`` to ``dest`` with its sha256 recorded beside it.

    Both files are renamed into place, so a reader sees whole files; a reader between the two
    renames sees a mismatch and rebuilds. Returns the hex digest.
    """
    built, dest = Path(built), Path(dest)
    digest = _digest(built)
    _write_atomic(digest_file(dest), f"{digest}  {dest.name}\n")
    os.replace(built, dest)
    return digest


def mismatch(lib: str | os.PathLike) -> str | None:
    """Why library ``lib`` must not be loaded (missing, no recorded digest, another digest), or None."""
    lib = Path(lib)
    record = digest_file(lib)
    if not lib.is_file():
        return f"{lib} is not built"
    if not record.is_file():
        return f"{lib} has no {record.name} beside it"
    words = record.read_text(errors="replace").split()
    want = words[0].lower() if words else ""
    got = _digest(lib)
    if want != got:
        return f"{lib} has sha256 {got}, {record.name} records {want[:64]!r}"
    return None


def load_verified(lib: str | os.PathLike, rebuild: Callable[[str], None] | None = None,
                  load: Callable[[str], object] = ctypes.CDLL):
    """``load(lib)`` once ``lib`` hashes to its recorded digest; never before.

    On a mismatch (:func:`mismatch`), ``rebuild(reason)`` must build and :func:`install` it again,
    after which it is checked once more; without ``rebuild`` (libraries that are never compiled
    here) a mismatch is a ``RuntimeError`` saying why and how to record the digest.
    """
    lib = Path(lib)
    reason = mismatch(lib)
    if reason is not None and rebuild is None:
        raise RuntimeError(f"refusing to load {reason}; rebuild it (jaxsem.backends.cuda.build(folder=...)) "
                           f"or, if it is the library you built, record its digest: "
                           f"cd {lib.parent} && sha256sum {lib.name} > {digest_file(lib).name}")
    if reason is not None:
        rebuild(reason)
        reason = mismatch(lib)
        if reason is not None:
            raise RuntimeError(f"refusing to load {reason}, just after building it (another process "
                               f"writing the cache at the same time?); run again")
    return load(str(lib))
