"""Navier–Stokes under MPI equals serial (mpirun -n 2 and -n 4).

Each rank builds the serial problem and its own part; a few steps of the periodic
Taylor–Green vortex and of Ethier–Steinman with its wall data give the serial velocity
and pressure on the rank's elements, the same solver iterations and the same energy; the
gradient through three Taylor–Green steps equals serial.
The periodic mesh has (4, 3, 2) elements: the pressure's order-1 coarsest level then has 24
nodes, more than the 20 Lanczos steps that bound its spectrum (with fewer, the Krylov space is
exhausted and the bounds, hence the V-cycle, are round-off that may differ between runs).
tests/run.sh runs this file at -n 2 only (see there).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.parallel.comm import Comm, allreduce_max

TIGHT = NS.NSOptions(pressure_tol=1e-11, velocity_tol=1e-12)
ES = flows.ethier_steinman(nu=0.5)
CASES = {
    "tgv": (lambda: js.box_mesh((4, 3, 2), 3, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3),
            None, flows.taylor_green().velocity, 0.05),
    "ethier_steinman": (lambda: js.box_mesh((4, 2, 2), 3, lengths=(2.0,) * 3, origin=(-1.0,) * 3, deform=0.05),
                        ES.velocity, lambda x, y, z: ES.velocity(x, y, z, 0.0), 0.01),
}


@pytest.mark.parametrize("name", list(CASES))
def test_navier_stokes_equals_serial(comm, name):
    make_mesh, boundary, u0, dt = CASES[name]
    mesh = make_mesh()
    out = []
    for c in (Comm(), comm):
        ns = NS.setup(mesh, nu=0.05, dt=dt, boundary=boundary, comm=c, options=TIGHT)
        st, s, _ = NS.run(ns, NS.initial_state(ns, u0), 4 * dt, sample_interval=2 * dt)
        out.append((ns, st, s))
    (_, ss, s_s), (nd, sd, s_d) = out
    el = np.asarray(nd.sem.elements)
    du = float(allreduce_max(jnp.max(jnp.abs(sd.u - ss.u[:, el])), comm) / jnp.max(jnp.abs(ss.u)))
    dp = float(allreduce_max(jnp.max(jnp.abs(sd.p - ss.p[el])), comm) / jnp.max(jnp.abs(ss.p)))
    assert du < 1e-10 and dp < 1e-8, (du, dp)
    np.testing.assert_allclose(s_d.kinetic_energy, s_s.kinetic_energy, rtol=1e-12)
    np.testing.assert_array_equal(s_d.pressure_iterations[1:], s_s.pressure_iterations[1:])


def test_navier_stokes_gradient_equals_serial(comm):
    """jax.grad of the kinetic energy after three steps w.r.t. ν and the initial velocity history,
    under MPI, equals serial (periodic: the pressure's null space handled on every rank alike). ν is
    replicated: each rank's gradient is its part, summed over the ranks it is serial's."""
    make_mesh, boundary, u0, dt = CASES["tgv"]
    mesh = make_mesh()
    out = []
    for c in (Comm(), comm):
        ns = NS.setup(mesh, nu=0.05, dt=dt, boundary=boundary, comm=c, options=TIGHT)
        st0 = NS.initial_state(ns, u0)

        def energy(nu, U, ns=ns, st0=st0):
            n = dataclasses.replace(ns, nu=nu)
            return NS.diagnostics(n, NS.simulate(n, dataclasses.replace(st0, U=U), 3)).kinetic_energy

        out.append((ns, jax.jit(jax.grad(energy, argnums=(0, 1)))(ns.nu, st0.U)))
    (_, (gs_nu, gs_u)), (nd, (gd_nu, gd_u)) = out
    el = np.asarray(nd.sem.elements)
    # a replicated parameter: each rank's gradient is its own part (as for allreduce_sum); their sum is serial's
    assert abs(float(gd_nu) - float(gs_nu)) > 1e-3 * abs(float(gs_nu))  # a part, not the whole
    g_nu = float(comm.allreduce(gd_nu))
    assert abs(g_nu - float(gs_nu)) < 1e-9 * abs(float(gs_nu)), (g_nu, float(gs_nu))
    du = float(allreduce_max(jnp.max(jnp.abs(gd_u - gs_u[:, :, el])), comm) / jnp.max(jnp.abs(gs_u)))
    assert du < 1e-9, du
