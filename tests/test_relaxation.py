"""High-pass-filter relaxation (jaxsem/models/navier_stokes/relaxation.py): the filter's transfer
function on Legendre modes, a resolved flow left untouched, the top modes drained, and the
gradient through a relaxed run against central differences."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.core import basis
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes.driving import PressureGradient
from jaxsem.models.navier_stokes.relaxation import Relaxation, low_pass
from jaxsem.operators.tensor import interp


@pytest.mark.parametrize("order", [3, 5, 7])
def test_low_pass_keeps_the_low_modes_and_damps_the_top_ones(order):
    """F₁ P_k = P_k for k ≤ N − modes; P_N removed; with two modes P_{N−1} kept at 3/4."""
    x, _ = basis.gll_points(order)
    P = [basis.legendre(k, x)[0] for k in range(order + 1)]
    F = low_pass(order, 1)
    for k in range(order):
        np.testing.assert_allclose(F @ P[k], P[k], rtol=0, atol=1e-12)
    np.testing.assert_allclose(F @ P[order], 0.0, rtol=0, atol=1e-12)
    F2 = low_pass(order, 2)
    np.testing.assert_allclose(F2 @ P[order - 1], 0.75 * P[order - 1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(F2 @ P[order], 0.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(F2 @ P[order - 2], P[order - 2], rtol=0, atol=1e-12)


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="modes"):
        Relaxation(modes=0)
    with pytest.raises(ValueError, match="strength"):
        Relaxation(strength=-1.0)
    with pytest.raises(ValueError, match="strength"):
        Relaxation(strength=float("nan"))
    with pytest.raises(TypeError, match="relaxation"):
        NS.NSOptions(relaxation=(1, 5.0))
    mesh = js.box_mesh(2, 3, periodic=(True,) * 3)
    with pytest.raises(ValueError, match="relaxation.modes"):
        NS.setup(mesh, 0.1, 0.01, options=NS.NSOptions(relaxation=Relaxation(modes=4)))


def _poiseuille(options):
    nu = 0.1
    mesh = js.box_mesh((2, 2, 1), 4, lengths=(2.0, 2.0, 1.0), origin=(0.0, -1.0, 0.0), periodic=(True, False, True))
    ns = NS.setup(mesh, nu, 0.05, boundary={"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP},
                  drive=PressureGradient(0, 2 * nu), options=options)
    return ns, NS.initial_state(ns, lambda x, y, z: jnp.stack([1 - y**2, 0 * x, 0 * x]))


def test_a_resolved_flow_is_left_alone():
    """Plane Poiseuille flow (degree 2 in each element of order 4) is steady with or without the
    relaxation term, which vanishes on it: the two runs agree to round-off."""
    tight = dict(pressure_tol=1e-12, velocity_tol=1e-13)
    ns0, st0 = _poiseuille(NS.NSOptions(**tight))
    ns1, st1 = _poiseuille(NS.NSOptions(**tight, relaxation=Relaxation(1, 50.0)))
    a, b = NS.simulate(ns0, st0, 6), NS.simulate(ns1, st1, 6)
    assert float(jnp.max(jnp.abs(a.u - b.u))) < 1e-12
    y = ns0.sem.x[1]
    assert float(jnp.max(jnp.abs(b.u[0] - (1 - y**2)))) < 1e-10


def _top_energy(ns, u):
    """Σ over elements of the GLL-mass-weighted |(I − F)u|², one top mode per axis."""
    F = jnp.asarray(low_pass(ns.sem.order, 1), u.dtype)
    h = u - interp(u, F)
    return float(jnp.sum(ns.sem.bmass * h * h))


def test_the_top_modes_are_drained():
    """A Taylor–Green start with grid-scale noise on 2³ elements of order 4: after 20 steps the
    energy in the top modes is ten times lower with χ = 20 than without, and the term removes
    energy from the flow: the kinetic energy ends lower too."""
    mesh = js.box_mesh(2, 4, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    rng = np.random.default_rng(1)

    def start(ns):
        st = NS.initial_state(ns, flows.taylor_green().velocity)
        noise = jnp.asarray(rng.standard_normal(st.u.shape), st.u.dtype) * 0.05
        noise = NS.scheme._average(ns, ns.sem, noise)  # continuous
        return dataclasses.replace(st, U=st.U.at[0].add(noise))

    out = {}
    for chi in (0.0, 20.0):
        opts = NS.NSOptions(relaxation=Relaxation(1, chi) if chi else None)
        ns = NS.setup(mesh, 0.01, 0.01, options=opts)
        rng = np.random.default_rng(1)
        st = NS.simulate(ns, start(ns), 20)
        out[chi] = (_top_energy(ns, st.u), float(NS.diagnostics(ns, st).kinetic_energy))
    assert out[20.0][0] < 0.1 * out[0.0][0], out
    assert out[20.0][1] < out[0.0][1], out



def test_gradient_through_a_relaxed_run_matches_central_differences():
    """∂E_k/∂ν and ∂E_k/∂u⁰ along a random direction after 3 steps with the relaxation on
    (order 3, 3³ elements, Taylor–Green with a grid-scale disturbance), against central
    differences."""
    mesh = js.box_mesh(3, 3, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    opts = NS.NSOptions(pressure_tol=1e-12, velocity_tol=1e-13, relaxation=Relaxation(1, 10.0))
    ns = NS.setup(mesh, 0.05, 0.02, options=opts)
    st0 = NS.initial_state(ns, lambda x, y, z: flows.taylor_green().velocity(x, y, z)
                           + 0.1 * jnp.stack([jnp.sin(3 * y), jnp.sin(3 * z), jnp.sin(3 * x)]))

    @jax.jit
    def energy(nu, u0):
        st = dataclasses.replace(st0, U=st0.U.at[0].set(u0))
        return NS.diagnostics(ns, NS.simulate(dataclasses.replace(ns, nu=nu), st, 3)).kinetic_energy

    g_nu, g_u = jax.grad(energy, argnums=(0, 1))(ns.nu, st0.u)
    h = 1e-5
    fd = (float(energy(ns.nu + h, st0.u)) - float(energy(ns.nu - h, st0.u))) / (2 * h)
    assert abs(float(g_nu) - fd) < 1e-6 * abs(fd), (float(g_nu), fd)
    v = NS.scheme._average(ns, ns.sem, jnp.asarray(np.random.default_rng(3).standard_normal(st0.u.shape)))
    h = 1e-4
    fd = (float(energy(ns.nu, st0.u + h * v)) - float(energy(ns.nu, st0.u - h * v))) / (2 * h)
    ad = float(jnp.vdot(g_u, v))
    assert abs(ad - fd) < 1e-6 * abs(fd), (ad, fd)
