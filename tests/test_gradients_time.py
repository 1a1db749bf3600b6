"""jax.grad through explicit time stepping == central finite differences; checkpointing; batching.

Maxwell (PEC cavity, curved 2×2×2 mesh of order 2, upwind flux, 16 LSERK4
steps) and advection (periodic, 2×2×2, order 2, 16 steps). The Maxwell loss
is an inverse-problem misfit: E at three probe nodes after every step
(:func:`jaxsem.models.inverse.sample` as ``observe``) against the exact record in
vacuum (two cavity modes), plus the final electric energy, as a function of

* ε: per element ``(E,)`` plus a per-node field ``(E, n, n, n)`` added to it
  (so the per-element gradient is the element sum of the per-node one), and
  a scalar ε (the direction ``(1, …, 1)`` of the per-element one);
* μ per element ``(E,)``;
* the initial condition ``q0: (6, E, n, n, n)``.

Directional derivatives along random directions must match central
differences to 1e-6 relative (measured ≤ 9e-10). The gradient of
:func:`~jaxsem.solvers.timestepping.integrate` (its reverse pass recomputes
``f`` from the kept stage inputs), plain and ``Checkpointing("sqrt")``, must
equal JAX's own reverse pass through a ``lax.scan`` of ``rk_step`` (every
residual of ``f`` kept) to 1e-12 (measured: identical to round-off). The
compiled scratch memory of the gradient must grow like √steps checkpointed
and like steps plain, by the 5 stage inputs of a step (measured 16 → 256
steps: plain ×9.4, 5.0 states per step; checkpointed ×1.8). ``jax.vmap``
over 16 permittivities must equal the loop. Compiles dominate the run time,
so each compiled function is built once per module and reused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import inverse
from jaxsem import timestepping as ts
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as ad
from jaxsem.models import maxwell as mx

RTOL = 1e-6
STEPS = 16
DT = 0.04  # < ½ of the stable limit 0.094 of this mesh at ε = μ = 1; ε, μ ≥ 1 below only slow waves
PROBES = np.array([[0.2, 0.3, 0.7], [0.8, 0.5, 0.4], [0.5, 0.8, 0.2]])


def autodiff_scan(f, y0, dt, num_steps, observe, method="lserk4"):
    """The reference: ``lax.scan`` of :func:`rk_step` (``(y, obs)``), whose reverse pass keeps every residual of ``f``."""

    def one(y, m):
        y = ts.rk_step(f, m * dt, y, dt, method, loop_stages=True)
        return y, observe(y)

    return jax.lax.scan(one, y0, jnp.arange(num_steps))


@pytest.fixture(scope="module")
def maxwell():
    dg = discretize_dg(box_mesh((2, 2, 2), 2, deform=0.1))
    E = dg.num_elements
    rng = np.random.default_rng(0)
    eps_e = jnp.asarray(rng.uniform(1.0, 2.0, E))
    eps_n = jnp.asarray(0.1 * rng.uniform(size=dg.jac.shape))
    mu_e = jnp.asarray(rng.uniform(1.0, 1.5, E))
    exact = lambda x, t: mx.cavity_mode(x, t) + 0.1 * mx.cavity_mode(x, t, mode=(2, 1, 1))
    q0 = exact(dg.x, 0.0)
    probes = inverse.probe_nodes(dg.x, PROBES)
    # the target: the exact record at the probe nodes in vacuum (ε = μ = 1), (STEPS, 3, P)
    xp = inverse.sample(dg.x, probes)
    target = jnp.stack([exact(xp, (m + 1) * DT)[:3] for m in range(STEPS)])

    def forward(eps, mu, q0, steps, every):
        mat = mx.material(dg, eps, mu)
        f, observe = (lambda t, q: mx.rhs(dg, mat, q)), (lambda q: inverse.sample(q[:3], probes))
        if every == "autodiff":
            return autodiff_scan(f, q0, DT, steps, observe)
        return ts.integrate(f, q0, DT, steps, checkpointing=ts.Checkpointing(every), observe=observe)

    def loss(eps_e, eps_n, mu_e, q0, steps=STEPS, every=None):
        q, obs = forward(eps_e[:, None, None, None] + eps_n, mu_e, q0, steps, every)
        record = jnp.tile(target, (steps // STEPS, 1, 1))  # longer runs (memory test) repeat it
        misfit = jnp.sum((obs - record) ** 2) / jnp.sum(record**2)
        return misfit + jnp.sum(dg.mass * q[:3] ** 2)

    params = (eps_e, eps_n, mu_e, q0)
    vg = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))
    compiled = {}

    def compile_vg(steps, every, **options):
        """``value_and_grad`` compiled for a step count and checkpointing (memory_analysis; callable)."""
        key = (steps, every)
        if key not in compiled:
            lowered = jax.jit(lambda *p: vg(*p, steps, every)).lower(*params)
            compiled[key] = lowered.compile(options or None)
        return compiled[key]

    plain = compile_vg(STEPS, None)
    return dict(dg=dg, params=params, loss=loss, vg=vg, compile_vg=compile_vg, plain=plain,
                grads=plain(*params)[1])


def _fd_errors(value, grads, params, dirs, h):
    """|⟨∇L, v⟩ − (L(p + hv) − L(p − hv)) / 2h| / |FD| for each (argument, direction)."""
    errs = {}
    for name, (i, v) in dirs.items():
        plus, minus = list(params), list(params)
        plus[i], minus[i] = params[i] + h * v, params[i] - h * v
        fd = (float(value(*plus)) - float(value(*minus))) / (2 * h)
        ad_ = float(jnp.vdot(grads[i], v))
        errs[name] = abs(ad_ - fd) / abs(fd)
    return errs


def test_maxwell_gradients_match_central_differences(maxwell):
    dg, params, grads = maxwell["dg"], maxwell["params"], maxwell["grads"]
    E, n = dg.num_elements, dg.n
    assert [g.shape for g in grads] == [(E,), (E, n, n, n), (E,), (6, E, n, n, n)]
    rng = np.random.default_rng(1)
    r = lambda shape: jnp.asarray(rng.standard_normal(shape))
    dirs = {"eps scalar": (0, jnp.ones(E)), "eps per element": (0, r(E)),
            "eps per node": (1, r((E, n, n, n))), "eps per node 2": (1, r((E, n, n, n))),
            "mu per element": (2, r(E)), "mu per element 2": (2, r(E)),
            "q0": (3, r((6, E, n, n, n))), "q0 2": (3, r((6, E, n, n, n)))}
    value = lambda *p: maxwell["plain"](*p)[0]
    errs = _fd_errors(value, grads, params, dirs, h=1e-5)
    print({k: f"{e:.1e}" for k, e in errs.items()})
    for name, e in errs.items():
        assert e < RTOL, (name, e)
    # per element = the element sums of per node (ε enters as eps_e + eps_n)
    np.testing.assert_allclose(grads[0], grads[1].sum(axis=(1, 2, 3)), rtol=1e-12)


def test_gradients_equal_autodiff_of_the_step_loop(maxwell):
    """integrate's reverse pass (f recomputed from the stage inputs), plain and in 4 chunks of 4
    steps under jax.checkpoint: JAX's reverse pass through a scan of rk_step, to round-off."""
    params = maxwell["params"]
    v0, g0 = maxwell["compile_vg"](STEPS, "autodiff")(*params)
    for v1, g1 in (maxwell["plain"](*params), maxwell["compile_vg"](STEPS, "sqrt")(*params)):
        assert abs(float(v1) - float(v0)) <= 1e-14 * abs(float(v0))
        for a, b in zip(g1, g0):
            assert float(jnp.max(jnp.abs(a - b))) <= 1e-12 * float(jnp.max(jnp.abs(b)))


def test_checkpointed_memory_grows_like_sqrt_of_steps(maxwell):
    """Compiled scratch memory (``temp_size_in_bytes``) of the gradient at 16 and 256 steps.

    Plain: every step's residuals are kept (×16 for 16× the steps, up to a
    constant part): the inputs of its 5 stages, 5 states (JAX's own reverse
    pass keeps ~18). ``"sqrt"``: ⌈√N⌉-step chunks under ``jax.checkpoint``
    keep N/c chunk states plus one chunk's residuals, ∝ √N (×4). A linear
    growth of the checkpointed version would fail the bound ×6. The 256-step
    programs are only compiled (XLA's backend optimizations off: the memory
    plan is the same, the compile 2–3× faster).
    """
    fast = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)
    mem = {}
    for every in (None, "sqrt"):
        for steps in (STEPS, 16 * STEPS):
            opts = fast if steps > STEPS else {}
            stats = maxwell["compile_vg"](steps, every, **opts).memory_analysis()
            mem[every, steps] = stats.temp_size_in_bytes
    plain = mem[None, 256] / mem[None, 16]
    sqrt = mem["sqrt", 256] / mem["sqrt", 16]
    per_step = (mem[None, 256] - mem[None, 16]) / (15 * STEPS) / maxwell["params"][3].nbytes
    print(f"temp bytes {mem}; growth 16 -> 256 steps: plain x{plain:.1f} ({per_step:.2f} states per step), "
          f"sqrt x{sqrt:.1f}")
    assert plain > 8, plain  # ~linear (16 with no constant part; ~4 for √N)
    assert 4.5 < per_step < 5.5, per_step  # the stage inputs
    assert sqrt < 6, sqrt  # ~√16 = 4; linear growth gives ~16
    assert mem["sqrt", 256] * 5 < mem[None, 256]


def test_vmap_over_permittivities_equals_the_loop(maxwell):
    """16 scalar permittivities at once: values and d/dε as one by one (the loop: the plain function)."""
    _, eps_n, mu_e, q0 = maxwell["params"]
    E = eps_n.shape[0]
    eps = jnp.linspace(1.0, 2.5, 16)
    one = lambda s: jax.value_and_grad(lambda s: maxwell["loss"](s * jnp.ones(E), 0.0 * eps_n, mu_e, q0))(s)
    vb, gb = jax.jit(jax.vmap(one))(eps)
    rows = [maxwell["plain"](s * jnp.ones(E), 0.0 * eps_n, mu_e, q0) for s in eps]
    np.testing.assert_allclose(vb, [float(v) for v, _ in rows], rtol=1e-12)
    np.testing.assert_allclose(gb, [float(g[0].sum()) for _, g in rows], rtol=1e-10)
    assert len(set(np.sign(np.asarray(gb)).tolist())) == 2  # a real study: the loss has a minimum inside


def test_advection_initial_condition_gradient():
    """d/du0 of a misfit after 16 upwind steps (periodic box): central differences; checkpointed = plain."""
    dg = discretize_dg(box_mesh((2, 2, 2), 2, periodic=(True,) * 3, deform=0.1))
    tr = ad.transport(dg)
    u0 = ad.gaussian(dg.x, 0.0)
    target = ad.gaussian(dg.x, 0.3)
    probes = inverse.probe_nodes(dg.x, PROBES)

    def loss(u0, every):
        u, obs = ts.integrate(lambda t, u: ad.rhs(dg, tr, u), u0, 0.02, STEPS,
                              checkpointing=ts.Checkpointing(every), observe=lambda u: inverse.sample(u, probes))
        return jnp.sum(dg.mass * (u - target) ** 2) + jnp.sum(obs**2)

    vg = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    _, g = vg(u0, None)
    _, gc = vg(u0, "sqrt")
    assert float(jnp.max(jnp.abs(gc - g))) <= 1e-12 * float(jnp.max(jnp.abs(g)))
    rng = np.random.default_rng(2)
    for _ in range(2):
        v = jnp.asarray(rng.standard_normal(u0.shape))
        h = 1e-4
        fd = (float(vg(u0 + h * v, None)[0]) - float(vg(u0 - h * v, None)[0])) / (2 * h)
        err = abs(float(jnp.vdot(g, v)) - fd) / abs(fd)
        print(f"advection u0: {err:.1e}")
        assert err < RTOL, err


def test_probe_nodes_average_the_copies_of_a_shared_node():
    dg = discretize_dg(box_mesh((2, 2, 2), 3))
    p = inverse.probe_nodes(dg.x, [[0.5, 0.5, 0.5], [0.49, 0.26, 0.02], [0.1, 0.1, 0.1]])
    # the centre vertex: 8 elements; a face node: 2; a node inside one element: 1
    assert (p.weight > 0).sum(axis=1).tolist() == [8, 2, 1]
    np.testing.assert_allclose(p.weight.sum(axis=1), 1.0)
    x = np.asarray(inverse.sample(dg.x, p)).T
    np.testing.assert_allclose(x[0], [0.5, 0.5, 0.5], atol=1e-15)
    assert p.distance[0] == pytest.approx(0.0, abs=1e-15) and p.distance[1] > 0
    np.testing.assert_allclose(np.linalg.norm(x - [[0.5, 0.5, 0.5], [0.49, 0.26, 0.02], [0.1, 0.1, 0.1]], axis=1),
                               p.distance, atol=1e-14)
    with pytest.raises(ValueError, match="points"):
        inverse.probe_nodes(dg.x, [0.5, 0.5, 0.5])


@pytest.mark.parametrize("model", ["maxwell", "advection"])
def test_dot_product_and_directions_on_three_elements_per_direction(model):
    """Curved 3×3×3 mesh of order 2, eight LSERK4 steps (plain and √-checkpointed reverse passes):
    the dot-product test of the linear map q⁰ ↦ q(T) for random element-local v, w (1e-10), and
    ⟨∇L, v⟩ against central differences along two random directions of the material (Maxwell: ε
    per node) or of the initial field (advection), 1e-7."""
    from jaxsem.gradcheck import directional_errors, dot_product as dot_product_test, random_directions

    steps = 8
    if model == "maxwell":
        dg = discretize_dg(box_mesh((3, 3, 3), 2, deform=0.1, periodic=(True, False, False)))
        q0 = mx.cavity_mode(dg.x, 0.0) + 0.1 * mx.cavity_mode(dg.x, 0.0, mode=(2, 1, 1))
        eps = 1.5 + 0.3 * jnp.sin(3 * dg.x[0]) * jnp.cos(2 * dg.x[1])
        f = lambda e: (lambda t, q: mx.rhs(dg, mx.material(dg, e, 1.0), q))
        dt, p0 = 0.02, eps
    else:
        dg = discretize_dg(box_mesh((3, 3, 3), 2, periodic=(True,) * 3, deform=0.1))
        tr = ad.transport(dg)
        q0 = ad.gaussian(dg.x, 0.0)
        f = lambda _: (lambda t, u: ad.rhs(dg, tr, u))
        dt, p0 = 0.01, q0
    c = 1.0 + 0.2 * jnp.cos(dg.x[0] + dg.x[2])
    for every in (None, "sqrt"):
        run = lambda q, e: ts.integrate(f(e), q, dt, steps, checkpointing=ts.Checkpointing(every))
        errs = dot_product_test(lambda q: run(q, p0), q0)
        loss = (lambda e: jnp.sum(c * dg.mass * run(q0, e)[:3] ** 2)) if model == "maxwell" else \
               (lambda u: jnp.sum(c * dg.mass * run(u, None) ** 2))
        fd, _ = directional_errors(loss, p0, random_directions(p0, 2), h=1e-5)
        print(model, every, [f"{e:.1e}" for e in errs], [f"{e:.1e}" for e in fd])
        assert max(errs) < 1e-10, errs
        assert max(fd) < 1e-7, fd
