"""Distributed SEM equals serial SEM (run under mpirun -n 2 and -n 4).

Every rank builds the same global mesh, discretizes it twice — serially (all
elements, Comm()) and distributed (its own elements) — and compares the
distributed results with the serial ones restricted to its elements. All
collective calls happen before any assertion, so a failure on one rank cannot
hang the others.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.parallel.comm import Comm, allreduce_max
from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.mesh.partition import partition_mesh


def _pair(comm, mesh, bp=None, partition=None, **kw):
    if bp is not None:
        kw = dict(quadrature=poisson.BP_SPECS[bp].quadrature, dirichlet=poisson.BP_SPECS[bp].dirichlet, **kw)
    serial = discretize(mesh, comm=Comm(), **kw)
    dist = discretize(mesh, comm=comm, partition=partition, **kw)
    return serial, dist


def _rel(a, b, comm):
    num = allreduce_max(jnp.max(jnp.abs(a - b)), comm)
    den = allreduce_max(jnp.max(jnp.abs(b)), comm)
    return float(num / den)


@pytest.mark.parametrize(
    "elements, periodic",
    [((4, 3, 2), (False, False, False)), ((2, 2, 2), (True, False, False)), ((3, 3, 1), (True, True, False))],
)
def test_gather_scatter_equals_serial(comm, elements, periodic):
    mesh = box_mesh(elements, 3, periodic=periodic, deform=0.05)
    serial, dist = _pair(comm, mesh)
    u = jax.random.normal(jax.random.PRNGKey(0), (3,) + serial.mask.shape)
    el = np.asarray(dist.elements)
    ref = serial.dssum(u)[:, el]
    out = jax.jit(lambda s, v: s.dssum(v))(dist, u[:, el])
    err = _rel(out, ref, comm)
    mult_err = _rel(dist.mult, serial.mult[el], comm)
    dot_err = abs(float(dist.dot(u[0, el], u[1, el]) - serial.dot(u[0], u[1])))
    assert err < 1e-13 and mult_err == 0.0 and dot_err < 1e-12
    assert len(dist.gs.exchange.neighbors) >= 1


def test_gather_scatter_csr_rows_equal_serial(comm):
    """The CUDA backend's plan under MPI: each rank sums its own copies by "csr" rows (on a CPU
    the emulated backend with that plan sums them by the rows' JAX form), then exchanges."""
    from typing import ClassVar

    from jaxsem.backends import EmulatedBackend

    class CsrEmulated(EmulatedBackend):
        gs_layout: ClassVar[str] = "csr"

    mesh = box_mesh((4, 3, 2), 3, periodic=(True, False, False), deform=0.05)
    serial, dist = _pair(comm, mesh, backend=CsrEmulated())
    u = jax.random.normal(jax.random.PRNGKey(1), (3,) + serial.mask.shape)
    el = np.asarray(dist.elements)
    err = _rel(jax.jit(lambda s, v: s.dssum(v))(dist, u[:, el]), serial.dssum(u)[:, el], comm)
    assert dist.gs.layout == "csr" and dist.gs.exchange is not None and dist.gs.csr_off is not None
    assert err < 1e-13


@pytest.mark.parametrize("bp", [1, 4, 5])
def test_pcg_solve_equals_serial(comm, bp):
    mesh = box_mesh((3, 2, 2), 3, deform=0.1)
    serial, dist = _pair(comm, mesh, bp=bp)
    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    solve = jax.jit(lambda s: poisson.solve(s, ms.f, h1, h2, tol=1e-12))
    us, info_s = solve(serial)
    ud, info_d = solve(dist)
    el = np.asarray(dist.elements)
    err = _rel(ud, us[..., el, :, :, :], comm)
    errs_d = poisson.relative_errors(dist, ud, ms.u)
    errs_s = poisson.relative_errors(serial, us, ms.u)
    assert int(info_d.iterations) == int(info_s.iterations)
    assert err < 1e-12
    assert abs(errs_d[0] - errs_s[0]) < 1e-10 * errs_s[0]


def test_fixed_iterations_and_uneven_partition(comm):
    mesh = box_mesh((5, 3, 1), 2, deform=0.1)
    # an uneven, non-grid partition: round-robin-ish blocks of unequal size
    part = np.minimum(np.arange(mesh.num_elements) * comm.size // (mesh.num_elements + 2), comm.size - 1)
    part[-1] = comm.size - 1
    serial, dist = _pair(comm, mesh, bp=5, partition=part)
    ms = poisson.manufactured(5)
    run = jax.jit(lambda s: poisson.solve(s, ms.f, tol=0.0, maxiter=17))
    us, i_s = run(serial)
    ud, i_d = run(dist)
    el = np.asarray(dist.elements)
    err = _rel(ud, us[el], comm)
    assert int(i_d.iterations) == int(i_s.iterations) == 17 and err < 1e-12
    assert np.array_equal(el, np.nonzero(part == comm.rank)[0])


def test_gradient_equals_serial(comm):
    mesh = box_mesh((2, 2, 2), 3, deform=0.1, periodic=(True, False, False))
    serial, dist = _pair(comm, mesh, bp=3)
    el = np.asarray(dist.elements)
    f = 1.0 + jax.random.uniform(jax.random.PRNGKey(1), serial.geom.B.shape)
    h2 = 0.5 + jax.random.uniform(jax.random.PRNGKey(2), serial.geom.B.shape)

    def loss(sem, f, h2):
        u, _ = poisson.solve(sem, f, 1.0, h2, tol=1e-13)
        return sem.dot(u, u)

    gs = jax.grad(loss, argnums=(1, 2))(serial, f, h2)
    gd = jax.jit(jax.grad(loss, argnums=(1, 2)))(dist, f[el], h2[el])
    e_f = _rel(gd[0], gs[0][el], comm)
    e_h = _rel(gd[1], gs[1][el], comm)
    assert e_f < 1e-11 and e_h < 1e-11


def test_too_many_ranks_is_a_clear_error(comm):
    mesh = box_mesh((1, 1, 1), 2)
    if comm.size > 1:
        with pytest.raises(ValueError, match="exceeds the number of elements"):
            discretize(mesh, comm=comm)
    else:
        with pytest.raises(ValueError, match="exceeds the number of elements"):
            partition_mesh(mesh, 2)


def test_host_staging_tuned(comm):
    """A distributed run raises glibc's mmap threshold for mpi4jax's host buffers (on by default)."""
    import jaxsem.parallel.mpi as C

    assert C.HOST_STAGING_TUNED is (comm.size > 1)


def test_single_reduction_pcg_equals_serial(comm):
    mesh = box_mesh((3, 2, 2), 3, deform=0.1)
    serial, dist = _pair(comm, mesh, bp=5)
    ms = poisson.manufactured(5)
    run = jax.jit(lambda s: poisson.solve(s, ms.f, tol=1e-11, method="single-reduction"))
    us, i_s = run(serial)
    ud, i_d = run(dist)
    el = np.asarray(dist.elements)
    err = _rel(ud, us[el], comm)
    assert int(i_d.iterations) == int(i_s.iterations) and bool(i_d.converged) and err < 1e-11
