"""The thermal-mesh tesseract (tesseracts/thermal-mesh): Mosaic's heated block against exact
solutions and Mosaic's stored references; gradients against central differences, both
through the tesseract's float32 endpoints and through the float64 map inside."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

Tesseract = pytest.importorskip("tesseract_core").Tesseract
apply_tesseract = pytest.importorskip("tesseract_jax").apply_tesseract

from jaxsem import gradcheck  # noqa: E402

API = pathlib.Path(__file__).resolve().parents[1] / "tesseracts" / "thermal-mesh" / "tesseract_api.py"
_spec = importlib.util.spec_from_file_location("thermal_mesh_api", API)
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)


@pytest.fixture(scope="module")
def tess():
    return Tesseract.from_tesseract_api(ta)  # the module itself: its plans and compiled maps are shared


def _k(rho):
    return float(ta.conductivity(rho, 1.0, 3.0))


def _mosaic_rho(N):
    """Mosaic's "random" density (benchmarks/problems/thermal_mesh/ics.py, seed 0) on N × N/2 × 1."""
    rng = np.random.default_rng(0)
    rho = 0.5 + 0.3 * rng.standard_normal(N * (N // 2)).astype(np.float32)
    return np.clip(rho, 0.05, 0.95).astype(np.float32)


def _mosaic_gaussian(N, Lx=2.0, Ly=1.0):
    """Mosaic's "gaussian_source" (amplitude 1, centre (Lx/2, Ly/2), width 0.2) at cell centres."""
    xs, ys = (np.arange(N) + 0.5) * Lx / N, (np.arange(N // 2) + 0.5) * Ly / (N // 2)
    X, Y = np.meshgrid(xs, ys, indexing="xy")
    return np.exp(-((X - Lx / 2) ** 2 + (Y - Ly / 2) ** 2) / (2 * 0.2**2)).ravel().astype(np.float32)


def _general_inputs():
    """3-D, non-uniform everything: random ρ and f, hot spot, T = 0.25 on x = 0, a target field."""
    rng = np.random.default_rng(3)
    inputs = ta.heated_block_inputs(5, 3, 3, rho=rng.uniform(0.1, 0.9, 45), source=rng.normal(size=45),
                                    hot_spot=True)
    inputs["boundary_conditions"]["dirichlet"]["values"] = np.full((1, 1), 0.25, np.float32)
    x = inputs["hex_mesh"]["points"]
    inputs["target_temperature"] = (4.0 * x[:, 0] + np.sin(3 * x[:, 1])).astype(np.float32)
    return inputs


@pytest.mark.parametrize("order", [1, 2])
def test_one_dimensional_conduction_is_exact(tess, order):
    # uniform ρ, T = 0 at x = 0, flux q at x = L: T = q x / k, C = q² L A / k, I = Σ_nodes T²; the
    # adjoint of C is T itself, so dC/dρ_e = −k'(ρ) |∇T|² V_e and dC/df_e = ∫_e T (order 2: p-multigrid)
    inputs = ta.heated_block_inputs(6, 3, 3, lengths=(2.0, 1.0, 0.5), rho=0.6, Q_total=0.5, order=order)
    rho, q = float(np.float32(0.6)), 0.5 / 0.5
    k, dk = _k(rho), 3 * rho**2 * (1 - 1e-3)
    out = tess.apply(inputs)
    assert out["thermal_compliance"] == pytest.approx(q**2 * 2.0 * 0.5 / k, rel=2e-6)
    points = inputs["hex_mesh"]["points"].astype(np.float64)
    assert out["identification_error"] == pytest.approx(np.sum((q * points[:, 0] / k) ** 2), rel=2e-6)
    g = tess.vector_jacobian_product(inputs, ["rho", "source"], ["thermal_compliance"], {"thermal_compliance": 1.0})
    volume = (2.0 / 6) * (1.0 / 3) * (0.5 / 3)
    np.testing.assert_allclose(g["rho"], -dk * (q / k) ** 2 * volume, rtol=1e-5)
    centre = points[inputs["hex_mesh"]["faces"]][:, :, 0].mean(axis=1)
    np.testing.assert_allclose(g["source"], q * centre / k * volume, rtol=1e-5)


def test_matches_mosaic_references(tess):
    # Mosaic a535cb3, mosaic/benchmarks/problems/thermal_mesh/references/*.npz (the entrants' trimmed
    # mean) on the harness's 16 × 8 × 1 block (Lz = Lx / nx, Q_total = 1): forward_agreement ρ₀ = 0.05
    # and 0.95, forward_baseline N = 16 (random ρ), forward_source_linearity amplitude 4 (ρ₀ = 0.5)
    block = lambda **kw: ta.heated_block_inputs(16, 8, 1, lengths=(2.0, 1.0, 2.0 / 16), **kw)
    cases = [(block(rho=0.05), 14223.803), (block(rho=0.95), 18.65851), (block(rho=_mosaic_rho(16)), 122.75734),
             (block(rho=0.5, source=4 * _mosaic_gaussian(16)), 135.00858)]
    for inputs, reference in cases:
        assert tess.apply(inputs)["thermal_compliance"] == pytest.approx(reference, rel=1e-5)


def test_padding_and_uniform_fields(tess):
    # arrays padded beyond the active counts change nothing; a one-value source or target is uniform
    inputs = {**_general_inputs(), "source": np.full(1, 0.7, np.float32),
              "target_temperature": np.full(1, 0.3, np.float32)}
    padded = {**_general_inputs(), "source": np.full(45, 0.7, np.float32),
              "target_temperature": np.full(96 + 7, 0.3, np.float32)}
    m, bc = padded["hex_mesh"], padded["boundary_conditions"]
    m["points"] = np.concatenate([m["points"], np.ones((7, 3), np.float32)])
    m["faces"] = np.concatenate([m["faces"], np.zeros((5, 8), np.int32)])
    for c in bc.values():
        c["mask"] = np.concatenate([c["mask"], np.ones(7, np.int32)])
    padded["rho"] = np.concatenate([padded["rho"], np.full(5, 9.0, np.float32)])
    a, b = tess.apply(inputs), tess.apply(padded)
    assert a["thermal_compliance"] == pytest.approx(b["thermal_compliance"], rel=1e-6)
    assert a["identification_error"] == pytest.approx(b["identification_error"], rel=1e-6)
    cot = {"thermal_compliance": 1.0}
    ga = tess.vector_jacobian_product(inputs, ["rho", "source"], ["thermal_compliance"], cot)
    gb = tess.vector_jacobian_product(padded, ["rho", "source"], ["thermal_compliance"], cot)
    assert gb["rho"].shape == (50,) and np.all(gb["rho"][45:] == 0)
    np.testing.assert_allclose(ga["rho"], gb["rho"][:45], rtol=1e-5)
    assert ga["source"].shape == (1,) and ga["source"][0] == pytest.approx(gb["source"].sum(), rel=1e-5)


def _directions(rng, inputs, count):
    return [{"rho": rng.normal(size=inputs["rho"].shape), "source": rng.normal(size=inputs["source"].shape)}
            for _ in range(count)]


def test_endpoints_against_central_differences(tess):
    # float32 at the schema: steps of 1e-2 along unit directions, Mosaic's thresholds
    inputs = _general_inputs()
    cot = {"thermal_compliance": 0.7, "identification_error": -0.2}
    loss = lambda i: sum(c * float(tess.apply(i)[o]) for o, c in cot.items())
    vjp = tess.vector_jacobian_product(inputs, ["rho", "source"], list(cot), cot)
    rng = np.random.default_rng(0)
    ad_r, ad_f, fd = [], [], []
    for d in _directions(rng, inputs, 4):
        scale = np.sqrt(sum(np.sum(v**2) for v in d.values()))
        d = {k: v / scale for k, v in d.items()}
        step = lambda s: {**inputs, **{k: (inputs[k] + s * 1e-2 * d[k]).astype(np.float32) for k in d}}
        fd.append((loss(step(1)) - loss(step(-1))) / 2e-2)
        ad_r.append(sum(np.dot(vjp[k], d[k]) for k in d))
        jvp = tess.jacobian_vector_product(inputs, ["rho", "source"], list(cot), d)
        ad_f.append(sum(c * float(jvp[o]) for o, c in cot.items()))
    for ad in (ad_r, ad_f):
        ad, fdv = np.array(ad), np.array(fd)
        assert np.median(np.abs(ad - fdv) / np.abs(fdv)) <= 1e-3
        assert np.dot(ad, fdv) / np.linalg.norm(ad) / np.linalg.norm(fdv) >= 0.999
    # the dot-product test through the endpoints: <J v, w> = <v, Jᵀ w> (float32 outputs)
    np.testing.assert_allclose(ad_f, ad_r, rtol=1e-5)
    # jax.grad through tesseract-jax, as Mosaic's harness differentiates, is the VJP endpoint
    out = lambda r: apply_tesseract(tess, {**inputs, "rho": r})
    g = jax.grad(lambda r: sum(c * out(r)[o] for o, c in cot.items()))(jnp.asarray(inputs["rho"]))
    np.testing.assert_allclose(g, vjp["rho"], rtol=1e-5, atol=1e-6 * np.abs(vjp["rho"]).max())


def test_float64_map_against_central_differences():
    # the map inside, float64 end to end: far below Mosaic's thresholds
    plan, rho, source, target, k_max, p_exp, precond = ta.prepare(ta.InputSchema.model_validate(_general_inputs()))
    f = lambda x: ta.outputs(plan, x["rho"], x["source"], target, k_max, p_exp, precond)[:2]
    loss = lambda x: 0.7 * f(x)[0] - 0.2 * f(x)[1]
    check = gradcheck.check_gradient(loss, {"rho": rho, "source": source}, directions=4, h=1e-5)
    assert check.median_error <= 1e-6 and check.cosine >= 1 - 1e-10
    # the dot-product test of the endpoints' float64 maps (compiled above): <J v, w> = <v, Jᵀ w>
    rng = np.random.default_rng(1)
    v = tuple(jnp.asarray(rng.normal(size=x.shape)) for x in (rho, source))
    w = tuple(jnp.asarray(rng.normal()) for _ in range(2))
    Jv = ta._jvp(plan, rho, source, target, k_max=k_max, p_exp=p_exp, precond=precond, tangents=v)
    JTw = ta._vjp(plan, rho, source, target, k_max=k_max, p_exp=p_exp, precond=precond, cot=w)
    lhs, rhs = sum(float(a * b) for a, b in zip(Jv, w)), sum(float(jnp.dot(a, b)) for a, b in zip(v, JTw))
    assert abs(lhs - rhs) <= 1e-9 * abs(lhs)


@pytest.mark.parametrize("change, match", [
    (lambda i: i["hex_mesh"].update(n_faces=999), "hex_mesh.n_faces"),
    (lambda i: i["hex_mesh"].update(n_points=0), "hex_mesh.n_points"),
    (lambda i: i.update(rho=i["rho"][:5]), "rho must have length"),
    (lambda i: i.update(source=i["source"][:5]), "source must have length"),
    (lambda i: i.update(order=0), "order must be"),
    (lambda i: i["boundary_conditions"].update(dirichlet=None), "boundary_conditions.dirichlet"),
    (lambda i: i["boundary_conditions"]["dirichlet"]["mask"].fill(0), "boundary_conditions.dirichlet.mask"),
    (lambda i: i["boundary_conditions"]["dirichlet"]["mask"].__setitem__(13, 1), "boundary_conditions.dirichlet.mask"),
    (lambda i: i["boundary_conditions"]["neumann"].update(values=np.ones((1, 2), np.float32)),
     "boundary_conditions.neumann.values"),
    (lambda i: i["boundary_conditions"]["neumann"]["mask"].__setitem__(-1, 2), "names group 2"),
])
def test_bad_inputs_raise_value_errors_naming_them(tess, change, match):
    inputs = ta.heated_block_inputs(4, 2, 1)
    change(inputs)
    with pytest.raises(ValueError, match=match):
        ta.apply(ta.InputSchema.model_validate(inputs))
    with pytest.raises(RuntimeError, match=f"ValueError: .*{match}"):  # the tesseract wraps endpoint errors
        tess.apply(inputs)
