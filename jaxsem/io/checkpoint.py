"""Checkpoint files: named arrays with the time, the step and the metadata of the run that wrote them.

A checkpoint is an npz archive (no pickled objects) holding ``t`` (float64), ``step``
(int64), one array ``field.<name>`` per named field and ``meta.<key>`` (0-d str, number or
bool) per metadata entry. Callers read fields by name (``load_checkpoint(path).fields["u"]``),
never by position. A pytree's leaves get names from their paths (:func:`tree_fields`:
``state.U``, ``state.step``, ``y.0``) and come back into the same structure
(:func:`tree_from_fields`). Files are written through :func:`jaxsem.io.atomic.atomic_output`;
every read checks the whole container and names the file in its errors.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import zipfile
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .atomic import atomic_output

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "checkpoint_meta", "checkpoint_shapes",
           "meta_mismatch", "tree_fields", "tree_from_fields"]

_FIELD, _META = "field.", "meta."
_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")  # dot-separated identifiers or indices


class Checkpoint(NamedTuple):
    """A checkpoint read by :func:`load_checkpoint`.

    ``fields``: name -> NumPy array; ``t``: the time; ``step``: steps taken; ``meta``: key ->
    str, int, float or bool.
    """

    fields: dict[str, np.ndarray]
    t: float
    step: int
    meta: dict[str, Any]


def save_checkpoint(path, fields: Mapping[str, Any], t: float, step: int, **meta) -> None:
    """Write the named arrays ``fields``, time ``t`` and ``step`` to ``path`` (npz), atomically.

    ``fields``: name -> array (NumPy or JAX); a name is dot-separated identifiers or indices
    (``"u"``, ``"state.U"``, ``"y.0"``). ``meta``: key -> str, int, float or bool (what
    identifies the run, for :func:`meta_mismatch`). Written through
    :func:`jaxsem.io.atomic.atomic_output`: a crash, a full disk or a concurrent writer of the
    same path leaves either the old or a new checkpoint, and no temporary file. Raises
    ``ValueError`` for a symlink at ``path``, a bad field name, a ``step`` that is not an
    integer ≥ 0 or a ``t`` that is not finite (such a file could not be resumed).
    """
    path = os.fspath(path)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"save_checkpoint({path!r}): step must be an integer >= 0, got {step!r}")
    if not math.isfinite(float(t)):
        raise ValueError(f"save_checkpoint({path!r}): t must be finite, got {t!r}")
    if not isinstance(fields, Mapping):
        raise TypeError(f"save_checkpoint({path!r}): fields must be a mapping of names to arrays, "
                        f"got {type(fields).__name__}")
    for name in fields:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"save_checkpoint({path!r}): field names must be dot-separated identifiers or "
                             f"indices, got {name!r}")
    arrays = {_FIELD + name: np.asarray(a) for name, a in fields.items()}
    with atomic_output(path, "checkpoint") as fh:
        np.savez(fh, t=np.float64(t), step=np.int64(step), **arrays,
                 **{_META + k: np.asarray(v) for k, v in meta.items()})


class _File(NamedTuple):
    """An open checkpoint file whose container :func:`_open` has checked."""

    path: str
    z: Any  # numpy's NpzFile
    names: tuple  # the field names, in file order

    def read(self, key: str) -> np.ndarray:
        """The array ``key``; a damaged member is a ``ValueError`` naming the file."""
        try:
            return self.z[key]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(f"checkpoint {self.path!r}: cannot read {key!r} ({err})") from None

    def scalar(self, key: str, kinds: str, allowed: str):
        """The 0-d array ``key`` of a dtype kind in ``kinds``, as a Python value."""
        a = self.read(key)
        if a.shape != () or a.dtype.kind not in kinds:
            raise ValueError(f"checkpoint {self.path!r}: {key} must be {allowed}, got an array of shape "
                             f"{a.shape} and dtype {a.dtype}")
        return a.item()

    def header(self, name: str) -> jax.ShapeDtypeStruct:
        """Shape and dtype of field ``name`` from its header, without reading its data."""
        try:
            with self.z.zip.open(f"{_FIELD}{name}.npy") as fh:
                version = np.lib.format.read_magic(fh)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read(fh)
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
            raise ValueError(f"checkpoint {self.path!r}: cannot read the header of field {name!r} ({err})") from None
        return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))

    def meta(self) -> dict:
        return {k[len(_META):]: self.read(k)[()].item() for k in self.z.files if k.startswith(_META)}


@contextlib.contextmanager
def _open(path, max_step: int | None = None):
    """A checkpoint file with its container checked (every error a ``ValueError`` naming the file).

    Checked: an npz archive (no pickled objects) holding ``t`` finite, ``step`` an integer in
    0..``max_step`` (no upper bound for ``None``), and otherwise only ``field.<name>`` arrays and
    ``meta.<key>`` entries, each a 0-d str, number or bool. A missing file is a
    ``FileNotFoundError`` naming it.
    """
    p = os.fspath(path)
    try:
        z = np.load(p, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {p!r}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"checkpoint {p!r} is not a checkpoint written by save_checkpoint (an npz "
                         f"archive): {err}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"checkpoint {p!r} is a single .npy array, not a checkpoint written by save_checkpoint "
                         "(an npz archive)")
    with z:
        missing = [k for k in ("t", "step") if k not in z.files]
        other = [k for k in z.files if k not in ("t", "step") and not
                 (k.startswith((_FIELD, _META)) and _NAME.fullmatch(k.partition(".")[2]))]
        if missing or other:
            raise ValueError(f"checkpoint {p!r} {'lacks ' + ', '.join(missing) if missing else 'holds ' + repr(other)}"
                             f": not a checkpoint written by save_checkpoint (it holds {sorted(z.files)})")
        ck = _File(p, z, tuple(k[len(_FIELD):] for k in z.files if k.startswith(_FIELD)))
        step = ck.scalar("step", "iu", "an integer")
        if step < 0 or (max_step is not None and step > max_step):
            allowed = ">= 0" if max_step is None else f"in 0..{max_step} (this run has {max_step} steps)"
            raise ValueError(f"checkpoint {p!r}: step must be an integer {allowed}, got {step}")
        t = ck.scalar("t", "fiu", "a finite number")
        if not math.isfinite(t):
            raise ValueError(f"checkpoint {p!r}: t must be a finite number, got {t}")
        for k in z.files:
            if k.startswith(_META):
                ck.scalar(k, "biufU", "a str, number or bool")
        yield ck


def load_checkpoint(path, like: Mapping[str, Any] | None = None, *, max_step: int | None = None) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`: a :class:`Checkpoint`.

    ``like``: name -> array or ``jax.ShapeDtypeStruct``, the fields to expect (exactly these
    names, each with that shape and dtype); ``None`` reads whatever fields the file holds.
    ``max_step``: the largest step allowed (the run's step count). The container is checked as
    by :func:`checkpoint_meta`; a failure is a ``ValueError`` naming the file, the field, the
    value and what is allowed.
    """
    with _open(path, max_step) as ck:
        if like is not None:
            if set(ck.names) != set(like):
                raise ValueError(f"checkpoint {ck.path!r} holds the fields {sorted(ck.names)}, this run's state "
                                 f"has {sorted(like)}")
            for name, ref in like.items():
                have = ck.header(name)
                shape = tuple(np.shape(ref))  # arrays and ShapeDtypeStructs alike
                dtype = np.dtype(ref.dtype) if hasattr(ref, "dtype") else np.result_type(ref)
                if (have.shape, have.dtype) != (shape, dtype):
                    raise ValueError(f"checkpoint {ck.path!r}: field {name!r} has shape {have.shape} and dtype "
                                     f"{have.dtype}, this run's has shape {shape} and dtype {dtype}")
        fields = {name: ck.read(_FIELD + name) for name in ck.names}
        return Checkpoint(fields, float(ck.read("t")), int(ck.read("step")), ck.meta())


def checkpoint_meta(path, *, max_step: int | None = None) -> dict:
    """The metadata of a checkpoint written by :func:`save_checkpoint`, as plain Python values.

    The container is checked first (a ``ValueError`` naming the file): an npz archive with ``t``
    finite, ``step`` an integer in 0..``max_step``, and only named fields and metadata;
    a missing file is a ``FileNotFoundError`` naming it."""
    with _open(path, max_step) as ck:
        return ck.meta()


def checkpoint_shapes(path) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a checkpoint's fields (name -> ``jax.ShapeDtypeStruct``), without
    reading their data; the container is checked as by :func:`checkpoint_meta`."""
    with _open(path) as ck:
        return {name: ck.header(name) for name in ck.names}


def meta_mismatch(path, saved: dict, want: dict) -> str | None:
    """Every key where a checkpoint's metadata and this run's differ, as one message (``None``: equal)."""
    none = "(none)"
    diffs = [f"{key} = {saved.get(key, none)!r} in the checkpoint, {want.get(key, none)!r} in this run"
             for key in sorted(set(saved) | set(want)) if saved.get(key, none) != want.get(key, none)]
    return f"resume: checkpoint {path} is of another run: " + "; ".join(diffs) if diffs else None


def _key(k) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    raise TypeError(f"cannot name a pytree leaf under the key {k!r}")


def tree_fields(name: str, tree) -> dict[str, Any]:
    """The leaves of ``tree`` as fields named by their paths under ``name``.

    A bare array is ``name``; a NamedTuple's or dataclass's ``U`` is ``name.U``; the second
    entry of a tuple ``name.1``; nested paths join with dots. :func:`tree_from_fields` inverts it.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join([name, *map(_key, path)]): leaf for path, leaf in leaves}


def tree_from_fields(name: str, like, fields: Mapping[str, Any]):
    """``like``'s structure with each leaf the JAX array ``fields`` holds under its :func:`tree_fields` name."""
    names = list(tree_fields(name, like))
    treedef = jax.tree_util.tree_structure(like)
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(fields[n]) for n in names])
