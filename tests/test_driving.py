"""Flows driven along a periodic axis (jaxsem/models/navier_stokes/driving.py): a held flow rate
and a given pressure gradient, against plane Poiseuille flow.

Between no-slip walls at y = ±1, periodic in x and z, u = (3U_b/2)(1 − y²) with the mean
pressure gradient G = 3νU_b; the walls' drag balances G|Ω|.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes.driving import FlowRate, PressureGradient

NU = 0.5  # the slowest mode decays like exp(−νπ²t/4): steady to round-off by t = 30
TIGHT = NS.NSOptions(pressure_tol=1e-11, velocity_tol=1e-12)


def _channel(drive):
    mesh = js.box_mesh((1, 3, 1), 4, lengths=(2.0, 2.0, 1.0), origin=(0.0, -1.0, 0.0), periodic=(True, False, True))
    ns = NS.setup(mesh, NU, 0.1, boundary={"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP}, drive=drive,
                  forces=("ymin", "ymax"), options=TIGHT)
    return ns, NS.initial_state(ns, lambda x, y, z: jnp.zeros((3,) + x.shape))


def test_flow_rate_is_held_and_its_pressure_gradient_reaches_poiseuille():
    """From rest: the bulk velocity is 1 at every sample; the applied gradient is 3νU_b and the
    profile Poiseuille's at the steady state; drag = G|Ω| (the momentum balance)."""
    ns, st = _channel(FlowRate(0, 1.0))
    st, s, _ = NS.run(ns, st, 30.0, sample_interval=3.0, steady_tol=1e-10)
    assert np.isnan(s.bulk_velocity[0]) and np.allclose(s.bulk_velocity[1:], 1.0, rtol=0, atol=1e-12)
    assert abs(s.driving[-1] - 3 * NU) < 1e-8, s.driving[-3:]
    y = ns.sem.x[1]
    assert float(jnp.max(jnp.abs(st.u[0] - 1.5 * (1 - y**2)))) < 1e-8
    assert abs(s.force[-1, :, 0].sum() - s.driving[-1] * ns.volume) < 1e-8


def test_pressure_gradient_gives_the_bulk_velocity_of_poiseuille():
    ns, st = _channel(PressureGradient(0, 3 * NU))
    st, s, _ = NS.run(ns, st, 30.0, sample_interval=3.0, steady_tol=1e-10)
    assert np.allclose(s.driving[1:], 3 * NU, rtol=1e-15)
    assert abs(s.bulk_velocity[-1] - 1.0) < 1e-8 and s.bulk_velocity[1] < s.bulk_velocity[-1]


def test_gradient_with_respect_to_the_held_flow_rate():
    """∂E_k/∂U_b after 4 steps from a disturbed start against central differences."""
    ns, _ = _channel(FlowRate(0, 1.0))
    st = NS.initial_state(ns, lambda x, y, z: jnp.stack([1 - y**2, 0.1 * jnp.sin(np.pi * x) * (1 - y**2), 0 * z]))

    def energy(ub):
        n = dataclasses.replace(ns, drive=dataclasses.replace(ns.drive, value=ub))
        return NS.diagnostics(n, NS.simulate(n, st, 4)).kinetic_energy

    vg = jax.jit(jax.value_and_grad(energy))
    g = float(vg(jnp.asarray(1.0))[1])
    h = 1e-5
    fd = (float(vg(jnp.asarray(1.0 + h))[0]) - float(vg(jnp.asarray(1.0 - h))[0])) / (2 * h)
    assert abs(g - fd) < 1e-6 * abs(fd), (g, fd)


def test_a_drive_across_walls_or_badly_given_is_refused():
    mesh = js.box_mesh((1, 2, 1), 2, periodic=(True, False, True))
    walls = {"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP}
    with pytest.raises(ValueError, match="drive: axis 1 crosses boundary faces"):
        NS.setup(mesh, NU, 0.1, boundary=walls, drive=FlowRate(1, 1.0))
    with pytest.raises(ValueError, match="FlowRate.axis must be 0, 1 or 2"):
        FlowRate(3, 1.0)
    with pytest.raises(ValueError, match="PressureGradient needs a finite number"):
        PressureGradient(0, float("nan"))
    with pytest.raises(TypeError, match="drive must be None, a FlowRate or a PressureGradient"):
        NS.setup(mesh, NU, 0.1, boundary=walls, drive=1.0)
