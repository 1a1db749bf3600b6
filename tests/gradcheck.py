"""Gradient checks shared by the model tests: the dot-product test and central differences.

``dot_product_test`` compares ⟨J v, w⟩ (forward mode) with ⟨v, Jᵀ w⟩ (reverse mode) for
random element-local ``v`` and ``w``: discontinuous across shared nodes, so an adjoint
that is right only on continuous fields (multiplicity weights, masks, a projection on
one side) fails it. ``directional_errors`` compares ⟨∇L, v⟩ with central differences of
L along several random directions.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _random_like(rng, tree):
    return jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(np.shape(a)), jnp.result_type(a)), tree)


def _vdot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def dot_product_test(f, x, seed=0, trials=2):
    """Relative |⟨J v, w⟩ − ⟨v, Jᵀ w⟩| / |⟨J v, w⟩| of ``f`` at ``x`` for ``trials`` random
    pairs (v, w) of standard normal entries: a list of floats."""
    rng = np.random.default_rng(seed)
    jvp = jax.jit(lambda x, v: jax.jvp(f, (x,), (v,))[1])
    vjp = jax.jit(lambda x, w: jax.vjp(f, x)[1](w)[0])
    out = []
    for _ in range(trials):
        v = _random_like(rng, x)
        jv = jvp(x, v)
        w = _random_like(rng, jv)
        a, b = float(_vdot(jv, w)), float(_vdot(v, vjp(x, w)))
        out.append(abs(a - b) / abs(a))
    return out


def directional_errors(loss, x, dirs, h):
    """Relative |⟨∇L, v⟩ − (L(x + hv) − L(x − hv)) / 2h| / |FD| for each direction ``v`` of
    ``dirs`` (pytrees like ``x``): ``(list of floats, ∇L)``."""
    vg = jax.jit(jax.value_and_grad(loss))
    g = vg(x)[1]
    out = []
    for v in dirs:
        step = lambda s: jax.tree.map(lambda a, d: a + s * h * d, x, v)
        fd = (float(vg(step(1.0))[0]) - float(vg(step(-1.0))[0])) / (2 * h)
        out.append(abs(float(_vdot(g, v)) - fd) / abs(fd))
    return out, g


def random_directions(x, count, seed=1):
    """``count`` pytrees like ``x`` with standard normal entries."""
    rng = np.random.default_rng(seed)
    return [_random_like(rng, x) for _ in range(count)]
