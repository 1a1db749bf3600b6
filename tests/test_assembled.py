"""Assembled storage (one value per global node): the maps Q, Qᵀ and the solves on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.backends import EINSUM
from jaxsem.discretization import assembled, discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.parallel.comm import Comm


def _sem(bp=5, elements=(3, 2, 2), order=3, storage="auto"):
    return poisson.bp_discretize(box_mesh(elements, order, deform=0.1), bp, storage=storage)


def test_one_device_gets_assembled_storage_unless_asked_local():
    sem = _sem()
    a = sem.assembled
    assert a is not None and a.size == sem.num_global
    idx = np.asarray(a.idx)
    # Dirichlet nodes are mapped out of range, every other node to its global id
    np.testing.assert_array_equal(idx == a.size, np.asarray(sem.mask) == 0)
    gid = np.asarray(sem.gs.gid).reshape(idx.shape)
    np.testing.assert_array_equal(idx[idx < a.size], gid[idx < a.size])
    assert _sem(storage="local").assembled is None
    with pytest.raises(ValueError, match="storage must be one of"):
        _sem(storage="global")


def test_q_and_qt_are_transposes_and_from_local_inverts_q():
    sem = _sem(bp=6)
    a = sem.assembled
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(k1, (3, a.size))
    u = jax.random.normal(k2, (3,) + sem.mask.shape)
    # <Q x, u> = <x, Qᵀ u>
    np.testing.assert_allclose(jnp.sum(assembled.to_local(a, x) * u), jnp.sum(x * assembled.scatter(a, u)),
                               rtol=1e-13)
    # Q x is continuous and zero on Dirichlet nodes; from_local picks the value back
    free = np.asarray(assembled.from_local(a, sem.mask, sem.mult))
    assert set(np.unique(free)) == {0.0, 1.0}
    ux = assembled.to_local(a, x)
    np.testing.assert_allclose(sem.dssum(ux * sem.mult), ux, atol=1e-14)
    np.testing.assert_allclose(assembled.from_local(a, ux, sem.mult), x * free, atol=1e-14)


@pytest.mark.parametrize("bp", [1, 3, 4, 5, 6])
def test_global_operator_is_the_e_vector_operator(bp):
    """Q A_g x = A Q x (A the masked assembled E-vector operator), and A_g is symmetric."""
    sem = _sem(bp)
    a = sem.assembled
    h1, h2 = poisson.coefficients(bp)
    comps = (3,) if bp in (2, 4, 6) else ()
    k1, k2 = jax.random.split(jax.random.PRNGKey(bp))
    x, y = (jax.random.normal(k, comps + (a.size,)) for k in (k1, k2))
    free = assembled.from_local(a, sem.mask, sem.mult)
    x, y = x * free, y * free
    Ag = poisson.global_operator(sem, h1, h2)
    A = poisson.operator(sem, h1, h2)
    Ax = Ag(x)
    np.testing.assert_allclose(assembled.to_local(a, Ax), A(assembled.to_local(a, x)), rtol=0,
                               atol=1e-12 * float(jnp.max(jnp.abs(Ax))))
    np.testing.assert_allclose(jnp.sum(Ax * y), jnp.sum(x * Ag(y)), rtol=1e-12)
    assert float(jnp.max(jnp.abs(Ax * (1 - free)))) == 0.0  # nothing on Dirichlet nodes


@pytest.mark.parametrize("bp", [3, 5])
def test_fused_stiffness_form_equals_the_generic_one(bp):
    """BP5's and BP3's operators (the fused kernels' forms) with a variable h₁ equal Qᵀ A_e Q."""
    sem = _sem(bp)
    a = sem.assembled
    x = jax.random.normal(jax.random.PRNGKey(3), (a.size,))
    if bp == 5:
        h1 = 1.0 + sem.x[0] ** 2
        got = EINSUM.stiffness_gll_assembled(x, a.idx, sem.D, sem.geom.G, h1)
    else:  # h₁ on the Gauss points
        h1 = 1.0 + jnp.cos(jnp.arange(sem.geom.B.size).reshape(sem.geom.B.shape))
        got = EINSUM.stiffness_assembled(x, a.idx, sem.J, sem.Dt, sem.geom.G, h1)
    want = assembled.scatter(a, poisson.local_operator(sem, h1, 0.0)(assembled.to_local(a, x)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("bp, pmg", [(1, False), (3, True), (5, False), (5, True), (6, False)])
def test_solve_equals_the_e_vector_solve(bp, pmg):
    """Same iterations and the same solution to round-off, Jacobi or p-multigrid."""
    mesh = box_mesh((3, 2, 2), 4, deform=0.1)
    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    out = {}
    for storage in ("auto", "local"):
        sem = poisson.bp_discretize(mesh, bp, storage=storage)
        pre = poisson.pmg(sem, h1, h2) if pmg else None
        u, info = jax.jit(lambda s, p: poisson.solve(s, ms.f, h1, h2, tol=1e-12, maxiter=500, precond=p))(sem, pre)
        assert bool(info.converged)
        out[storage] = (u, int(info.iterations))
    (ua, ia), (ul, il) = out["auto"], out["local"]
    assert abs(ia - il) <= 1
    np.testing.assert_allclose(ua, ul, rtol=0, atol=1e-11 * float(jnp.max(jnp.abs(ul))))


def test_gradient_through_assembled_solve_is_the_local_one():
    """d/dθ of a loss through the solve, θ scaling f, h₁ and the coordinates: equal in both
    storages and to central differences."""
    mesh = box_mesh((2, 2, 2), 3, deform=0.1)
    sems = {st: poisson.bp_discretize(mesh, 5, storage=st) for st in ("auto", "local")}

    def loss(sem):
        def f(c):
            s = sem.with_coordinates(sem.x * (1 + 0.1 * c))
            u, _ = poisson.solve(s, lambda x, y, z: (1 + c) * jnp.sin(3 * x) * y, 1.0 + c, 0.0, tol=1e-13)
            return jnp.sum(u**2 * s.mult)
        return f

    ga, gl = (float(jax.grad(loss(sems[st]))(0.3)) for st in ("auto", "local"))
    fa = loss(sems["auto"])
    fd = (float(fa(0.3 + 1e-5)) - float(fa(0.3 - 1e-5))) / 2e-5
    assert ga == pytest.approx(gl, rel=1e-10)
    assert ga == pytest.approx(fd, rel=1e-6)


def test_a_ranks_map_holds_its_nodes_with_interface_weights():
    """A rank's part of a distributed mesh keeps its own nodes: the local node ids of its plan
    (Dirichlet nodes out of range), the plan's exchange, and weights 1/(ranks holding the node)
    that count every node once over the ranks."""
    mesh = box_mesh((4, 2, 2), 2)
    serial = discretize(mesh)
    parts = [discretize(mesh, comm=Comm(size=2, rank=r)) for r in range(2)]
    total = 0.0
    for part in parts:
        a = part.assembled
        assert a.size == part.gs.num_global and a.exchange is part.gs.exchange and a.comm == part.comm
        idx = np.asarray(a.idx)
        np.testing.assert_array_equal(idx == a.size, np.asarray(part.mask) == 0)
        gid = np.asarray(part.gs.gid).reshape(idx.shape)
        np.testing.assert_array_equal(idx[idx < a.size], gid[idx < a.size])
        w = np.asarray(a.weight)
        shared = np.zeros(a.size, bool)
        for i in a.exchange.idx:
            shared[np.asarray(i)] = True
        assert shared.any() and np.all(w[shared] == 0.5) and np.all(w[~shared] == 1.0)
        np.testing.assert_array_equal(np.asarray(a.shared), np.nonzero(shared)[0])
        np.testing.assert_array_equal(np.asarray(a.excess), 0.5)
        total += w.sum()
    assert total == serial.num_global
    assert discretize(mesh, comm=Comm(size=2, rank=1), storage="local").assembled is None
    with pytest.raises(ValueError, match="no assembled storage"):
        poisson.global_operator(discretize(mesh, storage="local"))
