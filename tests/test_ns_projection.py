"""Projection onto previous pressure solutions (``NSOptions.pressure_projection``): the basis
holds the last L solutions and their exact Gram matrix, the projection reproduces a solution
in its span, and a run with it equals one without to the solves' tolerance (values and
gradient)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes import scheme


def tgv(L, tol=1e-10, K=3, p=4):
    mesh = js.box_mesh(K, p, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=0.01, dt=0.05, options=NS.NSOptions(pressure_tol=tol, velocity_tol=1e-12,
                                                               pressure_projection=L))
    return ns, NS.initial_state(ns, flows.taylor_green().velocity)


def test_basis_holds_the_last_solutions_and_their_gram_matrix():
    L = 3
    ns, st0 = tgv(L)
    assert st0.X.shape == (L,) + st0.P.shape[1:] and st0.G.shape == (L, L) and int(st0.nx) == 0
    st, info = jax.jit(lambda ns, st: NS.simulate(ns, st, 5, info=True))(ns, st0)
    assert int(st.nx) == 5
    # slot m % L holds the solution of step m: the last three steps' pressures, newest in slot 4 % 3
    P = st.P  # p⁵, p⁴, p³, shifted to zero mean after the solve: as solved they differ by a constant
    for back, slot in enumerate((4 % L, 3 % L, 2 % L)):
        d = np.asarray(st.X[slot] - P[back])
        assert np.ptp(d) < 1e-12 * float(jnp.max(jnp.abs(P[back]))), np.ptp(d)
    P_ = ns.pressure
    G = np.array([[float(ns.psem.dot(st.X[i], P_.apply(st.X[j]))) for j in range(L)] for i in range(L)])
    np.testing.assert_allclose(np.asarray(st.G), G, rtol=1e-12, atol=1e-12 * np.abs(G).max())
    assert np.all(np.asarray(info.pressure.converged))


def test_projection_reproduces_a_solution_in_the_span():
    ns, st0 = tgv(3)
    st = jax.jit(lambda ns, st: NS.simulate(ns, st, 4))(ns, st0)
    P_ = ns.pressure
    x = 0.3 * st.X[0] - 1.7 * st.X[2] + 0.5 * st.X[1]
    xbar = scheme._projection(P_, (st.X, st.G, st.nx), P_.apply(x))
    e = xbar - x
    rel = float(jnp.sqrt(ns.psem.dot(e, P_.apply(e)) / ns.psem.dot(x, P_.apply(x))))
    assert rel < 1e-5, rel  # the span's Gram matrix is nearly singular: its smallest directions are cut
    # an empty basis gives the zero guess
    ns0, s0 = tgv(3)
    assert float(jnp.max(jnp.abs(scheme._projection(P_, (s0.X, s0.G, s0.nx), P_.apply(x))))) == 0.0


def test_projection_changes_values_only_within_the_tolerance():
    ns0, s0 = tgv(0, tol=1e-10)
    ns4, s4 = tgv(4, tol=1e-10)
    run = jax.jit(lambda ns, st: NS.simulate(ns, st, 8, info=True))
    a, ia = run(ns0, s0)
    b, ib = run(ns4, s4)
    assert float(jnp.max(jnp.abs(a.u - b.u))) < 1e-9 * float(jnp.max(jnp.abs(a.u)))
    assert float(jnp.max(jnp.abs(a.p - b.p))) < 1e-7 * float(jnp.max(jnp.abs(a.p)))
    # after the first steps, the span of the last four solutions holds the extrapolated start:
    # the projection never needs more iterations
    assert np.all(np.asarray(ib.pressure.iterations)[4:] <= np.asarray(ia.pressure.iterations)[4:]), (
        ia.pressure.iterations, ib.pressure.iterations)

    def energy(nu, U, ns, st):
        ns = dataclasses.replace(ns, nu=nu)
        return NS.diagnostics(ns, NS.simulate(ns, dataclasses.replace(st, U=U), 4)).kinetic_energy

    g0 = jax.jit(jax.grad(energy, argnums=(0, 1)))(ns0.nu, s0.U, ns0, s0)
    g4 = jax.jit(jax.grad(energy, argnums=(0, 1)))(ns4.nu, s4.U, ns4, s4)
    assert abs(float(g4[0] - g0[0])) < 1e-8 * abs(float(g0[0])), (g0[0], g4[0])
    assert float(jnp.max(jnp.abs(g4[1] - g0[1]))) < 1e-8 * float(jnp.max(jnp.abs(g0[1])))


@pytest.mark.parametrize("L", [-1, 65, 2.0, True])
def test_bad_projection_length_is_named(L):
    with pytest.raises(ValueError, match="pressure_projection"):
        NS.NSOptions(pressure_projection=L)
