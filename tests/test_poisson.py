"""BP1–BP6 solved against manufactured solutions: p- and h-convergence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.backends import cuda as cuda_kernels


def _solve_bp(bp, elements, order, deform=0.1):
    sem = poisson.bp_discretize(box_mesh(elements, order, deform=deform), bp)
    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    u, info = jax.jit(lambda s: poisson.solve(s, ms.f, h1, h2, tol=1e-13, maxiter=2000))(sem)
    assert bool(info.converged)
    return poisson.relative_errors(sem, u, ms.u)


@pytest.mark.parametrize("bp", [1, 2, 3, 4, 5, 6])
def test_exponential_convergence_in_p(bp):
    orders = [2, 4, 6, 8]
    errs = np.array([_solve_bp(bp, (2, 2, 2), p)[0] for p in orders])
    # spectral: each +2 in p gains at least a factor 10, reaching ≤ 1e-4 at p = 8
    ratios = errs[1:] / errs[:-1]
    assert np.all(ratios < 0.1), errs
    assert errs[-1] < 1e-4, errs
    # exponential, not algebraic: the gain per step does not shrink as p grows
    # (for an algebraic rate e ~ p^-s the ratios would creep up towards 1)
    assert np.all(np.diff(ratios) < 0.01), ratios


@pytest.mark.parametrize("bp, order", [(5, 2), (3, 3), (1, 2), (6, 2)])
def test_algebraic_rate_p_plus_1_in_h(bp, order):
    hs = [2, 4, 8] if order == 2 else [2, 4, 6]
    errs = np.array([_solve_bp(bp, (m, m, m), order)[0] for m in hs])
    rates = np.log(errs[:-1] / errs[1:]) / np.log(np.array(hs[1:]) / np.array(hs[:-1]))
    assert abs(rates[-1] - (order + 1)) < 0.35, rates


def test_neumann_helmholtz_converges():
    # -Δu + u = f with ∂u/∂n = 0: u = cos(πx)cos(πy)cos(πz) on the unit box
    u_ex = lambda x, y, z: jnp.cos(jnp.pi * x) * jnp.cos(jnp.pi * y) * jnp.cos(jnp.pi * z)
    f = lambda x, y, z: (3 * jnp.pi**2 + 1) * u_ex(x, y, z)
    errs = []
    for p in (2, 4, 6):
        sem = discretize(box_mesh((2, 2, 2), p, deform=0.1), quadrature="gauss", dirichlet=False)
        u, info = poisson.solve(sem, f, 1.0, 1.0, tol=1e-13)
        assert bool(info.converged)
        errs.append(poisson.relative_errors(sem, u, u_ex)[0])
    assert errs[1] / errs[0] < 0.05 and errs[2] / errs[1] < 0.05 and errs[2] < 1e-4, errs


def test_periodic_poisson():
    # Periodic in x and y, Dirichlet in z: u = sin(2πx) cos(2πy) sin(πz)
    u_ex = lambda x, y, z: jnp.sin(2 * jnp.pi * x) * jnp.cos(2 * jnp.pi * y) * jnp.sin(jnp.pi * z)
    f = lambda x, y, z: 9 * jnp.pi**2 * u_ex(x, y, z)
    errs = []
    for p in (4, 6):
        sem = discretize(box_mesh((2, 2, 2), p, periodic=(True, True, False), deform=0.05), quadrature="gll")
        u, info = poisson.solve(sem, f, tol=1e-13)
        assert bool(info.converged)
        errs.append(poisson.relative_errors(sem, u, u_ex)[0])
    assert errs[1] / errs[0] < 0.05 and errs[1] < 1e-3, errs


def test_float32_switch():
    sem = poisson.bp_discretize(box_mesh((2, 2, 2), 4, deform=0.1), 5, dtype=jnp.float32)
    assert sem.geom.G.dtype == jnp.float32
    ms = poisson.manufactured(5)
    u, info = poisson.solve(sem, ms.f, tol=1e-5)
    assert u.dtype == jnp.float32 and bool(info.converged)
    e32 = poisson.relative_errors(sem, u, ms.u)[0]
    e64 = _solve_bp(5, (2, 2, 2), 4)[0]
    assert abs(e32 - e64) < 1e-3 * e64 + 1e-5


def test_bad_bp():
    with pytest.raises(ValueError, match="bp"):
        poisson.bp_discretize(box_mesh((1, 1, 1), 2), 7)


@pytest.mark.parametrize("bp", [1, 4, 5])
def test_backend_auto_matches_einsum(bp):
    """backend="auto" (the CUDA kernels on a GPU, einsum elsewhere) gives the einsum path's
    iterates and, through the implicit adjoint, its gradients w.r.t. the coefficient and the
    source; the choice is made once and kept on the discretization; bad choices are named."""
    mesh = box_mesh((1, 1, 2), 2, deform=0.1)
    sems = {b: poisson.bp_discretize(mesh, bp, backend=b) for b in ("einsum", "auto")}
    on_gpu = cuda_kernels.cuda_available()
    assert sems["einsum"].backend.name == "einsum" and sems["einsum"].backend.transposable
    assert sems["auto"].backend.name == ("cuda" if on_gpu else "einsum")
    assert sems["auto"].gs.layout == ("csr" if on_gpu else "segment")
    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    run = lambda sem: jax.jit(lambda s: poisson.solve(s, ms.f, h1, h2, tol=0.0, maxiter=8))(sem)
    (u_e, i_e), (u_a, i_a) = run(sems["einsum"]), run(sems["auto"])
    np.testing.assert_allclose(np.asarray(u_a), np.asarray(u_e), rtol=0, atol=1e-12 * float(jnp.abs(u_e).max()))
    h_e, h_a = np.asarray(i_e.history), np.asarray(i_a.history)
    np.testing.assert_allclose(h_a, h_e, rtol=1e-9, atol=1e-12 * h_e[0])
    b = poisson.load(sems["einsum"], ms.f)

    def loss(sem):  # the coefficient BPk has (h1 or h2) scaled by c; the source as rhs
        def f(c, rhs):
            u, _ = poisson.solve(sem, None, c * h1 if h1 else 0.0, c * h2 if h2 else 0.0, tol=1e-13,
                                 maxiter=200, rhs=rhs)
            return jnp.sum(u**2)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(1.3, b)

    (v_e, (gc_e, gb_e)), (v_a, (gc_a, gb_a)) = loss(sems["einsum"]), loss(sems["auto"])
    assert float(v_a) == pytest.approx(float(v_e), rel=1e-12)
    assert float(gc_a) == pytest.approx(float(gc_e), rel=1e-10) and float(gc_e) != 0.0
    np.testing.assert_allclose(np.asarray(gb_a), np.asarray(gb_e), rtol=0, atol=1e-10 * float(jnp.abs(gb_e).max()))
    with pytest.raises(ValueError, match="backend"):
        poisson.bp_discretize(mesh, bp, backend="pallas")
    if not on_gpu:
        with pytest.raises(ValueError, match="backend 'cuda'"):
            poisson.bp_discretize(mesh, bp, backend="cuda")


@pytest.mark.parametrize("order", [19, 20])
def test_error_norms_at_the_highest_orders(order):
    """relative_errors at orders 19 and 20 (its Gauss rule has N + 4 points): the GLL interpolant
    of the exact solution is within interpolation error of it."""
    ms = poisson.manufactured(5)
    sem = poisson.bp_discretize(box_mesh((1, 1, 1), order, deform=0.1), 5)
    u = sem.mask * sem.interpolate(ms.u)
    l2, linf = poisson.relative_errors(sem, u, ms.u)
    assert l2 < 1e-9 and linf < 1e-12


def _small(bp=3):
    return poisson.bp_discretize(box_mesh((2, 1, 1), 2, deform=0.1), bp)


@pytest.mark.parametrize("kw, name", [
    (dict(h1=jnp.ones((2, 2, 2, 2))), "h1"),                      # neither per element nor per point
    (dict(h2=jnp.ones((3,))), "h2"),
    (dict(h1=float("nan")), "h1"),
    (dict(h1=-1.0), "h1"),
    (dict(h1=0.0, h2=0.0), "h1 and h2"),
])
def test_bad_coefficients_named_before_the_solve(kw, name):
    sem = _small()
    with pytest.raises(ValueError, match=name):
        poisson.solve(sem, poisson.manufactured(3).f, **kw)


def test_bad_source_named():
    sem = _small()
    q = sem.geom.B.shape[-1]
    f = np.ones((sem.num_elements, q, q, q))
    f[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="f has 1 non-finite"):
        poisson.solve(sem, f)
    with pytest.raises(ValueError, match="f must be a callable"):
        poisson.solve(sem, np.ones((sem.num_elements, q, q)))


def test_per_element_and_per_point_coefficients_accepted():
    sem = _small()
    E, q = sem.num_elements, sem.geom.B.shape[-1]
    f = poisson.manufactured(3).f
    u1, i1 = poisson.solve(sem, f, h1=2.0)
    u2, i2 = poisson.solve(sem, f, h1=jnp.full((E, 1, 1, 1), 2.0))
    u3, i3 = poisson.solve(sem, f, h1=jnp.full((E, q, q, q), 2.0))
    assert bool(i1.converged) and bool(i2.converged) and bool(i3.converged)
    np.testing.assert_allclose(u2, u1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(u3, u1, rtol=0, atol=1e-12)


# --- boundary conditions per named group (poisson.setup) ----------------------------------

def _harmonic(x, y, z):
    return x**3 - 3 * x * y**2 + y * z + 2 * z**2 - x**2 - y**2 + 0.5 * x * y * z + 0.3


def test_dirichlet_data_exact_for_a_harmonic_polynomial():
    mesh = box_mesh((3, 3, 3), 3, lengths=(1.0, 1.5, 1.0))
    pb = poisson.setup(mesh, {g: poisson.Dirichlet(_harmonic) for g in mesh.boundaries})
    u, info = poisson.solve(pb, lambda x, y, z: 0 * x, tol=1e-13)
    assert bool(info.converged)
    assert float(jnp.abs(u - pb.sem.interpolate(_harmonic)).max()) < 1e-10


def _mixed(p, a=1.0, b=1.0):
    """-Δu = u on a curved box, u = sin(x + ½)eʸcos z: Dirichlet on x, y = 0 faces… fluxes elsewhere."""
    u = lambda x, y, z: a * jnp.sin(x + 0.5) * jnp.exp(y) * jnp.cos(z)
    ux = lambda x, y, z: a * jnp.cos(x + 0.5) * jnp.exp(y) * jnp.cos(z)
    uz = lambda x, y, z: -a * jnp.sin(x + 0.5) * jnp.exp(y) * jnp.sin(z)
    bc = {"xmin": poisson.Dirichlet(u), "xmax": poisson.Neumann(lambda x, y, z: b * ux(x, y, z)),
          "ymin": poisson.Neumann(lambda x, y, z: -u(x, y, z)), "ymax": poisson.Dirichlet(u),
          "zmin": poisson.Neumann(lambda x, y, z: -uz(x, y, z)), "zmax": poisson.Neumann(uz)}
    return poisson.setup(box_mesh((3, 3, 3), p, deform=0.1), bc), u


def test_mixed_dirichlet_neumann_groups_converge_spectrally_in_p():
    errs = []
    for p in (2, 3, 4, 5, 6):
        pb, ue = _mixed(p)
        u, info = jax.jit(lambda pb: poisson.solve(pb, ue, tol=1e-13))(pb)
        assert bool(info.converged)
        errs.append(poisson.relative_errors(pb.sem, u, ue)[0])
    errs = np.array(errs)
    slopes = np.diff(np.log(errs))  # log-error per +1 in p: about −2.5 (6e-4 at p = 2 to 2e-8 at 6)
    assert np.all(slopes < -2.0) and errs[-1] < 1e-7, errs


def test_gradient_through_the_solve_wrt_the_data():
    w = None

    def loss(ab):
        nonlocal w
        pb, _ = _mixed(3, ab[0], ab[1])
        if w is None:
            w = pb.sem.interpolate(lambda x, y, z: 1 + x * y - z**2)
        u, _ = poisson.solve(pb, lambda x, y, z: 0.7 * jnp.cos(y) * x, tol=1e-13)
        return pb.sem.integrate(w * u * u)  # nonlinear in the data

    ab = jnp.array([1.1, 0.8])
    g = jax.grad(loss)(ab)
    eps = 1e-5
    for k, d in enumerate(np.eye(2)):
        fd = (loss(ab + eps * d) - loss(ab - eps * d)) / (2 * eps)
        assert abs(float(g[k] - fd)) < 1e-7 * abs(float(fd)), (k, g, fd)


def test_default_is_homogeneous_dirichlet_and_unknown_groups_named():
    mesh = box_mesh((3, 3, 3), 3, deform=0.1)
    ms = poisson.manufactured(5)
    u0, _ = poisson.solve(discretize(mesh), ms.f, tol=1e-13)
    u1, _ = poisson.solve(poisson.setup(mesh), ms.f, tol=1e-13)
    u2, _ = poisson.solve(poisson.setup(mesh, {"zmin": poisson.Dirichlet(0.0)}), ms.f, tol=1e-13)
    assert float(jnp.abs(u1 - u0).max()) < 1e-13 and float(jnp.abs(u2 - u0).max()) < 1e-13
    with pytest.raises(ValueError, match=r"\['top'\].*'xmax'"):
        poisson.setup(mesh, {"top": poisson.Neumann(1.0)})
