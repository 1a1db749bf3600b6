"""Explicit RK: empirical orders, stability radii, checkpointed grads, the guarded driver."""

import dataclasses
import itertools
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import timestepping as ts

# A damped rotation with forcing: y' = A y + (sin t, 0).
A = jnp.array([[-0.1, 2.0], [-2.0, -0.1]])


def f_lin(t, y):
    return A @ y + jnp.array([jnp.sin(t), 0.0])


Y0 = jnp.array([1.0, 0.0])


@pytest.mark.parametrize("method,order", [("lserk4", 4), ("rk4", 4), ("ssprk3", 3)])
def test_empirical_order(method, order):
    ref = ts.integrate(f_lin, Y0, 1 / 2048, 4096, method="rk4")
    errs = [float(jnp.linalg.norm(ts.integrate(f_lin, Y0, 2 / n, n, method=method) - ref)) for n in (32, 64, 128)]
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(rates - order) < 0.1), rates


def test_stability_radii():
    assert ts.imaginary_axis_limit("rk4") == pytest.approx(2 * np.sqrt(2), abs=1e-6)
    assert ts.imaginary_axis_limit("ssprk3") == pytest.approx(np.sqrt(3), abs=1e-6)
    assert ts.imaginary_axis_limit("lserk4") == pytest.approx(3.3407, abs=1e-3)  # Carpenter–Kennedy
    assert ts.stability_radius("rk4") == pytest.approx(2.6156, abs=1e-3)
    assert ts.stability_radius("ssprk3") == pytest.approx(np.sqrt(3), abs=1e-6)
    assert ts.stability_radius("lserk4") == pytest.approx(3.1685, abs=1e-3)
    for m in ts.METHODS:  # the half-disk is inside the region: |R| <= 1 on its boundary
        z = ts.stability_radius(m) * np.exp(1j * np.linspace(np.pi / 2, 3 * np.pi / 2, 101))
        assert np.all(np.abs(ts.stability_function(m, z)) <= 1 + 1e-9)
    assert ts.cfl_dt(10.0, "rk4", 0.5) == pytest.approx(0.5 * ts.stability_radius("rk4") / 10)


def test_lserk4_is_fourth_order_on_scalar_exponential():
    # R(z) agrees with exp(z) to O(z^5): the stage coefficients are right.
    z = np.array([1e-2, 2e-2])
    err = np.abs(ts.stability_function("lserk4", z) - np.exp(z))
    assert np.log2(err[1] / err[0]) == pytest.approx(5, abs=0.05)


def test_checkpointed_integrate_matches_and_differentiates():
    def loss(a, every):
        f = lambda t, y: a * (A @ y)
        return jnp.sum(ts.integrate(f, Y0, 0.01, 37, checkpointing=ts.Checkpointing(every)) ** 2)

    v0, g0 = jax.value_and_grad(loss)(1.3, None)
    v1, g1 = jax.value_and_grad(loss)(1.3, 8)
    assert v0 == pytest.approx(float(v1), rel=1e-14) and g0 == pytest.approx(float(g1), rel=1e-12)
    h = 1e-6
    fd = (loss(1.3 + h, None) - loss(1.3 - h, None)) / (2 * h)
    assert float(g0) == pytest.approx(float(fd), rel=1e-7)


def test_both_remat_schedules_equal_the_plain_gradient():
    """jax.checkpoint chunks and the custom_vjp chunks: the plain loop's values and gradients.

    The loss depends on the final state, the per-step observations, a parameter
    the right-hand side closes over, ``dt`` and ``y0``; 37 steps in chunks of
    8 leave 5 plain steps, chunks of 36 leave 1; and it is batched (``vmap``).
    Forward mode works through ``jax.checkpoint`` only (custom_vjp refuses it).
    """

    def loss(a, y0, dt, checkpointing):
        f = lambda t, y: a * (A @ y) + dt * jnp.sin(y + t)
        y, obs = ts.integrate(f, y0, dt, 37, checkpointing=checkpointing, observe=lambda y: y[0] ** 2)
        return jnp.sum(y**2) + jnp.sum(obs)

    plain, custom = ts.Checkpointing(), ts.Checkpointing(8, "custom_vjp")
    vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3)  # Checkpointing: hashable
    v0, g0 = vg(1.3, Y0, 0.01, plain)
    for ck in (ts.Checkpointing(8, "checkpoint"), custom, ts.Checkpointing(36, "custom_vjp")):
        v, g = vg(1.3, Y0, 0.01, ck)
        assert float(v) == pytest.approx(float(v0), rel=1e-14)
        for a, b in zip(g, g0):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    batch = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None, None, None)), static_argnums=3)
    a = jnp.array([0.7, 1.3, 2.0])
    np.testing.assert_allclose(batch(a, Y0, 0.01, custom), batch(a, Y0, 0.01, plain), rtol=1e-12)
    # forward over reverse (a Hessian–vector product) needs the jax.checkpoint schedule
    hvp = lambda ck: jax.jvp(jax.grad(lambda a: loss(a, Y0, 0.01, ck)), (1.3,), (1.0,))[1]
    assert float(hvp(ts.Checkpointing("sqrt"))) == pytest.approx(float(hvp(plain)), rel=1e-12)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(lambda a: loss(a, Y0, 0.01, custom), (1.3,), (1.0,))


@pytest.mark.parametrize("method", ts.METHODS)
def test_reverse_pass_of_a_nonlinear_f_equals_autodiff_and_differences(method):
    """integrate's reverse pass (stage inputs kept, f recomputed) for a nonlinear f: the gradient
    w.r.t. a closed-over parameter, y0 and a traced dt is that of JAX's own reverse pass through a
    scan of rk_step (every residual kept) to 1e-12, plain and in chunks, with the stages looped and
    written out, and central differences."""

    def f(a, t, y):
        return a * jnp.tanh(A @ y) - 0.3 * y**3 + jnp.cos(t) * y[::-1]

    def loss(p, how):
        a, y0, dt = p
        observe = lambda y: jnp.sin(y[0])
        if how is None:  # the reference
            def one(y, m):
                y = ts.rk_step(lambda t, y: f(a, t, y), m * dt, y, dt, method, loop_stages=True)
                return y, observe(y)

            y, obs = jax.lax.scan(one, y0, jnp.arange(23))
        else:
            checkpointing, stages = how
            y, obs = ts.integrate(lambda t, y: f(a, t, y), y0, dt, 23, method=method,
                                  checkpointing=checkpointing, observe=observe, stages=stages)
        return jnp.sum(y**2) + jnp.sum(obs**2)

    vg = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    p = (1.3, jnp.array([0.8, -0.4]), 0.05)
    v0, g0 = vg(p, None)
    for how in itertools.product((ts.Checkpointing(), ts.Checkpointing("sqrt"), ts.Checkpointing(4, "custom_vjp")),
                                 ("loop", "unrolled")):
        v, g = vg(p, how)
        assert float(v) == pytest.approx(float(v0), rel=1e-14)
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    plain = (ts.Checkpointing(), "auto")
    g = vg(p, plain)[1]
    h = 1e-6
    for i, v in ((0, 1.0), (1, jnp.array([0.3, -1.1])), (2, 1.0)):
        plus, minus = list(p), list(p)
        plus[i], minus[i] = p[i] + h * v, p[i] - h * v
        fd = (float(vg(tuple(plus), plain)[0]) - float(vg(tuple(minus), plain)[0])) / (2 * h)
        assert float(jnp.vdot(g[i], v)) == pytest.approx(fd, rel=1e-7), i


def test_checkpointing_chunks_and_bad_arguments():
    sqrt = ts.Checkpointing("sqrt")
    assert [sqrt.chunk(n) for n in (0, 1, 2, 3, 16, 17, 256)] == [None, None, None, 2, 4, 5, 16]
    assert ts.Checkpointing(8).chunk(37) == 8 and ts.Checkpointing(37).chunk(37) is None
    assert ts.Checkpointing().chunk(37) is None and ts.Checkpointing(np.int64(8)).every == 8
    assert ts.Checkpointing(8) == ts.Checkpointing(8, "auto") and len({sqrt, ts.Checkpointing("sqrt")}) == 1
    for bad in ("log", 0, -2, 2.5, True):
        with pytest.raises(ValueError, match=r"Checkpointing\.every must be None, 'sqrt' or an int >= 1, got"):
            ts.Checkpointing(bad)
    with pytest.raises(ValueError, match=r"Checkpointing\.remat must be one of .*'custom_vjp'.*got 'scan'"):
        ts.Checkpointing(2, remat="scan")
    with pytest.raises(TypeError, match="checkpointing must be a Checkpointing"):
        ts.integrate(f_lin, Y0, 0.1, 10, checkpointing="sqrt")
    with pytest.raises(ValueError, match="num_steps"):
        ts.integrate(f_lin, Y0, 0.1, -1)
    with pytest.raises(ValueError, match="stages must be 'auto', 'loop' or 'unrolled', got 'none'"):
        ts.integrate(f_lin, Y0, 0.1, 10, stages="none")


def test_observe_collects_per_step():
    y, obs = ts.integrate(f_lin, Y0, 0.1, 5, observe=lambda y: y[0], checkpointing=ts.Checkpointing(2))
    assert obs.shape == (5,) and float(obs[-1]) == float(y[0])


def test_run_matches_integrate_and_chunking_is_invisible():
    y_int = ts.integrate(f_lin, Y0, 0.01, 250)
    y1, info1 = ts.run(f_lin, Y0, 0.01, 250, options=ts.RunOptions(chunk_steps=250))
    y2, info2 = ts.run(f_lin, Y0, 0.01, 250, options=ts.RunOptions(chunk_steps=33))
    assert np.array_equal(np.asarray(y1), np.asarray(y2))  # bit-identical
    assert np.allclose(y1, y_int, rtol=1e-13)
    assert info2.steps == 250 and info2.chunks == 8 and info2.t == pytest.approx(2.5)


def test_run_refuses_dt_above_limit():
    with pytest.raises(ValueError, match=r"exceeds the stable limit 0\.05"):
        ts.run(f_lin, Y0, 0.06, 10, options=ts.RunOptions(dt_max=0.05))
    with pytest.raises(ValueError, match="dt must be"):
        ts.run(f_lin, Y0, -1.0, 10)
    with pytest.raises(ValueError, match="method"):
        ts.run(f_lin, Y0, 0.1, 10, method="euler")


def test_run_reports_first_nonfinite_step():
    # Blows up as soon as a stage sees t >= 0.5: step 50 (t from 0.49 to 0.50) is the first bad one.
    f = lambda t, y: jnp.where(t >= 0.5 - 1e-12, jnp.nan, -y)
    with pytest.raises(ts.NonFiniteError, match=r"at step 50 \(t = 0\.5\)") as exc:
        ts.run(f, Y0, 0.01, 200, method="rk4", options=ts.RunOptions(chunk_steps=30))
    assert exc.value.step == 50
    # And an exponential overflow is caught too (Inf).
    with pytest.raises(FloatingPointError, match="non-finite"):
        ts.run(lambda t, y: 800.0 * y, Y0, 0.1, 200, options=ts.RunOptions(chunk_steps=50))


def test_checkpoint_restart_is_bit_identical(tmp_path):
    path = tmp_path / "ck.npz"
    opts = ts.RunOptions(chunk_steps=40, meta={"problem": "damped rotation", "order": 2})
    y_full, _ = ts.run(f_lin, Y0, 0.01, 300, options=opts)
    # An interrupted run: 120 steps with checkpoints, then resume to 300.
    ts.run(f_lin, Y0, 0.01, 120, options=dataclasses.replace(opts, checkpoint_path=path))
    assert os.listdir(tmp_path) == ["ck.npz"]  # no temporary file left
    y_ck, t, step, meta = ts.load_checkpoint(path, Y0)
    assert step == 120 and t == pytest.approx(1.2) and str(meta["method"]) == "lserk4"
    assert str(meta["problem"]) == "damped rotation" and int(meta["order"]) == 2
    y_res, info = ts.run(f_lin, Y0, 0.01, 300, options=dataclasses.replace(opts, resume=path))
    assert info.resumed_from == 120 and info.steps == 180
    assert np.array_equal(np.asarray(y_res), np.asarray(y_full))
    # Another dt, method or caller metadata: refused, naming the key and both values.
    resume = dataclasses.replace(opts, resume=path)
    with pytest.raises(ValueError, match=r"dt = 0\.01 in the checkpoint, 0\.02 in this run"):
        ts.run(f_lin, Y0, 0.02, 300, options=resume)
    with pytest.raises(ValueError, match=r"method = 'lserk4' in the checkpoint, 'rk4' in this run"):
        ts.run(f_lin, Y0, 0.01, 300, method="rk4", options=resume)
    with pytest.raises(ValueError, match=r"order = 2 in the checkpoint, 3 in this run"):
        ts.run(f_lin, Y0, 0.01, 300, options=dataclasses.replace(resume, meta={"problem": "damped rotation",
                                                                              "order": 3}))
    with pytest.raises(ValueError, match=r"problem = 'damped rotation' in the checkpoint, '\(none\)' in this run"):
        ts.run(f_lin, Y0, 0.01, 300, options=ts.RunOptions(resume=path, meta={"order": 2}))


def test_run_options_are_checked_and_hashable():
    assert ts.RunOptions(meta={"b": 1, "a": "x"}).meta == (("a", "x"), ("b", 1))
    assert hash(ts.RunOptions(meta={"a": 1.5})) == hash(ts.RunOptions(meta=[("a", 1.5)]))
    assert ts.RunOptions(meta={"n": np.int64(3)}).meta == (("n", 3),)
    for kw, msg in [
        (dict(chunk_steps=0), r"RunOptions\.chunk_steps must be an int >= 1, got 0"),
        (dict(chunk_steps=2.0), r"RunOptions\.chunk_steps must be an int >= 1, got 2\.0"),
        (dict(dt_max=-1.0), r"RunOptions\.dt_max must be None or a positive finite number, got -1\.0"),
        (dict(meta={"dt": 0.1}), r"RunOptions\.meta key 'dt' is reserved"),
        (dict(meta={"not a key": 1}), r"RunOptions\.meta keys must be identifiers, got 'not a key'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ts.RunOptions(**kw)
    for kw, msg in [
        (dict(progress="yes"), r"RunOptions\.progress must be True, False or 'auto', got 'yes'"),
        (dict(checkpoint_path=3), r"RunOptions\.checkpoint_path must be None or a path"),
        (dict(meta={"mesh": [1, 2]}), r"RunOptions\.meta\['mesh'\] must be a str, int, float or bool"),
    ]:
        with pytest.raises(TypeError, match=msg):
            ts.RunOptions(**kw)
    with pytest.raises(TypeError):
        ts.RunOptions(100)  # keywords only
    with pytest.raises(TypeError, match="options must be a RunOptions"):
        ts.run(f_lin, Y0, 0.1, 10, options={"chunk_steps": 5})


def test_progress_bar_on_stderr(capsys):
    ts.run(f_lin, Y0, 0.01, 20, options=ts.RunOptions(chunk_steps=5, progress=True, desc="unit"))
    out, err = capsys.readouterr()
    assert out == "" and "unit" in err


def test_spectral_radius_of_a_known_operator():
    lam = jnp.array([3.0, -7.0, 2.0, 0.5])
    rho = ts.spectral_radius(lambda v, a: a * v, jnp.zeros(4), lam, iterations=200)
    assert rho == pytest.approx(7.0, rel=1e-6)


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
    opts = ts.RunOptions(chunk_steps=chunk, checkpoint_path=path)
    with pytest.raises(ts.RunInterrupted, match=rf"interrupted by {sig.name} at step 80 \(t = 0\.8\); "
                                                r"checkpoint .*ck\.npz holds this state") as exc:
        ts.drive(advance, Y0, 300, dt=dt, t0=0.0, label="lserk4", options=opts)
    assert (exc.value.step, exc.value.t, exc.value.signal, exc.value.checkpoint) == (80, pytest.approx(0.8), sig,
                                                                                     str(path))
    assert signal.getsignal(sig) is before
    assert ts.load_checkpoint(path, Y0)[2] == 80 and os.listdir(tmp_path) == ["ck.npz"]
    y_full, _ = ts.run(f_lin, Y0, dt, 300, options=ts.RunOptions(chunk_steps=chunk))
    y_res, info = ts.run(f_lin, Y0, dt, 300, options=ts.RunOptions(chunk_steps=chunk, resume=path))
    assert info.resumed_from == 80 and np.array_equal(np.asarray(y_res), np.asarray(y_full))
    # without a checkpoint file the message says so
    with pytest.raises(ts.RunInterrupted, match="no checkpoint was written"):
        ts.drive(advance, Y0, 300, dt=dt, t0=0.0, label="lserk4", options=ts.RunOptions(chunk_steps=chunk))


def _forge(tmp_path, good, name, **changes):
    """A copy of the checkpoint ``good`` with fields replaced (``None``: removed)."""
    with np.load(good) as z:
        d = dict(z)
    d.update(changes)
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in d.items() if v is not None})
    return path


def test_load_checkpoint_checks_every_field_and_names_the_file(tmp_path):
    good = tmp_path / "good.npz"
    ts.save_checkpoint(good, Y0, 0.5, 50, dt=0.01, t0=0.0, method="lserk4")
    y, t, step, meta = ts.load_checkpoint(good, Y0, max_step=100)
    assert (t, step, str(meta["method"])) == (0.5, 50, "lserk4")
    cases = [
        (dict(step=np.int64(-3)), r"step must be an integer in 0\.\.100 \(this run has 100 steps\), got -3"),
        (dict(step=np.int64(101)), r"step must be an integer in 0\.\.100 .*got 101"),
        (dict(step=np.float64(50.0)), r"step must be an integer, got an array of shape \(\) and dtype float64"),
        (dict(step=np.arange(2)), r"step must be an integer, got an array of shape \(2,\)"),
        (dict(step=None), r"lacks step"),
        (dict(t=np.float64(np.nan)), r"t must be a finite number, got nan"),
        (dict(t=np.float64(-np.inf)), r"t must be a finite number, got -inf"),
        (dict(num_leaves=np.int64(2)), r"num_leaves = 2 must be >= 0 and name its arrays leaf_0 \.\. leaf_1"),
        (dict(num_leaves=np.int64(-1)), r"num_leaves = -1"),
        (dict(leaf_0=np.zeros(3)), r"array 0 has shape \(3,\) and dtype float64, this run's has shape \(2,\)"),
        (dict(leaf_0=np.zeros(2, np.float32)), r"dtype float32, this run's has shape \(2,\) and dtype float64"),
        (dict(meta_dt=np.zeros(3)), r"meta_dt must be a str, number or bool"),
        (dict(meta_obj=np.array([{}], dtype=object)), r"cannot read 'meta_obj'"),
    ]
    for i, (changes, msg) in enumerate(cases):
        path = _forge(tmp_path, good, f"bad{i}.npz", **changes)
        with pytest.raises(ValueError, match=msg) as exc:
            ts.load_checkpoint(path, Y0, max_step=100)
        assert f"checkpoint {str(path)!r}" in str(exc.value), exc.value
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got -3"):  # no run length to bound it
        ts.checkpoint_meta(_forge(tmp_path, good, "neg.npz", step=np.int64(-3)))
    (tmp_path / "text.npz").write_text("not a zip")
    (tmp_path / "half.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    np.save(tmp_path / "one.npy", np.zeros(2))
    for name, msg in [("text.npz", "is not a checkpoint written by save_checkpoint"),
                      ("half.npz", "is not a checkpoint written by save_checkpoint|cannot read"),
                      ("one.npy", "is a single .npy array")]:
        with pytest.raises(ValueError, match=msg) as exc:
            ts.load_checkpoint(tmp_path / name, Y0)
        assert name in str(exc.value)
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nothing\.npz': no such file"):
        ts.checkpoint_meta(tmp_path / "nothing.npz")
    with pytest.raises(ValueError, match=r"save_checkpoint\('.*x\.npz'\): step must be an integer >= 0, got -1"):
        ts.save_checkpoint(tmp_path / "x.npz", Y0, 0.0, -1)
    # a run that resumes past its own end is refused with the file named, before any step
    with pytest.raises(ValueError, match=r"good\.npz'.*0\.\.20 \(this run has 20 steps\), got 50"):
        ts.run(f_lin, Y0, 0.01, 20, options=ts.RunOptions(resume=good, meta={}))
