"""jax.grad through elliptic solves == central finite differences; batched (vmap) studies.

Both differentiable solves are checked: :func:`jaxsem.models.poisson.solve`
(``lax.custom_linear_solve``) and :func:`jaxsem.models.inverse.solve` (``custom_vjp``
that reports the adjoint). Gradients w.r.t. the source, per-point and
per-element coefficients h₁, h₂ and the node coordinates (shape derivatives
through ``SEM.with_coordinates``) must match central differences to 1e-6
relative along random directions. The loss is quadratic in the solution with a
target of the solution's size, and the solves run to 1e-14, so the
difference error (O(ε²) truncation, O(tol/ε) solver noise) is ~1e-9.
"""

import warnings

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import inverse
from jaxsem.backends import CUDA
from jaxsem.backends.cuda import cuda_available
from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson

TOL, MAXITER = 1e-14, 300
RTOL = 1e-6

SOLVERS = {
    "custom_linear_solve": lambda sem, f, h1, h2: poisson.solve(sem, f, h1, h2, tol=TOL, maxiter=MAXITER),
    "custom_vjp": lambda sem, f, h1, h2: inverse.solve(sem, f, h1, h2, tol=TOL, maxiter=MAXITER),
}


def _bump(x):
    """Vanishes on the unit box's faces, 1 at its centre."""
    return 64.0 * x[0] * (1 - x[0]) * x[1] * (1 - x[1]) * x[2] * (1 - x[2])


def _smooth_field(key, x, modes=3):
    """A random smooth vector field times the bump: ``(3, ...)``, continuous, zero on the boundary."""
    k1, k2, k3 = jax.random.split(key, 3)
    amp = jax.random.normal(k1, (3, modes))
    freq = jax.random.uniform(k2, (3, modes, 3), minval=-3.0, maxval=3.0)
    phase = jax.random.uniform(k3, (3, modes), maxval=2 * np.pi)
    arg = jnp.einsum("cmd,d...->cm...", freq, x) + phase[..., None, None, None, None]
    return _bump(x) * jnp.sum(amp[..., None, None, None, None] * jnp.sin(arg), axis=1)


@pytest.fixture(scope="module")
def problem():
    """Curved (2, 2, 1) mesh, order 3, Gauss q = N + 2 quadrature (J ≠ I, q ≠ n), Dirichlet."""
    sem = discretize(box_mesh((2, 2, 1), order=3, deform=0.1), quadrature="gauss", backend="einsum")
    shape = sem.geom.B.shape  # (E, q, q, q)
    xq = sem.geom.xq
    fq = 1.0 + 0.5 * jnp.cos(2 * xq[0] + xq[1])            # array part of the source
    source = lambda x, y, z: 2.0 + jnp.sin(3 * x) * y       # moves with the mesh
    h1 = 1.0 + 0.3 * jnp.sin(np.pi * xq[0]) * jnp.cos(xq[1] + xq[2])
    h2 = 2.0 + jnp.cos(3 * xq[2])
    u0, info = jax.jit(lambda s: poisson.solve(s, lambda *x: fq + source(*x), h1, h2, tol=TOL, maxiter=MAXITER))(sem)
    assert bool(info.converged)
    # a target of the solution's size (not a multiple of it)
    target = 0.5 * u0 + 0.1 * jnp.max(jnp.abs(u0)) * sem.mask * sem.interpolate(
        lambda x, y, z: jnp.sin(np.pi * x) * jnp.sin(np.pi * y))
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    dirs = dict(
        f=[jax.random.normal(k, shape) for k in keys[0:2]],
        h1=[jax.random.normal(k, shape) for k in keys[2:4]],
        h2=[jax.random.normal(k, shape) for k in keys[4:6]],
        x=[_smooth_field(k, sem.x) for k in keys[6:8]],
    )
    return sem, fq, source, h1, h2, target, dirs


def _make_loss(sem, source, target, solver, coordinates=True):
    """L = ‖u − t‖² / ‖t‖² (mass-weighted on the deformed mesh) of u(f, h₁, h₂, x)."""

    def loss(fq, h1, h2, x):
        s = sem.with_coordinates(x) if coordinates else sem
        u, _ = SOLVERS[solver](s, lambda *p: fq + source(*p), h1, h2)
        return s.norm(u - target) ** 2 / s.norm(target) ** 2

    return loss


def _value_and_grad(loss, argnums=(0, 1, 2, 3)):
    """One compiled function serves the gradient and the differences (the value)."""
    vg = jax.jit(jax.value_and_grad(loss, argnums=argnums))
    return (lambda *p: vg(*p)[0]), (lambda *p: vg(*p)[1])


def _fd_errors(loss, grads, params, dirs, eps):
    """Relative |⟨∇L, v⟩ − (L(p + εv) − L(p − εv)) / 2ε| / |FD| per argument and direction."""
    errs = {}
    for i, name in enumerate(("f", "h1", "h2", "x")):
        for v in dirs.get(name, []):
            plus, minus = list(params), list(params)
            plus[i] = params[i] + eps[name] * v
            minus[i] = params[i] - eps[name] * v
            fd = float(loss(*plus) - loss(*minus)) / (2 * eps[name])
            ad = float(jnp.vdot(grads[i], v))
            errs.setdefault(name, []).append(abs(ad - fd) / abs(fd))
    return errs


@pytest.fixture(scope="module")
def per_point(problem):
    """Loss and gradient w.r.t. (f, h₁, h₂, x) with per-point coefficients, for each solver."""
    sem, fq, source, h1, h2, target, _ = problem
    params = (fq, h1, h2, sem.x)
    out = {}
    for solver in SOLVERS:
        loss, grad = _value_and_grad(_make_loss(sem, source, target, solver))
        out[solver] = loss, grad(*params)
    return params, out


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_gradients_match_central_differences(problem, per_point, solver):
    sem, *_, dirs = problem
    params, out = per_point
    loss, grads = out[solver]
    # coordinates move by ≤ 1e-5 (elements of size 0.5), coefficients by ~1e-5: O(ε²) ≈ 1e-9
    errs = _fd_errors(loss, grads, params, dirs, eps=dict(f=1e-5, h1=1e-5, h2=1e-5, x=1e-5))
    print(solver, {k: [f"{e:.1e}" for e in v] for k, v in errs.items()})
    for name, e in errs.items():
        assert max(e) < RTOL, (name, e)
    # only interior nodes move: the boundary stays, so the mesh stays conforming
    for v in dirs["x"]:
        assert float(jnp.abs(v * (1 - sem.mask)).max()) < 1e-15


def test_per_element_coefficients(problem):
    """h₁, h₂ of shape (E, 1, 1, 1), broadcast over each element's quadrature points."""
    sem, fq, source, _, _, target, _ = problem
    E = sem.num_elements
    h1 = jnp.linspace(0.8, 1.6, E).reshape(E, 1, 1, 1)
    h2 = jnp.linspace(3.0, 1.0, E).reshape(E, 1, 1, 1)
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    dirs = dict(h1=[jax.random.normal(k, (E, 1, 1, 1)) for k in keys[:2]],
                h2=[jax.random.normal(k, (E, 1, 1, 1)) for k in keys[2:]])
    params = (fq, h1, h2, sem.x)
    for solver in SOLVERS:
        loss, grad = _value_and_grad(_make_loss(sem, source, target, solver, coordinates=False), argnums=(0, 1, 2))
        grads = grad(*params)
        assert grads[1].shape == grads[2].shape == (E, 1, 1, 1)
        errs = _fd_errors(loss, grads, params, dirs, eps=dict(h1=1e-5, h2=1e-5))
        print(solver, {k: [f"{e:.1e}" for e in v] for k, v in errs.items()})
        for name, e in errs.items():
            assert max(e) < RTOL, (solver, name, e)
    # a per-element field equals the same values broadcast per point
    full = lambda h: jnp.broadcast_to(h, sem.geom.B.shape)
    u_e, _ = poisson.solve(sem, fq, h1, h2, tol=TOL, maxiter=MAXITER)
    u_p, _ = poisson.solve(sem, fq, full(h1), full(h2), tol=TOL, maxiter=MAXITER)
    assert float(jnp.abs(u_e - u_p).max()) < 1e-13 * float(jnp.abs(u_p).max())


@pytest.mark.skipif(not cuda_available(), reason="the CUDA backend needs a CUDA GPU")
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_cuda_kernels_give_the_same_gradients(problem, per_point, solver):
    """The CUDA backend (Gauss stiffness + mass kernels) in the forward and adjoint PCG: the loss
    and its gradient w.r.t. f, h1, h2 and the coordinates equal einsum's."""
    sem, _, source, _, _, target, _ = problem
    sem = dataclasses.replace(sem, backend=CUDA)
    params, out = per_point
    value, grads = jax.jit(jax.value_and_grad(_make_loss(sem, source, target, solver),
                                              argnums=(0, 1, 2, 3)))(*params)
    ref_loss, ref_grads = out[solver]
    assert float(value) == pytest.approx(float(ref_loss(*params)), rel=1e-12)
    for g, r in zip(grads, ref_grads):
        assert float(jnp.abs(g - r).max()) <= 1e-10 * float(jnp.abs(r).max())


def test_custom_vjp_equals_custom_linear_solve(per_point):
    _, out = per_point
    for a, b in zip(*(g for _, g in out.values())):
        assert float(jnp.abs(a - b).max()) <= 1e-10 * float(jnp.abs(b).max())


def test_adjoint_info_is_reported(problem):
    sem, fq, _, h1, h2, target, _ = problem

    def loss(h1, probe, tol, maxiter):
        u, info = inverse.solve(sem, fq, h1, h2, tol=tol, maxiter=maxiter, probe=probe)
        return sem.dot(u - target, u - target), info

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=(2, 3))
    (_, pbar), info = grad(h1, inverse.adjoint_probe(MAXITER), 1e-12, MAXITER)
    adj = inverse.adjoint_info(pbar)
    # the adjoint operator is the forward one (symmetric): similar work, same tolerance met
    assert bool(info.converged) and bool(adj.converged)
    assert abs(int(adj.iterations) - int(info.iterations)) <= 5
    assert float(adj.residual) <= 1e-12 * float(adj.residual0)
    hist = np.asarray(adj.history)
    assert np.isfinite(hist[: int(adj.iterations) + 1]).all() and np.isnan(hist[int(adj.iterations) + 1:]).all()

    # a capped adjoint is reported and warned about, not hidden
    with pytest.warns(inverse.AdjointNotConvergedWarning, match="did not converge"):
        (_, pbar), _ = grad(h1, inverse.adjoint_probe(4), 1e-12, 4)
        jax.block_until_ready(pbar)
    adj = inverse.adjoint_info(pbar)
    assert int(adj.iterations) == 4 and not bool(adj.converged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when asked not to check
        g = jax.jit(jax.grad(lambda h: inverse.solve(sem, fq, h, h2, tol=1e-12, maxiter=4, check=False)[0].sum()))
        jax.block_until_ready(g(h1))


def test_bad_arguments(problem):
    sem, fq, *_ = problem
    with pytest.raises(ValueError, match="exactly one"):
        inverse.solve(sem, None, 1.0, 0.0)
    with pytest.raises(ValueError, match="probe"):
        inverse.solve(sem, fq, maxiter=10, probe=inverse.adjoint_probe(20))
    with pytest.raises(ValueError, match="maxiter"):
        inverse.solve(sem, fq, maxiter=0)


def test_vmap_over_a_batch_equals_the_loop(problem):
    """Eight Helmholtz shifts h₂ at once: solutions, iteration counts and gradients as one by one.

    A vmapped ``lax.while_loop`` runs until every member has stopped, but each
    member's state (and iteration counter) freezes once its own test fails, so
    per-member iteration counts are exactly the unbatched ones.
    """
    sem, fq, _, h1, _, target, _ = problem
    h2s = jnp.linspace(0.0, 400.0, 8)

    def loss(h2, probe):
        u, info = inverse.solve(sem, fq, h1, h2, tol=1e-12, maxiter=MAXITER, probe=probe)
        return sem.dot(u - target, u - target) / sem.dot(target, target), info

    vg = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    probe = inverse.adjoint_probe(MAXITER)
    (Lb, ib), (gb, pb) = jax.jit(jax.vmap(vg, in_axes=(0, None)))(h2s, probe)
    one = jax.jit(vg)
    rows = [one(h, probe) for h in h2s]
    its = np.array([int(i.iterations) for (_, i), _ in rows])
    adj = np.array([int(inverse.adjoint_info(p).iterations) for _, (_, p) in rows])
    np.testing.assert_array_equal(np.asarray(ib.iterations), its)
    np.testing.assert_array_equal(np.asarray(inverse.adjoint_info(pb).iterations), adj)
    assert len(set(its.tolist())) > 1  # the members really stop at different iterations
    np.testing.assert_allclose(Lb, [float(L) for (L, _), _ in rows], rtol=1e-12)
    np.testing.assert_allclose(gb, [float(g) for _, (g, _) in rows], rtol=1e-10)
    # the custom_linear_solve path batches too
    solve = lambda h2: poisson.solve(sem, fq, h1, h2, tol=1e-12, maxiter=MAXITER)
    ub, info = jax.jit(jax.vmap(solve))(h2s)
    solve = jax.jit(solve)
    np.testing.assert_array_equal(np.asarray(info.iterations), its)
    for k, h in enumerate(h2s):
        u, _ = solve(h)
        assert float(jnp.abs(ub[k] - u).max()) <= 1e-12 * float(jnp.abs(u).max())


# --- every bake-off problem, preconditioner and storage on 3×3×3 elements ----------------------

BP_CASES = ([(bp, "jacobi", st) for bp in range(1, 7) for st in ("auto", "local")]
            + [(bp, "pmg", st) for bp in (3, 5, 6) for st in ("auto", "local")])


@pytest.mark.parametrize("bp,precond,storage", BP_CASES)
def test_bp_gradients_on_three_elements_per_direction(bp, precond, storage):
    """BPk on a curved 3×3×3 mesh of order 2 (interior nodes shared by eight elements):
    the dot-product test of the source-to-solution map with random element-local v, w
    (1e-9), and ⟨∇L, v⟩ of L = ⟨w, u⟩ w.r.t. the per-point coefficient against central
    differences along two random directions (1e-7)."""
    from jaxsem.gradcheck import directional_errors, dot_product as dot_product_test, random_directions

    mesh = box_mesh((3, 3, 3), order=2, deform=0.1)
    sem = poisson.bp_discretize(mesh, bp, backend="einsum", storage=storage)
    spec = poisson.BP_SPECS[bp]
    h1, h2 = poisson.coefficients(bp)
    q = sem.geom.B.shape[-1]
    xq = sem.geom.xq
    h = 1.0 + 0.3 * jnp.sin(np.pi * xq[0]) * jnp.cos(xq[1] + xq[2])  # the non-zero coefficient, per point
    pm = poisson.pmg(sem, h1, h2) if precond == "pmg" else None
    shape = ((spec.components,) if spec.components > 1 else ()) + (sem.num_elements, q, q, q)
    fq = jnp.asarray(np.random.default_rng(bp).standard_normal(shape))

    def solve(f, hc):
        a1, a2 = (hc, 0.0) if h1 else (0.0, hc)
        u, _ = poisson.solve(sem, f, a1, a2, tol=1e-13, maxiter=500, precond=pm)
        return u

    errs = dot_product_test(lambda f: solve(f, h), fq)
    u = jax.jit(solve)(fq, h)
    w = jnp.asarray(np.random.default_rng(10 + bp).standard_normal(u.shape))
    fd, _ = directional_errors(lambda hc: jnp.vdot(w, solve(fq, hc)), h, random_directions(h, 2), h=1e-5)
    print(bp, precond, storage, [f"{e:.1e}" for e in errs], [f"{e:.1e}" for e in fd])
    assert max(errs) < 1e-9, errs
    assert max(fd) < 1e-7, fd
