"""Fused Pallas BK5 kernel (jaxsem.operators.fused) against the einsum reference.

On CPU the kernel runs in the Pallas interpreter (tiny sizes); on a GPU the same
tests compile it with Triton.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import basis
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


def test_vjp_is_the_operator_and_matches_reference():
    u, D, G = _inputs(11, 3, 4)
    v = jnp.asarray(np.random.default_rng(12).standard_normal(u.shape))
    f = lambda u, D, G: jnp.vdot(v, stiffness_gll_fused(u, D, G, interpret=INTERPRET))
    f_ref = lambda u, D, G: jnp.vdot(v, stiffness_gll(u, D, G))
    gu, gD, gG = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(u, D, G)
    ru, rD, rG = jax.grad(f_ref, argnums=(0, 1, 2))(u, D, G)
    assert _rel(gu, ru) < 1e-13 and _rel(gD, rD) < 1e-13 and _rel(gG, rG) < 1e-13
    # symmetric operator: the u-gradient is A v
    assert _rel(gu, stiffness_gll(v, D, G)) < 1e-13
    # second order through the custom VJP: d/du of <A u, A u>/2 = A A u
    h = jax.grad(lambda u: 0.5 * jnp.sum(stiffness_gll_fused(u, D, G, interpret=INTERPRET) ** 2))(u)
    assert _rel(h, stiffness_gll(stiffness_gll(u, D, G), D, G)) < 1e-12
