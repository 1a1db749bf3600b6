"""Linear advection DG (jaxsem.models.advection): convergence, LSERK4 order, conservation, CLI.

Measured (periodic 2x2x2 unit box, Gaussian width 0.15, c = (1, 0.5, 0.25),
t = 0.25, LSERK4 at cfl 0.5, affine): relative L2 error vs the exact translated
Gaussian for N = 3..9: 1.83e-1, 7.07e-2, 2.77e-2, 7.01e-3, 2.39e-3, 5.43e-4,
1.75e-4 (a factor ~3.2 per order: exponential).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.app import cli
from jaxsem import timestepping as ts
from jaxsem.io import load_checkpoint
from jaxsem.solvers import driver
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as ad

MEASURED = {3: 1.829e-1, 4: 7.073e-2, 5: 2.768e-2, 6: 7.008e-3, 7: 2.388e-3, 8: 5.428e-4, 9: 1.752e-4}


def _setup(order, elements=(2, 2, 2), deform=0.0, velocity=ad.DEFAULT_VELOCITY):
    dg = discretize_dg(box_mesh(elements, order, periodic=(True,) * 3, deform=deform))
    return dg, ad.transport(dg, velocity)


def _gaussian_error(N, t_final=0.25, cfl=0.5):
    """:func:`ad.solve_gaussian` without its separate compile (one compile per N: faster)."""
    dg, tr = _setup(N)
    rho = ad.spectral_radius(dg, tr, iterations=30)
    u, _, _ = ad.simulate(dg, tr, ad.gaussian(dg.x, 0.0), t_final, scheme=ad.Scheme(cfl=cfl), rho=rho)
    return ad.relative_error(dg, u, ad.gaussian(dg.x, t_final))


def test_spectral_convergence_in_order():
    errs = {N: _gaussian_error(N) for N in range(3, 10)}
    e = np.array([errs[N] for N in range(3, 10)])
    for N, v in errs.items():  # the measured numbers, within 10%
        assert v == pytest.approx(MEASURED[N], rel=0.1), (N, v)
    assert np.all(np.diff(np.log(e)) < -0.3)  # every order gains at least a factor 1.35
    slope = np.polyfit(np.arange(3, 10), np.log(e), 1)[0]
    assert slope < -1.0  # exponential: a factor > e per order on average (measured ~3.2)
    assert e[-1] < 2.5e-4


def _integrate_fn(num_steps, flux="upwind", observe=None):
    f = ad.make_rhs(flux)

    @jax.jit
    def go(u0, dg, tr, dt):
        return ts.integrate(lambda t, u: f(t, u, (dg, tr)), u0, dt, num_steps, observe=observe)

    return go


def test_lserk4_fourth_order_in_dt():
    dg, tr = _setup(4, deform=0.1)
    u0 = ad.gaussian(dg.x, 0.0)
    T = 0.2
    dt0 = T / 4  # about the stable limit's 0.9 (limit ~5.4e-2 at N=4)
    ref = _integrate_fn(64)(u0, dg, tr, T / 64)
    errs = []
    for k in (4, 8, 16):
        u = _integrate_fn(k)(u0, dg, tr, T / k)
        errs.append(float(jnp.sqrt(dg.integrate((u - ref) ** 2))))
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert dt0 < ad.stable_dt(dg, tr)
    assert np.all(np.abs(orders - 4) < 0.3), (errs, orders)


@pytest.mark.parametrize("deform", [0.0, 0.2], ids=["affine", "curved"])
def test_mass_conservation_and_upwind_energy_decay(deform):
    dg, tr = _setup(4, (2, 2, 2), deform)
    # A rough, non-smooth start stresses the flux terms.
    u0 = ad.gaussian(dg.x, 0.0) + 0.1 * jnp.asarray(np.random.default_rng(1).standard_normal(dg.jac.shape))
    dt = 0.5 * ad.stable_dt(dg, tr)
    obs = lambda u: jnp.stack([dg.integrate(u), 0.5 * dg.integrate(u * u)])
    for flux in ("upwind", "central"):
        _, o = _integrate_fn(300, flux, obs)(u0, dg, tr, dt)
        m0, e0 = float(ad.mass(dg, u0)), float(ad.energy(dg, u0))
        drift = float(jnp.max(jnp.abs(o[:, 0] - m0))) / abs(m0)
        assert drift < 1e-13, (flux, drift)
        if flux == "upwind":
            e = np.concatenate([[e0], np.asarray(o[:, 1])])
            assert np.all(np.diff(e) <= 1e-14 * e0)  # non-increasing, every step
            assert e[-1] < 0.9 * e0  # and the rough part is damped
        else:  # central: the semi-discrete energy is conserved; LSERK4 damps the rough part a little
            assert 0.95 * e0 < float(o[-1, 1]) <= e0


def test_semidiscrete_properties_on_curved_mesh():
    """Free stream preserved, ∫ rhs = 0, and ∫ u·rhs ≤ 0 (= 0 central), by the curl-form metrics."""
    dg, tr = _setup(5, (2, 2, 2), 0.2, velocity=(0.3, -1.0, 0.7))
    ones = jnp.ones(dg.jac.shape)
    rho = ad.spectral_radius(dg, tr)
    assert float(jnp.max(jnp.abs(ad.rhs(dg, tr, ones)))) < 1e-12 * rho
    v = jnp.asarray(np.random.default_rng(0).standard_normal(dg.jac.shape))
    up, ce = ad.rhs(dg, tr, v), ad.rhs(dg, tr, v, flux="central")
    scale = rho * float(dg.integrate(v * v))
    assert abs(float(dg.integrate(up))) < 1e-14 * scale and abs(float(dg.integrate(ce))) < 1e-14 * scale
    assert float(dg.integrate(v * up)) < -1e-3 * scale
    assert abs(float(dg.integrate(v * ce))) < 1e-14 * scale


def test_gaussian_is_periodic_and_exact():
    x = jnp.asarray(np.random.default_rng(2).uniform(size=(3, 50)))
    c = (1.0, 0.5, 0.25)
    # after one period in every axis (t = 4: 4, 2, 1 box lengths) the Gaussian is back
    assert float(jnp.max(jnp.abs(ad.gaussian(x, 4.0, c) - ad.gaussian(x, 0.0, c)))) < 1e-13
    shifted = x - jnp.asarray(c)[:, None] * 0.3
    assert float(jnp.max(jnp.abs(ad.gaussian(x, 0.3, c) - ad.gaussian(shifted, 0.0, c)))) < 1e-13
    with pytest.raises(ValueError, match="velocity"):
        ad.transport(_setup(2)[0], (1.0, 0.0))


# ----------------------------------------------------------------------------- driver options


def test_checkpoint_resume_and_refusal_of_other_physics(tmp_path):
    """Resumed = uninterrupted, bit for bit; another flux, form, order or velocity is refused by name."""
    dg, tr = _setup(3, deform=0.1)
    u0 = ad.gaussian(dg.x, 0.0)
    rho = ad.spectral_radius(dg, tr, iterations=30)
    dt = 0.5 * ad.stable_dt(dg, tr, rho=rho)
    scheme, path = ad.Scheme(dt=dt), tmp_path / "ad.npz"
    full, _, _ = ad.simulate(dg, tr, u0, 6 * dt, scheme=scheme, rho=rho, options=driver.RunOptions(chunk_steps=2))
    ad.simulate(dg, tr, u0, 2 * dt, scheme=scheme, rho=rho,
                options=driver.RunOptions(chunk_steps=2, checkpoint_path=path))
    resume = driver.RunOptions(chunk_steps=2, resume=path)
    res, info, _ = ad.simulate(dg, tr, u0, 6 * dt, scheme=scheme, rho=rho, options=resume)
    assert info.resumed_from == 2 and info.steps == 4
    assert np.array_equal(np.asarray(res), np.asarray(full))
    meta = load_checkpoint(path).meta
    assert str(meta["velocity"]) == "1 0.5 0.25" and str(meta["flux"]) == "upwind" and int(meta["order"]) == 3
    with pytest.raises(ValueError, match=r"flux = 'upwind' in the checkpoint, 'central' in this run"):
        ad.simulate(dg, tr, u0, 6 * dt, scheme=ad.Scheme(flux="central", dt=dt), rho=rho, options=resume)
    with pytest.raises(ValueError, match=r"form = 'split' in the checkpoint, 'conservative' in this run"):
        ad.simulate(dg, tr, u0, 6 * dt, scheme=ad.Scheme(form="conservative", dt=dt), rho=rho, options=resume)
    with pytest.raises(ValueError, match=r"velocity = '1 0.5 0.25' in the checkpoint, '0 0 -1' in this run"):
        ad.simulate(dg, ad.transport(dg, (0.0, 0.0, -1.0)), u0, 6 * dt, scheme=scheme, rho=rho, options=resume)
    dg4, tr4 = _setup(4, deform=0.1)
    with pytest.raises(ValueError, match=r"order = 3 in the checkpoint, 4 in this run"):
        ad.simulate(dg4, tr4, ad.gaussian(dg4.x, 0.0), 6 * dt, scheme=scheme, rho=rho, options=resume)
    dg32 = discretize_dg(box_mesh((2, 2, 2), 3, periodic=(True,) * 3, deform=0.1), dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"dtype = 'float64' in the checkpoint, 'float32' in this run"):
        ad.simulate(dg32, ad.transport(dg32), u0.astype(jnp.float32), 6 * dt, scheme=scheme, rho=rho,
                    options=resume)


def test_scheme_and_driver_arguments_are_named():
    assert ad.Scheme(form="conservative").form == "conservative"
    with pytest.raises(TypeError, match="schedule"):  # no user switch: the backend's rhs has one structure
        ad.Scheme(schedule="overlap")
    with pytest.raises(ValueError, match=r"Scheme\.form must be one of \('split', 'conservative', 'chain'\)"):
        ad.Scheme(form="weak")
    with pytest.raises(ValueError, match=r"Scheme\.cfl must be a number in \(0, 1\]"):
        ad.Scheme(cfl=2.0)
    with pytest.raises(ValueError, match=r"solve_gaussian: mesh must be periodic on every axis, got periodic="):
        ad.solve_gaussian(box_mesh((2, 2, 2), 2), 0.1)
    with pytest.raises(ValueError, match=r"solve_gaussian: mesh must fill the box"):
        ad.solve_gaussian(box_mesh((2, 2, 2), 2, periodic=(True,) * 3, origin=(0.0, -0.5, 0.0)), 0.1)
    dg, tr = _setup(2)
    with pytest.raises(ValueError, match="t_final must be a finite number >= 0, got nan"):
        ad.simulate(dg, tr, ad.gaussian(dg.x, 0.0), float("nan"))


# ----------------------------------------------------------------------------- CLI

CLI_SMALL = ["solve", "advection", "--order", "4", "--elements", "2", "--t-final", "0.1"]
CLI_KEYS = {"problem", "order", "elements", "dofs", "error_l2", "steps", "converged", "seconds", "device",
            "ranks", "jax_version"}


def test_cli_advection_json(capsys):
    assert cli.main([*CLI_SMALL, "--json", "-q"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and err == ""
    r = json.loads(out)
    assert CLI_KEYS <= set(r)
    assert r["problem"] == "advection" and r["order"] == 4 and r["elements"] == [2, 2, 2]
    assert r["dofs"] == 8 * 4**3 and r["ranks"] == 1 and r["converged"] is True
    assert r["steps"] >= 4 and r["seconds"] > 0 and r["mass_drift"] < 1e-13
    # measured 7.03e-2 (deform 0.1 default, t = 0.1): the error vs the exact translated Gaussian
    assert 0 < r["error_l2"] < 0.1
    # the same number from the library
    _, _, res = ad.solve_gaussian(box_mesh((2, 2, 2), 4, periodic=(True,) * 3, deform=0.1), 0.1)
    assert r["error_l2"] == pytest.approx(res.error_l2, rel=1e-10)


def test_cli_advection_report_and_vtu(capsys, tmp_path):
    vtu = tmp_path / "adv.vtu"
    assert cli.main([*CLI_SMALL, "--velocity", "0", "0", "-1", "--flux", "central", "--vtu", str(vtu), "-q"]) == 0
    out, _ = capsys.readouterr()
    assert "advection" in out and "relative L2" in out and "central" in out and "(0 0 -1)" in out
    import meshio

    m = meshio.read(vtu)
    assert m.points.shape == (8 * 5**3, 3) and set(m.point_data) == {"u", "u_exact"}
    u, ue = m.point_data["u"], m.point_data["u_exact"]
    # the file holds the run's fields: u close to the exact Gaussian, not equal to it
    assert 0 < np.linalg.norm(u - ue) < 0.2 * np.linalg.norm(ue)


BAD = [
    ([*CLI_SMALL, "--cfl", "2"], "--cfl"),
    ([*CLI_SMALL, "--t-final", "-1"], "--t-final"),
    ([*CLI_SMALL, "--velocity", "nan", "0", "0"], "--velocity"),
    ([*CLI_SMALL, "--velocity", "1", "0"], "--velocity"),
    ([*CLI_SMALL, "--bc", "pec"], "--bc"),
    (["solve", "poisson", "--velocity", "1", "0", "0"], "--velocity"),
    (["solve", "maxwell", "--velocity", "1", "0", "0"], "--velocity"),
    ([*CLI_SMALL, "--order", "0"], "--order"),
    ([*CLI_SMALL, "--schedule", "overlap"], "--schedule"),
    ([*CLI_SMALL, "--vtu", "/nonexistent-dir/u.vtu"], "--vtu"),
]


@pytest.mark.parametrize("argv,name", BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_cli_advection_bad_arguments_exit_2(argv, name, capsys, monkeypatch):
    def no_jax_work(*a, **k):
        raise AssertionError("validation must happen before any JAX work")

    monkeypatch.setattr("jaxsem.app.verify.verify_advection", no_jax_work)
    monkeypatch.setattr("jaxsem.app.verify.solve_poisson", no_jax_work)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0] and name in lines[0] and "Traceback" not in err
