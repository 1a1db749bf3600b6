"""The Mosaic ``navier_stokes_grid`` tesseract (tesseracts/navier-stokes-grid/tesseract_api.py).

Loaded without containers (``Tesseract.from_tesseract_api``). On a 6³ grid (3³ elements of
order 4: shared nodes interior to the periodic box), 3 schema steps of 2 jaxsem steps each:

1. grid → GLL nodes → grid is the identity, and the nodal values are the band-limited
   field's own (Nyquist mode included), to round-off; the Leray projection leaves a
   divergence-free field alone and removes a gradient;
2. ``apply`` on the 3-D Taylor–Green vortex equals jaxsem's own run of the flow at the grid
   points (float32 round-off), and its energy follows the early decay E(t) = E(0)e^{−6νt} to
   the discretization error of this coarse mesh; the 2-D vortex, an exact solution, decays as
   u₀e^{−2νt} (at order 8: the error is 3.7e-3 at order 4 and falls as h⁵, 1.2e-4 at N = 12);
3. reverse (binomial checkpointing, 2 states for 6 steps) and forward mode of the float64 map
   against central differences along random directions of v0 and along ν and dt (cotangent
   2·result, the gradient of Mosaic's loss Σ result²), and ⟨J v, c⟩ = ⟨v, Jᵀ c⟩;
4. the endpoints return those float64 derivatives in float32, and ``jax.grad`` through
   ``tesseract_jax.apply_tesseract`` (Mosaic's path) gives the VJP;
5. bad inputs raise ``ValueError`` naming the input, before any set-up.
"""

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tesseract_core")
from tesseract_core import Tesseract  # noqa: E402

import jaxsem as js  # noqa: E402
from jaxsem.models import flows  # noqa: E402
from jaxsem.models import navier_stokes as NS  # noqa: E402

API = pathlib.Path(__file__).resolve().parents[1] / "tesseracts" / "navier-stokes-grid" / "tesseract_api.py"
N, NU, DT, STEPS, SUB = 6, 0.05, 0.05, 3, 2
L = 2 * np.pi


@pytest.fixture(scope="module")
def api():
    spec = importlib.util.spec_from_file_location("jaxsem_ns_grid_tesseract", API)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tess(api):
    return Tesseract.from_tesseract_api(api)


def _grid(n=N):
    x = np.arange(n) * L / n
    return np.meshgrid(x, x, x, indexing="ij")


def _tgv(n=N):
    X, Y, Z = _grid(n)
    return np.stack([np.sin(X) * np.cos(Y) * np.cos(Z), -np.cos(X) * np.sin(Y) * np.cos(Z), 0 * X], -1)


def _start():
    """The Taylor–Green vortex plus a random divergence-free field of wavenumbers ≤ 2."""
    rng = np.random.default_rng(3)
    k = np.fft.fftfreq(N, 1.0 / N)
    K = np.meshgrid(k, k, k, indexing="ij")
    low = (np.abs(K[0]) <= 2) & (np.abs(K[1]) <= 2) & (np.abs(K[2]) <= 2)
    A = np.fft.ifftn(low[..., None] * np.fft.fftn(rng.standard_normal((N, N, N, 3)), axes=(0, 1, 2)),
                     axes=(0, 1, 2)).real
    Ah = np.fft.fftn(A, axes=(0, 1, 2))
    curl = np.stack([1j * (K[1] * Ah[..., 2] - K[2] * Ah[..., 1]), 1j * (K[2] * Ah[..., 0] - K[0] * Ah[..., 2]),
                     1j * (K[0] * Ah[..., 1] - K[1] * Ah[..., 0])], -1)
    return _tgv() + 0.3 * np.fft.ifftn(curl, axes=(0, 1, 2)).real


def _inputs(v0, **kw):
    return dict(dict(v0=np.asarray(v0, np.float32), viscosity=np.array([NU], np.float32),
                     dt=np.array([DT], np.float32), steps=STEPS, substeps=SUB, snapshots=2), **kw)


def test_loads_by_path_with_its_endpoints():
    t = Tesseract.from_tesseract_api(str(API))
    assert {"apply", "vector_jacobian_product", "jacobian_vector_product", "abstract_eval"} <= set(
        t.available_endpoints)


def test_grid_nodes_grid_is_exact_for_band_limited_fields(api):
    g = api.grid_map((N, N, N), L, 4)
    assert g.elements == (3, 3, 3)
    f = lambda x, y, z: np.stack([np.sin(x) * np.cos(2 * y) + 0.3 * np.cos(3 * z), np.cos(x + y - z),
                                  np.sin(2 * x) * np.sin(z) - np.cos(3 * y)], -1)  # 3 = N/2: Nyquist
    v = f(*_grid())
    u = api.to_nodes(g, jnp.asarray(v))
    x = np.asarray(g.ns.sem.x)
    assert float(jnp.max(jnp.abs(u - np.moveaxis(f(x[0], x[1], x[2]), -1, 0)))) < 1e-13
    assert float(jnp.max(jnp.abs(api.to_grid(g, u) - v))) < 1e-14
    assert np.max(np.abs(api.to_grid(g, g.ns.sem.x) - np.stack(_grid(), -1))) < 1e-14  # grid points are nodes
    assert float(jnp.max(jnp.abs(api.project(g, jnp.asarray(_start())) - _start()))) < 1e-14
    X, Y, Z = _grid()
    grad = np.stack([np.cos(X) * np.cos(2 * Y), -2 * np.sin(X) * np.sin(2 * Y), 0 * Z], -1)  # ∇(sin x cos 2y)
    assert float(jnp.max(jnp.abs(api.project(g, jnp.asarray(grad))))) < 1e-14


def test_tgv_3d_equals_jaxsem_run(tess, api):
    """The tesseract's result is jaxsem's own run of the flow (the same mesh, Δt = dt/2, the
    vortex evaluated at the nodes) read at the grid points; its energy decays as e^{−6νt}."""
    out = tess.apply(_inputs(_tgv()))["result"]
    mesh = js.box_mesh(N // 2, 4, lengths=(L,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=float(np.float32(NU)), dt=float(np.float32(DT)) / SUB, options=api.OPTIONS)
    st = NS.simulate(ns, NS.initial_state(ns, flows.taylor_green().velocity), STEPS * SUB)
    x = np.asarray(ns.sem.x).reshape(3, -1)
    node = {tuple(np.round(p, 9)): i for i, p in enumerate(x.T)}
    at = [node[tuple(np.round(p, 9))] for p in np.stack(_grid(), -1).reshape(-1, 3)]
    ref = np.asarray(st.u).reshape(3, -1)[:, at].T.reshape(out.shape)
    assert np.max(np.abs(out - ref)) < 1e-6
    t = STEPS * float(np.float32(DT))
    ratio = np.sum(out.astype(np.float64) ** 2) / np.sum(_tgv() ** 2)
    assert abs(ratio / np.exp(-6 * NU * t) - 1) < 6e-3, ratio  # measured −4.1e-3: 3 elements of order 4 per 2π



def test_tgv_2d_decays_as_the_exact_solution(tess):
    X, Y, _ = _grid()
    X, Y = X[:, :, :1], Y[:, :, :1]
    v0 = np.stack([np.sin(X) * np.cos(Y), -np.cos(X) * np.sin(Y)], -1)  # (N, N, 1, 2)
    out = tess.apply(_inputs(v0, order=8))["result"]
    assert out.shape == (N, N, 1, 2)
    exact = v0 * np.exp(-2 * NU * STEPS * float(np.float32(DT)))
    assert np.max(np.abs(out - exact)) < 1e-5, np.max(np.abs(out - exact))  # measured 4.1e-6


@pytest.fixture(scope="module")
def derivatives(api):
    """At the float64 point of ``_inputs(_start())``: random directions (two of v0, then ν, then
    dt), the cotangent c = 2·result (of L = Σ result², Mosaic's loss), Jᵀc, and per direction
    J·d and the central difference (F(x + hd) − F(x − hd))/2h, h = 1e-4."""
    g = api.grid_map((N, N, N), L, 4)
    x = api.point(np.float32(_start()), np.float32(NU), np.float32(DT))
    rng = np.random.default_rng(7)
    zero = np.zeros(x[0].shape)
    dirs = [api.point(rng.standard_normal(x[0].shape), 0.0, 0.0) for _ in range(2)]
    dirs += [api.point(zero, 1.0, 0.0), api.point(zero, 0.0, 1.0)]
    static = dict(steps=STEPS, substeps=SUB)
    c = 2 * api.forward(g, *x, **static)
    grads = api.vjp(g, *x, c, **static, snapshots=2)
    jv = [api.jvp(g, x, d, **static)[1] for d in dirs]
    h = 1e-4
    fd = [(api.forward(g, *(a + h * b for a, b in zip(x, d)), **static)
           - api.forward(g, *(a - h * b for a, b in zip(x, d)), **static)) / (2 * h) for d in dirs]
    return g, x, dirs, c, grads, jv, fd


def test_vjp_matches_central_differences(derivatives):
    _, _, dirs, c, grads, _, fd = derivatives
    ad = np.array([sum(float(jnp.vdot(a, b)) for a, b in zip(grads, d)) for d in dirs])
    fd = np.array([float(jnp.vdot(c, f)) for f in fd])
    err = np.abs(ad - fd) / np.abs(fd)
    cos = ad @ fd / (np.linalg.norm(ad) * np.linalg.norm(fd))
    assert np.median(err) < 1e-6 and np.max(err) < 1e-5 and cos > 1 - 1e-10, (err, cos)


def test_jvp_matches_central_differences(derivatives):
    *_, jv, fd = derivatives
    err = [float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) for a, b in zip(jv, fd)]
    assert max(err) < 1e-5, err


def test_forward_and_reverse_mode_are_transposes(api, derivatives):
    """⟨J v, c⟩ = ⟨v, Jᵀ c⟩ with v moving v0, ν and dt at once (plain scan against the
    binomial schedule)."""
    g, x, dirs, c, grads, _, _ = derivatives
    v = (dirs[0][0], dirs[2][1], dirs[3][2])
    _, jv = api.jvp(g, x, v, steps=STEPS, substeps=SUB)
    lhs = float(jnp.vdot(jv, c))
    rhs = sum(float(jnp.vdot(a, b)) for a, b in zip(v, grads))
    assert abs(lhs - rhs) < 1e-10 * abs(lhs), (lhs, rhs)


def test_endpoints_return_the_float64_derivatives(tess, api, derivatives):
    g, x, dirs, c, *_ = derivatives
    inputs = _inputs(_start())
    out = tess.apply(inputs)["result"]
    ref = np.asarray(api.forward(g, *x, steps=STEPS, substeps=SUB))
    assert out.dtype == np.float32 and np.max(np.abs(out - ref)) < 1e-6
    ct = np.asarray(c, np.float32)
    back = tess.vector_jacobian_product(inputs, ["v0", "viscosity", "dt"], ["result"], {"result": ct})
    ref = api.vjp(g, *x, jnp.asarray(ct, np.float64), steps=STEPS, substeps=SUB, snapshots=2)
    for key, r in zip(("v0", "viscosity", "dt"), ref):
        assert back[key].shape == np.shape(inputs[key])
        np.testing.assert_allclose(back[key], np.reshape(r, np.shape(inputs[key])), rtol=1e-5,
                                   atol=1e-6 * float(jnp.max(jnp.abs(r))))
    tangent = {"v0": np.asarray(dirs[0][0], np.float32), "dt": np.array([1.0], np.float32)}
    fwd = tess.jacobian_vector_product(inputs, ["v0", "dt"], ["result"], tangent)["result"]
    _, r = api.jvp(g, x, api.point(tangent["v0"], 0.0, 1.0), steps=STEPS, substeps=SUB)
    assert np.max(np.abs(fwd - r)) < 1e-5 * float(jnp.max(jnp.abs(r)))


def test_jax_grad_through_apply_tesseract_is_the_vjp(tess):
    """Mosaic's path: ``jax.grad`` of Σ result² through ``tesseract_jax.apply_tesseract``."""
    tj = pytest.importorskip("tesseract_jax")
    inputs = _inputs(_start())
    v0 = jnp.asarray(inputs["v0"])
    grad = jax.grad(lambda v: jnp.sum(tj.apply_tesseract(tess, dict(inputs, v0=v))["result"] ** 2))(v0)
    out = tess.apply(inputs)["result"]
    ref = tess.vector_jacobian_product(inputs, ["v0"], ["result"], {"result": 2 * out})["v0"]
    np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-5, atol=1e-6 * np.max(np.abs(ref)))


def test_setup_is_built_once(tess, api):
    tess.apply(_inputs(_tgv()))  # builds it unless an earlier test on this worker did
    before = api.grid_map.cache_info()
    tess.apply(_inputs(_tgv()))
    after = api.grid_map.cache_info()
    assert after.misses == before.misses and after.hits > before.hits


@pytest.mark.parametrize("change, name", [
    (dict(v0=np.zeros((6, 6, 6, 2), np.float32)), "v0"),
    (dict(v0=np.zeros((6, 6, 4, 3), np.float32)), "v0"),
    (dict(v0=np.zeros((7, 7, 7, 3), np.float32)), "v0"),
    (dict(v0=np.zeros((2, 2, 2, 3), np.float32)), "v0"),
    (dict(viscosity=np.array([-0.01], np.float32)), "viscosity"),
    (dict(dt=np.array([0.0], np.float32)), "dt"),
    (dict(steps=-1), "steps"),
    (dict(domain_extent=-1.0), "domain_extent"),
    (dict(order=3), "order"),
    (dict(substeps=0), "substeps"),
    (dict(boundary_conditions=dict(y_lo=dict(type="no_slip"))), "boundary_conditions"),
    (dict(obstacle=dict(radius=0.1)), "obstacle"),
])
def test_bad_inputs_name_the_argument(tess, api, change, name):
    before = api.grid_map.cache_info().misses
    with pytest.raises(ValueError, match=name):
        tess.apply(dict(_inputs(_tgv()), **change))
    assert api.grid_map.cache_info().misses == before  # refused before any set-up
