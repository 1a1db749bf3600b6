import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.solvers import pcg
from jaxsem.solvers.pcg import weighted_dots


def _spd(n, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return Q @ np.diag(np.linspace(1.0, 50.0, n)) @ Q.T, rng.standard_normal(n)


def test_pcg_matches_dense_solve():
    A, b = _spd(30)
    x, info = pcg(lambda v: A @ v, jnp.asarray(b), dot=jnp.vdot, precond=lambda r: r / np.diag(A), tol=1e-13, maxiter=100)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-10)
    assert bool(info.converged) and 0 < int(info.iterations) <= 60
    h = np.asarray(info.history)
    assert np.isfinite(h[: int(info.iterations) + 1]).all() and np.isnan(h[int(info.iterations) + 1 :]).all()
    assert h[int(info.iterations)] <= 1e-13 * h[0]


def test_fixed_iteration_mode_runs_exactly_maxiter():
    A, b = _spd(40, 1)
    _, info = jax.jit(lambda b: pcg(lambda v: A @ v, b, dot=jnp.vdot, tol=0.0, maxiter=7))(jnp.asarray(b))
    assert int(info.iterations) == 7


def test_non_convergence_is_reported():
    A, b = _spd(40, 2)
    _, info = pcg(lambda v: A @ v, jnp.asarray(b), dot=jnp.vdot, tol=1e-12, maxiter=3)
    assert int(info.iterations) == 3 and not bool(info.converged)
    assert float(info.residual) > 1e-12 * float(info.residual0)


@pytest.mark.parametrize("kwargs, match", [(dict(maxiter=0), "maxiter"), (dict(maxiter=2.5), "maxiter"), (dict(tol=-1.0), "tol")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pcg(lambda v: v, jnp.ones(3), dot=jnp.vdot, **kwargs)


@pytest.fixture(scope="module")
def small_problem():
    mesh = box_mesh((2, 2, 1), order=3, deform=0.1)
    sem = discretize(mesh, quadrature="gauss", dirichlet=True)
    q = sem.geom.B.shape
    key = jax.random.PRNGKey(3)
    k = jax.random.split(key, 6)
    f = 1.0 + jax.random.uniform(k[0], q)
    h1 = 1.0 + 0.5 * jax.random.uniform(k[1], q)
    h2 = 0.5 + jax.random.uniform(k[2], q)
    # a target of the solution's size keeps the loss well conditioned for differences
    target = 0.02 * jax.random.normal(k[3], sem.mask.shape)
    dirs = [jax.random.normal(k[4], q), jax.random.normal(k[5], q)]
    return sem, f, h1, h2, target, dirs


def _loss(sem, target, f, h1, h2):
    u, _ = poisson.solve(sem, f, h1, h2, tol=1e-14, maxiter=500)
    return sem.dot(u - target, u - target)


@pytest.mark.parametrize("arg", [0, 1, 2])
def test_gradient_matches_central_difference(small_problem, arg):
    sem, f, h1, h2, target, dirs = small_problem
    params = [f, h1, h2]
    loss = jax.jit(lambda *p: _loss(sem, target, *p))
    g = jax.grad(loss, argnums=arg)(*params)
    d = dirs[0]
    eps = 1e-4
    plus = list(params)
    minus = list(params)
    plus[arg] = params[arg] + eps * d
    minus[arg] = params[arg] - eps * d
    fd = (loss(*plus) - loss(*minus)) / (2 * eps)
    ad = jnp.vdot(g, d)
    assert abs(float(ad - fd)) <= 1e-6 * abs(float(fd)), (float(ad), float(fd))


def test_solution_info_and_adjoint_are_consistent(small_problem):
    sem, f, h1, h2, target, _ = small_problem
    u, info = poisson.solve(sem, f, h1, h2, tol=1e-12)
    assert bool(info.converged)
    # the solution satisfies the assembled equations
    r = poisson.load(sem, f) - poisson.operator(sem, h1, h2)(u)
    assert float(jnp.sqrt(sem.dot(r, r))) <= 1e-11 * float(info.residual0)
    # u is continuous and zero on the Dirichlet boundary
    assert float(jnp.abs(sem.dssum(sem.mult * u) - u).max()) < 1e-14
    assert float(jnp.abs(u * (1 - sem.mask)).max()) == 0.0


def test_single_reduction_cg_has_the_classic_iterates():
    mesh = box_mesh((2, 2, 2), order=4, deform=0.1)
    sem = poisson.bp_discretize(mesh, 5)
    f = poisson.manufactured(5).f
    run = jax.jit(lambda s, m, tol, k: poisson.solve(s, f, tol=tol, maxiter=k, method=m), static_argnums=(1, 2, 3))
    for k in (1, 5, 20):
        xc, ic = run(sem, "classic", 0.0, k)
        xs, is_ = run(sem, "single-reduction", 0.0, k)
        assert int(ic.iterations) == int(is_.iterations) == k
        assert float(jnp.abs(xc - xs).max() / jnp.abs(xc).max()) < 1e-10
        np.testing.assert_allclose(ic.history[: k + 1], is_.history[: k + 1], rtol=1e-8)
    xc, ic = run(sem, "classic", 1e-10, 500)
    xs, is_ = run(sem, "single-reduction", 1e-10, 500)
    assert bool(ic.converged) and bool(is_.converged)
    assert abs(int(ic.iterations) - int(is_.iterations)) <= 1
    assert float(jnp.abs(xc - xs).max() / jnp.abs(xc).max()) < 1e-8
    # counts three inner products per step in one reduction
    calls = []
    dots = lambda pairs: (calls.append(len(pairs)), jnp.stack([sem.dot(u, v) for u, v in pairs]))[1]
    A = poisson.operator(sem)
    pcg(A, poisson.load(sem, f), dot=sem.dot, dots=dots, tol=0.0, maxiter=3, method="single-reduction")
    assert calls == [3]  # traced once inside the while_loop body: one fused reduction


def test_bad_method():
    with pytest.raises(ValueError, match="method"):
        pcg(lambda v: v, jnp.ones(3), dot=jnp.vdot, method="pipelined-magic")


def test_weighted_dots_is_one_reduction_with_the_same_iterates():
    mesh = box_mesh((2, 2, 2), order=3, deform=0.1)
    sem = poisson.bp_discretize(mesh, 5)
    b = poisson.load(sem, poisson.manufactured(5).f)
    dinv = poisson.jacobi(sem)
    A = poisson.operator(sem)
    dots = weighted_dots(sem.mult)
    r = b + 0.5 * dinv
    np.testing.assert_allclose(dots([(r, dinv * r), (r, r)]), sem.dots([(r, dinv * r), (r, r)]), rtol=1e-13)
    run = lambda d: jax.jit(lambda b: pcg(A, b, dot=sem.dot, dots=d, precond=lambda r: dinv * r, tol=0.0, maxiter=12))(b)
    (x1, i1), (x2, i2) = run(sem.dots), run(dots)
    assert float(jnp.abs(x1 - x2).max() / jnp.abs(x1).max()) < 1e-12
    np.testing.assert_allclose(i1.history, i2.history, rtol=1e-11)
    # (r, M r) and (r, r): one reduce instruction in the compiled body
    hlo = jax.jit(lambda r: dots([(r, dinv * r), (r, r)])).lower(r).as_text()
    assert hlo.count("stablehlo.reduce") == 1
