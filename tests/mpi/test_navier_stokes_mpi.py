"""Navier–Stokes under MPI equals serial (mpirun -n 2 and -n 4).

Each rank builds the serial problem and its own part; a few steps of the periodic
Taylor–Green vortex and of Ethier–Steinman with its wall data give the serial velocity
and pressure on the rank's elements, the same solver iterations and the same energy; the
gradient through three Taylor–Green steps equals serial. With boundary conditions per group
(tests/test_navier_stokes_boundary.py's cases, re-declared here with ``comm``): Kovasznay flow
(velocity data on three sides, an outflow with pressure and viscous-flux data) and a channel
(a Poiseuille inflow with an amplitude parameter, no-slip walls, an outflow with pressure data)
give the serial fields, iterations and force series, and the gradient of the wall force w.r.t.
the inflow amplitude equals serial.
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
from jaxsem.models.navier_stokes import NO_SLIP, Outflow, Velocity
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
    under MPI with the binomial schedule (two snapshots: its custom VJP re-runs steps that send
    messages), equals serial with the plain scan (periodic: the pressure's null space handled on
    every rank alike). ν is replicated: each rank's gradient is its part, summed over the ranks it
    is serial's."""
    from jaxsem.solvers.timestepping import Checkpointing

    make_mesh, boundary, u0, dt = CASES["tgv"]
    mesh = make_mesh()
    out = []
    for c, ck in ((Comm(), Checkpointing()), (comm, Checkpointing(snapshots=2))):
        ns = NS.setup(mesh, nu=0.05, dt=dt, boundary=boundary, comm=c, options=TIGHT)
        st0 = NS.initial_state(ns, u0)

        def energy(nu, U, ns=ns, st0=st0, ck=ck):
            n = dataclasses.replace(ns, nu=nu)
            st = NS.simulate(n, dataclasses.replace(st0, U=U), 3, checkpointing=ck)
            return NS.diagnostics(n, st).kinetic_energy

        out.append((ns, jax.jit(jax.grad(energy, argnums=(0, 1)))(ns.nu, st0.U)))
    (_, (gs_nu, gs_u)), (nd, (gd_nu, gd_u)) = out
    el = np.asarray(nd.sem.elements)
    # a replicated parameter: each rank's gradient is its own part (as for allreduce_sum); their sum is serial's
    assert abs(float(gd_nu) - float(gs_nu)) > 1e-3 * abs(float(gs_nu))  # a part, not the whole
    g_nu = float(comm.allreduce(gd_nu))
    assert abs(g_nu - float(gs_nu)) < 1e-10 * abs(float(gs_nu)), (g_nu, float(gs_nu))
    du = float(allreduce_max(jnp.max(jnp.abs(gd_u - gs_u[:, :, el])), comm) / jnp.max(jnp.abs(gs_u)))
    assert du < 1e-10, du  # measured 3e-15 (ν) and 5e-15 (the initial velocity) at two ranks


# Boundary conditions per group. The data functions are module-level: they are static, so the
# problems that the tests build alike share their compiled programs.
KOV = flows.kovasznay(40.0)
KOV_GRAD = flows.velocity_gradient(KOV.velocity)
U0, NU_CH = 1.5, 0.5


def _kov_flux(x, y, z, t):
    return KOV.nu * KOV_GRAD(x, y, z, t)[0]  # ν ∂u/∂x: the outflow face's normal is +x


def _poiseuille(x, y, z, t, a=U0):
    """u = a(1 − y²) on y ∈ [−1, 1]: plane Poiseuille flow, p = −2νa x."""
    return jnp.stack([a * (1 - y**2) + 0 * x, 0 * x, 0 * z])


def _channel_pressure(x, y, z, t):
    return -2 * NU_CH * U0 * (x - 2.0)


def _kovasznay(comm):
    mesh = js.box_mesh((3, 4, 1), 4, lengths=(1.5, 2.0, 0.25), origin=(-0.5, -0.5, 0.0),
                       periodic=(False, False, True))
    bc = {"xmin": Velocity(KOV.velocity), "ymin": Velocity(KOV.velocity), "ymax": Velocity(KOV.velocity),
          "xmax": Outflow(pressure=KOV.pressure, flux=_kov_flux)}
    return NS.setup(mesh, KOV.nu, 0.01, boundary=bc, forces=("ymax",), comm=comm, options=TIGHT)


def _channel(comm):
    mesh = js.box_mesh((3, 3, 1), 3, lengths=(2.0, 2.0, 0.5), origin=(0.0, -1.0, 0.0),
                       periodic=(False, False, True), deform=0.0)
    bc = {"xmin": Velocity(_poiseuille, params=jnp.asarray(U0)), "ymin": NO_SLIP, "ymax": NO_SLIP,
          "xmax": Outflow(pressure=_channel_pressure)}
    return NS.setup(mesh, NU_CH, 0.02, boundary=bc, forces=("ymin",), comm=comm, options=TIGHT)


def _dfg_inflow(x, y, z, t):
    from jaxsem.mesh import DFG_2D_1
    x, y, z = jnp.broadcast_arrays(x, y, z)
    u = DFG_2D_1.inflow(y)
    return jnp.stack([u, 0 * u, 0 * u])


def _cylinder(comm):
    """The DFG 2-D channel with its cylinder (Gmsh, level 0, order 2, periodic in z), Re 20."""
    pytest.importorskip("gmsh")
    from jaxsem.mesh import DFG_2D_1, dfg_mesh
    bc = dict(inlet=Velocity(_dfg_inflow), walls=NO_SLIP, cylinder=NO_SLIP, outlet=Outflow())
    return NS.setup(dfg_mesh("2D", 2, 0), DFG_2D_1.nu, 0.01, boundary=bc, forces=("cylinder",), comm=comm,
                    options=TIGHT)


BOUNDARY_CASES = {
    "kovasznay": (_kovasznay, lambda x, y, z: KOV.velocity(x, y, z, 0.0)),
    "channel": (_channel, lambda x, y, z: _poiseuille(x, y, z, 0.0) * (1 + 0.3 * jnp.sin(np.pi * x))),
    "cylinder": (_cylinder, lambda x, y, z: _dfg_inflow(x, y, z, 0.0)),
}


@pytest.mark.parametrize("name", list(BOUNDARY_CASES))
def test_navier_stokes_boundary_groups_equal_serial(comm, name):
    """Velocity data, no-slip and outflow (pressure, viscous flux) groups under MPI: the serial
    velocity and pressure on the rank's elements, the same iterations, and the force series
    (global: the same on every rank) equal serial's."""
    build, u0 = BOUNDARY_CASES[name]
    out = []
    for c in (Comm(), comm):
        ns = build(c)
        st, s, _ = NS.run(ns, NS.initial_state(ns, u0), 0.08, sample_interval=0.04)
        out.append((ns, st, s))
    (_, ss, s_s), (nd, sd, s_d) = out
    el = np.asarray(nd.sem.elements)
    du = float(allreduce_max(jnp.max(jnp.abs(sd.u - ss.u[:, el])), comm) / jnp.max(jnp.abs(ss.u)))
    dp = float(allreduce_max(jnp.max(jnp.abs(sd.p - ss.p[el])), comm) / jnp.max(jnp.abs(ss.p)))
    f_d, f_s = jnp.asarray(s_d.force[1:]), jnp.asarray(s_s.force[1:])
    spread = float(jnp.max(allreduce_max(f_d, comm) + allreduce_max(-f_d, comm)))  # max − min over ranks
    df = float(jnp.max(jnp.abs(f_d - f_s)) / jnp.max(jnp.abs(f_s)))
    assert du < 1e-10 and dp < 1e-9, (du, dp)
    assert f_d.shape == f_s.shape == (2, 1, 3) and spread == 0.0 and df < 1e-9, (f_d.shape, spread, df)
    np.testing.assert_array_equal(s_d.pressure_iterations[1:], s_s.pressure_iterations[1:])
    np.testing.assert_array_equal(s_d.velocity_iterations[1:], s_s.velocity_iterations[1:])


def test_navier_stokes_wall_force_gradient_equals_serial(comm):
    """jax.grad of the channel's wall force after three steps w.r.t. the inflow amplitude (a
    Velocity param, replicated: each rank's gradient is its part, their sum is serial's) under MPI
    equals serial."""
    build, u0 = BOUNDARY_CASES["channel"]
    out = []
    for c in (Comm(), comm):
        ns = build(c)
        st0 = NS.initial_state(ns, u0)

        def drag(a, ns=ns, st0=st0):
            _, info = NS.simulate(dataclasses.replace(ns, bc=ns.bc.with_params("xmin", a)), st0, 3, info=True)
            return info.force[-1, 0, 0]

        out.append(jax.jit(jax.value_and_grad(drag))(jnp.asarray(U0)))
    (fs, gs), (fd, gd) = out
    g = float(comm.allreduce(gd))
    assert abs(float(fd) - float(fs)) < 1e-9 * abs(float(fs)), (float(fd), float(fs))
    assert abs(g - float(gs)) < 1e-9 * abs(float(gs)), (g, float(gs))
