"""SEDG Maxwell: exact modes (spectral in N, 4th order in Δt), energy, reflection, gradients, CLI.

Measured (float64, upwind flux, LSERK4 at half the stable Δt, t = 0.1; relative L2
error of all six components against the exact solution):

==============================================  ========  ========  ========  ========
case                                             N = 4     N = 6     N = 7     N = 10
==============================================  ========  ========  ========  ========
PEC cavity (1,1,1), 2×2×2, affine                5.5e-4    2.3e-6    1.1e-7    2.0e-10
PEC cavity (1,1,1), 2×2×2, deform 0.1            3.6e-3       —      2.5e-5    1.1e-7
PEC cavity (1,1,1), 3×3×3, deform 0.1               —      1.1e-5       —      1.9e-9
plane wave k=π(1,1,0), box 2×2×1, 3×3×1, affine     —      1.3e-5       —      3.9e-10
plane wave k=π(1,1,0), box 2³, 3×3×2, deform 0.1    —      1.6e-4       —      8.1e-8
==============================================  ========  ========  ========  ========

Δt orders (N = 4, vs the same semi-discrete system at Δt/16): LSERK4 4.00, 4.01;
RK4 4.00, 4.00; SSP-RK3 3.00, 3.00. Reflection at ε 1 → 2.25: −0.19998 (exact −0.2).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import dg as dgm
from jaxsem.app import cli
from jaxsem.backends import EINSUM, EMULATED, EmulatedBackend
from jaxsem import timestepping as ts
from jaxsem.io import load_checkpoint
from jaxsem.solvers import driver
from jaxsem.solvers.stops import NonFiniteError
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as ad
from jaxsem.models import maxwell as mx
from test_dg import rotate_elements


class Case:
    """A discretized exact-mode problem, built once per test module."""

    def __init__(self, order, elements, deform=0.0, bc="pec", lengths=(1.0, 1.0, 1.0), mode=None):
        periodic = bc == "periodic"
        self.mesh = box_mesh(elements, order, lengths=lengths, periodic=(periodic,) * 3, deform=deform)
        self.dg = dgm.discretize_dg(self.mesh)
        self.mat = mx.material(self.dg)
        if periodic:
            self.exact = lambda x, t: mx.plane_wave(x, t, lengths, mode or (1, 1, 0))
        else:
            self.exact = lambda x, t: mx.cavity_mode(x, t, lengths, mode or (1, 1, 1))
        self._rho = {}

    def rho(self, flux="upwind"):
        if flux not in self._rho:
            self._rho[flux] = mx.spectral_radius(self.dg, self.mat, flux)
        return self._rho[flux]

    def error(self, t_final, flux="upwind", cfl=0.5, method="lserk4"):
        q0 = self.exact(self.dg.x, 0.0)
        q, info, dt = mx.simulate(self.dg, self.mat, q0, t_final, scheme=mx.Scheme(flux=flux, cfl=cfl, method=method),
                                  rho=self.rho(flux))
        return mx.relative_error(self.dg, q, self.exact(self.dg.x, t_final))


_cases = {}


def case(*key, **kw):
    k = key + tuple(sorted(kw.items()))
    if k not in _cases:
        _cases[k] = Case(*key, **kw)
    return _cases[k]


T = 0.1
# One compilation per shape and option set (eager op-by-op dispatch compiles every primitive).
rhs = jax.jit(mx.rhs, static_argnames=("flux", "bc", "form"))


# ----------------------------------------------------------------------------- spectral convergence


def test_cavity_affine_spectral_convergence_in_N():
    errs = [case(N, (2, 2, 2)).error(T) for N in (4, 7, 10)]
    assert errs[0] > 300 * errs[1] and errs[1] > 300 * errs[2], errs  # exponential, not algebraic
    assert errs[2] < 1e-9, errs


def test_cavity_curved_1e_8_at_N10():
    # (Spectral convergence on curved elements: test_plane_wave_periodic_curved_spectral.)
    assert case(10, (3, 3, 3), 0.1).error(T) < 1e-8


def test_plane_wave_periodic_affine_1e_8_at_N10():
    err = case(10, (3, 3, 1), bc="periodic", lengths=(2.0, 2.0, 1.0)).error(T)
    assert err < 1e-8


def test_plane_wave_periodic_curved_spectral():
    c = lambda N: case(N, (3, 3, 2), 0.1, bc="periodic", lengths=(2.0, 2.0, 2.0))
    e6, e10 = c(6).error(T), c(10).error(T)
    assert e6 > 100 * e10 and e10 < 2e-7, (e6, e10)  # measured 1.6e-4 → 8.1e-8


# ----------------------------------------------------------------------------- order in Δt


@pytest.mark.parametrize("method,order", [("lserk4", 4), ("rk4", 4), ("ssprk3", 3)])
def test_time_order(method, order):
    # Errors against the same semi-discrete system at a tiny Δt isolate the time error.
    c = case(4, (2, 2, 2), 0.0)
    f, args = mx.make_rhs("upwind"), (c.dg, c.mat)
    q0 = c.exact(c.dg.x, 0.0)
    t_final = 0.4
    dt_lim = mx.stable_dt(c.dg, c.mat, method=method, rho=c.rho())
    n0 = int(np.ceil(t_final / (0.9 * dt_lim)))
    ref, _ = driver.run(f, q0, t_final / (16 * n0), 16 * n0, args=args, method="rk4",
                    options=driver.RunOptions(chunk_steps=10**6))
    errs = []
    for m in (1, 2, 4):
        q, _ = driver.run(f, q0, t_final / (m * n0), m * n0, args=args, method=method,
                      options=driver.RunOptions(dt_max=dt_lim))
        errs.append(float(jnp.sqrt(jnp.sum((q - ref) ** 2) / jnp.sum(ref**2))))
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(rates - order) < 0.3), (errs, rates)


# ----------------------------------------------------------------------------- energy


def _random_state(dg, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((6,) + dg.jac.shape))


@pytest.mark.parametrize("bc", ["pec", "pmc"])
def test_semidiscrete_energy_exact_on_curved_heterogeneous_mesh(bc):
    # d/dt ½∫(ε|E|²+μ|H|²) = <q, M·rhs> is 0 for central (to round-off) and < 0 for
    # upwind, for ANY state, on rotated curved elements with jumps in ε and μ.
    mesh = rotate_elements(box_mesh((2, 2, 2), 4, deform=0.15), seed=2)
    dg = dgm.discretize_dg(mesh)
    rng = np.random.default_rng(1)
    mat = mx.material(dg, eps=jnp.asarray(rng.uniform(1, 4, 8)), mu=jnp.asarray(rng.uniform(1, 2, (8, 5, 5, 5))))
    q = _random_state(dg)
    w = jnp.concatenate([jnp.broadcast_to(mat.eps, q[:3].shape), jnp.broadcast_to(mat.mu, q[3:].shape)])
    rate = lambda flux: float(jnp.sum(dg.mass * w * q * rhs(dg, mat, q, flux=flux, bc=bc)))
    r_c = rhs(dg, mat, q, flux="central", bc=bc)
    scale = float(jnp.sqrt(jnp.sum(dg.mass * w * q * q)) * jnp.sqrt(jnp.sum(dg.mass * w * r_c**2)))
    assert abs(rate("central")) < 1e-13 * scale
    assert rate("upwind") < -1e-3 * scale
    # The chain-rule curl (NekCEM's) is not skew on curved elements; the split form is.
    rate_chain = float(jnp.sum(dg.mass * w * q * rhs(dg, mat, q, flux="central", bc=bc, form="chain")))
    assert abs(rate_chain) > 1e-6 * scale


def test_chain_and_split_forms_agree_on_affine_mesh():
    c = case(4, (2, 2, 2), 0.0)
    q = _random_state(c.dg)
    a, b = rhs(c.dg, c.mat, q, form="split"), rhs(c.dg, c.mat, q, form="chain")
    assert float(jnp.max(jnp.abs(a - b))) < 1e-11 * float(jnp.max(jnp.abs(a)))


def test_energy_central_conserved_to_time_error_upwind_nonincreasing():
    # Curved periodic mesh, plane wave. Central: the energy drift is the RK4 error
    # only (|R(iy)| = 1 − O(y⁶)), so halving Δt cuts it by ≥ 16. Upwind: every step
    # loses energy.
    c = case(6, (3, 3, 2), 0.1, bc="periodic", lengths=(2.0, 2.0, 2.0))
    q0 = c.exact(c.dg.x, 0.0)
    E0 = float(mx.energy(c.dg, c.mat, q0))
    drift = []
    for m in (1, 2):
        dt = 0.5 * mx.stable_dt(c.dg, c.mat, "central", rho=c.rho("central")) / m
        q, _ = driver.run(mx.make_rhs("central"), q0, dt, 40 * m, args=(c.dg, c.mat),
                      options=driver.RunOptions(chunk_steps=1000))
        drift.append(abs(float(mx.energy(c.dg, c.mat, q)) / E0 - 1))
    assert drift[0] < 1e-7 and drift[1] < drift[0] / 16, drift  # measured 2.5e-8, 7.8e-10
    dt = 0.9 * mx.stable_dt(c.dg, c.mat, "upwind", rho=c.rho())
    _, hist = ts.integrate(lambda t, q: mx.rhs(c.dg, c.mat, q), q0, dt, 40,
                           observe=lambda q: mx.energy(c.dg, c.mat, q))
    hist = np.concatenate([[E0], np.asarray(hist)])
    assert np.all(np.diff(hist) <= 1e-14 * E0) and hist[-1] < hist[0]


# ----------------------------------------------------------------------------- material interface


def test_reflection_coefficient_at_dielectric_interface():
    # A Gaussian pulse E_y = Z1·H_z travelling +x hits ε: 1 → 2.25 at x = 1 (normal
    # incidence). R = (Z2 − Z1)/(Z2 + Z1) = −0.2 with Z = √(μ/ε); measured by projecting
    # the left-region field at t = 1 on the mirrored incident pulse.
    eps2, w, x0 = 2.25, 0.1, 0.5
    mesh = box_mesh((8, 1, 1), 7, lengths=(2.0, 0.25, 0.25), periodic=(False, True, True))
    dg = dgm.discretize_dg(mesh)
    xc = np.asarray(dg.x[0]).mean(axis=(1, 2, 3))
    mat = mx.material(dg, eps=jnp.where(jnp.asarray(xc) > 1.0, eps2, 1.0))
    x = dg.x[0]
    g = jnp.exp(-(((x - x0) / w) ** 2))
    z = jnp.zeros_like(x)
    q, _, _ = mx.simulate(dg, mat, jnp.stack([z, g, z, z, z, g]), 1.0, scheme=mx.Scheme(cfl=0.5))
    Z1, Z2 = 1.0, 1.0 / np.sqrt(eps2)
    R = (Z2 - Z1) / (Z2 + Z1)
    left = x < 1.0
    refl = jnp.exp(-(((x - 0.5) / w) ** 2))  # mirrored pulse, centre back at 0.5
    R_meas = float(jnp.sum(dg.mass * left * q[1] * refl) / jnp.sum(dg.mass * left * refl**2))
    assert R_meas == pytest.approx(R, abs=1e-3)  # measured −0.19998
    # The reflected wave travels −x: H_z = −E_y/Z1 there.
    H_meas = float(jnp.sum(dg.mass * left * q[5] * refl) / jnp.sum(dg.mass * left * refl**2))
    assert H_meas == pytest.approx(-R / Z1, abs=2e-3)


# ----------------------------------------------------------------------------- gradients


def test_gradient_wrt_eps_matches_finite_differences():
    # Loss after 12 LSERK4 steps (checkpointed in chunks of 4) as a function of pointwise
    # ε; per-element ε is its restriction (the element sums of the pointwise gradient).
    c = case(4, (2, 2, 2), 0.1)
    q0 = c.exact(c.dg.x, 0.0)
    dt = 0.5 * mx.stable_dt(c.dg, c.mat, rho=c.rho())

    @jax.jit
    def loss(eps):
        mat = mx.material(c.dg, eps=eps)
        q = ts.integrate(lambda t, q: mx.rhs(c.dg, mat, q), q0, dt, 12, checkpointing=ts.Checkpointing(4))
        return jnp.sum(c.dg.mass * q[2] ** 2)

    nodal = lambda e: jnp.broadcast_to(e[:, None, None, None], c.dg.jac.shape)
    eps0 = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, 8))
    g_point = jax.jit(jax.grad(loss))(nodal(eps0))
    assert g_point.shape == c.dg.jac.shape
    g = g_point.sum(axis=(1, 2, 3))
    v = jnp.asarray(np.random.default_rng(1).standard_normal(8))
    h = 1e-5
    fd = (loss(nodal(eps0 + h * v)) - loss(nodal(eps0 - h * v))) / (2 * h)
    assert float(jnp.dot(g, v)) == pytest.approx(float(fd), rel=1e-6)
    # A pointwise perturbation inside one element, too.
    vp = jnp.asarray(np.random.default_rng(2).standard_normal(c.dg.jac.shape))
    fdp = (loss(nodal(eps0) + h * vp) - loss(nodal(eps0) - h * vp)) / (2 * h)
    assert float(jnp.sum(g_point * vp)) == pytest.approx(float(fdp), rel=1e-6)


# ----------------------------------------------------------------------------- plumbing


def _scatters(jaxpr) -> list:
    """The operand shapes of every scatter-add in ``jaxpr`` and the jaxprs inside it."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scatter-add":
            out.append(tuple(eqn.invars[0].aval.shape))
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += _scatters(inner)
    return out


def test_exchange_is_packed_and_equals_reading_the_neighbours():
    """The reference's face exchange (a gather–scatter over the face-point ids, all six components
    in ONE scatter) and the fused path's read of the neighbours through ``dg.nbr`` (the emulated
    backend) give the same operator on rotated curved elements with walls, and on a periodic axis."""
    for mesh, bc in ((rotate_elements(box_mesh((3, 3, 3), 3, deform=0.1), seed=4), "pec"),
                     (box_mesh((3, 3, 3), 3, deform=0.1, periodic=(True, False, False)), "pmc")):
        dgs = {b: dgm.discretize_dg(mesh, backend=b) for b in (EINSUM, EMULATED)}
        q = _random_state(dgs[EINSUM])
        a, b = (rhs(dg, mx.material(dg), q, bc=bc, form="chain") for dg in dgs.values())
        assert float(jnp.max(jnp.abs(a - b))) < 1e-12 * float(jnp.max(jnp.abs(a)))
    dg = dgs[EINSUM]
    jaxpr = jax.make_jaxpr(lambda v: mx.rhs(dg, mx.material(dg), v))(q).jaxpr
    material_scatter = 2 * dgm.face_connectivity(mesh).num_ids  # Z and Y, in material()
    assert [s for s in _scatters(jaxpr) if s != (material_scatter,)] == [(6 * dg.fgs.num_global,)]


_KERNEL_CALLS = []


class _Recording(EmulatedBackend):
    """The emulated backend, noting each trace of its fused Maxwell kernel."""

    def maxwell_kernel(self, dg, mat, q, flux, bc):
        _KERNEL_CALLS.append(flux)
        return super().maxwell_kernel(dg, mat, q, flux, bc)


@pytest.mark.parametrize("deform, form, fused", [(0.0, "split", True), (0.0, "chain", True),
                                                 (0.1, "split", False), (0.1, "chain", True)])
def test_default_form_runs_the_fused_kernel_on_affine_meshes(deform, form, fused):
    """A fused backend takes its kernel wherever the chain-rule curl is the operator asked for:
    the default split form on affine meshes, the chain form everywhere; the split form on a
    curved mesh is the reference's. The value is the reference's either way."""
    mesh = box_mesh((3, 3, 3), 3, deform=deform)
    dg, ref = dgm.discretize_dg(mesh, backend=_Recording()), dgm.discretize_dg(mesh, backend=EINSUM)
    q = _random_state(dg, seed=3)
    _KERNEL_CALLS.clear()
    got = mx.rhs(dg, mx.material(dg), q, form=form)
    assert bool(_KERNEL_CALLS) == fused
    want = mx.rhs(ref, mx.material(ref), q, form=form)
    assert float(jnp.max(jnp.abs(got - want))) < 1e-12 * float(jnp.max(jnp.abs(want)))


def test_rotated_elements_give_the_same_operator():
    base = box_mesh((2, 2, 2), 4, deform=0.1)
    rot = rotate_elements(base, seed=7)
    vals = []
    for mesh in (base, rot):
        dg = dgm.discretize_dg(mesh)
        mat = mx.material(dg)
        q = mx.cavity_mode(dg.x, 0.3)
        r = rhs(dg, mat, q)
        G = jnp.sin(3 * dg.x[0] + 1) * jnp.cos(2 * dg.x[1] - dg.x[2])
        vals.append(np.asarray(jnp.sum(dg.mass * r * G, axis=(1, 2, 3, 4))))
    assert np.allclose(vals[0], vals[1], rtol=1e-11, atol=1e-12)


def test_guards_refuse_large_dt_and_bad_inputs():
    c = case(4, (2, 2, 2), 0.0)
    q0 = c.exact(c.dg.x, 0.0)
    limit = mx.stable_dt(c.dg, c.mat, rho=c.rho())
    with pytest.raises(ValueError, match=f"stable limit {limit:.6g}"):
        mx.simulate(c.dg, c.mat, q0, 10 * limit, scheme=mx.Scheme(dt=2 * limit), rho=c.rho())
    with pytest.raises(ValueError, match="t_final must be a finite number >= 0, got -1"):
        mx.simulate(c.dg, c.mat, q0, -1.0, rho=c.rho())
    with pytest.raises(ValueError, match="bc must be one of"):
        mx.simulate(c.dg, c.mat, q0, 0.1, bc="wall", rho=c.rho())
    with pytest.raises(TypeError, match="scheme must be a maxwell.Scheme"):
        mx.simulate(c.dg, c.mat, q0, 0.1, scheme=ad.Scheme(), rho=c.rho())
    with pytest.raises(ValueError, match="flux"):
        mx.rhs(c.dg, c.mat, q0, flux="lax")
    with pytest.raises(ValueError, match="eps"):
        mx.material(c.dg, eps=jnp.ones(3))
    with pytest.raises(ValueError, match="positive"):
        mx.material(c.dg, mu=-1.0)


def test_blowup_is_reported_with_step():
    c = case(4, (2, 2, 2), 0.0)
    q0 = c.exact(c.dg.x, 0.0)
    limit = mx.stable_dt(c.dg, c.mat, rho=c.rho())
    with pytest.raises(NonFiniteError, match="appeared at step") as exc:  # 3x the limit, unguarded
        driver.run(mx.make_rhs(), q0, 3 * limit, 5000, args=(c.dg, c.mat), options=driver.RunOptions(chunk_steps=100))
    assert 1 < exc.value.step < 5000
    with pytest.raises(ValueError, match="initial state"):
        mx.simulate(c.dg, c.mat, q0.at[0, 3, 2, 2, 2].set(jnp.nan), 0.05, rho=c.rho())


def test_maxwell_checkpoint_resume_bit_identical(tmp_path):
    c = case(4, (2, 2, 2), 0.0)
    q0 = c.exact(c.dg.x, 0.0)
    full, _, dt = mx.simulate(c.dg, c.mat, q0, 0.2, rho=c.rho(), options=driver.RunOptions(chunk_steps=4))
    path = tmp_path / "mx.npz"
    fixed = mx.Scheme(dt=dt)
    _, info, _ = mx.simulate(c.dg, c.mat, q0, 4 * dt, scheme=fixed, rho=c.rho(),
                             options=driver.RunOptions(chunk_steps=4, checkpoint_path=path))
    assert info.step == 4  # "the run died here"
    meta = load_checkpoint(path).meta
    assert {k: str(meta[k]) for k in ("flux", "form", "bc", "order", "dtype", "elements")} == dict(
        flux="upwind", form="split", bc="pec", order="4", dtype="float64", elements="8")
    assert len(str(meta["mesh"])) == 16 and len(str(meta["material"])) == 16
    resume = driver.RunOptions(chunk_steps=4, resume=path)
    res, info, _ = mx.simulate(c.dg, c.mat, q0, 0.2, scheme=fixed, rho=c.rho(), options=resume)
    assert info.resumed_from == 4 and info.step == round(0.2 / dt)
    assert np.array_equal(np.asarray(res), np.asarray(full))


def test_maxwell_resume_refuses_other_physics(tmp_path):
    """A checkpoint resumes only the run that wrote it: another flux, form, order, mesh, dtype or ε is named."""
    c = case(4, (2, 2, 2), 0.0)
    q0 = c.exact(c.dg.x, 0.0)
    path = tmp_path / "mx.npz"
    dt = 0.5 * mx.stable_dt(c.dg, c.mat, rho=c.rho())
    mx.simulate(c.dg, c.mat, q0, 2 * dt, scheme=mx.Scheme(dt=dt), rho=c.rho(),
                options=driver.RunOptions(checkpoint_path=path))
    resume = driver.RunOptions(resume=path)
    with pytest.raises(ValueError, match=r"flux = 'upwind' in the checkpoint, 'central' in this run"):
        mx.simulate(c.dg, c.mat, q0, 4 * dt, scheme=mx.Scheme(flux="central", dt=dt), rho=c.rho(), options=resume)
    with pytest.raises(ValueError, match=r"form = 'split' in the checkpoint, 'chain' in this run"):
        mx.simulate(c.dg, c.mat, q0, 4 * dt, scheme=mx.Scheme(form="chain", dt=dt), rho=c.rho(), options=resume)
    with pytest.raises(ValueError, match=r"material = '\w+' in the checkpoint, '\w+' in this run"):
        mx.simulate(c.dg, mx.material(c.dg, eps=2.0), q0, 4 * dt, scheme=mx.Scheme(dt=dt), rho=c.rho(),
                    options=resume)
    # another order (and so another mesh): named before the state's shapes are compared
    other = case(3, (2, 2, 2), 0.0)
    with pytest.raises(ValueError, match=r"order = 4 in the checkpoint, 3 in this run") as exc:
        mx.simulate(other.dg, other.mat, other.exact(other.dg.x, 0.0), 4 * dt, scheme=mx.Scheme(dt=dt),
                    rho=c.rho(), options=resume)
    assert "mesh = " in str(exc.value)
    # the same order on a curved mesh: only the mesh fingerprint differs
    curved = case(4, (2, 2, 2), 0.1)
    with pytest.raises(ValueError, match=r"is of another run: mesh = '\w+' in the checkpoint, '\w+' in this run$"):
        mx.simulate(curved.dg, curved.mat, q0, 4 * dt, scheme=mx.Scheme(dt=dt), rho=c.rho(), options=resume)
    with pytest.raises(ValueError, match=r"RunOptions\.meta key 'flux' is set by the maxwell driver"):
        mx.simulate(c.dg, c.mat, q0, 4 * dt, scheme=mx.Scheme(dt=dt), rho=c.rho(),
                    options=driver.RunOptions(resume=path, meta={"flux": "upwind"}))


def test_scheme_and_driver_arguments_are_named():
    """Options objects check their fields; the verification driver checks its mesh, before any JAX work."""
    assert mx.Scheme() == mx.Scheme("upwind", "split", "lserk4", 0.5, None) and hash(mx.Scheme(cfl=1)) is not None
    for kw, msg in [
        (dict(flux="lax"), r"Scheme\.flux must be one of \('upwind', 'central'\), got 'lax'"),
        (dict(form="conservative"), r"Scheme\.form must be one of \('split', 'chain'\), got 'conservative'"),
        (dict(method="euler"), r"Scheme\.method must be one of .*'lserk4'.*got 'euler'"),
        (dict(cfl=1.5), r"Scheme\.cfl must be a number in \(0, 1\] .*got 1\.5"),
        (dict(cfl=0), r"Scheme\.cfl must be a number in \(0, 1\]"),
        (dict(dt=-0.1), r"Scheme\.dt must be None or a positive finite number, got -0\.1"),
    ]:
        with pytest.raises(ValueError, match=msg):
            mx.Scheme(**kw)
    with pytest.raises(ValueError, match=r"solve_mode: mesh must be closed .* on every axis, got periodic="):
        mx.solve_mode(box_mesh((2, 2, 2), 2, periodic=(True, False, False)), 0.1)
    with pytest.raises(ValueError, match=r"solve_mode: mesh must fill the box \[0, L\]"):
        mx.solve_mode(box_mesh((2, 2, 2), 2, origin=(1.0, 0.0, 0.0)), 0.1)
    with pytest.raises(TypeError, match="solve_mode: mesh must be a jaxsem Mesh"):
        mx.solve_mode(4, 0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'numbering'; placement takes comm"):
        mx.solve_mode(box_mesh((2, 2, 2), 2), 0.1, numbering=None)


def test_solve_mode_periodic_mesh_runs_the_plane_wave():
    mesh = box_mesh((2, 2, 2), 3, lengths=(2.0, 2.0, 2.0), periodic=(True,) * 3)
    dg, q, r = mx.solve_mode(mesh, 0.05, scheme=mx.Scheme(flux="central"))
    assert q.shape == (6, 8, 4, 4, 4) and r.order == 3 and r.num_elements == 8 and r.steps >= 1
    exact = mx.plane_wave(dg.x, 0.05, lengths=(2.0, 2.0, 2.0))
    assert r.error_l2 == pytest.approx(mx.relative_error(dg, q, exact), rel=1e-12)
    assert r.error_l2 < 0.05  # measured 2.6e-2 (order 3, two elements per wavelength)
    assert abs(r.energy / r.energy0 - 1) < 1e-5  # central flux: energy kept to the time error (measured 5.8e-7)


# ----------------------------------------------------------------------------- CLI


def _json(capsys):
    out, err = capsys.readouterr()
    assert out.count("\n") == 1
    return json.loads(out), err


def test_cli_solve_maxwell_json(capsys, tmp_path):
    vtu = tmp_path / "m.vtu"
    code = cli.main(["solve", "maxwell", "--order", "4", "--elements", "2", "2", "2", "--t-final", "0.1",
                     "--deform", "0.1", "--vtu", str(vtu), "--json"])
    r, err = _json(capsys)
    assert code == 0
    assert r["problem"] == "maxwell" and r["order"] == 4 and r["elements"] == [2, 2, 2]
    assert r["dofs"] == 8 * 4**3 and r["converged"] is True
    assert 0 < r["error_l2"] < 1e-2 and r["steps"] > 0 and r["seconds"] > 0
    assert r["flux"] == "upwind" and r["bc"] == "pec" and r["ranks"] == 1
    assert {"device", "jax_version"} <= set(r)
    assert vtu.exists() and "maxwell" in err


def test_cli_solve_maxwell_periodic_central_text(capsys):
    code = cli.main(["solve", "maxwell", "--order", "4", "--elements", "2", "--t-final", "0.05",
                     "--bc", "periodic", "--flux", "central", "--deform", "0", "-q"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert "Maxwell" in out and "relative L2" in out


@pytest.mark.parametrize("args,msg", [
    (["--cfl", "1.5"], "--cfl"),
    (["--t-final", "-1"], "--t-final"),
    (["--flux", "lax"], "--flux"),
    (["--bc", "wall"], "--bc"),
])
def test_cli_solve_maxwell_bad_args(capsys, args, msg):
    assert cli.main(["solve", "maxwell", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and msg in err and err.count("\n") == 1
