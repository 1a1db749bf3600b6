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
