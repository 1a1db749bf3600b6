"""jax.grad through Navier–Stokes steps == central finite differences.

A periodic Taylor–Green vortex on 2×2×2 elements of order 4, ν = 0.05, Δt = 0.05,
four steps of :func:`jaxsem.models.navier_stokes.simulate` (BDF1, BDF2, then BDF3:
the ramp-up and the full order are both differentiated). The loss is the final
kinetic energy E_k(ν, V0) with the initial velocity V0 · u_TG. Both derivatives
must equal central differences to 1e-6 relative: ∂E_k/∂ν through
``dataclasses.replace(ns, nu=ν)`` (the pressure and velocity solves differentiated
implicitly) and ∂E_k/∂V0 through the initial state. The solves run to 1e-12 so the
finite difference resolves the derivative; steps of 1e-4 (relative to ν, absolute
in V0) sit between the truncation error O(h²) and the round-off O(ε/h). Measured
relative differences: 4e-10 (ν) and 2e-13 (V0).

The signs are physical: more viscosity dissipates more (∂E_k/∂ν < 0), and a stronger
vortex holds more energy, ∂E_k/∂V0 ≈ 2E_k/V0 (E_k is nearly quadratic in V0 over so
short a time, the nonlinear term only moving energy between scales; measured 4e-5 apart,
asserted to 2 %).
"""

import dataclasses

import jax
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS

RTOL = 1e-6
NU, V0, DT, STEPS = 0.05, 1.0, 0.05, 4
H_NU, H_V0 = 1e-4 * NU, 1e-4


@pytest.fixture(scope="module")
def problem():
    mesh = js.box_mesh(2, 4, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=NU, dt=DT, options=NS.NSOptions(pressure_tol=1e-12, velocity_tol=1e-12))
    u_tg = flows.taylor_green().velocity(*ns.sem.x)

    def energy(nu, v0):
        n = dataclasses.replace(ns, nu=nu)
        return NS.diagnostics(n, NS.simulate(n, NS.initial_state(n, v0 * u_tg), STEPS)).kinetic_energy

    return jax.jit(energy), jax.jit(jax.grad(energy, argnums=(0, 1)))


def _rel(a, b):
    return abs(float(a) - float(b)) / abs(float(b))


def test_grad_viscosity_matches_central_difference(problem):
    energy, grad = problem
    g = grad(NU, V0)[0]
    fd = (energy(NU + H_NU, V0) - energy(NU - H_NU, V0)) / (2 * H_NU)
    assert float(g) < 0, f"more viscosity must lower the energy, got dE/dnu = {float(g)}"
    assert abs(float(g)) > 1e-3, float(g)
    assert _rel(g, fd) < RTOL, (float(g), float(fd), _rel(g, fd))


def test_grad_amplitude_matches_central_difference(problem):
    energy, grad = problem
    g = grad(NU, V0)[1]
    fd = (energy(NU, V0 + H_V0) - energy(NU, V0 - H_V0)) / (2 * H_V0)
    assert _rel(g, fd) < RTOL, (float(g), float(fd), _rel(g, fd))
    # E_k ≈ c V0²: the derivative is positive and close to 2E_k/V0
    e = float(energy(NU, V0))
    assert float(g) > 0 and _rel(g, 2 * e / V0) < 0.02, (float(g), 2 * e / V0)
