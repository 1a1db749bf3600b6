"""The host driver: chunks invisible in the result, guards, progress, checkpoints, resume, stop signals."""

import dataclasses
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.io import checkpoint_shapes, load_checkpoint
from jaxsem.solvers import driver
from jaxsem.solvers import timestepping as ts
from jaxsem.solvers.stops import NonFiniteError, RunInterrupted, Terminated, raise_on_signal

# A damped rotation with forcing: y' = A y + (sin t, 0).
A = jnp.array([[-0.1, 2.0], [-2.0, -0.1]])


def f_lin(t, y):
    return A @ y + jnp.array([jnp.sin(t), 0.0])


Y0 = jnp.array([1.0, 0.0])


def test_run_matches_integrate_and_chunking_is_invisible():
    y_int = ts.integrate(f_lin, Y0, 0.01, 250)
    y1, info1 = driver.run(f_lin, Y0, 0.01, 250, options=driver.RunOptions(chunk_steps=250))
    y2, info2 = driver.run(f_lin, Y0, 0.01, 250, options=driver.RunOptions(chunk_steps=33))
    assert np.array_equal(np.asarray(y1), np.asarray(y2))  # bit-identical
    assert np.allclose(y1, y_int, rtol=1e-13)
    assert info2.steps == 250 and info2.chunks == 8 and info2.t == pytest.approx(2.5)


def test_run_refuses_dt_above_limit():
    with pytest.raises(ValueError, match=r"exceeds the stable limit 0\.05"):
        driver.run(f_lin, Y0, 0.06, 10, options=driver.RunOptions(dt_max=0.05))
    with pytest.raises(ValueError, match="dt must be"):
        driver.run(f_lin, Y0, -1.0, 10)
    with pytest.raises(ValueError, match="method"):
        driver.run(f_lin, Y0, 0.1, 10, method="euler")


def test_run_reports_first_nonfinite_step():
    # Blows up as soon as a stage sees t >= 0.5: step 50 (t from 0.49 to 0.50) is the first bad one.
    f = lambda t, y: jnp.where(t >= 0.5 - 1e-12, jnp.nan, -y)
    with pytest.raises(NonFiniteError, match=r"at step 50 \(t = 0\.5\)") as exc:
        driver.run(f, Y0, 0.01, 200, method="rk4", options=driver.RunOptions(chunk_steps=30))
    assert exc.value.step == 50
    # And an exponential overflow is caught too (Inf).
    with pytest.raises(FloatingPointError, match="non-finite"):
        driver.run(lambda t, y: 800.0 * y, Y0, 0.1, 200, options=driver.RunOptions(chunk_steps=50))


def test_checkpoint_restart_is_bit_identical(tmp_path):
    path = tmp_path / "ck.npz"
    opts = driver.RunOptions(chunk_steps=40, meta={"problem": "damped rotation", "order": 2})
    y_full, _ = driver.run(f_lin, Y0, 0.01, 300, options=opts)
    # An interrupted run: 120 steps with checkpoints, then resume to 300.
    driver.run(f_lin, Y0, 0.01, 120, options=dataclasses.replace(opts, checkpoint_path=path))
    assert os.listdir(tmp_path) == ["ck.npz"]  # no temporary file left
    ck = load_checkpoint(path)
    assert ck.step == 120 and ck.t == pytest.approx(1.2) and ck.meta["method"] == "lserk4"
    assert ck.meta["problem"] == "damped rotation" and ck.meta["order"] == 2
    assert list(ck.fields) == ["y"] and ck.fields["y"].shape == (2,)  # the state, by name
    y_res, info = driver.run(f_lin, Y0, 0.01, 300, options=dataclasses.replace(opts, resume=path))
    assert info.resumed_from == 120 and info.steps == 180
    assert np.array_equal(np.asarray(y_res), np.asarray(y_full))
    # Another dt, method or caller metadata: refused, naming the key and both values.
    resume = dataclasses.replace(opts, resume=path)
    with pytest.raises(ValueError, match=r"dt = 0\.01 in the checkpoint, 0\.02 in this run"):
        driver.run(f_lin, Y0, 0.02, 300, options=resume)
    with pytest.raises(ValueError, match=r"method = 'lserk4' in the checkpoint, 'rk4' in this run"):
        driver.run(f_lin, Y0, 0.01, 300, method="rk4", options=resume)
    with pytest.raises(ValueError, match=r"order = 2 in the checkpoint, 3 in this run"):
        driver.run(f_lin, Y0, 0.01, 300, options=dataclasses.replace(resume, meta={"problem": "damped rotation",
                                                                              "order": 3}))
    with pytest.raises(ValueError, match=r"problem = 'damped rotation' in the checkpoint, '\(none\)' in this run"):
        driver.run(f_lin, Y0, 0.01, 300, options=driver.RunOptions(resume=path, meta={"order": 2}))


def test_run_options_are_checked_and_hashable():
    assert driver.RunOptions(meta={"b": 1, "a": "x"}).meta == (("a", "x"), ("b", 1))
    assert hash(driver.RunOptions(meta={"a": 1.5})) == hash(driver.RunOptions(meta=[("a", 1.5)]))
    assert driver.RunOptions(meta={"n": np.int64(3)}).meta == (("n", 3),)
    for kw, msg in [
        (dict(chunk_steps=0), r"RunOptions\.chunk_steps must be an int >= 1, got 0"),
        (dict(chunk_steps=2.0), r"RunOptions\.chunk_steps must be an int >= 1, got 2\.0"),
        (dict(checkpoint_every=0), r"RunOptions\.checkpoint_every must be an int >= 1, got 0"),
        (dict(dt_max=-1.0), r"RunOptions\.dt_max must be None or a positive finite number, got -1\.0"),
        (dict(meta={"dt": 0.1}), r"RunOptions\.meta key 'dt' is reserved"),
        (dict(meta={"not a key": 1}), r"RunOptions\.meta keys must be identifiers, got 'not a key'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            driver.RunOptions(**kw)
    for kw, msg in [
        (dict(progress="yes"), r"RunOptions\.progress must be True, False or 'auto', got 'yes'"),
        (dict(checkpoint_path=3), r"RunOptions\.checkpoint_path must be None or a path"),
        (dict(meta={"mesh": [1, 2]}), r"RunOptions\.meta\['mesh'\] must be a str, int, float or bool"),
    ]:
        with pytest.raises(TypeError, match=msg):
            driver.RunOptions(**kw)
    with pytest.raises(TypeError):
        driver.RunOptions(100)  # keywords only
    with pytest.raises(TypeError, match="options must be a RunOptions"):
        driver.run(f_lin, Y0, 0.1, 10, options={"chunk_steps": 5})


def test_progress_bar_on_stderr(capsys):
    driver.run(f_lin, Y0, 0.01, 20, options=driver.RunOptions(chunk_steps=5, progress=True, desc="unit"))
    out, err = capsys.readouterr()
    assert out == "" and "unit" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stop_signal_ends_the_run_after_the_chunk_and_its_checkpoint(tmp_path, sig):
    """SIGINT/SIGTERM during a chunk: the chunk and its checkpoint complete, then RunInterrupted names
    the step, time and file; the previous handler is back; the checkpoint resumes to the full run's bits."""
    path = tmp_path / "ck.npz"
    dt, chunk = 0.01, 40
    adv = ts.advance_fn(f_lin, "lserk4", with_args=False)
    t0_, dt_ = jnp.asarray(0.0), jnp.asarray(dt)

    def advance(y, args, m0, count):
        if int(m0) == chunk:  # arrives while the second chunk runs
            signal.raise_signal(sig)
        return adv(y, args, t0_, dt_, m0, count)

    before = signal.getsignal(sig)
    opts = driver.RunOptions(chunk_steps=chunk, checkpoint_path=path)
    with pytest.raises(RunInterrupted, match=rf"interrupted by {sig.name} at step 80 \(t = 0\.8\); "
                                                r"checkpoint .*ck\.npz holds this state") as exc:
        driver.drive(advance, Y0, 300, dt=dt, t0=0.0, label="lserk4", options=opts)
    assert (exc.value.step, exc.value.t, exc.value.signal, exc.value.checkpoint) == (80, pytest.approx(0.8), sig,
                                                                                     str(path))
    assert signal.getsignal(sig) is before
    assert load_checkpoint(path).step == 80 and os.listdir(tmp_path) == ["ck.npz"]
    y_full, _ = driver.run(f_lin, Y0, dt, 300, options=driver.RunOptions(chunk_steps=chunk))
    y_res, info = driver.run(f_lin, Y0, dt, 300, options=driver.RunOptions(chunk_steps=chunk, resume=path))
    assert info.resumed_from == 80 and np.array_equal(np.asarray(y_res), np.asarray(y_full))
    # without a checkpoint file the message says so
    with pytest.raises(RunInterrupted, match="no checkpoint was written"):
        driver.drive(advance, Y0, 300, dt=dt, t0=0.0, label="lserk4", options=driver.RunOptions(chunk_steps=chunk))


def test_checkpoint_every_writes_every_kth_chunk_the_last_and_the_stopped_one(tmp_path, monkeypatch):
    """checkpoint_every=3 over 8 chunks writes after chunks 3, 6 and the last (8); a signal in chunk 5
    writes chunk 5's state, the one RunInterrupted names, and it resumes to the full run's bits."""
    path = tmp_path / "ck.npz"
    dt, chunk, steps = 0.01, 10, 75
    written = []
    save = driver.save_checkpoint
    monkeypatch.setattr(driver, "save_checkpoint", lambda p, f, t, m, **kw: (written.append(m), save(p, f, t, m, **kw)))
    opts = driver.RunOptions(chunk_steps=chunk, checkpoint_path=path, checkpoint_every=3)
    y_full, info = driver.run(f_lin, Y0, dt, steps, options=opts)
    assert written == [30, 60, 75] and info.chunks == 8 and load_checkpoint(path).step == 75
    adv = ts.advance_fn(f_lin, "lserk4", with_args=False)

    def advance(y, args, m0, count):
        if int(m0) == 4 * chunk:  # the fifth chunk: not a multiple of 3
            signal.raise_signal(signal.SIGTERM)
        return adv(y, args, jnp.asarray(0.0), jnp.asarray(dt), m0, count)

    written.clear()
    with pytest.raises(RunInterrupted, match=r"at step 50 \(t = 0\.5\); checkpoint .*ck\.npz holds this state"):
        driver.drive(advance, Y0, steps, dt=dt, t0=0.0, label="lserk4", options=opts)
    assert written == [30, 50] and load_checkpoint(path).step == 50
    y_res, info = driver.run(f_lin, Y0, dt, steps, options=dataclasses.replace(opts, resume=path))
    assert info.resumed_from == 50 and np.array_equal(np.asarray(y_res), np.asarray(y_full))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("sig, exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_stop_signal_lost_in_a_callback_still_ends_the_run_before_its_steps(sig, exc):
    """Python drops an exception raised inside a callback it cannot unwind (``__del__``, XLA's
    garbage-collector callback): a Ctrl-C that lands there during the set-up still ends the run,
    before any step, with the exception the handler raised."""

    class RaisesOnDelete:
        def __del__(self):
            raise_on_signal(sig)

    obj = RaisesOnDelete()
    del obj  # "Exception ignored in ...": the handler's exception is lost
    calls = []

    def advance(y, args, m0, count):
        calls.append(int(m0))
        return y

    with pytest.raises(exc):
        driver.drive(advance, Y0, 10, dt=0.1, t0=0.0, label="unit")
    assert calls == []
    y, info = driver.drive(advance, Y0, 10, dt=0.1, t0=0.0, label="unit")  # the signal counted once
    assert info.steps == 10 and calls == [0]


def test_checkpoints_name_the_parts_of_the_state(tmp_path):
    """A pytree state is saved leaf by leaf under its path (``y.0``, ``y.1.b``), or under the names
    ``drive`` is given for its parts; the resume rebuilds the structure, bit-identical to one run."""
    f = lambda t, y: (A @ y[0], {"b": -y[1]["b"]})
    y0 = (Y0, {"b": jnp.ones(3)})
    path = tmp_path / "ck.npz"
    full, _ = driver.run(f, y0, 0.01, 50, options=driver.RunOptions(chunk_steps=10))
    driver.run(f, y0, 0.01, 20, options=driver.RunOptions(chunk_steps=10, checkpoint_path=path))
    assert set(checkpoint_shapes(path)) == {"y.0", "y.1.b"}
    y, info = driver.run(f, y0, 0.01, 50, options=driver.RunOptions(chunk_steps=10, resume=path))
    assert info.resumed_from == 20 and isinstance(y, tuple) and set(y[1]) == {"b"}
    for a, b in zip(jax.tree_util.tree_leaves(y), jax.tree_util.tree_leaves(full)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    adv = ts.advance_fn(f, "lserk4", with_args=False)
    advance = lambda y, a, m0, n: adv(y, a, jnp.asarray(0.0), jnp.asarray(0.01), m0, n)
    opts = driver.RunOptions(chunk_steps=10, checkpoint_path=tmp_path / "named.npz")
    driver.drive(advance, y0, 20, dt=0.01, t0=0.0, label="lserk4", options=opts, names=("rotation", "decay"))
    assert set(checkpoint_shapes(tmp_path / "named.npz")) == {"rotation", "decay.b"}
    y, _ = driver.drive(advance, y0, 50, dt=0.01, t0=0.0, label="lserk4", names=("rotation", "decay"),
                        options=driver.RunOptions(chunk_steps=10, resume=tmp_path / "named.npz"))
    assert np.array_equal(np.asarray(y[0]), np.asarray(full[0]))
    # another state's checkpoint is refused, naming both sets of fields
    with pytest.raises(ValueError, match=r"holds the fields \['y'\], this run's state has \['y.0', 'y.1.b'\]"):
        driver.run(f, y0, 0.01, 50, options=driver.RunOptions(resume=_plain_checkpoint(tmp_path)))


def _plain_checkpoint(tmp_path):
    path = tmp_path / "plain.npz"
    driver.run(f_lin, Y0, 0.01, 10, options=driver.RunOptions(chunk_steps=10, checkpoint_path=path))
    return path


def test_a_resume_past_the_run_s_end_is_refused_before_any_step(tmp_path):
    good = _plain_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"plain\.npz'.*0\.\.5 \(this run has 5 steps\), got 10"):
        driver.run(f_lin, Y0, 0.01, 5, options=driver.RunOptions(resume=good, meta={}))


def test_chunk_program_is_compiled_once_when_the_start_mixes_placements():
    """A first state whose fields sit on a device (committed) beside a time made by ``jnp.asarray``
    (uncommitted): the chunk program's outputs are all committed, so without placing the start
    alike the second chunk compiles the program again (measured: 7 s of each Navier–Stokes run)."""

    @jax.jit
    def advance(y, args, m0, count):
        u, t = y
        return jax.lax.fori_loop(0, count, lambda i, c: (0.5 * c[0], c[1] + args), (u, t))

    y0 = (jax.device_put(jnp.ones(3), jax.devices()[0]), jnp.asarray(0.0))
    assert y0[0].committed and not y0[1].committed
    (u, t), info = driver.drive(advance, y0, 6, dt=0.1, t0=0.0, label="halving", args=jnp.asarray(0.1),
                                options=driver.RunOptions(chunk_steps=2))
    assert info.chunks == 3 and float(t) == pytest.approx(0.6) and np.array_equal(np.asarray(u), np.full(3, 0.5**6))
    assert advance._cache_size() == 1
    same = (jnp.ones(3), jnp.asarray(0.0))  # uncommitted throughout: left as it is
    assert driver.placed_alike(same) is same
