"""Flow statistics (jaxsem/models/navier_stokes/statistics.py): running averages and Reynolds
stresses of known states, plane profiles on a graded channel mesh, wall shear of Poiseuille flow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes import statistics as ST

NU = 0.2


def _channel(order=4):
    mesh = js.box_mesh((2, 3, 1), order, lengths=(2.0, 2.0, 1.0), origin=(0.0, -1.0, 0.0),
                       periodic=(True, False, True), grading=(None, js.Grading("tanh", 1.5), None))
    ns = NS.setup(mesh, NU, 0.01, boundary={"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP},
                  scalars=NS.Scalar("T", 0.1, {"ymin": NS.Value(1.0), "ymax": NS.Value(0.0)}))
    return ns


def _state(ns, a):
    """Poiseuille flow times a, a cross flow, θ = (1 − y)/2 + a sin(πx)."""
    x, y, z = ns.sem.x
    st = NS.initial_state(ns, jnp.stack([a * 1.5 * (1 - y**2), 0.1 * a * jnp.sin(np.pi * x) * (1 - y**2), 0 * z]),
                          scalars={"T": (1 - y) / 2 + a * jnp.sin(np.pi * x) * (1 - y**2)})
    return st


def test_two_states_give_their_mean_and_the_stress_of_their_difference():
    ns = _channel()
    s1, s2 = _state(ns, 1.0), _state(ns, 3.0)
    avg = ST.start(ns, s1)
    acc = jax.jit(ST.accumulate)
    avg = acc(acc(avg, s1, 0.5), s2, 0.5)
    m = ST.means(avg)
    np.testing.assert_allclose(m["u"], (s1.u + s2.u) / 2, rtol=0, atol=1e-14)
    d = (s1.u - s2.u) / 2  # each state's fluctuation about the mean is ±d
    for k, (i, j) in enumerate(ST.PAIRS):
        np.testing.assert_allclose(m["stress"][k], d[i] * d[j], rtol=0, atol=1e-13)
    dth = (s1.theta - s2.theta) / 2
    np.testing.assert_allclose(m["flux"], d[None] * dth[:, None], rtol=0, atol=1e-13)
    assert float(avg.weight) == 1.0
    with pytest.raises(ValueError, match="no state was accumulated"):
        ST.means(ST.start(ns, s1))


def test_plane_moments_count_the_spatial_variation_of_the_means():
    """A state held in time with v = 0.1 sin(πx)(1 − y²): its pointwise stresses are zero, its
    stresses about the time-and-plane mean are the plane variance, ⟨v'v'⟩ = 0.005(1 − y²)²
    (up to the GLL rule's error on sin²), and ⟨u'v'⟩ = 0 since u does not vary along x."""
    ns = _channel()
    st = _state(ns, 1.0)
    acc = jax.jit(ST.accumulate)
    avg = acc(acc(ST.start(ns, st), st, 0.5), st, 1.5)
    np.testing.assert_allclose(ST.means(avg)["stress"], 0.0, atol=1e-14)
    y, U, stress = ST.plane_moments(ns, avg, axis=1)
    _, plain = ST.plane_average(ns, jnp.stack([st.u[1], st.u[1] ** 2]), axis=1)
    np.testing.assert_allclose(U[0], 1.5 * (1 - y**2), atol=1e-13)
    np.testing.assert_allclose(U[1], 0.0, atol=1e-15)
    np.testing.assert_allclose(stress[1], plain[1] - plain[0] ** 2, rtol=0, atol=1e-15)
    np.testing.assert_allclose(stress[1], 0.005 * (1 - y**2) ** 2, rtol=0, atol=2e-5)
    assert float(np.max(stress[1])) > 4e-3
    np.testing.assert_allclose(stress[[0, 2, 3, 4, 5]], 0.0, atol=1e-14)
    with pytest.raises(ValueError, match="no state was accumulated"):
        ST.plane_moments(ns, ST.start(ns, st), axis=1)


def test_plane_profile_on_a_graded_mesh():
    """A field of y alone averages to itself on each of the Ey·N + 1 planes of nodes."""
    ns = _channel()
    y = ns.sem.x[1]
    coords, vals = ST.plane_average(ns, jnp.stack([y**2, jnp.cos(y)]), axis=1)
    assert coords.shape == (3 * 4 + 1,) and np.all(np.diff(coords) > 0)
    assert coords[0] == pytest.approx(-1.0) and coords[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(vals[0], coords**2, atol=1e-14)
    np.testing.assert_allclose(vals[1], np.cos(coords), atol=1e-14)
    with pytest.raises(ValueError, match="axis must be 0, 1 or 2"):
        ST.plane_average(ns, y, axis=3)


def test_wall_shear_of_poiseuille_flow():
    """u = 1.5(1 − y²): τ_w = 3ν along x on both walls, u_τ = √(3ν), exact at order 4."""
    ns = _channel()
    st = NS.initial_state(ns, jnp.stack([1.5 * (1 - ns.sem.x[1]**2), 0 * ns.sem.x[1], 0 * ns.sem.x[1]]))
    for g in ("ymin", "ymax"):
        np.testing.assert_allclose(ST.wall_shear(ns, st, g), [3 * NU, 0, 0], atol=1e-12)
    assert float(ST.friction_velocity(ns, st, ("ymin", "ymax"))) == pytest.approx(np.sqrt(3 * NU), rel=1e-12)


def test_gradient_of_the_wall_shear_with_respect_to_viscosity():
    """∂τ_w/∂ν of a pressure-driven channel after 4 steps from a disturbed Poiseuille start:
    central differences agree to 1e-6."""
    import dataclasses

    mesh = js.box_mesh((2, 2, 1), 3, lengths=(2.0, 2.0, 1.0), origin=(0.0, -1.0, 0.0), periodic=(True, False, True))
    ns = NS.setup(mesh, NU, 0.01, boundary={"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP},
                  drive=NS.PressureGradient(0, 3 * NU), options=NS.NSOptions(pressure_tol=1e-11, velocity_tol=1e-12))
    x, y, z = ns.sem.x
    st = NS.initial_state(ns, jnp.stack([1.5 * (1 - y**2) * (1 + 0.2 * jnp.sin(np.pi * x)), 0 * y, 0 * z]))

    def shear(nu):
        n = dataclasses.replace(ns, nu=nu)
        return ST.wall_shear(n, NS.simulate(n, st, 4), "ymin")[0]

    vg = jax.jit(jax.value_and_grad(shear))
    g = float(vg(jnp.asarray(NU))[1])
    h = 1e-6
    fd = (float(vg(jnp.asarray(NU + h))[0]) - float(vg(jnp.asarray(NU - h))[0])) / (2 * h)
    assert abs(g - fd) < 1e-6 * abs(fd), (g, fd)
