"""Checkpoint files: named fields round-trip, every field of a damaged file is refused by name."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.io import (checkpoint_meta, checkpoint_shapes, load_checkpoint, meta_mismatch, save_checkpoint,
                       tree_fields, tree_from_fields)

U = np.arange(6.0).reshape(2, 3)
LIKE = {"u": U, "n": np.zeros(4, np.int32)}


def test_fields_round_trip_by_name(tmp_path):
    path = tmp_path / "ck.npz"
    save_checkpoint(path, {"u": jnp.asarray(U), "n": np.arange(4, dtype=np.int32)}, 0.25, 7, flux="upwind",
                    order=3, cfl=0.5, fused=True)
    ck = load_checkpoint(path, LIKE, max_step=10)
    assert set(ck.fields) == {"u", "n"} and (ck.t, ck.step) == (0.25, 7)
    assert np.array_equal(ck.fields["u"], U) and ck.fields["n"].dtype == np.int32
    assert ck.meta == {"flux": "upwind", "order": 3, "cfl": 0.5, "fused": True}
    assert all(type(v) in (str, int, float, bool) for v in ck.meta.values())  # plain Python values
    assert checkpoint_meta(path) == ck.meta
    assert checkpoint_shapes(path) == {"u": jax.ShapeDtypeStruct((2, 3), np.float64),
                                       "n": jax.ShapeDtypeStruct((4,), np.int32)}
    assert set(load_checkpoint(path).fields) == {"u", "n"}  # no expectation: whatever the file holds
    with pytest.raises(ValueError, match=r"holds the fields \['n', 'u'\], this run's state has \['u', 'v'\]"):
        load_checkpoint(path, {"u": U, "v": U})
    with pytest.raises(ValueError, match=r"field 'u' has shape \(2, 3\) and dtype float64, this run's has shape "
                                         r"\(3, 2\) and dtype float32"):
        load_checkpoint(path, dict(LIKE, u=jax.ShapeDtypeStruct((3, 2), np.float32)))
    for bad in ("", "a b", "u/../v", ".u", "u."):
        with pytest.raises(ValueError, match=f"field names must be dot-separated identifiers or indices, got {bad!r}"):
            save_checkpoint(path, {bad: U}, 0.0, 0)
    with pytest.raises(TypeError, match="fields must be a mapping of names to arrays, got ndarray"):
        save_checkpoint(path, U, 0.0, 0)
    assert meta_mismatch(path, ck.meta, dict(ck.meta, order=4)) == (
        f"resume: checkpoint {path} is of another run: order = 3 in the checkpoint, 4 in this run")
    assert meta_mismatch(path, ck.meta, ck.meta) is None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _State:
    U: jax.Array
    step: jax.Array


def test_a_pytree_is_named_by_its_paths_and_rebuilt(tmp_path):
    state = _State(U=jnp.ones((2, 3)), step=jnp.asarray(4, jnp.int32))
    tree = (state, {"series": jnp.arange(3.0)}, [jnp.zeros(1)])
    fields = tree_fields("y", tree)
    assert list(fields) == ["y.0.U", "y.0.step", "y.1.series", "y.2.0"]
    assert list(tree_fields("u", jnp.zeros(2))) == ["u"]
    save_checkpoint(tmp_path / "ck.npz", fields, 0.0, 0)
    back = tree_from_fields("y", tree, load_checkpoint(tmp_path / "ck.npz", fields).fields)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(tree)):
        assert isinstance(a, jax.Array) and a.dtype == b.dtype and np.array_equal(a, b)


def _forge(tmp_path, good, name, **changes):
    """A copy of the checkpoint ``good`` with members replaced (``None``: removed)."""
    with np.load(good) as z:
        d = dict(z)
    d.update(changes)
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in d.items() if v is not None})
    return path


def test_load_checkpoint_checks_every_field_and_names_the_file(tmp_path):
    good = tmp_path / "good.npz"
    save_checkpoint(good, {"y": np.zeros(2)}, 0.5, 50, dt=0.01, t0=0.0, method="lserk4")
    like = {"y": np.zeros(2)}
    ck = load_checkpoint(good, like, max_step=100)
    assert (ck.t, ck.step, ck.meta["method"]) == (0.5, 50, "lserk4")
    cases = [
        (dict(step=np.int64(-3)), r"step must be an integer in 0\.\.100 \(this run has 100 steps\), got -3"),
        (dict(step=np.int64(101)), r"step must be an integer in 0\.\.100 .*got 101"),
        (dict(step=np.float64(50.0)), r"step must be an integer, got an array of shape \(\) and dtype float64"),
        (dict(step=np.arange(2)), r"step must be an integer, got an array of shape \(2,\)"),
        (dict(step=None), r"lacks step"),
        (dict(t=np.float64(np.nan)), r"t must be a finite number, got nan"),
        (dict(t=np.float64(-np.inf)), r"t must be a finite number, got -inf"),
        (dict(leaf_0=np.zeros(2)), r"holds \['leaf_0'\]: not a checkpoint written by save_checkpoint"),
        ({"field.y": None, "field.z": np.zeros(2)}, r"holds the fields \['z'\], this run's state has \['y'\]"),
        ({"field.y": np.zeros(3)}, r"field 'y' has shape \(3,\) and dtype float64, this run's has shape \(2,\)"),
        ({"field.y": np.zeros(2, np.float32)}, r"dtype float32, this run's has shape \(2,\) and dtype float64"),
        ({"meta.dt": np.zeros(3)}, r"meta\.dt must be a str, number or bool"),
        ({"meta.obj": np.array([{}], dtype=object)}, r"cannot read 'meta\.obj'"),
    ]
    for i, (changes, msg) in enumerate(cases):
        path = _forge(tmp_path, good, f"bad{i}.npz", **changes)
        with pytest.raises(ValueError, match=msg) as exc:
            load_checkpoint(path, like, max_step=100)
        assert f"checkpoint {str(path)!r}" in str(exc.value), exc.value
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got -3"):  # no run length to bound it
        checkpoint_meta(_forge(tmp_path, good, "neg.npz", step=np.int64(-3)))
    (tmp_path / "text.npz").write_text("not a zip")
    (tmp_path / "half.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    np.save(tmp_path / "one.npy", np.zeros(2))
    for name, msg in [("text.npz", "is not a checkpoint written by save_checkpoint"),
                      ("half.npz", "is not a checkpoint written by save_checkpoint|cannot read"),
                      ("one.npy", "is a single .npy array")]:
        with pytest.raises(ValueError, match=msg) as exc:
            load_checkpoint(tmp_path / name, like)
        assert name in str(exc.value)
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nothing\.npz': no such file"):
        checkpoint_meta(tmp_path / "nothing.npz")
    with pytest.raises(ValueError, match=r"save_checkpoint\('.*x\.npz'\): step must be an integer >= 0, got -1"):
        save_checkpoint(tmp_path / "x.npz", like, 0.0, -1)
