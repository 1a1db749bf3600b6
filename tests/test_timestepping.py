"""Explicit RK: empirical orders, stability radii, checkpointed grads."""

import itertools

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
    for ck in (ts.Checkpointing(8, "checkpoint"), custom, ts.Checkpointing(36, "custom_vjp"),
               ts.Checkpointing(8, offload=True)):
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


def test_offload_keeps_the_chunk_states_in_host_memory():
    """``Checkpointing(offload=True)``: the chunks' start states are stored in the host's memory
    space in the gradient's program (and nothing is without it), the gradient is the plain loop's, and a
    bad ``offload`` or one without ``every`` is refused, naming the field."""

    def loss(a, ck):
        y = ts.integrate(lambda t, y: a * jnp.tanh(A @ y), Y0, 0.01, 37, checkpointing=ck)
        return jnp.sum(y**2)

    def host_shapes(ck):  # shapes of the values the gradient's program puts in host memory
        shapes = set()

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                shapes.update(v.aval.shape for v in eqn.outvars
                              if getattr(v.aval, "memory_space", None) == jax.memory.Space.Host)
                for p in eqn.params.values():
                    for sub in p if isinstance(p, (tuple, list)) else (p,):
                        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                        if hasattr(sub, "eqns"):
                            walk(sub)

        walk(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(1.3, ck).jaxpr)
        return shapes

    assert (4, 2) in host_shapes(ts.Checkpointing(8, offload=True))  # 37 steps: 4 chunk states of 8
    assert host_shapes(ts.Checkpointing(8, "custom_vjp")) == set()
    g = jax.grad(loss)
    assert float(g(1.3, ts.Checkpointing("sqrt", offload=True))) == pytest.approx(
        float(g(1.3, ts.Checkpointing())), rel=1e-12)
    with pytest.raises(ValueError, match="offload"):
        ts.Checkpointing(8, offload="yes")
    with pytest.raises(ValueError, match="offload"):
        ts.Checkpointing(offload=True)
    with pytest.raises(ValueError, match="offload"):
        ts.Checkpointing(snapshots=4, offload=True)


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


def _least_recomputation(n: int, s: int, memo={}) -> int:
    """The fewest steps any schedule advances to reverse ``n`` steps from one stored state with
    ``s`` snapshots: a dynamic programme over the place of the next snapshot (independent of
    the closed form and of the split rule the library uses)."""
    if n == 1:
        return 0
    if s == 1:
        return n * (n - 1) // 2
    if (n, s) not in memo:
        memo[n, s] = min(m + _least_recomputation(n - m, s - 1) + _least_recomputation(m, s) for m in range(1, n))
    return memo[n, s]


def test_binomial_schedule_reverses_every_step_with_the_least_recomputation():
    """The revolve table, replayed on step numbers: each row restores a stored state, reaches the
    step it pulls back through, stores only into the slots it has, and the rows pull back through
    n − 1, …, 0; the steps it advances are the fewest the dynamic programme finds."""
    from jaxsem.solvers.timestepping import _revolve_actions

    for n in range(2, 70):
        for s in range(1, 7):
            rows = _revolve_actions(n, s)
            assert [m for *_, m in rows] == list(range(n - 1, -1, -1))
            stored, advanced = {0: 0}, 0
            for restore, pairs, m in rows:
                step = stored[restore]
                for start, count, slot in pairs:
                    assert start == step
                    step, advanced = step + count, advanced + count
                    if slot is not None:
                        assert 0 < slot < s
                        stored[slot] = step
                assert step == m
            least = _least_recomputation(n, s)
            assert advanced == least, (n, s)
            # the forward run advances n − 1 of them; the rest is the reverse pass's
            assert ts.Checkpointing(snapshots=s).recomputed_steps(n) == least - (n - 1)
    assert ts.Checkpointing(snapshots=30).recomputed_steps(3000) == 5473  # t = 3: under 3 runs' worth


def test_binomial_schedule_gradient_equals_the_plain_one_and_recomputes_what_it_says():
    """Checkpointing(snapshots=s): the plain loop's value and gradient (w.r.t. a closed-over
    parameter, y0 and a traced dt, with per-step observations) for 1, 3 and more snapshots than
    steps; the steps evaluated (a callback counts them) are the forward run's n, the n pull-backs
    and the schedule's recomputed steps, no more."""

    def loss(a, y0, dt, checkpointing):
        f = lambda t, y: a * (A @ y) + dt * jnp.sin(y + t)
        y, obs = ts.integrate(f, y0, dt, 37, checkpointing=checkpointing, observe=lambda y: y[0] ** 2)
        return jnp.sum(y**2) + jnp.sum(obs)

    vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    v0, g0 = vg(1.3, Y0, 0.01, ts.Checkpointing())
    for s in (1, 3, 40):
        v, g = vg(1.3, Y0, 0.01, ts.Checkpointing(snapshots=s))
        assert float(v) == pytest.approx(float(v0), rel=1e-14)
        for a, b in zip(g, g0):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)

    calls = []

    def one(y, m):
        jax.debug.callback(lambda m: calls.append(int(m)), m)
        return jnp.sin(y) * 1.01, y[0]

    for s in (1, 3, 6):
        calls.clear()
        ck = ts.Checkpointing(snapshots=s)
        g = jax.grad(lambda y: jnp.sum(ts.checkpointed_scan(one, y, 40, ck)[0]))(Y0)
        jax.block_until_ready(g)
        assert len(calls) == 2 * 40 + ck.recomputed_steps(40), s


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
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"Checkpointing\.snapshots must be None or an int >= 1, got"):
            ts.Checkpointing(snapshots=bad)
    with pytest.raises(ValueError, match="every or snapshots, not both"):
        ts.Checkpointing("sqrt", snapshots=4)
    with pytest.raises(TypeError, match="checkpointing must be a Checkpointing"):
        ts.integrate(f_lin, Y0, 0.1, 10, checkpointing="sqrt")
    with pytest.raises(ValueError, match="num_steps"):
        ts.integrate(f_lin, Y0, 0.1, -1)
    with pytest.raises(ValueError, match="stages must be 'auto', 'loop' or 'unrolled', got 'none'"):
        ts.integrate(f_lin, Y0, 0.1, 10, stages="none")


def test_observe_collects_per_step():
    y, obs = ts.integrate(f_lin, Y0, 0.1, 5, observe=lambda y: y[0], checkpointing=ts.Checkpointing(2))
    assert obs.shape == (5,) and float(obs[-1]) == float(y[0])


def test_spectral_radius_of_a_known_operator():
    lam = jnp.array([3.0, -7.0, 2.0, 0.5])
    rho = ts.spectral_radius(lambda v, a: a * v, jnp.zeros(4), lam, iterations=200)
    assert rho == pytest.approx(7.0, rel=1e-6)
