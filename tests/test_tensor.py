"""The tensor contractions' two forms: einsum and unrolled sums of scaled slices (the CUDA backend's)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.backends import CUDA, EINSUM, EMULATED
from jaxsem.core import basis
from jaxsem.operators.tensor import grad_gll, grad_gll_sums, grad_gll_t, grad_gll_t_sums


@pytest.mark.parametrize("n, lead", [(2, ()), (5, (3,)), (8, (2, 3))])
def test_gradient_sums_equal_the_einsum_form(n, lead):
    D = jnp.asarray(basis.gll_points(n - 1)[0][:, None] ** np.arange(n) + np.eye(n))  # any (n, n) matrix
    u = jax.random.normal(jax.random.PRNGKey(n), lead + (4, n, n, n))
    w = [jax.random.normal(jax.random.PRNGKey(10 * n + a), lead + (4, n, n, n)) for a in range(3)]
    for a, b in zip(grad_gll_sums(u, D), grad_gll(u, D)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13 * float(jnp.max(jnp.abs(b))))
    gt, ref = grad_gll_t_sums(*w, D), grad_gll_t(*w, D)
    np.testing.assert_allclose(gt, ref, rtol=0, atol=1e-13 * float(jnp.max(jnp.abs(ref))))
    # a transpose pair, and JAX's transpose of the sums is the einsum transpose
    lhs = sum(jnp.vdot(g, x) for g, x in zip(grad_gll_sums(u, D), w))
    assert abs(float(lhs - jnp.vdot(u, gt))) < 1e-12 * float(jnp.abs(lhs))
    _, pull = jax.vjp(lambda v: grad_gll_sums(v, D), u)
    np.testing.assert_allclose(pull(tuple(w))[0], ref, rtol=0, atol=1e-13 * float(jnp.max(jnp.abs(ref))))


def test_backends_choose_their_form():
    u = jnp.arange(2 * 27.0).reshape(2, 3, 3, 3)
    D = jnp.asarray(basis.gll_points(2)[0][:, None] ** np.arange(3))
    for backend in (EINSUM, EMULATED, CUDA):  # methods only: no kernel runs
        got = backend.grad_gll(u, D)
        np.testing.assert_allclose(jnp.stack(got), jnp.stack(grad_gll(u, D)), rtol=0, atol=1e-12)
    for backend in (CUDA, EMULATED):  # the sums: slices, products and adds (the emulated backend's too,
        # so tests/test_navier_stokes_gradients.py's fused-path gradient runs them on a CPU)
        assert "dot_general" not in str(jax.make_jaxpr(lambda u: backend.grad_gll(u, D))(u))
    assert "dot_general" in str(jax.make_jaxpr(lambda u: EINSUM.grad_gll(u, D))(u))
