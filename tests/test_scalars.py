"""Scalars carried by a flow and the buoyancy they drive (jaxsem/models/navier_stokes/scalars.py).

* an advected and diffused scalar in a uniform flow, θ = e^{−κ|k|²t} sin(x − Ut)…: spectral in
  p, second order in Δt with BDF2/EXT2;
* conduction between a wall held at a value and a wall with a given flux (or two values):
  θ = 1 − z + e^{−κπ²t} sin πz exact, the Value and Flux conditions per group;
* a source term: a steady θ with −κθ'' = q;
* buoyancy (Boussinesq): a stable conduction profile stays at rest, its weight carried by the
  pressure (Rayleigh–Bénard onset: tests/test_cli_flows.py);
* gradients of the Nusselt number w.r.t. κ and the buoyancy vector against central differences;
* bad input named.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes import NO_SLIP
from jaxsem.models.navier_stokes.scalars import INSULATED, Buoyancy, Flux, Scalar, Value

TIGHT = NS.NSOptions(pressure_tol=1e-11, velocity_tol=1e-12)
KAPPA, U = 0.1, 0.7


def _advected(order, dt, steps, time_order=3, repeat=1):
    """‖θ − exact‖∞ of sin(x − Ut) e^{−κt} in a uniform flow along a periodic line of elements
    after ``repeat`` times ``steps`` steps (one compiled program)."""
    mesh = js.box_mesh((4, 1, 1), order, lengths=(2 * np.pi, 1.0, 1.0), periodic=(True,) * 3)
    opts = NS.NSOptions(pressure_tol=1e-11, velocity_tol=1e-12, time_order=time_order)
    ns = NS.setup(mesh, nu=0.05, dt=dt, scalars=Scalar("c", KAPPA), options=opts)
    st = NS.initial_state(ns, lambda x, y, z: jnp.stack([U + 0 * x, 0 * x, 0 * x]),
                          scalars={"c": lambda x, y, z: jnp.sin(x)})
    run = jax.jit(NS.simulate, static_argnums=2)
    for _ in range(repeat):
        st = run(ns, st, steps)
    x, t = ns.sem.x[0], float(st.t)
    return float(jnp.max(jnp.abs(st.theta[0] - np.exp(-KAPPA * t) * jnp.sin(x - U * t))))


def test_advected_scalar_spectral_in_p_and_second_order_in_dt():
    e = {p: _advected(p, 0.005, 40) for p in (3, 5)}
    assert e[3] / e[5] > 30 and e[5] < 1e-4, e
    e1, e2 = _advected(7, 0.04, 25, time_order=2), _advected(7, 0.02, 25, time_order=2, repeat=2)
    assert 1.8 < np.log2(e1 / e2) < 2.3, (e1, e2)


def _conduction(bc, order=6, source=None, theta0=None, t_final=0.2, dt=0.002):
    mesh = js.box_mesh((1, 1, 3), order, lengths=(1.0, 1.0, 1.0), periodic=(True, True, False))
    ns = NS.setup(mesh, nu=1.0, dt=dt, boundary={"zmin": NO_SLIP, "zmax": NO_SLIP},
                  scalars=Scalar("T", KAPPA, boundary=bc, source=source), options=TIGHT)
    st = NS.initial_state(ns, lambda x, y, z: jnp.zeros((3,) + x.shape),
                          scalars={"T": theta0 or (lambda x, y, z: 1 - z + jnp.sin(np.pi * z))})
    st, s, _ = NS.run(ns, st, t_final, sample_interval=t_final / 2)
    return ns, st, s


def _decay(x, y, z, t):
    return 1 - z + jnp.exp(-KAPPA * np.pi**2 * t) * jnp.sin(np.pi * z)


def _top_flux(x, y, z, t):  # κ ∂θ/∂n on zmax (n = +z) of _decay
    return KAPPA * (-1.0 - np.pi * jnp.exp(-KAPPA * np.pi**2 * t)) + 0 * x


@pytest.mark.parametrize("top", ["value", "flux"])
def test_conduction_between_walls_with_values_or_a_flux(top):
    """θ = 1 − z + e^{−κπ²t} sin πz: θ = 1 on zmin, and on zmax θ = 0 or the flux κ∂θ/∂z of the
    exact solution; the flow stays at rest (no buoyancy), the scalar's solves are counted.
    Measured 2.0e-6 for both, the time error of the first-order start (Δt = 0.002)."""
    bc = {"zmin": Value(1.0), "zmax": Value(0.0) if top == "value" else Flux(_top_flux)}
    ns, st, s = _conduction(bc)
    ex = _decay(*ns.sem.x, float(st.t))
    err = float(jnp.max(jnp.abs(st.theta[0] - ex)))
    assert err < 5e-6, err
    assert float(jnp.max(jnp.abs(st.u))) < 1e-12
    assert s.scalar_iterations[-1] >= 1 and s.scalar_residual[-1] <= TIGHT.velocity_tol
    assert np.isnan(s.scalar_iterations[0])


def test_source_gives_the_steady_profile():
    """−κθ'' = q with q = κπ² sin πz, θ = 0 on both walls: θ → sin πz (a steady state of the
    scheme whatever Δt: 200 steps of 0.1)."""
    q = lambda x, y, z, t: KAPPA * np.pi**2 * jnp.sin(np.pi * z)  # noqa: E731
    ns, st, _ = _conduction({"zmin": Value(0.0), "zmax": Value(0.0)}, source=q,
                            theta0=lambda x, y, z: 0 * z, t_final=20.0, dt=0.1)
    err = float(jnp.max(jnp.abs(st.theta[0] - jnp.sin(np.pi * ns.sem.x[2]))))
    assert err < 1e-6, err


def test_insulated_walls_conserve_the_mean():
    """Flux(0) on both walls: ∫θ stays what it was (to the solves' tolerance)."""
    ns, st, _ = _conduction({"zmin": INSULATED, "zmax": INSULATED})
    x = ns.sem.x
    start = ns.sem.integrate(1 - x[2] + jnp.sin(np.pi * x[2]))
    assert abs(float(ns.sem.integrate(st.theta[0]) - start)) < 1e-10 * abs(float(start))


def _rbc(ra, order=5, elements=(3, 1, 3), dt=0.002, pr=1.0, amplitude=1e-3, options=NS.NSOptions()):
    kc = 3.117
    mesh = js.box_mesh(elements, order, lengths=(2 * np.pi / kc, 0.3, 1.0), periodic=(True, True, False))
    ns = NS.setup(mesh, nu=pr, dt=dt, boundary={"zmin": NO_SLIP, "zmax": NO_SLIP},
                  scalars=Scalar("T", 1.0, boundary={"zmin": Value(1.0), "zmax": Value(0.0)}),
                  buoyancy=Buoyancy("T", (0.0, 0.0, ra * pr)), options=options)
    st = NS.initial_state(ns, lambda x, y, z: jnp.zeros((3,) + x.shape),
                          scalars={"T": lambda x, y, z: 1 - z + amplitude * jnp.cos(kc * x) * jnp.sin(np.pi * z)})
    return ns, st


def test_stable_stratification_stays_at_rest():
    """Hot at the bottom, Ra = 1000 < Ra_c, the conduction profile: the buoyancy is a gradient,
    the pressure carries it (p = Ra·Pr (z − z²/2) up to a constant) and the fluid stays at rest."""
    ns, st = _rbc(1000.0, order=4, elements=(2, 1, 2), amplitude=0.0, options=TIGHT)
    st, s, _ = NS.run(ns, st, 0.1, sample_interval=0.05)
    assert float(jnp.max(jnp.abs(st.u))) < 1e-9
    z = ns.sem.x[2]
    p = 1000.0 * (z - z**2 / 2)
    p = p - ns.sem.integrate(p) / ns.volume
    assert float(jnp.max(jnp.abs(st.p - p))) < 1e-8 * 1000.0


def test_gradients_of_the_nusselt_number_with_respect_to_diffusivity_and_rayleigh():
    """∂Nu/∂κ and ∂Nu/∂(Ra·Pr) of the bottom wall's Nusselt number after 6 steps of a perturbed
    convection cell (the buoyancy drives the flow, the flow carries the heat): central
    differences agree to 1e-6."""
    import dataclasses

    ns, st = _rbc(2500.0, order=3, elements=(2, 1, 2), dt=0.005, amplitude=0.1, options=TIGHT)
    area = float(ns.volume)  # the cell is one unit deep: its bottom's area is its volume

    def nusselt(kappa, g):
        f = dataclasses.replace(ns.scalars[0], kappa=kappa)
        b = dataclasses.replace(ns.buoyancy, vector=jnp.stack([0.0, 0.0, g]))
        n = dataclasses.replace(ns, scalars=(f,), buoyancy=b)
        return NS.scalar_flux(n, NS.simulate(n, st, 6), "T", "zmin") / (area * kappa)

    vg = jax.jit(jax.value_and_grad(nusselt, argnums=(0, 1)))
    k0, g0 = jnp.asarray(1.0), jnp.asarray(2500.0)
    nu0, (dk, dg) = vg(k0, g0)
    assert 0.5 < float(nu0) < 2.0
    for d, (hk, hg) in ((dk, (1e-5, 0.0)), (dg, (0.0, 1e-2))):
        fd = (float(vg(k0 + hk, g0 + hg)[0]) - float(vg(k0 - hk, g0 - hg)[0])) / (2 * (hk + hg))
        assert abs(float(d) - fd) < 1e-6 * abs(fd), (float(d), fd)


def test_bad_scalars_are_named():
    mesh = js.box_mesh((1, 1, 2), 2, periodic=(True, True, False))
    walls = {"zmin": NO_SLIP, "zmax": NO_SLIP}
    with pytest.raises(ValueError, match="diffusivity of 'T' must be a positive"):
        Scalar("T", -1.0)
    with pytest.raises(ValueError, match="distinct names"):
        NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=(Scalar("T", 1.0, {"zmin": INSULATED, "zmax": INSULATED}),) * 2)
    with pytest.raises(ValueError, match="buoyancy names scalar 'S'"):
        NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=Scalar("T", 1.0, {"zmin": INSULATED, "zmax": INSULATED}),
                 buoyancy=Buoyancy("S", (0, 0, 1)))
    with pytest.raises(ValueError, match=r"scalar 'T': boundary gives no condition to 1 boundary face.*\['zmax'\]"):
        NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=Scalar("T", 1.0, {"zmin": Value(1.0)}))
    with pytest.raises(ValueError, match=r"scalar 'T': boundary names group\(s\) \['top'\]"):
        NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=Scalar("T", 1.0, {"top": Value(1.0)}))
    with pytest.raises(TypeError, match="Value or a Flux"):
        NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=Scalar("T", 1.0, {"zmin": NO_SLIP, "zmax": INSULATED}))
    with pytest.raises(TypeError, match="Value.data must be a finite number or a callable"):
        Value("hot")
    with pytest.raises(ValueError, match="Buoyancy.vector must be 3 finite numbers"):
        Buoyancy("T", (0, 1))
    ns = NS.setup(mesh, 1.0, 0.1, boundary=walls, scalars=Scalar("T", 1.0, {"zmin": Value(1.0), "zmax": INSULATED}))
    with pytest.raises(ValueError, match=r"scalars names \['S'\], which the flow does not carry"):
        NS.initial_state(ns, lambda x, y, z: jnp.zeros((3,) + x.shape), scalars={"S": 1.0})
    st = NS.initial_state(ns, lambda x, y, z: jnp.zeros((3,) + x.shape))  # a scalar not given: 0, its Value data
    assert ns.scalar_names == ("T",) and st.T.shape == (3, 1) + ns.sem.mask.shape
    assert float(jnp.max(st.theta[0])) == 1.0 and float(jnp.min(st.theta[0])) == 0.0
