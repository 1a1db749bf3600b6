"""The gradient verification protocol (:mod:`jaxsem.gradcheck`) on every differentiable model.

Each model at CPU size, on meshes with three elements per direction (interior nodes shared by
eight elements), with a point ``x`` that is a dict of parameters and a loss Σ c·u² with c
random per element-local node (a cotangent discontinuous across shared nodes):

* Poisson (:func:`jaxsem.models.poisson.solve`, curved 3³ mesh of order 2, solves to 1e-13):
  x = the source and the per-point coefficient h₁, u = the solution;
* Maxwell (:mod:`jaxsem.models.maxwell`, curved 3³ mesh of order 2 with one periodic axis,
  8 LSERK4 steps): x = ε per element and the initial field, u = the final electric field;
* advection (:mod:`jaxsem.models.advection`, periodic curved 3³ mesh of order 2, 8 steps):
  x = the initial field;
* Navier–Stokes (:func:`jaxsem.models.navier_stokes.simulate`, Ethier–Steinman on a curved 3³
  mesh of order 2 with its wall data, 4 steps, solves to 1e-12): x = ν and the initial
  velocity history.

(a) central differences along 10 random directions: the protocol's thresholds (median
relative error ≤ 1e-3, cosine ≥ 0.99) and the tighter bound these cases reach (median
≤ 1e-6); (b) the dot-product test to 1e-10. For advection and Navier–Stokes, (b)'s reverse
pass runs through the binomial schedule ``Checkpointing(snapshots=2)`` (a ``custom_vjp``,
without forward mode), against the forward mode of the plain scan. (c) for Navier–Stokes,
|∇L| over 2, 4 and 8 steps, printed. The measured figures are in docs/verification.md.

The checks of the checks: a gradient scaled by 1.01 fails (a)'s median error and (b), one
with a wrong cotangent fails (a)'s cosine too; the right one passes.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import gradcheck as gc
from jaxsem import timestepping as ts
from jaxsem.discretization import discretize
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as ad
from jaxsem.models import flows
from jaxsem.models import maxwell as mx
from jaxsem.models import navier_stokes as NS
from jaxsem.models import poisson

TIGHT = 1e-6  # these small cases reach a median ≤ 2e-8
REVOLVE = ts.Checkpointing(snapshots=2)
ES = flows.ethier_steinman(nu=0.5)


def _weights(shape, seed):
    """Positive weights, independent per element-local node."""
    return jnp.asarray(1.0 + 0.5 * np.random.default_rng(seed).uniform(size=shape))


def _poisson():
    sem = discretize(box_mesh((3, 3, 3), order=2, deform=0.1), backend="einsum")
    xq = sem.geom.xq
    x = dict(f=1.0 + 0.5 * jnp.cos(2 * xq[0] + xq[1]),
             h1=1.0 + 0.3 * jnp.sin(np.pi * xq[0]) * jnp.cos(xq[1] + xq[2]))
    u = lambda p: poisson.solve(sem, p["f"], p["h1"], 0.0, tol=1e-13, maxiter=500)[0]
    return x, u, None, 1e-5


def _maxwell():
    dg = discretize_dg(box_mesh((3, 3, 3), 2, deform=0.1, periodic=(True, False, False)))
    q0 = mx.cavity_mode(dg.x, 0.0) + 0.1 * mx.cavity_mode(dg.x, 0.0, mode=(2, 1, 1))
    x = dict(eps=jnp.asarray(np.random.default_rng(3).uniform(1.0, 2.0, dg.num_elements)), q0=q0)

    def u(p):
        f = lambda t, q: mx.rhs(dg, mx.material(dg, p["eps"], 1.0), q)
        return ts.integrate(f, p["q0"], 0.02, 8)[:3]

    return x, u, None, 1e-5


def _advection():
    dg = discretize_dg(box_mesh((3, 3, 3), 2, periodic=(True,) * 3, deform=0.1))
    tr = ad.transport(dg)
    x = dict(u0=ad.gaussian(dg.x, 0.0))
    run = lambda ck: (lambda p: ts.integrate(lambda t, u: ad.rhs(dg, tr, u), p["u0"], 0.01, 8, checkpointing=ck))
    return x, run(ts.Checkpointing()), run(REVOLVE), 1e-5


@functools.cache
def _navier_stokes_case():
    mesh = box_mesh(3, 2, lengths=(2.0,) * 3, origin=(-1.0,) * 3, deform=0.05)
    options = NS.NSOptions(pressure_tol=1e-12, velocity_tol=1e-12)
    ns = NS.setup(mesh, nu=0.5, dt=0.01, boundary=ES.velocity, options=options)
    st0 = NS.initial_state(ns, lambda x, y, z: ES.velocity(x, y, z, 0.0))
    x = dict(nu=jnp.asarray(0.5), U=st0.U)

    def final(p, steps, ck):
        return NS.simulate(dataclasses.replace(ns, nu=p["nu"]), dataclasses.replace(st0, U=p["U"]), steps,
                           checkpointing=ck).u

    return x, final


def _navier_stokes():
    x, final = _navier_stokes_case()
    return x, (lambda p: final(p, 4, ts.Checkpointing())), (lambda p: final(p, 4, REVOLVE)), 1e-4


# each: (x, u: x ↦ field, the same map under the binomial schedule or None, the difference step)
MODELS = {"poisson": _poisson, "maxwell": _maxwell, "advection": _advection, "navier_stokes": _navier_stokes}


@pytest.mark.parametrize("model", list(MODELS))
def test_protocol(model):
    """(a) on x ↦ L(u(x)) and (b) on x ↦ u(x); for a map ``u_reverse`` scheduled by a
    ``custom_vjp`` (no forward mode), (b) pits its reverse pass against ``u``'s forward mode."""
    x, u, u_reverse, h = MODELS[model]()
    c = _weights(jax.eval_shape(u, x).shape, seed=7)
    r = gc.check_gradient(lambda p: jnp.sum(c * u(p) ** 2), x, directions=10, h=h)
    dot = gc.dot_product(u, x, trials=2, reverse=u_reverse)
    print(f"{model}: median {r.median_error:.1e}, max {r.errors.max():.1e}, |1 - cosine| {abs(1 - r.cosine):.1e}, "
          f"dot product {[f'{e:.1e}' for e in dot]}")
    assert r.passed(), r
    assert r.median_error <= TIGHT, r.errors
    assert max(dot) <= gc.DOT_RTOL, dot
    assert np.all(np.abs(r.fd) > 0)


def test_navier_stokes_horizon_growth():
    """(c): |∇L| w.r.t. (ν, U⁰) at 2, 4, 8 steps, reported; finite and positive."""
    x, final = _navier_stokes_case()
    c = _weights(x["U"].shape[1:], seed=8)
    growth = gc.horizon_growth(lambda p, s: jnp.sum(c * final(p, s, ts.Checkpointing()) ** 2), x, [2, 4, 8])
    for s, v, n, (n_nu, n_u) in zip(growth.steps, growth.values, growth.norms, growth.leaf_norms):
        print(f"navier_stokes {s} steps: L {v:.6e}, |grad| {n:.6e} (nu {n_nu:.3e}, U {n_u:.3e})")
    assert growth.steps == (2, 4, 8)
    assert np.all(np.isfinite(growth.norms)) and np.all(growth.norms > 0)
    assert growth.leaf_norms.shape == (3, 2) and np.all(growth.leaf_norms > 0)
    np.testing.assert_allclose(np.hypot(*growth.leaf_norms.T), growth.norms, rtol=1e-14)


# --- the checks of the checks ----------------------------------------------------------------


def _g(x):
    return jnp.sin(x["a"]) * x["b"] + x["a"] ** 2 * x["s"]


def _with_cotangent(wrong):
    """``_g`` as a ``custom_vjp`` whose backward pass is ``wrong`` of the true cotangents."""
    g = jax.custom_vjp(_g)
    g.defvjp(lambda x: (_g(x), x), lambda x, ct: (wrong(jax.vjp(_g, x)[1](ct)[0]),))
    return g


WRONG = {
    "right": lambda ct: ct,
    "scaled by 1.01": lambda ct: jax.tree.map(lambda a: 1.01 * a, ct),
    "reversed": lambda ct: dict(ct, a=ct["a"][::-1]),
}


@pytest.mark.parametrize("kind", list(WRONG))
def test_a_wrong_gradient_fails(kind):
    """x = {a: (5,), b: (5,), s: a float}; L = Σ w·g(x)². A cotangent scaled by 1.01 (right
    direction, 1% off) fails the median error of (a), a reversed one its cosine too; both fail
    (b) against the forward mode of the true map."""
    x = dict(a=jnp.linspace(0.3, 1.7, 5), b=jnp.asarray([1.0, -2.0, 0.5, 3.0, -1.0]), s=0.7)
    w = jnp.asarray([1.0, 2.0, 3.0, 4.0, 5.0])
    g = _with_cotangent(WRONG[kind])
    r = gc.check_gradient(lambda p: jnp.sum(w * g(p) ** 2), x)
    dot = gc.dot_product(_g, x, reverse=g, trials=3)
    print(f"{kind}: median {r.median_error:.1e}, cosine {r.cosine:.4f}, dot product {[f'{e:.1e}' for e in dot]}")
    assert len(r.errors) == len(r.ad) == len(r.fd) == 10
    assert isinstance(r.grad["s"], jax.Array) and r.grad["s"].shape == ()
    if kind == "right":
        assert r.passed() and r.median_error < 1e-8 and 1 - r.cosine < 1e-12, r
        assert max(dot) < 1e-14, dot
        return
    assert not r.passed(), r
    assert r.median_error > 5e-3, r.errors
    if kind == "reversed":
        assert r.cosine < gc.MIN_COSINE, r.cosine
    assert min(dot) > 1e-4, dot


def test_explicit_directions_and_zero_gradients():
    x = (jnp.ones(3), 2.0)
    loss = lambda p: jnp.sum(p[0] ** 3) * p[1]
    dirs = [(jnp.asarray([1.0, 0.0, 0.0]), 0.0), (jnp.zeros(3), 1.0)]
    r = gc.check_gradient(loss, x, dirs, h=1e-4)
    np.testing.assert_allclose(r.ad, [6.0, 3.0], rtol=1e-14)
    np.testing.assert_allclose(r.fd, [6.0, 3.0], rtol=1e-7)
    errs, grad = gc.directional_errors(loss, x, dirs, h=1e-4)
    assert errs == [float(e) for e in r.errors] and float(grad[1]) == 3.0
    flat = gc.check_gradient(lambda p: 0.0 * jnp.sum(p[0]), x, 3)
    assert flat.passed() and flat.cosine == 1.0 and np.all(flat.errors == 0)
    assert [d[0].shape for d in gc.random_directions(x, 2)] == [(3,), (3,)]


def test_bad_arguments():
    loss, x = jnp.sum, jnp.ones(3)
    for kw, match in [(dict(directions=0), "directions must be"), (dict(directions=[]), "directions must be"),
                      (dict(directions=[jnp.ones(2)]), r"directions\[0\] must be"), (dict(h=0.0), "h must be"),
                      (dict(h=float("nan")), "h must be")]:
        with pytest.raises(ValueError, match=match):
            gc.check_gradient(loss, x, **kw)
    with pytest.raises(ValueError, match="x's leaves"):
        gc.check_gradient(loss, jnp.ones(3, int))
    with pytest.raises(ValueError, match="x must be"):
        gc.check_gradient(loss, {})
    with pytest.raises(ValueError, match="trials must be"):
        gc.dot_product(jnp.sin, x, trials=0)
    with pytest.raises(ValueError, match="count must be"):
        gc.random_directions(x, 0)
    for steps in ([], [2, -1], "248"):
        with pytest.raises(ValueError, match="steps must be"):
            gc.horizon_growth(lambda x, s: jnp.sum(x), x, steps)
