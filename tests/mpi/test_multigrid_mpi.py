"""The p-multigrid preconditioner under MPI equals the serial one (mpirun -n 2 and -n 4).

Each rank builds the serial problem and its own part; the distributed pMG-PCG
solve of BP5 and BP3 takes the serial number of iterations and gives the serial
solution (to 1e-10) on the rank's elements, coarse levels included.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.parallel.comm import Comm, allreduce_max


@pytest.mark.parametrize("bp", [5, 3])
def test_pmg_solve_equals_serial(comm, bp):
    mesh = box_mesh((4, 2, 2), 4, deform=0.1)
    ms, (h1, h2) = poisson.manufactured(bp), poisson.coefficients(bp)
    spec = poisson.BP_SPECS[bp]
    solve = jax.jit(lambda s, p: poisson.solve(s, ms.f, h1, h2, tol=1e-10, precond=p))
    out = []
    for c in (Comm(), comm):
        sem = discretize(mesh, spec.quadrature, spec.dirichlet, comm=c)
        out.append((sem, *solve(sem, poisson.pmg(sem, h1, h2))))
    (serial, us, i_s), (dist, ud, i_d) = out
    el = np.asarray(dist.elements)
    err = float(allreduce_max(jnp.max(jnp.abs(ud - us[el])), comm) / jnp.max(jnp.abs(us)))
    assert bool(i_d.converged) and bool(i_s.converged)
    assert int(i_d.iterations) == int(i_s.iterations) <= 20
    assert err < 1e-10
