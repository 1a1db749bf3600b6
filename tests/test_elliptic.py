"""The one elliptic solve (jaxsem.elliptic) and the level hierarchy it builds p-multigrid on
(jaxsem.discretization.hierarchy).

Storage: assembled and E-vector Krylov vectors give the same solution (Dirichlet, scalar-array
coefficients as the Navier–Stokes velocity passes them, and pure Neumann with the constants
projected out). The adjoint: ⟨S b, c⟩ = ⟨b, Sᵀ c⟩ for transpose_solve_local, and jax.vjp of
the solve equals it. Coarsening: a level built from the discretization alone equals
discretize of the mesh at that order. Bad arguments are refused by name.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem import elliptic
from jaxsem.core import basis
from jaxsem.discretization import hierarchy
from jaxsem.models import poisson
from jaxsem.operators.tensor import interp


def _rough(sem, seed=0):
    """A continuous, masked, non-polynomial E-vector (assembled right-hand side)."""
    x, y, z = sem.x
    v = jnp.sin(3.1 * x + 1.7 * y * y) * jnp.cos(2.3 * z + seed) + 0.3 * x * y
    return sem.mask * sem.dssum(sem.bmass * v)


def _solve(H, b, **kw):
    return jax.jit(lambda H, b: elliptic.solve(H, b, tol=1e-12, **kw))(H, b)


@pytest.mark.parametrize("precond", ["jacobi", "pmg"])
def test_assembled_and_local_storage_agree_with_scalar_array_coefficients(precond):
    mesh = js.box_mesh((3, 3, 3), 3, deform=0.1)
    sem = js.discretize(mesh)
    local = dataclasses.replace(sem, assembled=None)
    nu, h2 = jnp.asarray(0.03), jnp.asarray(7.0)  # traced-like 0-d coefficients (NS velocity)
    b = _rough(sem)
    out = []
    for s in (sem, local):
        H = elliptic.helmholtz(s, nu, h2, precond=precond) if precond == "pmg" else elliptic.Helmholtz.of(s, nu, h2)
        x, info = _solve(H, b)
        assert bool(info.converged)
        out.append(x)
        # the residual of the E-vector operator with the coefficients multiplied outside the kernels
        r = b - (s.mask * s.dssum(nu * poisson.local_operator(s, 1.0, 0.0)(x) + h2 * s.bmass * x))
        assert float(jnp.sqrt(s.dot(r, r) / s.dot(b, b))) < 1e-10
    assert float(jnp.max(jnp.abs(out[0] - out[1]))) < 1e-10 * float(jnp.max(jnp.abs(out[1])))


def test_jacobi_from_unit_diagonals_equals_the_one_from_the_coefficients():
    """The unit diagonals (−∇² and mass, summed over copies, no mask) give the inverse diagonal
    of h₁(−∇²) + h₂ for scalar coefficients (Python numbers or 0-d arrays, either term absent),
    on a masked, deformed mesh: equal to the one assembled from the element diagonals to
    round-off; a field coefficient ignores them. A Jacobi solve with them takes the same
    iterations to the same solution, in assembled and E-vector storage alike."""
    mesh = js.box_mesh((3, 2, 2), 3, deform=0.1)
    sem = js.discretize(mesh)
    diag = elliptic.unit_diagonals(sem)
    for h1, h2 in [(1.0, 0.0), (0.0, 2.5), (jnp.asarray(0.03), jnp.asarray(7.0)), (0.5, jnp.asarray(3.0))]:
        ref = elliptic.jacobi(sem, h1, h2)
        got = elliptic.jacobi(sem, h1, h2, diag)
        assert float(jnp.max(jnp.abs(got - ref))) < 1e-13 * float(jnp.max(jnp.abs(ref))), (h1, h2)
        assert float(jnp.max(jnp.abs(ref))) > 0 and float(jnp.max(jnp.abs(ref * (1 - sem.mask)))) == 0
    field = jnp.full((sem.num_elements, 1, 1, 1), 0.2) * (1 + jnp.arange(sem.num_elements)[:, None, None, None] % 3)
    assert float(jnp.max(jnp.abs(elliptic.jacobi(sem, field, 1.0, diag) - elliptic.jacobi(sem, field, 1.0)))) == 0
    nu, h2 = jnp.asarray(0.03), jnp.asarray(7.0)
    b = _rough(sem)
    for s in (sem, dataclasses.replace(sem, assembled=None)):
        (x0, i0), (x1, i1) = (_solve(elliptic.Helmholtz.of(s, nu, h2, diagonals=d), b) for d in (None, diag))
        assert bool(i0.converged) and int(i0.iterations) == int(i1.iterations) > 3, (i0.iterations, i1.iterations)
        assert float(jnp.max(jnp.abs(x1 - x0))) < 1e-12 * float(jnp.max(jnp.abs(x0)))


@pytest.mark.parametrize("storage", ["auto", "local"])
def test_pure_neumann_solution_is_orthogonal_to_constants(storage):
    mesh = js.box_mesh((3, 3, 3), 3, deform=0.1)
    sem = elliptic.pure_neumann(js.discretize(mesh, storage=storage))
    assert float(jnp.min(sem.mask)) == 1.0
    H = elliptic.helmholtz(sem, 1.0, 0.0, precond="pmg", nullspace=True)
    b = _rough(sem)
    b = b - sem.dssum(sem.bmass) * (sem.integrate(b / sem.dssum(sem.bmass)) / sem.integrate(jnp.ones_like(b)))
    x, info = _solve(H, b, x0=5.0 + 0 * b)  # a constant guess: its component stays along the constants
    assert bool(info.converged)
    r = b - H.apply(x)
    assert float(jnp.sqrt(sem.dot(r, r) / sem.dot(b, b))) < 1e-9
    # x = x⊥ + 5: the part along the constants is the guess's
    ones = jnp.ones_like(x)
    mean = float(sem.dot(x, ones) / sem.dot(ones, ones))
    assert abs(mean - 5.0) < 1e-8


def test_transpose_solve_is_the_adjoint_of_the_solve():
    mesh = js.box_mesh((3, 3, 3), 3, deform=0.1)
    sem = js.discretize(mesh, storage="local")
    H = elliptic.Helmholtz.of(sem, 1.3, 0.4)
    b = _rough(sem, 1.0)
    c = jax.random.normal(jax.random.PRNGKey(0), b.shape, b.dtype)  # any E-vector: no projection assumed
    Sb, _ = _solve(H, b)
    Stc, info = jax.jit(lambda H, c: elliptic.transpose_solve_local(H, c, tol=1e-12))(H, c)
    assert bool(info.converged)
    lhs, rhs = float(jnp.vdot(Sb, c)), float(jnp.vdot(b, Stc))
    assert abs(lhs - rhs) < 1e-9 * abs(lhs)
    # reverse mode through the solve runs the same adjoint
    _, vjp = jax.vjp(lambda b: elliptic.solve(H, b, tol=1e-12)[0], b)
    assert float(jnp.max(jnp.abs(vjp(c)[0] - Stc))) < 1e-9 * float(jnp.max(jnp.abs(Stc)))


@pytest.mark.parametrize("storage", ["auto", "local"])
def test_adjoint_guess_starts_the_adjoint_and_receives_its_solution(storage):
    """``adjoint_guess``: the value and the forward derivative do not depend on it; the guess's
    cotangent is the adjoint solution Sᵀc (in the guess's form); handed back as the guess it starts the adjoint
    there, so that two iterations, which miss the tolerance from zero, reach it (and no warning)."""
    from jaxsem.solvers.pcg import AdjointNotConvergedWarning

    mesh = js.box_mesh((3, 3, 3), 3, deform=0.1)
    sem = js.discretize(mesh, storage=storage)
    H = elliptic.Helmholtz.of(sem, 1.3, 0.4)
    b = _rough(sem, 1.0)
    c = jax.random.normal(jax.random.PRNGKey(1), b.shape, b.dtype)
    g0 = 0.7 * b  # any guess

    def f(b, g, maxiter=1000):
        return jnp.vdot(c, elliptic.solve_local(H, b, tol=1e-12, maxiter=maxiter, adjoint_guess=g)[0])

    assert float(f(b, g0)) == float(jnp.vdot(c, elliptic.solve_local(H, b, tol=1e-12)[0]))
    _, t_guess = jax.jvp(lambda b: f(b, g0), (b,), (c,))
    _, t_plain = jax.jvp(lambda b: jnp.vdot(c, elliptic.solve_local(H, b, tol=1e-12)[0]), (b,), (c,))
    assert float(t_guess) == float(t_plain)
    gb, gg = jax.grad(f, argnums=(0, 1))(b, g0)
    plain = jax.grad(lambda b: jnp.vdot(c, elliptic.solve_local(H, b, tol=1e-12)[0]))(b)
    scale = float(jnp.max(jnp.abs(plain)))
    assert float(jnp.max(jnp.abs(gb - plain))) < 1e-10 * scale
    # local storage: the guess is b's cotangent itself; assembled: √mult times the adjoint's copies
    # (mult·Qλ for b), which maps back onto the same assembled vector
    like = gb if storage == "local" else jnp.sqrt(sem.mult) * gg
    assert float(jnp.max(jnp.abs(like - gb))) < 1e-14 * scale
    with pytest.warns(AdjointNotConvergedWarning):
        jax.block_until_ready(jax.grad(lambda b: f(b, 0 * b, maxiter=2))(b))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdjointNotConvergedWarning)
        again = jax.grad(lambda b: f(b, gg, maxiter=2))(b)
    assert float(jnp.max(jnp.abs(again - plain))) < 1e-10 * scale


@pytest.mark.parametrize("dirichlet", [True, False])
def test_coarsen_equals_discretize_of_the_mesh_at_that_order(dirichlet):
    mesh = js.box_mesh((3, 2, 3), 4, deform=0.1, periodic=(True, False, False))
    sem = js.discretize(mesh, dirichlet=dirichlet)
    c = hierarchy.coarsen(sem, 2)
    Jx = basis.interp_matrix(sem.n, 3, "gll", "gll")[0]
    ref = js.discretize(dataclasses.replace(mesh, order=2, x=np.asarray(interp(jnp.asarray(mesh.x), jnp.asarray(Jx)))),
                        dirichlet=dirichlet, storage="local")
    assert c.order == 2 and c.assembled is None and c.num_global == ref.num_global
    np.testing.assert_array_equal(np.asarray(c.gs.gid), np.asarray(ref.gs.gid))
    np.testing.assert_array_equal(np.asarray(c.mask), np.asarray(ref.mask))
    np.testing.assert_allclose(np.asarray(c.x), np.asarray(ref.x), rtol=0, atol=1e-14)
    # coordinates set on the fine level (a moved geometry) are the ones coarsened
    moved = sem.with_coordinates(sem.x * 1.5)
    np.testing.assert_allclose(np.asarray(hierarchy.coarsen(moved, 2).x), 1.5 * np.asarray(ref.x), atol=1e-13)


def test_levels_follow_the_schedule_and_the_dtype():
    sem = js.discretize(js.box_mesh((2, 2, 2), 5))
    lv = hierarchy.levels(sem)
    assert tuple(s.order for s in lv) == (5, 3, 2, 1) and lv[0] is sem
    lv32 = hierarchy.levels(sem, (5, 2), "float32")
    assert tuple(s.order for s in lv32) == (5, 2) and all(s.x.dtype == jnp.float32 for s in lv32)


def test_bad_arguments_are_named():
    sem = js.discretize(js.box_mesh((2, 2, 2), 3))
    with pytest.raises(ValueError, match="precond"):
        elliptic.helmholtz(sem, precond="ilu")
    with pytest.raises(TypeError, match="precond"):
        elliptic.helmholtz(sem, precond=3)
    with pytest.raises(ValueError, match="order"):
        hierarchy.coarsen(sem, 4)
    with pytest.raises(ValueError, match="orders"):
        hierarchy.levels(sem, (3, 3))
    with pytest.raises(ValueError, match="source"):
        hierarchy.coarsen(dataclasses.replace(sem, source=None), 2)


def test_source_compares_by_topology_not_coordinates():
    """Discretizations of one topology share compiled programs (equal static sources); another
    topology (a periodic axis) is never mistaken for it, so coarsening a program's output uses
    its own mesh."""
    a = js.discretize(js.box_mesh((3, 3, 3), 2)).source
    b = js.discretize(js.box_mesh((3, 3, 3), 2, deform=0.1)).source
    c = js.discretize(js.box_mesh((3, 3, 3), 2, periodic=(True, False, False))).source
    d = js.discretize(js.box_mesh((3, 3, 3), 3)).source
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d


# --- the compact geometric factors of affine elements ---------------------------------------

def test_affine_factors_are_the_constants_of_affine_elements_only():
    """On a box of affine elements G = c ⊙ w⊗w⊗w to round-off, and every form of h₁ gives the
    operator of the full factors; a deformed mesh has no compact form."""
    import importlib

    st = importlib.import_module("jaxsem.operators.stiffness")  # the module (the package exports a function of that name)
    order = 4
    sem = js.discretize(js.box_mesh((3, 2, 2), order, lengths=(1.0, 2.0, 0.5)), backend="einsum")
    G = sem.geom.G
    c = st.affine_factors(G)
    assert c is not None and c.shape == (6, sem.num_elements, 1, 1, 1) and st.is_compact(c)
    full = st.full_factors(c, order + 1)
    assert float(jnp.max(jnp.abs(full - G)) / jnp.max(jnp.abs(G))) < 1e-14
    assert float(jnp.max(jnp.abs(c[1:3]))) < 1e-14 * float(jnp.max(jnp.abs(c)))  # axis-aligned: no rs, rt
    u = jax.random.normal(jax.random.PRNGKey(0), (2,) + sem.mask.shape)
    E, n = sem.num_elements, order + 1
    for h1 in (None, 0.7, 1.0 + jnp.arange(E, dtype=float).reshape(E, 1, 1, 1),
               1.0 + jax.random.uniform(jax.random.PRNGKey(1), (E, n, n, n))):
        want = st.stiffness_gll(u, sem.D, G, h1)
        got = st.stiffness_gll(u, sem.D, st.with_coefficient(c, h1, n))
        assert float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) < 1e-13, h1
    assert st.is_compact(st.with_coefficient(c, 0.5, n)) and not st.is_compact(
        st.with_coefficient(c, jnp.ones((E, n, n, n)), n))
    curved = js.discretize(js.box_mesh((3, 2, 2), order, deform=0.1), backend="einsum")
    assert st.affine_factors(curved.geom.G) is None


def test_backends_with_compact_factors_solve_as_the_reference():
    """The emulated backend (the CUDA backend's choices, einsum values) takes the compact factors
    on an affine mesh and only there; its solve and gradient equal the reference's."""
    from jaxsem.backends import EMULATED

    mesh = js.box_mesh((3, 3, 3), 3)
    ref = poisson.bp_discretize(mesh, 5, backend="einsum")
    emu = poisson.bp_discretize(mesh, 5, backend=EMULATED)
    assert ref.affine is None and emu.affine is not None and emu.affine.shape == (6, 27, 1, 1, 1)
    assert emu.stiffness_factors is emu.affine and ref.stiffness_factors is ref.geom.G
    assert poisson.bp_discretize(js.box_mesh((3, 2, 2), 3, deform=0.1), 5, backend=EMULATED).affine is None
    assert emu.with_coordinates(emu.x * 1.1).affine is None  # moved nodes: the factors are recomputed in full
    x = jax.random.normal(jax.random.PRNGKey(2), (ref.assembled.size,))
    for h1, h2 in ((1.0, 0.0), (0.3, 2.0)):
        want = elliptic.global_operator(ref, h1, h2)(x)
        got = elliptic.global_operator(emu, h1, h2)(x)
        assert float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) < 1e-13
    ms = poisson.manufactured(5)
    loss = lambda s: lambda f: jnp.sum(poisson.solve(s, f, 1.0, 0.5, tol=1e-12)[0] ** 2)
    f = ms.f(*ref.geom.xq) if callable(ms.f) else ms.f
    g_ref, g_emu = jax.grad(loss(ref))(f), jax.grad(loss(emu))(f)
    assert float(jnp.max(jnp.abs(g_emu - g_ref)) / jnp.max(jnp.abs(g_ref))) < 1e-10
