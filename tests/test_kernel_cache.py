"""The CUDA kernel cache (jaxsem.backends.cache): a private directory and hash-checked libraries.

Everything here runs without a GPU or nvcc: the checks take a directory, a library path, a
rebuild function and a loader, so a planted library is seen not to reach the loader.
"""

import hashlib
import os
import re
import stat
from pathlib import Path

import pytest

from jaxsem.backends import cache
from jaxsem.backends import cuda as ck


# ---------------------------------------------------------------- $JAXSEM_CUDA_CACHE


def test_unset_variable_means_the_home_cache():
    assert cache.cache_dir({}) == Path.home() / ".cache" / "jaxsem"


@pytest.mark.parametrize("value", ["/tmp/jaxsem-kernels", "/a/b/../c", "~/kernels"])
def test_absolute_variable_is_used(value):
    assert cache.cache_dir({cache.ENV: value}) == Path(value).expanduser()


@pytest.mark.parametrize("value", ["", "   ", "kernels", "./kernels", "../kernels", "a/b/c",
                                   "~no-such-user-jaxsem/kernels"])
def test_empty_or_relative_variable_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=rf"\$JAXSEM_CUDA_CACHE must be an absolute path.*got {value!r}"):
        cache.cache_dir({cache.ENV: value})


@pytest.mark.parametrize("value", ["", "relative/kernels"])
def test_cuda_backend_refuses_the_variable_before_using_it(monkeypatch, value):
    """The library path the CUDA backend builds and loads goes through the same check."""
    monkeypatch.setenv(cache.ENV, value)
    with pytest.raises(ValueError, match=r"\$JAXSEM_CUDA_CACHE must be an absolute path"):
        ck._cached(("bk5", "float64", 8), None)


def test_cuda_backend_cache_path_is_inside_a_private_directory(monkeypatch, tmp_path):
    root = tmp_path / "new" / "kernels"
    monkeypatch.setenv(cache.ENV, str(root))
    path = ck._cached(("bk5", "float64", 8), None)
    assert path.parent == root and path.name.startswith("sem_bk5_f64_n8_sm")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    os.chmod(root, 0o777)
    with pytest.raises(PermissionError, match=rf"{root} \(\$JAXSEM_CUDA_CACHE\) has mode 0777"):
        ck._cached(("bk5", "float64", 8), None)


# ---------------------------------------------------------------- the directory


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o777])
def test_missing_directory_is_created_0700_whatever_the_umask(tmp_path, umask):
    path = tmp_path / "a" / "b" / "kernels"
    old = os.umask(umask)
    try:
        assert cache.trusted_dir(path) == path
    finally:
        os.umask(old)
    assert path.is_dir() and stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o750, 0o500])
def test_own_directory_writable_only_by_owner_is_accepted(tmp_path, mode):
    path = tmp_path / "kernels"
    path.mkdir()
    os.chmod(path, mode)
    assert cache.trusted_dir(path) == path
    assert stat.S_IMODE(os.stat(path).st_mode) == mode  # checked, never changed


@pytest.mark.parametrize("mode, who", [(0o777, "group and others"), (0o775, "group"), (0o766, "group and others"),
                                       (0o770, "group"), (0o720, "group"), (0o702, "others"), (0o757, "others")])
def test_group_or_world_writable_directory_is_refused(tmp_path, mode, who):
    path = tmp_path / "kernels"
    path.mkdir()
    os.chmod(path, mode)
    with pytest.raises(PermissionError, match=rf"{path} \(\$JAXSEM_CUDA_CACHE\) has mode {mode:04o} "
                                              rf"\(writable by {who}\).*Fix: chmod go-w {path}"):
        cache.trusted_dir(path)


@pytest.mark.parametrize("offset", [1, 1000, 65534])
def test_directory_of_another_user_is_refused(tmp_path, offset):
    """Owned by this process's user, checked as if we ran as another uid (``uid=``)."""
    path = tmp_path / "kernels"
    path.mkdir(mode=0o700)
    me = os.stat(path).st_uid
    other = (me + offset) % 65536
    with pytest.raises(PermissionError, match=rf"{path} \(\$JAXSEM_CUDA_CACHE\) is owned by uid {me}, not by "
                                              rf"this user \(uid {other}\).*set \$JAXSEM_CUDA_CACHE to a directory"):
        cache.trusted_dir(path, uid=other)


def test_other_owner_and_writable_mode_are_both_named(tmp_path):
    path = tmp_path / "kernels"
    path.mkdir()
    os.chmod(path, 0o777)
    me = os.stat(path).st_uid
    both = rf"owned by uid {me}, not by this user \(uid {me + 1}\) and has mode 0777"
    with pytest.raises(PermissionError, match=both):
        cache.trusted_dir(path, uid=me + 1)


def test_a_file_is_not_a_cache_directory(tmp_path):
    path = tmp_path / "kernels"
    path.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=rf"{path} \(\$JAXSEM_CUDA_CACHE\) is not a directory"):
        cache.trusted_dir(path)


# ---------------------------------------------------------------- the libraries


def _built(folder: Path, content: bytes) -> Path:
    """A file as nvcc would leave it in the build's temporary folder."""
    out = folder / "tmp-build.so"
    out.write_bytes(content)
    return out


class Loader:
    """Stands for ctypes.CDLL: records the path and the bytes it would have loaded."""

    def __init__(self):
        self.loaded = []

    def __call__(self, path):
        self.loaded.append((path, Path(path).read_bytes()))
        return path


class Rebuild:
    """Stands for nvcc: installs ``content`` at ``lib`` (recording its digest) on each call."""

    def __init__(self, tmp_path, lib, content=b"\x7fELF fresh build", record=True):
        self.tmp_path, self.lib, self.content, self.record = tmp_path, lib, content, record
        self.reasons = []

    def __call__(self, reason):
        self.reasons.append(reason)
        if self.record:
            cache.install(_built(self.tmp_path, self.content), self.lib)
        else:
            self.lib.write_bytes(self.content)


def test_install_records_the_digest_in_sha256sum_format(tmp_path):
    lib = tmp_path / "sem_bk5_f64_n8.so"
    content = os.urandom(5000)
    digest = cache.install(_built(tmp_path, content), lib)
    assert digest == hashlib.sha256(content).hexdigest()
    assert lib.read_bytes() == content and not (tmp_path / "tmp-build.so").exists()
    assert (tmp_path / "sem_bk5_f64_n8.so.sha256").read_text() == f"{digest}  sem_bk5_f64_n8.so\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sem_bk5_f64_n8.so", "sem_bk5_f64_n8.so.sha256"]
    assert cache.mismatch(lib) is None


def test_a_matching_library_is_loaded_without_rebuilding(tmp_path):
    lib = tmp_path / "sem_gs_f64.so"
    cache.install(_built(tmp_path, b"\x7fELF good"), lib)
    load, rebuild = Loader(), Rebuild(tmp_path, lib)
    assert cache.load_verified(lib, rebuild, load) == str(lib)
    assert load.loaded == [(str(lib), b"\x7fELF good")] and rebuild.reasons == []


def _plant(tmp_path, lib, case):
    """A library that must not be loaded as it is, and the reason expected for it."""
    if case == "no digest":
        lib.write_bytes(b"\x7fELF planted")
        return rf"has no {lib.name}\.sha256 beside it"
    if case == "missing library":
        return "is not built"
    cache.install(_built(tmp_path, b"\x7fELF good"), lib)
    record = lib.with_name(lib.name + ".sha256")
    if case == "replaced library":
        lib.write_bytes(b"\x7fELF planted")
    elif case == "truncated library":
        lib.write_bytes(b"\x7fELF go")
    elif case == "digest of another file":
        record.write_text(hashlib.sha256(b"another").hexdigest() + "  " + lib.name + "\n")
    elif case == "empty digest file":
        record.write_text("")
    elif case == "garbage digest file":
        record.write_bytes(b"\xff\xfe not hex at all")
    return "has sha256 [0-9a-f]{64}, .* records"


CASES = ["no digest", "missing library", "replaced library", "truncated library", "digest of another file",
         "empty digest file", "garbage digest file"]


@pytest.mark.parametrize("case", CASES)
def test_a_mismatch_is_rebuilt_and_only_the_rebuilt_library_loaded(tmp_path, case):
    lib = tmp_path / "sem_mass_f32_n5_sm90_0123456789abcdef.so"
    why = _plant(tmp_path, lib, case)
    load, rebuild = Loader(), Rebuild(tmp_path, lib)
    cache.load_verified(lib, rebuild, load)
    assert len(rebuild.reasons) == 1
    assert re.search(why, rebuild.reasons[0]), rebuild.reasons
    assert load.loaded == [(str(lib), b"\x7fELF fresh build")]


@pytest.mark.parametrize("case", CASES)
def test_a_mismatch_that_cannot_be_rebuilt_is_refused_and_never_loaded(tmp_path, case):
    """``$JAXSEM_CUDA_LIB``: libraries built elsewhere, never compiled here."""
    lib = tmp_path / "sem_bk5_f64_n8.so"
    why = _plant(tmp_path, lib, case)
    load = Loader()
    fix = rf"sha256sum {lib.name} > {lib.name}\.sha256"
    with pytest.raises(RuntimeError, match=rf"refusing to load {lib}.*{why}.*{fix}"):
        cache.load_verified(lib, None, load)
    assert load.loaded == []


@pytest.mark.parametrize("case", ["no digest", "replaced library"])
def test_a_rebuild_that_leaves_a_mismatch_is_refused_and_never_loaded(tmp_path, case):
    lib = tmp_path / "sem_bk5_f64_n8.so"
    _plant(tmp_path, lib, case)
    load, rebuild = Loader(), Rebuild(tmp_path, lib, record=False)
    with pytest.raises(RuntimeError, match=rf"refusing to load {lib}.*just after building it"):
        cache.load_verified(lib, rebuild, load)
    assert len(rebuild.reasons) == 1 and load.loaded == []
