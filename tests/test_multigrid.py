"""p-multigrid (jaxsem.solvers.multigrid, jaxsem.solvers.chebyshev): transfers, smoother, V-cycle, iterations.

Transfers: P reproduces coarse polynomials exactly and keeps fields continuous; R = Pᵀ
in the multiplicity-weighted products. Chebyshev: the fourth-kind error polynomial is
bounded by 1 and damps the top of the spectrum; Ritz bounds bracket the dense spectrum.
V-cycle: linear, symmetric and positive. Solves: pMG-PCG to 1e-10 in a few iterations,
nearly independent of p and h, equal to Jacobi-PCG's solution, for BP5, BP3, BP4 (vector),
curved hex27 elements read from a Gmsh file, Neumann Helmholtz, pure Neumann, coefficient
fields and float32; sharded over forced CPU devices equal to serial (this file run as a
script in a subprocess by tests/subproc.py, XLA_FLAGS set first).
"""

import dataclasses
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.mesh.gmsh import read_gmsh
from jaxsem.models import poisson
from jaxsem.discretization import assembled, hierarchy
from jaxsem.solvers import chebyshev, multigrid as mg

import subproc


def pmg_solve(sem, pmg, b, tol=1e-10, h1=1.0, h2=0.0, method="classic", maxiter=1000):
    """``poisson.solve`` with the V-cycle (pmg) or Jacobi (pmg None), compiled."""
    return jax.jit(lambda s, p, b: poisson.solve(s, None, h1, h2, tol=tol, maxiter=maxiter, rhs=b, method=method,
                                                 precond=p))(sem, pmg, b)


def setup(sem, mesh, **kw):
    h1, h2 = kw.pop("h1", 1.0), kw.pop("h2", 0.0)
    return poisson.pmg(sem, h1=h1, h2=h2, options=mg.PMGOptions(**kw))


def bp_case(bp, K, p, deform=0.1, **kw):
    mesh = js.box_mesh(K, p, deform=deform)
    sem = poisson.bp_discretize(mesh, bp, **kw)
    man = poisson.manufactured(bp)
    return mesh, sem, poisson.load(sem, man.f)


def rotated(mesh, seed):
    """``mesh`` with every element's local axes permuted and reversed at random (proper
    rotations only): shared faces meet in every relative orientation."""
    rng = np.random.default_rng(seed)
    x, cells = mesh.x.copy(), mesh.cells.copy()
    for e in range(mesh.num_elements):
        perm, flips = rng.permutation(3), rng.integers(0, 2, 3)
        parity = sum(perm[a] > perm[b] for a in range(3) for b in range(a + 1, 3)) % 2
        flips[0] ^= (parity + flips.sum()) % 2  # determinant +1

        def turn(a):  # a: [k, j, i]
            a = np.transpose(a, perm)
            return np.flip(a, tuple(np.nonzero(flips)[0])) if flips.any() else a

        x[:, e] = np.stack([turn(x[d, e]) for d in range(3)])
        cells[e] = turn(cells[e].reshape(2, 2, 2)).ravel()
    return dataclasses.replace(mesh, x=x, cells=cells)


@functools.lru_cache(maxsize=None)
def curved():
    """BP5 on 3³ curved elements of order 4, each element rotated: levels (4, 2, 1)."""
    mesh = rotated(js.box_mesh(3, 4, deform=0.1), seed=3)
    sem = poisson.bp_discretize(mesh, 5)
    return mesh, sem, setup(sem, mesh)


@functools.lru_cache(maxsize=None)
def neumann():
    """Neumann (h₁, h₂) = (1, 1) on 3³ curved elements of order 4, periodic in x."""
    mesh = js.box_mesh(3, 4, deform=0.1, periodic=(True, False, False))
    sem = js.discretize(mesh, dirichlet=False)
    return mesh, sem, setup(sem, mesh, h2=1.0)


@functools.lru_cache(maxsize=None)
def bp_iterations(bp, K, p):
    """(pMG iterations, Jacobi iterations or None, relative solution difference) to 1e-10."""
    mesh, sem, b = bp_case(bp, K, p)
    u, info = pmg_solve(sem, setup(sem, mesh), b)
    assert bool(info.converged)
    if K > 3:
        return int(info.iterations), None, None
    uj, infoj = pmg_solve(sem, None, b)
    assert bool(infoj.converged)
    return int(info.iterations), int(infoj.iterations), float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj)))


def continuous(sem, v):
    return sem.mask * sem.dssum(sem.mult * v)


def rand(sem, seed, lead=()):
    v = jax.random.normal(jax.random.PRNGKey(seed), lead + sem.mult.shape, sem.x.dtype)
    return continuous(sem, v)


# --- options and levels ------------------------------------------------------------------

def test_default_orders_halve_to_one():
    assert hierarchy.default_orders(7) == (7, 4, 2, 1)
    assert hierarchy.default_orders(8) == (8, 4, 2, 1)
    assert hierarchy.default_orders(2) == (2, 1)
    assert hierarchy.default_orders(1) == (1,)


@pytest.mark.parametrize("kw, match", [
    (dict(orders=(4, 4, 1)), "decrease"), (dict(orders=(3, 0)), "decrease"), (dict(degree=0), "degree"),
    (dict(safety=0.9), "safety"), (dict(lanczos_steps=1), "lanczos_steps"),
    (dict(coarse_reduction=1.0), "coarse_reduction"), (dict(coarse_steps=0), "coarse_steps")])
def test_options_reject_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        mg.PMGOptions(**kw)


def test_setup_rejects_a_schedule_not_below_the_fine_order():
    mesh = js.box_mesh(2, 3)
    sem = poisson.bp_discretize(mesh, 5)
    with pytest.raises(ValueError, match="orders"):
        setup(sem, mesh, orders=(5, 2))
    with pytest.raises(ValueError, match="strictly decreasing order"):
        mg.setup((sem, sem), poisson.operator, poisson.jacobi)
    # strongly curved elements fold when their geometry is interpolated to order 1: a schedule
    # asked for is refused, the default one ends at the lowest order that does not fold
    mesh = js.box_mesh(2, 4, deform=0.22)
    sem = poisson.bp_discretize(mesh, 5)
    with pytest.raises(ValueError, match="order 1 .* folds"):
        setup(sem, mesh, orders=(4, 2, 1))
    with pytest.warns(hierarchy.PMGScheduleWarning, match=r"folds at order 1; levels \(4, 2\)"):
        pm = setup(sem, mesh)
    assert [lv.sem.order for lv in pm.levels] == [4, 2]


def test_default_schedule_works_on_every_deformation_the_cli_accepts():
    """|deform| < 0.27 (the CLI's range) at the default order 6: the schedule ends where the geometry
    folds (order 2 at 0.25), and the solve converges to the same solution as Jacobi-PCG."""
    mesh = js.box_mesh(3, 6, deform=0.26)
    sem = poisson.bp_discretize(mesh, 5)
    with pytest.warns(hierarchy.PMGScheduleWarning, match="folds at order 2"):
        pm = poisson.pmg(sem)
    assert [lv.sem.order for lv in pm.levels] == [6, 3]
    ms = poisson.manufactured(5)
    u, info = poisson.solve(sem, ms.f, tol=1e-10, precond=pm)
    u_j, info_j = poisson.solve(sem, ms.f, tol=1e-10)
    assert bool(info.converged) and bool(info_j.converged) and int(info.iterations) < int(info_j.iterations)
    assert float(jnp.max(jnp.abs(u - u_j))) < 1e-8 * float(jnp.max(jnp.abs(u_j)))


@functools.lru_cache(maxsize=None)
def small():
    """BP5 on 2³ curved elements of order 3 with the user schedule (3, 1)."""
    mesh = js.box_mesh(2, 3, deform=0.15)
    sem = poisson.bp_discretize(mesh, 5)
    return mesh, sem, setup(sem, mesh, orders=(1,), lanczos_steps=20)


def test_user_schedule_and_coarse_geometry_from_the_fine_level():
    _, sem, pmg = small()
    assert pmg.orders == (3, 1)
    # coarse nodes are the fine (curved) coordinates interpolated
    lv = pmg.levels[1]
    J = np.asarray(js.basis.interp_matrix(sem.n, lv.sem.n, "gll", "gll")[0])
    x = np.einsum("ai,bj,ck,dekji->decba", J, J, J, np.asarray(sem.x))
    np.testing.assert_allclose(np.asarray(lv.sem.x), x, atol=1e-14)


# --- transfers ---------------------------------------------------------------------------

def test_prolongation_reproduces_coarse_polynomials():
    # affine elements: physical polynomials of degree 3 are in the order-3 space
    fine, coarse = js.discretize(js.box_mesh((2, 3, 2), 6)), js.discretize(js.box_mesh((2, 3, 2), 3))
    J = jnp.asarray(js.basis.interp_matrix(3 + 1, 6 + 1, "gll", "gll")[0])
    poly = lambda x, y, z: 1 + x - 2 * y**3 + x * y * z + 0.5 * z**2 * x - x**3 * y**2 * z
    Pu = mg.prolong(J, coarse.interpolate(poly))
    np.testing.assert_allclose(np.asarray(Pu), np.asarray(fine.interpolate(poly)), atol=1e-13)


def test_prolongation_keeps_fields_continuous():
    _, _, pmg = curved()
    for l in range(1, len(pmg.levels)):
        fine, lv = pmg.levels[l - 1].sem, pmg.levels[l]
        Pu = mg.prolong(lv.J, rand(lv.sem, l))
        assert float(jnp.max(jnp.abs(fine.dssum(fine.mult * Pu) - Pu))) < 1e-14 * float(jnp.max(jnp.abs(Pu)))


def test_rotated_elements_solve_like_the_box():
    mesh, sem, pmg = curved()
    box = js.box_mesh(3, 4, deform=0.1)
    assert not np.array_equal(mesh.cells, box.cells)
    b = poisson.load(sem, poisson.manufactured(5).f)
    u, info = pmg_solve(sem, pmg, b)
    uj, infoj = pmg_solve(sem, None, b)
    assert bool(info.converged) and int(info.iterations) <= 15 and int(infoj.iterations) >= 4 * int(info.iterations)
    assert float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj))) < 1e-9
    assert abs(bp_iterations(5, 3, 4)[0] - int(info.iterations)) <= 1  # the same mesh, unrotated


@pytest.mark.parametrize("case", [curved, neumann])
def test_restriction_is_the_transpose_of_prolongation(case):
    _, _, pmg = case()
    for l in range(1, len(pmg.levels)):
        fine, lv = pmg.levels[l - 1].sem, pmg.levels[l]
        uc, vf = rand(lv.sem, 2 * l), rand(fine, 2 * l + 1)
        lhs = fine.dot(mg.prolong(lv.J, uc), vf)
        rhs = lv.sem.dot(uc, mg.restrict(lv.sem, lv.J, fine.mult, vf))
        assert abs(float(lhs - rhs)) < 1e-13 * abs(float(lhs)), (l, float(lhs), float(rhs))


# --- Chebyshev -----------------------------------------------------------------------------

@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_fourth_kind_error_polynomial(degree):
    """Scalar problems λx = λ: the error 1 − x is the smoother's polynomial e(λ)."""
    lam = jnp.linspace(1e-6, 1.0, 4001)
    x = chebyshev.fourth_kind(lambda u: lam * u, 1.0, 1.0, degree, lam)
    e = 1 - x
    assert float(jnp.max(jnp.abs(e))) <= 1.0
    assert abs(float(e[-1])) <= 1 / (2 * degree + 1) + 1e-12
    # the energy-weighted error √λ·|e| is bounded by 1/(2k+1) (Lottes 2023)
    assert float(jnp.max(jnp.sqrt(lam) * jnp.abs(e))) <= 1 / (2 * degree + 1) + 1e-12


def test_first_kind_solves_on_its_interval():
    lam = jnp.linspace(0.01, 1.0, 1001)
    for k in (5, 20):
        x = chebyshev.first_kind(lambda u: lam * u, 1.0, 0.01, 1.0, k, lam)
        bound = 2 * ((10 - 1) / (10 + 1)) ** k
        assert float(jnp.max(jnp.abs(1 - x))) <= bound
    assert chebyshev.steps_for(100.0, 0.1) == 15  # 2·(9/11)^15 ≈ 0.098


def dense_operator(sem, h1=1.0, h2=0.0):
    """The assembled matrix on free global nodes, and its Jacobi diagonal (small meshes only)."""
    gid = np.asarray(sem.gs.gid).reshape(sem.mult.shape)
    N = int(gid.max()) + 1
    A = poisson.operator(sem, h1, h2)
    cols = jax.vmap(lambda i: A((jnp.asarray(gid) == i).astype(sem.x.dtype) * sem.mask))(jnp.arange(N))
    first = np.unique(gid.ravel(), return_index=True)[1]
    M = np.asarray(cols).reshape(N, -1)[:, first]
    free = np.asarray(sem.mask).ravel()[first] > 0
    return M[np.ix_(free, free)]


def test_ritz_bounds_bracket_the_spectrum():
    _, sem, pmg = small()
    M = dense_operator(sem)
    d = np.diag(M)
    lam = np.linalg.eigvalsh(M / np.sqrt(np.outer(d, d)))
    lv = pmg.levels[0]
    lmax = float(lv.rho) / pmg.options.safety
    assert lam[-1] >= lmax > 0.97 * lam[-1]  # from below, close after 20 steps
    assert float(lv.rho) > lam[-1]  # the bound the smoother uses
    assert float(lv.lmin) >= lam[0] * (1 - 1e-10)


def test_chebyshev_smoother_damps_rough_error():
    _, sem, pmg = curved()
    lv = pmg.levels[0]
    A = pmg.level_operator(0)
    energy = lambda e: float(jnp.sqrt(sem.dot(e, A(e))))
    smooth = lambda e, k: e - chebyshev.fourth_kind(A, lv.dinv, lv.rho, k, A(e))
    rough = rand(sem, 7)
    gentle = continuous(sem, sem.interpolate(lambda x, y, z: jnp.sin(jnp.pi * x) * jnp.sin(jnp.pi * y)
                                             * jnp.sin(jnp.pi * z)))
    r_rough = [energy(smooth(rough, k)) / energy(rough) for k in (1, 2, 3, 4)]
    r_gentle = [energy(smooth(gentle, k)) / energy(gentle) for k in (1, 2, 3, 4)]
    assert r_rough[0] < 0.5 and all(a > b for a, b in zip(r_rough, r_rough[1:])) and r_rough[-1] < 0.15
    assert min(r_gentle) > 0.85


# --- the V-cycle -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", [curved, neumann])
def test_vcycle_is_linear_symmetric_and_positive(case):
    _, sem, pmg = case()
    M = jax.jit(mg.vcycle)
    u, v = rand(sem, 1), rand(sem, 2)
    Mu, Mv = M(pmg, u), M(pmg, v)
    scale = float(sem.dot(Mu, u))
    assert abs(float(sem.dot(Mu, v) - sem.dot(u, Mv))) < 1e-12 * scale
    lin = M(pmg, 2.5 * u - v) - (2.5 * Mu - Mv)
    assert float(jnp.max(jnp.abs(lin))) < 1e-12 * float(jnp.max(jnp.abs(Mu)))
    for seed in range(3, 8):
        w = rand(sem, seed)
        assert float(sem.dot(M(pmg, w), w)) > 0
    # and a good preconditioner: M A ≈ I on rough vectors, eigenvalues of M A in (0, 2)
    A = pmg.level_operator(0)
    ratio = float(sem.dot(M(pmg, A(u)), A(u)) / sem.dot(u, A(u)))
    assert 0.2 < ratio < 2.0


@pytest.mark.parametrize("case", [curved, neumann])
def test_assembled_cycle_equals_the_e_vector_cycle(case):
    """The cycle whose finest level smooths on assembled vectors is ``Qᵀ(mult·vcycle(Q r))`` to
    round-off; its node map holds one copy of every free node and none of a Dirichlet one."""
    _, sem, pmg = case()
    a, lv = sem.assembled, pmg.levels[0]
    assert lv.pick is not None and pmg.global_operator is not None
    g = lambda u: assembled.from_local(a, u, sem.mult)
    r = rand(sem, 11, lead=(2,))
    z = jax.jit(mg.vcycle_assembled)(pmg, g(r))
    want = g(jax.jit(mg.vcycle)(pmg, r))
    assert z.shape == want.shape == (2, a.size)
    np.testing.assert_allclose(z, want, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(want))))
    # every copy of a free node picked back gives the node: Q(one copy) = the E-vector itself
    np.testing.assert_array_equal(assembled.to_local(a, mg._one_copy(lv.pick, r)), r)
    np.testing.assert_allclose(lv.adinv, g(lv.dinv), rtol=1e-14, atol=0)  # copies equal to round-off
    free = int(jnp.sum(g(sem.mask) > 0))
    assert int(jnp.sum(lv.pick < sem.mult.size)) == free
    assert (free < a.size) == bool(sem.dirichlet)


def test_assembled_cycle_needs_the_node_map():
    _, sem, pmg = small()
    bare = mg.setup(hierarchy.levels(sem, (1,)), poisson.operator, poisson.jacobi)  # no global_operator
    assert bare.levels[0].pick is None and bare.global_operator is None
    with pytest.raises(ValueError, match="global_operator"):
        mg.vcycle_assembled(bare, jnp.zeros(sem.assembled.size))
    # a solve on assembled vectors with it runs the E-vector cycle: the same solution
    b = poisson.load(sem, poisson.manufactured(5).f)
    u1, i1 = pmg_solve(sem, bare, b)
    u2, i2 = pmg_solve(sem, pmg, b)
    assert int(i1.iterations) == int(i2.iterations)
    np.testing.assert_allclose(u1, u2, rtol=0, atol=1e-9 * float(jnp.max(jnp.abs(u2))))


# --- solves ----------------------------------------------------------------------------------

def test_pmg_needs_few_iterations_independent_of_order():
    its = {p: bp_iterations(5, 3, p) for p in (2, 4, 6)}
    # measured: p = 2, 4, 6 -> 9, 12, 15 (pMG) vs 25, 66, 113 (Jacobi)
    for p, (it, itj, _) in its.items():
        assert it <= 16 and itj >= 2.5 * it, its
    assert its[6][0] <= 1.7 * its[2][0] and its[6][1] >= 7 * its[6][0], its


def test_pmg_solution_equals_jacobi():
    for p in (2, 4, 6):
        assert bp_iterations(5, 3, p)[2] < 1e-9


def test_pmg_iterations_nearly_independent_of_h():
    its = {K: bp_iterations(5, K, 4)[0] for K in (2, 3, 6)}
    # measured: 10, 12, 14
    assert max(its.values()) <= 15 and its[6] <= 1.5 * its[2], its


def test_bp3_gauss():
    it, itj, diff = bp_iterations(3, 3, 5)
    assert it <= 14 and itj >= 4 * it and diff < 1e-9, (it, itj, diff)


def test_bp4_vector_field():
    mesh, sem, b = bp_case(4, 2, 3)
    pmg = setup(sem, mesh)
    u, info = pmg_solve(sem, pmg, b)
    uj, _ = pmg_solve(sem, None, b)
    assert u.shape == (3,) + sem.mult.shape and bool(info.converged) and int(info.iterations) <= 12
    assert float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj))) < 1e-9


def test_gmsh_file_curved_hex27(tmp_path):
    """A mesh read from a .msh file: 3³ curved triquadratic (hex27) elements in Gmsh's node
    order, a non-box domain (curved faces), read at order 4; BP5-like Dirichlet Poisson."""
    from test_gmsh import _write_hex27_native  # here: test_gmsh needs meshio, which a GPU session may lack

    path = tmp_path / "curved27.msh"
    _write_hex27_native(path, (3, 3, 3))
    mesh = read_gmsh(path, order=4)
    assert float(np.max(np.abs(mesh.x - js.box_mesh(3, 4).x))) > 0.05  # not the unit box
    sem = poisson.bp_discretize(mesh, 5)
    pmg = poisson.pmg(sem)
    assert pmg.orders == (4, 2, 1)
    f = lambda x, y, z: jnp.sin(3 * x) * jnp.cos(2 * y) + z
    u, info = poisson.solve(sem, f, precond=pmg, tol=1e-10)
    uj, infoj = poisson.solve(sem, f, precond=None, tol=1e-10)
    # measured: 11 iterations (pMG) vs 81 (Jacobi)
    assert bool(info.converged) and int(info.iterations) <= 13, int(info.iterations)
    assert bool(infoj.converged) and int(infoj.iterations) >= 5 * int(info.iterations), int(infoj.iterations)
    assert float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj))) < 1e-9


def test_neumann_helmholtz_coefficient_fields_and_classic_pcg():
    mesh, sem, pmg = neumann()
    E = sem.num_elements
    xq = sem.geom.xq
    h1 = 1.0 + 0.5 * jnp.sin(2 * xq[0]) * xq[1]  # per point (E, q, q, q)
    h2 = jnp.linspace(0.5, 2.0, E).reshape(E, 1, 1, 1)  # per element
    b = poisson.load(sem, lambda x, y, z: jnp.cos(jnp.pi * x) + y * z)
    for c1, c2 in ((1.0, 1.0), (h1, h2)):
        if c1 is h1:
            pmg = mg.setup(hierarchy.levels(sem), poisson.operator, poisson.jacobi, h1=c1, h2=c2)
        u, info = pmg_solve(sem, pmg, b, h1=c1, h2=c2, method="classic")
        uj, infoj = pmg_solve(sem, None, b, h1=c1, h2=c2)
        assert bool(info.converged) and int(info.iterations) <= 12 < int(infoj.iterations)
        assert float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj))) < 1e-9
    assert pmg.levels[1].h1.shape == (E,) + (pmg.levels[1].sem.n,) * 3 and pmg.levels[1].h2.shape == (E, 1, 1, 1)


def test_pure_neumann_laplacian():
    """Singular (constants): a consistent right-hand side A u*, solution u* up to a constant."""
    mesh = js.box_mesh(3, 5, deform=0.1)
    sem = js.discretize(mesh, dirichlet=False)
    pmg = setup(sem, mesh)
    assert 0 < float(pmg.levels[-1].lmin) and pmg.coarse_steps < 50
    ustar = sem.interpolate(lambda x, y, z: jnp.cos(jnp.pi * x) * jnp.cos(2 * jnp.pi * y) + z**2)
    b = poisson.operator(sem)(ustar)
    u, info = pmg_solve(sem, pmg, b)
    assert bool(info.converged) and int(info.iterations) <= 15
    d = u - ustar
    assert float(jnp.max(jnp.abs(d - jnp.mean(d)))) < 1e-8


def test_float32():
    mesh = js.box_mesh(2, 4, deform=0.1)
    sem = poisson.bp_discretize(mesh, 5, dtype=jnp.float32)
    b = poisson.load(sem, poisson.manufactured(5).f)
    pmg = setup(sem, mesh)
    assert pmg.levels[-1].dinv.dtype == jnp.float32
    u, info = pmg_solve(sem, pmg, b, tol=1e-5)
    uj, infoj = pmg_solve(sem, None, b, tol=1e-5)
    assert u.dtype == jnp.float32 and bool(info.converged) and int(info.iterations) <= 8 < int(infoj.iterations)
    assert float(jnp.max(jnp.abs(u - uj)) / jnp.max(jnp.abs(uj))) < 1e-4


def test_float32_cycle_inside_a_float64_solve():
    """PMGOptions(dtype="float32"): every level (the finest again) in float32, the outer solve
    float64 (flexible CG). The float64 tolerance 1e-10 is met, with the iterations of the
    float64 cycle, and the solution equals the all-float64 one to the tolerance."""
    mesh, sem, b = bp_case(5, 3, 5)
    p64 = setup(sem, mesh)
    p32 = setup(sem, mesh, dtype="float32")
    assert p32.dtype == jnp.float32 and all(lv.sem.x.dtype == jnp.float32 for lv in p32.levels)
    assert p32.orders == p64.orders and p32.levels[0].sem is not sem
    # the finest float32 level keeps the assembled storage of sem: the cycle runs on it there
    assert p32.levels[0].sem.assembled is not None and p32.levels[0].pick is not None
    assert all(lv.sem.assembled is None for lv in p32.levels[1:])
    g = lambda u: assembled.from_local(sem.assembled, u, sem.mult)
    za = mg.vcycle_assembled(p32, g(b))
    assert za.dtype == jnp.float64
    assert float(jnp.max(jnp.abs(za - g(mg.vcycle(p32, b)))) / jnp.max(jnp.abs(za))) < 1e-5
    z = mg.vcycle(p32, b)
    assert z.dtype == jnp.float64
    z64 = mg.vcycle(p64, b)
    assert 1e-9 < float(jnp.max(jnp.abs(z - z64)) / jnp.max(jnp.abs(z64))) < 1e-4  # a float32 cycle, not a copy
    u64, i64 = pmg_solve(sem, p64, b)
    u32, i32 = pmg_solve(sem, p32, b)
    assert u32.dtype == jnp.float64 and bool(i32.converged) and float(i32.true_relative_residual) <= 1e-10
    assert int(i32.iterations) <= int(i64.iterations) + 1, (int(i32.iterations), int(i64.iterations))
    assert float(jnp.max(jnp.abs(u32 - u64)) / jnp.max(jnp.abs(u64))) < 1e-9


def test_gradient_through_a_pmg_solve_equals_jacobi():
    _, sem, pmg = small()
    g = sem.geom
    f0 = poisson.manufactured(5).f(g.xq[0], g.xq[1], g.xq[2])
    w = sem.interpolate(lambda x, y, z: x * y + z)

    def loss(f, p):
        u, _ = pmg_solve(sem, p, poisson.load(sem, f), tol=1e-12)
        return sem.dot(u, w)

    gp, gj = jax.grad(loss)(f0, pmg), jax.grad(loss)(f0, None)
    assert float(jnp.max(jnp.abs(gp - gj)) / jnp.max(jnp.abs(gj))) < 1e-9


# --- sharded over forced CPU devices -----------------------------------------------------

def shard_check(P: int) -> dict:
    """BP5 and a periodic Neumann Helmholtz problem, serial and sharded over P devices."""
    from jaxsem.discretization import to_mesh_order

    out = {}
    cases = {"bp5": (js.box_mesh((4, 3, 2), 4, deform=0.1), True, 0.0),
             "periodic_helmholtz": (js.box_mesh((4, 2, 3), 3, deform=0.1, periodic=(True, True, False)), False, 1.0)}
    for name, (mesh, dirichlet, h2) in cases.items():
        res = {}
        for key, devices in (("serial", None), ("shard", P)):
            sem = js.discretize(mesh, dirichlet=dirichlet, devices=devices)
            pmg = setup(sem, mesh, h2=h2)
            b = poisson.load(sem, lambda x, y, z: jnp.sin(3 * x) * jnp.cos(2 * y) + z)
            u, info = pmg_solve(sem, pmg, b, h2=h2)
            res[key] = (to_mesh_order(sem, u), int(info.iterations), bool(info.converged),
                        [float(lv.rho) for lv in pmg.levels], pmg.coarse_steps)
        (us, its, cs, rs, ks), (ud, itd, cd, rd, kd) = res["serial"], res["shard"]
        out[name] = dict(err=float(np.max(np.abs(us - ud)) / np.max(np.abs(us))), iterations=[itd, its],
                         converged=[cd, cs], rho_err=float(np.max(np.abs(np.subtract(rs, rd)) / np.asarray(rs))),
                         coarse_steps=[kd, ks])
    return out


@pytest.fixture(scope="module", autouse=True)
def sharded_run():
    """The sharded check, started before the serial tests so that they overlap."""
    proc = subproc.start([__file__, "shard", "3"], devices=3)
    yield proc
    subproc.stop(proc)


def test_sharded_equals_serial(sharded_run):
    res = subproc.result(sharded_run)
    for name, r in res.items():
        assert r["err"] < 1e-11 and r["rho_err"] < 1e-12, (name, r)
        assert r["iterations"][0] == r["iterations"][1] and all(r["converged"]), (name, r)
        assert r["coarse_steps"][0] == r["coarse_steps"][1]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "shard":
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() >= int(sys.argv[2]), jax.devices()
    print("RESULT " + json.dumps(shard_check(int(sys.argv[2]))))


def test_gradient_through_a_pmg_solve_equals_central_differences():
    """d/dh1 of a functional of the pMG-PCG solution (the preconditioner built once, for h1 = 1,
    and not differentiated) equals the central difference."""
    _, sem, pmg = small()
    f = poisson.manufactured(5).f
    w = sem.interpolate(lambda x, y, z: x * y + z)

    def loss(h1):
        u, _ = jax.jit(lambda s, p, h: poisson.solve(s, f, h, 0.0, tol=1e-13, precond=p))(sem, pmg, h1)
        return sem.dot(u, w)

    h, eps = 1.3, 1e-4
    g = float(jax.grad(loss)(h))
    fd = (float(loss(h + eps)) - float(loss(h - eps))) / (2 * eps)
    assert abs(g - fd) < 1e-7 * abs(fd)
