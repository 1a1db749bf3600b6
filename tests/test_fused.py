"""Fused Pallas BK5 kernel (jaxsem.operators.fused) against the einsum reference.

On CPU the kernel runs in the Pallas interpreter (tiny sizes); on a GPU the same
tests compile it with Triton.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import basis
from jaxsem.backends import cuda as cuda_kernels
from jaxsem.operators.fused import (
    FusedConfig, _fused_apply, default_config, fused_supported, stiffness_gll_auto, stiffness_gll_fused,
)
from jaxsem.operators.stiffness import stiffness_gll

INTERPRET = jax.default_backend() != "gpu"


def _inputs(seed, E, n, dtype=jnp.float64, gll=True):
    rng = np.random.default_rng(seed)
    u = jnp.asarray(rng.standard_normal((E, n, n, n)), dtype)
    G = jnp.asarray(rng.standard_normal((6, E, n, n, n)), dtype)
    if gll:
        D = jnp.asarray(basis.derivative_matrix(basis.gll_points(n - 1)[0]), dtype)
    else:
        D = jnp.asarray(rng.standard_normal((n, n)), dtype)
    return u, D, G


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


# (n, E, config): power-of-two n (contiguous loads) and padded n (masked gathers);
# E = 1, E < block, E not a multiple of the block (last block shifted back).
CASES = [
    (8, 5, FusedConfig("chunk", 2, 4)),
    (8, 3, FusedConfig("chunk", 4, 4)),
    (8, 7, FusedConfig("chunk", 2, 4, 2, programs=3)),  # persistent grid, clamped tail
    (8, 3, FusedConfig("kron", 2, 4)),
    (8, 3, FusedConfig("mixed", 2, 4)),
    (8, 3, FusedConfig("bcast", 2, 4)),
    (4, 9, FusedConfig("chunk", 8, 2)),
    (6, 3, FusedConfig("chunk", 2, 4)),
    (3, 1, FusedConfig("chunk", 4, 4)),
    (2, 3, FusedConfig("bcast", 1, 4)),
    (10, 2, FusedConfig("chunk", 1, 8)),
]


@pytest.mark.parametrize("n, E, cfg", CASES, ids=lambda x: str(x))
def test_fused_matches_einsum_fp64(n, E, cfg):
    u, D, G = _inputs(n * 100 + E, E, n, gll=(n % 2 == 0))
    ref = stiffness_gll(u, D, G)
    # output buffer poisoned with NaN: every point must be written
    w = _fused_apply(u, D, G, cfg, INTERPRET, poison=jnp.nan)
    assert not bool(jnp.isnan(w).any())
    assert w.shape == ref.shape and w.dtype == jnp.float64
    assert _rel(w, ref) < 1e-13


def test_fused_fp32():
    u, D, G = _inputs(7, 5, 8, jnp.float32)
    w = stiffness_gll_fused(u, D, G, interpret=INTERPRET)
    assert w.dtype == jnp.float32
    ref = stiffness_gll(*(x.astype(jnp.float64) for x in (u, D, G)))
    assert _rel(w, ref) < 1e-5


def test_public_entry_points_and_h1():
    u, D, G = _inputs(3, 3, 4)
    h1 = 0.7
    w = jax.jit(lambda u, D, G: stiffness_gll_fused(u, D, G, h1, interpret=INTERPRET))(u, D, G)
    assert _rel(w, stiffness_gll(u, D, G, h1)) < 1e-13
    # leading (component) axis applied one by one
    u3 = jnp.stack([u, 2 * u, -u])
    assert _rel(stiffness_gll_fused(u3, D, G, interpret=INTERPRET), stiffness_gll(u3, D, G)) < 1e-13
    # the selector: einsum on CPU, either way the same numbers
    for impl in ("auto", "einsum", "pallas"):
        kw = {"interpret": INTERPRET} if impl == "pallas" else {}
        assert _rel(stiffness_gll_auto(u, D, G, impl=impl, **kw), stiffness_gll(u, D, G)) < 1e-13
    with pytest.raises(ValueError):
        stiffness_gll_auto(u, D, G, impl="cuda")
    with pytest.raises(ValueError):
        stiffness_gll_fused(u, D, G, elements_per_block=3)
    assert fused_supported(u) and not fused_supported(u[..., :2])
    assert default_config(8).variant in ("chunk", "kron", "mixed", "bcast")


def test_derivatives_match_reference():
    """Reverse and forward mode through the fused kernel (its JVP is the reference's)."""
    u, D, G = _inputs(11, 3, 4)
    v = jnp.asarray(np.random.default_rng(12).standard_normal(u.shape))
    f = lambda u, D, G: jnp.vdot(v, stiffness_gll_fused(u, D, G, interpret=INTERPRET))
    f_ref = lambda u, D, G: jnp.vdot(v, stiffness_gll(u, D, G))
    gu, gD, gG = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(u, D, G)
    ru, rD, rG = jax.grad(f_ref, argnums=(0, 1, 2))(u, D, G)
    assert _rel(gu, ru) < 1e-13 and _rel(gD, rD) < 1e-13 and _rel(gG, rG) < 1e-13
    # symmetric operator: the u-gradient is A v
    assert _rel(gu, stiffness_gll(v, D, G)) < 1e-13
    # d/du of <A u, A u>/2 = A A u
    h = jax.grad(lambda u: 0.5 * jnp.sum(stiffness_gll_fused(u, D, G, interpret=INTERPRET) ** 2))(u)
    assert _rel(h, stiffness_gll(stiffness_gll(u, D, G), D, G)) < 1e-12
    # forward mode in G (the operator is linear in G too: the tangent is A(u; dG))
    dG = jnp.asarray(np.random.default_rng(13).standard_normal(G.shape))
    w, dw = jax.jvp(lambda G: stiffness_gll_fused(u, D, G, interpret=INTERPRET), (G,), (dG,))
    assert _rel(w, stiffness_gll(u, D, G)) < 1e-13 and _rel(dw, stiffness_gll(u, D, dG)) < 1e-13


# ----------------------------------------------------------------------------- Gauss kernels, vectors, bk_apply

from jaxsem import geometry as geo
from jaxsem.operators import BK_SPECS, bk_apply, mass, stiffness
from jaxsem.operators.bk import bk_impl
from jaxsem.operators.fused import (
    _gauss_apply, default_config_gauss, gauss_fused_supported, mass_auto, mass_fused, stiffness_auto, stiffness_fused,
)


def _gauss_inputs(seed, E, p, comps=None, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    Q = geo.quadrature(p, "gauss")
    n, q = p + 1, p + 2
    u = jnp.asarray(rng.standard_normal(((comps,) if comps else ()) + (E, n, n, n)), dtype)
    B = jnp.asarray(rng.standard_normal((E, q, q, q)), dtype)
    G = jnp.asarray(rng.standard_normal((6, E, q, q, q)), dtype)
    return u, jnp.asarray(Q.J, dtype), jnp.asarray(Q.Dt, dtype), B, G


# (op, p, components, E, config): k padding of the u tile (p = 3, eb = 2: NK = 8 > NP = 4),
# a ragged last block (E = 5, eb = 4), the component loop (B/G read once per element).
GAUSS_CASES = [
    ("mass", 3, 3, 3, FusedConfig("chunk", 2, 4)),
    ("stiffness", 3, None, 3, FusedConfig("chunk", 2, 4)),
    ("stiffness", 2, 3, 5, FusedConfig("chunk", 4, 4)),
    # the mass defaults MASS_CONFIGS picks (p = 3: eb 4, ragged E; p = 7: eb 2, QP 16)
    ("mass", 3, None, 5, FusedConfig("chunk", 4, 4)),
    ("mass", 7, None, 3, FusedConfig("chunk", 2, 4)),
]


@pytest.mark.parametrize("op, p, comps, E, cfg", GAUSS_CASES, ids=lambda x: str(x))
def test_gauss_fused_matches_einsum_fp64(op, p, comps, E, cfg):
    u, J, Dt, B, G = _gauss_inputs(10 * p + E, E, p, comps)
    data = B if op == "mass" else G
    ref = mass(u, J, B) if op == "mass" else stiffness(u, J, Dt, G)
    w = _gauss_apply(u, J, Dt, data, op, cfg, INTERPRET, poison=jnp.nan)
    assert not bool(jnp.isnan(w).any())
    assert w.shape == ref.shape and w.dtype == jnp.float64
    assert _rel(w, ref) < 1e-13


def test_bk6_is_one_kernel_with_g_read_once():
    u, D, G = _inputs(21, 3, 4)
    u3 = jnp.stack([u, -2 * u, u * u])
    w = _fused_apply(u3, D, G, FusedConfig("chunk", 2, 4), INTERPRET, poison=jnp.nan)
    assert w.shape == u3.shape and not bool(jnp.isnan(w).any())
    assert _rel(w, stiffness_gll(u3, D, G)) < 1e-13
    jaxpr = str(jax.make_jaxpr(lambda u: stiffness_gll_fused(u, D, G, interpret=INTERPRET))(u3))
    assert jaxpr.count("pallas_call") == 1


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_bk_apply_fused_matches_einsum(k):
    spec = BK_SPECS[k]
    p = 2
    Q = geo.quadrature(p, spec.quadrature)
    q = Q.J.shape[0]
    rng = np.random.default_rng(k)
    u = jnp.asarray(rng.standard_normal(((3,) if spec.components == 3 else ()) + (2, p + 1, p + 1, p + 1)))
    G = jnp.asarray(rng.standard_normal((6, 2, q, q, q)))
    B = jnp.asarray(rng.standard_normal((2, q, q, q)))
    J, Dt = jnp.asarray(Q.J), jnp.asarray(Q.Dt)
    ref = bk_apply(spec, u, J, Dt, G, B, impl="einsum")
    w = bk_apply(spec, u, J, Dt, G, B, impl="fused")
    assert _rel(w, ref) < 1e-13
    assert bk_impl(spec, u, J, "fused") == "pallas" and bk_impl(spec, u, J, "einsum") == "einsum"
    # auto: the CUDA kernel where it builds, else einsum; never Pallas unless asked for
    assert bk_impl(spec, u, J, "auto") == ("cuda" if cuda_kernels.cuda_available() else "einsum")


def test_gauss_vjp_and_entry_points():
    u, J, Dt, B, G = _gauss_inputs(5, 2, 2)
    v = jnp.asarray(np.random.default_rng(6).standard_normal(u.shape))
    f = lambda u, J, Dt, G: jnp.vdot(v, stiffness_fused(u, J, Dt, G, interpret=INTERPRET))
    f_ref = lambda u, J, Dt, G: jnp.vdot(v, stiffness(u, J, Dt, G))
    got = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(u, J, Dt, G)
    want = jax.grad(f_ref, argnums=(0, 1, 2, 3))(u, J, Dt, G)
    for a, b in zip(got, want):
        assert _rel(a, b) < 1e-13
    assert _rel(got[0], stiffness(v, J, Dt, G)) < 1e-13  # symmetric: the u-gradient is A v
    gm = jax.grad(lambda u, B: jnp.vdot(v, mass_fused(u, J, B, 0.5, interpret=INTERPRET)), argnums=(0, 1))(u, B)
    gr = jax.grad(lambda u, B: jnp.vdot(v, mass(u, J, B, 0.5)), argnums=(0, 1))(u, B)
    assert _rel(gm[0], gr[0]) < 1e-13 and _rel(gm[1], gr[1]) < 1e-13
    # FP32 and the selectors (einsum on CPU for "auto")
    u32, J32, Dt32, _, G32 = _gauss_inputs(5, 2, 2, dtype=jnp.float32)
    w32 = stiffness_fused(u32, J32, Dt32, G32, interpret=INTERPRET)
    assert w32.dtype == jnp.float32
    assert _rel(w32, stiffness(u, J, Dt, G32.astype(jnp.float64))) < 1e-5
    assert _rel(stiffness_auto(u, J, Dt, G, 2.0, impl="auto"), stiffness(u, J, Dt, G, 2.0)) < 1e-13
    assert _rel(mass_auto(u, J, B, impl="einsum"), mass(u, J, B)) < 1e-13
    with pytest.raises(ValueError, match="impl"):
        mass_auto(u, J, B, impl="cuda")
    with pytest.raises(ValueError, match="elements_per_block"):
        stiffness_fused(u, J, Dt, G, elements_per_block=1)  # eb·QP = 4 < 16
    assert gauss_fused_supported(u, J) and not gauss_fused_supported(u, jnp.zeros((17, 3)))
    cfg = default_config_gauss(8, 9)
    assert (cfg.elements_per_block, cfg.num_warps) == (1, 8)
    # mass: the launches measured best on an H100 (p = 3 and 7), the rule elsewhere
    assert [(c.elements_per_block, c.num_warps) for c in
            (default_config_gauss(n, n + 1, op="mass") for n in (4, 6, 8, 10))] == [(4, 4), (2, 4), (2, 4), (1, 8)]
