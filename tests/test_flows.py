"""Exact flows satisfy the incompressible Navier–Stokes equations (by autodiff); the TGV reference
data reads back the values its README records."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem  # noqa: F401  (enables float64)
from jaxsem.models import flows

NUS = [1.0, 0.05, 1 / 1600, 0.0]
TIMES = [0.0, 0.3, 1.0]


def _points(n=20, seed=0):
    return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, (n, 3)))


def _curl(J):
    """∇×u from J[i, j] = ∂u_i/∂x_j."""
    return jnp.stack([J[2, 1] - J[1, 2], J[0, 2] - J[2, 0], J[1, 0] - J[0, 1]])


def _ns_terms(flow, X, t, nu):
    """(u_t, (u·∇)u, ∇p, ν∇²u, ∇·u, ∇×u) at one point X: (3,) by forward autodiff."""
    u = lambda X, t: flow.velocity(X[0], X[1], X[2], t)
    p = lambda X, t: flow.pressure(X[0], X[1], X[2], t)
    J = jax.jacfwd(u)(X, t)
    H = jax.jacfwd(jax.jacfwd(u))(X, t)
    return (jax.jacfwd(u, argnums=1)(X, t), J @ u(X, t), jax.grad(p)(X, t),
            nu * jnp.einsum("ijj->i", H), jnp.trace(J), _curl(J))


def _momentum_residual(flow, t, nu, pressure_sign=1.0):
    """max over points of |u_t + (u·∇)u + ∇p − ν∇²u| / (sum of the terms' magnitudes)."""
    ut, conv, gp, visc, _, _ = jax.vmap(lambda X: _ns_terms(flow, X, t, nu))(_points())
    res = ut + conv + pressure_sign * gp - visc
    scale = sum(jnp.linalg.norm(q, axis=-1) for q in (ut, conv, gp, visc))
    return float(jnp.max(jnp.linalg.norm(res, axis=-1) / scale))


@pytest.mark.parametrize("nu", NUS)
@pytest.mark.parametrize("t", TIMES)
def test_ethier_steinman_solves_navier_stokes(nu, t):
    flow = flows.ethier_steinman(nu=nu)
    assert flow.nu == nu
    assert _momentum_residual(flow, t, nu) < 1e-12
    _, _, _, _, div, curl = jax.vmap(lambda X: _ns_terms(flow, X, t, nu))(_points())
    u = jax.vmap(lambda X: flow.velocity(X[0], X[1], X[2], t))(_points())
    assert float(jnp.max(jnp.abs(div))) < 1e-12 * float(jnp.max(jnp.abs(u)))
    omega = jax.vmap(lambda X: flow.vorticity(X[0], X[1], X[2], t))(_points())
    np.testing.assert_allclose(omega, curl, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(curl))))


@pytest.mark.parametrize("t", [0.3, 1.0])
def test_ethier_steinman_residual_detects_errors(t):
    """The momentum check fails for a wrong viscosity or a wrong pressure sign."""
    flow = flows.ethier_steinman(nu=1.0)
    assert _momentum_residual(flow, t, nu=1.1) > 1e-2
    assert _momentum_residual(flow, t, nu=0.9) > 1e-2
    assert _momentum_residual(flow, t, nu=1.0, pressure_sign=-1.0) > 1e-2
    other = flows.ethier_steinman(a=np.pi / 4, d=np.pi / 3, nu=1.0)
    assert _momentum_residual(other, t, nu=1.0) < 1e-12  # other parameters are a solution too


def test_ethier_steinman_values_shapes_and_tracing():
    a, d, nu = np.pi / 4, np.pi / 2, 0.5
    flow = flows.ethier_steinman(a, d, nu)
    # at the origin every sine vanishes: u = v = w = −a e^{−νd²t}, p = −3a²/2 e^{−2νd²t} = −½|u|²
    t = 0.7
    np.testing.assert_allclose(flow.velocity(0.0, 0.0, 0.0, t), -a * np.exp(-nu * d**2 * t) * np.ones(3), rtol=1e-15)
    np.testing.assert_allclose(flow.pressure(0.0, 0.0, 0.0, t), -1.5 * a**2 * np.exp(-2 * nu * d**2 * t), rtol=1e-15)
    x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (3, 4, 5, 6)))
    u = flow.velocity(x[0], x[1], x[2], t)
    assert u.shape == (3, 4, 5, 6) and u.dtype == jnp.float64
    assert flow.pressure(x[0], x[1], x[2], t).shape == (4, 5, 6)
    assert flow.vorticity(x[0], 0.0, x[2], jnp.zeros((4, 5, 6))).shape == (3, 4, 5, 6)
    np.testing.assert_allclose(flow.pressure(x[0], x[1], x[2], t), -0.5 * jnp.sum(u**2, axis=0), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jax.jit(flow.velocity)(x[0], x[1], x[2], t), u, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kw, name", [({"nu": -1.0}, "nu"), ({"a": np.nan}, "a"), ({"d": np.inf}, "d"),
                                      ({"nu": [1.0, 2.0]}, "nu")])
def test_ethier_steinman_rejects_bad_parameters(kw, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        flows.ethier_steinman(**kw)


@pytest.mark.parametrize("V0", [1.0, 2.5])
def test_taylor_green_divergence_free_vorticity_and_pressure(V0):
    """∇·u = 0, ω = ∇×u, and p solves the pressure Poisson equation ∇²p = −∂_j u_i ∂_i u_j."""
    tg = flows.taylor_green(V0)
    X = _points(seed=2) * np.pi
    u = lambda X: tg.velocity(X[0], X[1], X[2])
    p = lambda X: tg.pressure(X[0], X[1], X[2])
    J = jax.vmap(jax.jacfwd(u))(X)
    lap_p = jax.vmap(lambda X: jnp.trace(jax.hessian(p)(X)))(X)
    scale = V0**2
    assert float(jnp.max(jnp.abs(jnp.trace(J, axis1=1, axis2=2)))) < 1e-14 * V0
    np.testing.assert_allclose(jax.vmap(lambda X: tg.vorticity(X[0], X[1], X[2]))(X), jax.vmap(_curl)(J),
                               rtol=0, atol=1e-14 * V0)
    np.testing.assert_allclose(lap_p, -jnp.einsum("nij,nji->n", J, J), rtol=0, atol=1e-13 * scale)
    # the check can fail: a pressure off by a factor does not solve it
    assert float(jnp.max(jnp.abs(1.1 * lap_p + jnp.einsum("nij,nji->n", J, J)))) > 1e-2 * scale


@pytest.mark.parametrize("V0", [1.0, 2.0])
def test_taylor_green_volume_averages(V0):
    """⟨½|u|²⟩ = V0²/8 and ⟨½|ω|²⟩ = 3V0²/8 on [−π, π]³ (Gauss–Legendre, converged to round-off)."""
    tg = flows.taylor_green(V0)
    xi, wi = np.polynomial.legendre.leggauss(32)
    x, w = np.pi * xi, np.pi * wi
    X = np.stack(np.meshgrid(x, x, x, indexing="ij"))
    W = w[:, None, None] * w[None, :, None] * w[None, None, :] / (2 * np.pi) ** 3
    u = tg.velocity(*X)
    J = jax.vmap(jax.jacfwd(lambda X: tg.velocity(X[0], X[1], X[2])))(X.reshape(3, -1).T)
    omega = jax.vmap(_curl)(J).T.reshape(u.shape)
    np.testing.assert_allclose(np.sum(W * 0.5 * jnp.sum(u**2, 0)), 0.125 * V0**2, rtol=1e-13)
    np.testing.assert_allclose(np.sum(W * 0.5 * jnp.sum(omega**2, 0)), 0.375 * V0**2, rtol=1e-13)
    np.testing.assert_allclose(np.sum(W * tg.pressure(*X)), 0.0, atol=1e-14 * V0**2)


@pytest.fixture
def reference():
    ref = flows.tgv_reference()
    if ref is None:
        pytest.skip(f"TGV reference data absent (set {flows.TGV_REFERENCE_ENV} or add ../shared/data/tgv)")
    return ref


def test_packaged_tgv_table_is_the_dns_at_its_times(monkeypatch):
    """The table shipped in the package (a fresh clone's reference): the DNS rows every 0.1 plus the
    dissipation peak and the last row, values as in the file; equal to the full file where present."""
    monkeypatch.delenv(flows.TGV_REFERENCE_ENV, raising=False)
    monkeypatch.setattr(flows, "_SHARED_PATH", flows._PACKAGED_PATH.parent / "absent.gdiag")
    ref = flows.tgv_reference()
    assert ref is not None and ref.path == flows._PACKAGED_PATH and ref.time.shape == (202,)
    assert ref.peak_dissipation() == (8.97, 0.012857528187)
    for t, E in {5: 0.118435751357, 9: 0.086403858222, 10: 0.0744791681585, 19.99: 0.0215673592481}.items():
        assert float(ref.at(t).kinetic_energy) == E, t
    assert float(ref.at(9.0).dissipation) == 0.012854539499
    full = flows.tgv_reference(flows._SHARED_PATH) if flows._SHARED_PATH.is_file() else None
    if full is not None:
        i = np.searchsorted(full.time, ref.time)
        for a, b in ((full.kinetic_energy, ref.kinetic_energy), (full.dissipation, ref.dissipation),
                     (full.enstrophy, ref.enstrophy), (full.time, ref.time)):
            np.testing.assert_array_equal(a[i], b)


def test_tgv_reference_key_values(reference):
    ref = reference
    if ref.path != flows._SHARED_PATH:
        pytest.skip("the full 2000-row DNS file is not here (../shared/data/tgv); the packaged table is tested above")
    assert ref.time.shape == ref.kinetic_energy.shape == ref.dissipation.shape == ref.enstrophy.shape == (2000,)
    assert ref.time[0] == 0.0 and ref.time[-1] == 19.99
    np.testing.assert_allclose(np.diff(ref.time), 0.01, atol=1e-12)
    assert ref.peak_dissipation() == (8.97, 0.012857528187)
    assert ref.kinetic_energy[0] == 0.125 and ref.enstrophy[0] == 0.375
    i = int(np.argmax(ref.enstrophy))
    assert (ref.time[i], ref.enstrophy[i]) == (8.97, 10.2861271303)
    expected = {5: 0.118435751357, 8: 0.0982898834307, 9: 0.086403858222, 10: 0.0744791681585,
                12: 0.0544416581953, 15: 0.0364387248782, 19.99: 0.0215673592481}
    for t, E in expected.items():
        assert float(ref.at(t).kinetic_energy) == E, t
    assert float(ref.at(9.0).dissipation) == 0.012854539499
    assert float(ref.at(10.0).dissipation) == 0.011272054483
    assert float(ref.at(19.99).dissipation) == 0.001873496392
    # ε = 2νZ (incompressible, ν = 1/1600): the data hold it to 2.8e-5 pointwise (largest near t = 6.7)
    np.testing.assert_allclose(ref.dissipation, 2 / 1600 * ref.enstrophy, rtol=3e-5)
    with pytest.raises(ValueError):
        ref.kinetic_energy[0] = 1.0  # read-only


def test_tgv_reference_interpolation(reference):
    if reference.path != flows._SHARED_PATH:
        pytest.skip("needs the full 2000-row DNS file (../shared/data/tgv)")
    s = reference.at(np.array([[0.005, 9.995]]))
    assert s.kinetic_energy.shape == (1, 2)
    np.testing.assert_allclose(s.kinetic_energy[0, 0], 0.5 * (reference.kinetic_energy[0] + reference.kinetic_energy[1]),
                               rtol=1e-15)
    np.testing.assert_allclose(s.enstrophy[0, 1], 0.5 * (reference.enstrophy[999] + reference.enstrophy[1000]), rtol=1e-15)
    for bad in (20.0, -0.01, np.nan):
        with pytest.raises(ValueError, match="^t must lie"):
            reference.at(bad)


def _write(path, lines):
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    return path


def test_tgv_reference_search_order(tmp_path, monkeypatch):
    small = _write(tmp_path / "small.gdiag", ["# header", "# t E eps Z", "0 0.125 0.1 0.375", "1 0.025 0.1 0.3"])
    monkeypatch.setenv(flows.TGV_REFERENCE_ENV, str(small))
    ref = flows.tgv_reference()
    assert ref.path == small and list(ref.time) == [0.0, 1.0] and list(ref.enstrophy) == [0.375, 0.3]
    monkeypatch.setenv(flows.TGV_REFERENCE_ENV, str(tmp_path / "absent.gdiag"))
    with pytest.raises(FileNotFoundError, match=f"{flows.TGV_REFERENCE_ENV}.*absent.gdiag"):
        flows.tgv_reference()
    monkeypatch.delenv(flows.TGV_REFERENCE_ENV)
    monkeypatch.setattr(flows, "_SHARED_PATH", tmp_path / "absent.gdiag")
    assert flows.tgv_reference().path == flows._PACKAGED_PATH
    monkeypatch.setattr(flows, "_PACKAGED_PATH", tmp_path / "absent.txt")
    assert flows.tgv_reference() is None
    with pytest.raises(FileNotFoundError, match="^path: .*absent.gdiag"):
        flows.tgv_reference(tmp_path / "absent.gdiag")


@pytest.mark.parametrize("lines, message", [
    (["# h", "0 0.125 0.1", "1 0.1 0.1"], "line 2: expected 4 columns .* got 3"),
    (["0 0.125 0.1 0.375", "1 0.1 x 0.3"], "line 2: non-numeric"),
    (["0 0.125 0.1 0.375"], "at least 2 data rows, got 1"),
    (["0 0.125 0.1 0.375", "0 0.1 0.1 0.3"], "times must increase"),
    (["0 0.125 0.1 0.375", "1 nan 0.1 0.3"], "non-finite"),
])
def test_tgv_reference_malformed(tmp_path, lines, message):
    bad = _write(tmp_path / "bad.gdiag", lines)
    with pytest.raises(ValueError, match=f"^path: .*{bad.name}.*{message}"):
        flows.tgv_reference(bad)
