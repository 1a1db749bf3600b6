import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.solvers import pcg
from jaxsem.solvers.pcg import AdjointNotConvergedWarning, linear_solve, min_tol
from jaxsem.core.reduce import weighted_dots


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


@pytest.mark.parametrize("tol, dtype", [
    (1.0, jnp.float64), (2.0, jnp.float64), (np.nan, jnp.float64), (np.inf, jnp.float64), (-1e-8, jnp.float64),
    (1e-30, jnp.float64), (1e-15, jnp.float64), (1e-7, jnp.float32), (True, jnp.float64), ("1e-8", jnp.float64),
])
def test_bad_tolerance_is_named_before_tracing(tol, dtype):
    """tol ≥ 1 (x = 0 "converges"), non-finite, negative, or below 10·eps of the dtype: refused with
    the value and the allowed range, before the operator is ever traced or applied."""
    calls = []
    A = lambda v: (calls.append(1), v)[1]
    b = jnp.ones(3, dtype)
    with pytest.raises(ValueError, match=r"tol must be 0 .*or in \[.*, 1\).*got|tol must be a number") as e:
        pcg(A, b, dot=jnp.vdot, tol=tol)
    assert repr(tol) in str(e.value) or str(tol) in str(e.value)
    with pytest.raises(ValueError, match="tol"):
        jax.jit(lambda b: pcg(A, b, dot=jnp.vdot, tol=tol))(b)
    with pytest.raises(ValueError, match="tol"):
        linear_solve(A, b, dot=jnp.vdot, project=lambda u: u, weight=jnp.ones(3, dtype), tol=tol)
    assert calls == []


def test_tolerance_range_follows_the_dtype():
    assert min_tol(jnp.float64) == pytest.approx(10 * np.finfo(np.float64).eps)
    assert min_tol(jnp.float32) == pytest.approx(10 * np.finfo(np.float32).eps)
    A, b = _spd(20, 4)
    for dt in (jnp.float32, jnp.float64):
        x, info = pcg(lambda v: jnp.asarray(A, dt) @ v, jnp.asarray(b, dt), dot=jnp.vdot, tol=min_tol(dt), maxiter=3)
        assert x.dtype == dt and int(info.iterations) == 3  # the bound itself is accepted
    with pytest.raises(ValueError, match=r"float32.*got 1e-06"):
        pcg(lambda v: v, jnp.ones(3, jnp.float32), dot=jnp.vdot, tol=1e-6)


def _ill_conditioned32(kappa=1e4, n=60):
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = Q @ np.diag(np.logspace(0, np.log10(kappa), n)) @ Q.T
    return A, rng.standard_normal(n)


def test_converged_is_decided_on_the_true_residual():
    """float32, κ = 1e4: the recurrence reaches 1e-5 while b − A x stalls near 1e-4 (the issue's
    "converged" with a true residual above tol). Reported as not converged, with the true value."""
    A, b = _ill_conditioned32()
    A32, tol = jnp.asarray(A, jnp.float32), 1e-5
    solve = jax.jit(lambda b: pcg(lambda v: A32 @ v, b, dot=jnp.vdot, tol=tol, maxiter=500))
    x, info = solve(jnp.asarray(b, jnp.float32))
    true = np.linalg.norm(b - A @ np.asarray(x, np.float64)) / np.linalg.norm(b)
    assert float(info.residual) <= tol * float(info.residual0)  # the recurrence says "converged"
    assert true > 3 * tol and not bool(info.converged) and not bool(info.breakdown)
    assert float(info.true_relative_residual) == pytest.approx(true, rel=0.1)
    assert int(info.iterations) < 500  # the restarts stop once they no longer lower b − A x
    # the history is the recurrence's, as before
    h = np.asarray(info.history)
    assert h[int(info.iterations)] == pytest.approx(float(info.residual))


def _lying_dots(method, factor=1e-4):
    """``dots`` whose (r, r) is ``factor`` too small: the recurrence test passes too early."""
    def dots(pairs):
        vals = [jnp.vdot(u, v) for u, v in pairs]
        vals[-1] = factor * vals[-1]
        return jnp.stack(vals)
    return dots


@pytest.mark.parametrize("method", ["classic", "single-reduction"])
def test_restart_from_the_true_residual_reaches_tol(method):
    """When the recurrence meets tol and b − A x does not, CG restarts from the true residual
    until it does: converged then holds for the returned x; capped, it is reported as not."""
    A, b = _spd(40, 5)
    tol = 1e-10
    run = lambda maxiter: pcg(lambda v: A @ v, jnp.asarray(b), dot=jnp.vdot, dots=_lying_dots(method),
                              precond=lambda r: r / np.diag(A), tol=tol, maxiter=maxiter, method=method)
    x, info = jax.jit(lambda: run(200))()
    true = np.linalg.norm(b - A @ np.asarray(x)) / np.linalg.norm(b)
    assert bool(info.converged) and true <= tol and float(info.true_relative_residual) <= tol
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-7)
    # too few iterations for the restarts: the recurrence met tol, the true residual did not
    x, info = jax.jit(lambda: run(12))()
    true = np.linalg.norm(b - A @ np.asarray(x)) / np.linalg.norm(b)
    assert not bool(info.converged) and true > tol
    assert float(info.true_relative_residual) == pytest.approx(true, rel=1e-6)


def test_fixed_iteration_mode_reports_the_true_residual():
    A, b = _spd(40, 1)
    for method in ("classic", "single-reduction"):
        solve = jax.jit(lambda b: pcg(lambda v: A @ v, b, dot=jnp.vdot, tol=0.0, maxiter=7, method=method))
        x, info = solve(jnp.asarray(b))
        true = np.linalg.norm(b - A @ np.asarray(x)) / np.linalg.norm(b)
        assert int(info.iterations) == 7 and not bool(info.converged)
        assert float(info.true_relative_residual) == pytest.approx(true, rel=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_named_when_concrete(bad):
    A, b = _spd(10, 6)
    bb = b.copy()
    bb[3] = bad
    with pytest.raises(ValueError, match=r"b \(right-hand side\) has 1 non-finite value"):
        pcg(lambda v: A @ v, jnp.asarray(bb), dot=jnp.vdot)
    with pytest.raises(ValueError, match=r"x0 \(initial guess\) has 1 non-finite value"):
        pcg(lambda v: A @ v, jnp.asarray(b), dot=jnp.vdot, x0=jnp.asarray(bb))
    with pytest.raises(ValueError, match=r"b \(right-hand side\)"):
        linear_solve(lambda v: A @ v, jnp.asarray(bb), dot=jnp.vdot, project=lambda u: u, weight=jnp.ones(10))


def test_non_finite_inputs_are_flagged_when_traced():
    """Under jit NaN/Inf cannot raise: info.breakdown is set, converged is False and x is all NaN
    (before: u = 0 with only converged=False); one bad member of a batch leaves the others alone."""
    A, b = _spd(10, 6)
    bad = b.copy()
    bad[3] = np.nan
    solve = jax.jit(lambda b, x0: pcg(lambda v: A @ v, b, dot=jnp.vdot, x0=x0, tol=1e-12, maxiter=50))
    for rhs, x0 in ((bad, np.zeros(10)), (b, np.where(np.arange(10) == 2, np.inf, 0.0))):
        x, info = solve(jnp.asarray(rhs), jnp.asarray(x0))
        assert bool(info.breakdown) and not bool(info.converged)
        assert np.isnan(np.asarray(x)).all()
    # an operator that produces NaN (e.g. a NaN coefficient)
    x, info = jax.jit(lambda b: pcg(lambda v: A @ v * jnp.nan, b, dot=jnp.vdot))(jnp.asarray(b))
    assert bool(info.breakdown) and not bool(info.converged) and np.isnan(np.asarray(x)).all()
    # vmap: per member
    batch = jax.vmap(lambda b: pcg(lambda v: A @ v, b, dot=jnp.vdot, tol=1e-12, maxiter=50))
    xs, infos = batch(jnp.asarray(np.stack([b, bad])))
    assert np.asarray(infos.breakdown).tolist() == [False, True]
    assert np.asarray(infos.converged).tolist() == [True, False]
    np.testing.assert_allclose(xs[0], np.linalg.solve(A, b), rtol=1e-10)
    # a good solve: no breakdown, true and recurrence residuals agree
    x, info = solve(jnp.asarray(b), jnp.zeros(10))
    assert not bool(info.breakdown) and bool(info.converged)
    assert float(info.true_relative_residual) <= 1e-12


def test_poisson_solve_names_a_non_finite_source(small_problem):
    sem, f, h1, h2, _, _ = small_problem
    with pytest.raises(ValueError, match=r"f has 1 non-finite"):  # named as the caller passed it
        poisson.solve(sem, f.at[0, 0, 0, 0].set(jnp.nan), h1, h2)
    u, info = jax.jit(lambda f: poisson.solve(sem, f, h1, h2, tol=1e-10))(f.at[0, 0, 0, 0].set(jnp.nan))
    assert bool(info.breakdown) and not bool(info.converged)
    free = sem.mask > 0  # Dirichlet nodes hold the boundary data; every unknown is NaN, none looks valid
    assert bool(jnp.isnan(u[free]).all()) and int(free.sum()) > 0


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


def test_flexible_cg():
    """Fixed SPD preconditioner: the flexible (Polak–Ribière) β has the classic iterates.
    A preconditioner that changes each call (Jacobi times 1 + 0.1·noise, new noise per
    call): both meet 1e-12, flexible CG in about half the iterations (measured 1081 vs 2123)."""
    A, b = _spd(60, seed=1)
    A = A @ np.diag(np.linspace(1, 30, 60)) @ A  # wider spectrum
    d = 1 / np.diag(A)
    op, bj = (lambda v: A @ v), jnp.asarray(b)
    xc, ic = pcg(op, bj, dot=jnp.vdot, precond=lambda r: d * r, tol=0.0, maxiter=25)
    xf, if_ = pcg(op, bj, dot=jnp.vdot, precond=lambda r: d * r, tol=0.0, maxiter=25, method="flexible")
    np.testing.assert_allclose(if_.history, ic.history, rtol=1e-7)
    np.testing.assert_allclose(xf, xc, rtol=1e-7, atol=1e-12)

    def noisy(r):  # a different, slightly perturbed Jacobi at every call
        key = jax.random.PRNGKey(jnp.asarray(1e6 * jnp.abs(r[0]), jnp.uint32))
        return d * r * (1 + 0.1 * jax.random.normal(key, r.shape))

    its = {}
    for method in ("classic", "flexible"):
        x, info = pcg(op, bj, dot=jnp.vdot, precond=noisy, tol=1e-12, maxiter=4000, method=method)
        assert bool(info.converged), method
        np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-8)
        its[method] = int(info.iterations)
    assert its["flexible"] < 0.7 * its["classic"], its


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


def _periodic_laplacian(n):
    """The 1D periodic second difference: symmetric, singular, null space the constants."""
    L = 2 * np.eye(n) - np.roll(np.eye(n), 1, 0) - np.roll(np.eye(n), -1, 0)
    return jnp.asarray(L)


@pytest.mark.parametrize("method", ["classic", "single-reduction", "flexible"])
def test_nullspace_keeps_a_singular_solve_in_the_range(method):
    """A preconditioner that amplifies the null space (as a Chebyshev polynomial's p(0) does)
    with a right-hand side carrying a small constant part: with ``nullspace`` the solve meets
    tol and returns the solution orthogonal to the constants; without it, it fails."""
    n = 40
    A = _periodic_laplacian(n)
    one = jnp.ones(n)
    M = jnp.eye(n) + 1e6 * jnp.outer(one, one) / n
    rng = np.random.default_rng(5)
    b0 = jnp.asarray(rng.standard_normal(n))
    b0 = b0 - jnp.mean(b0)
    b = b0 + 1e-9 * one  # a consistent system up to an inconsistency at the 1e-10 level
    kw = dict(dot=jnp.vdot, precond=lambda r: M @ r, tol=1e-12, maxiter=200, method=method)
    x, info = pcg(lambda v: A @ v, b, nullspace=one, **kw)
    assert bool(info.converged), info.true_relative_residual
    assert abs(float(jnp.sum(x))) < 1e-10 * float(jnp.linalg.norm(x))
    np.testing.assert_allclose(A @ x, b0, atol=1e-11 * float(jnp.linalg.norm(b0)))
    _, info = pcg(lambda v: A @ v, b, **kw)
    assert not bool(info.converged)


def test_adjoint_that_misses_tol_warns():
    """jax.grad through linear_solve: an adjoint that stops above tol warns, naming the residual;
    one that meets it is silent."""
    n = 30
    A = _periodic_laplacian(n) + 1e-3 * jnp.eye(n)
    rng = np.random.default_rng(6)
    b = jnp.asarray(rng.standard_normal(n))
    w = jnp.asarray(rng.standard_normal(n))

    def loss(b, maxiter):
        x, _ = linear_solve(lambda v: A @ v, b, dot=jnp.vdot, project=lambda u: u, weight=jnp.ones(n),
                            tol=1e-12, maxiter=maxiter)
        return jnp.vdot(w, x)

    with pytest.warns(AdjointNotConvergedWarning, match="relative residual"):
        jax.block_until_ready(jax.jit(jax.grad(loss), static_argnums=1)(b, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdjointNotConvergedWarning)
        g = jax.jit(jax.grad(loss), static_argnums=1)(b, 200)
    np.testing.assert_allclose(g, jnp.linalg.solve(A.T, w), rtol=1e-8)
