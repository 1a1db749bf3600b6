"""The dealiased convective operator's einsum form (jaxsem.operators.convection)."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem import geometry
from jaxsem.backends import EINSUM, EMULATED, cuda
from jaxsem.operators.convection import advection_local, on_rule
from jaxsem.operators.tensor import grad_gll, interp, interp_t


def _rule(order):
    n = order + 1
    qd = geometry.quadrature(order, "gauss", q=cuda.convection_q(n))
    return jnp.asarray(qd.J), jnp.asarray(qd.Dt), qd


def test_on_rule_is_the_interpolated_gll_gradient():
    """(J⊗J⊗Dd) c equals the GLL gradient interpolated to the rule (Dd = J D) to round-off."""
    order = 5
    J, Dd, _ = _rule(order)
    D = jnp.asarray(geometry.quadrature(order, "gll").Dt)
    c = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 6, 6, 6))
    uq, *g = on_rule(c, J, Dd)
    np.testing.assert_allclose(uq, interp(c, J), atol=1e-13)
    for a, b in zip(g, grad_gll(c, D)):
        np.testing.assert_allclose(a, interp(b, J), atol=1e-12)


def test_advection_local_equals_the_interpolate_then_multiply_form():
    """Equal, to round-off, to the form the Navier–Stokes term had before (GLL gradient, then
    each field interpolated), and linear in c."""
    order, E = 4, 5
    J, Dd, _ = _rule(order)
    D = jnp.asarray(geometry.quadrature(order, "gll").Dt)
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    c = jax.random.normal(k[0], (2, E, 5, 5, 5))
    u = jax.random.normal(k[1], (3, E, 5, 5, 5))
    q = J.shape[0]
    Brx = jax.random.normal(k[2], (3, 3, E, q, q, q))
    ur, us, ut = grad_gll(c, D)
    uq = interp(u, J)
    v = [Brx[a, 0] * uq[0] + Brx[a, 1] * uq[1] + Brx[a, 2] * uq[2] for a in range(3)]
    old = interp_t(v[0] * interp(ur, J) + v[1] * interp(us, J) + v[2] * interp(ut, J), J)
    new = advection_local(c, u, J, Dd, Brx)
    assert float(jnp.max(jnp.abs(new - old))) < 1e-12 * float(jnp.max(jnp.abs(old)))
    np.testing.assert_allclose(advection_local(2 * c + c[::-1], u, J, Dd, Brx),
                               2 * new + new[::-1], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(EINSUM.convection(c, u, J, Dd, Brx), new)


def test_advection_of_a_linear_field_is_exact():
    """On a box element (B·∂r/∂x on the rule from its lengths) the derivative of c = 2x − y + 3z
    is exact on the rule, so the term is the rule's integral of φ_i (u·∇c) = φ_i (2u − v + 3w):
    Jᵀ⊗Jᵀ⊗Jᵀ (w_q · J⊗J⊗J (2u − v + 3w)). Checks each direction's matrix and factor."""
    order = 3
    J, Dd, qd = _rule(order)
    h = np.array([0.5, 0.25, 2.0])  # element lengths along x, y, z (r, s, t ∈ [-1, 1])
    w3 = np.einsum("k,j,i->kji", qd.w, qd.w, qd.w) * np.prod(h / 2)
    Brx = np.zeros((3, 3, 1) + w3.shape)
    for a in range(3):
        Brx[a, a, 0] = w3 * 2 / h[a]
    xg = np.asarray(js.basis.gll_points(order)[0])
    t, s, r = np.meshgrid(xg, xg, xg, indexing="ij")  # arrays are [k, j, i] = (t, s, r)
    x, y, z = r * h[0] / 2, s * h[1] / 2, t * h[2] / 2
    c = (2 * x - y + 3 * z)[None, None]
    u = np.stack([1 + x * y, z**2, x - z])[:, None]
    w = advection_local(jnp.asarray(c), jnp.asarray(u), J, Dd, jnp.asarray(Brx))[0, 0]
    f = interp(jnp.asarray(2 * u[0, 0] - u[1, 0] + 3 * u[2, 0]), J)
    np.testing.assert_allclose(np.asarray(w), np.asarray(interp_t(jnp.asarray(w3) * f, J)), rtol=1e-12, atol=1e-13)


def _case(order=3, E=4, m=3, seed=5):
    J, Dd, _ = _rule(order)
    n, q = order + 1, J.shape[0]
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    c = jax.random.normal(k[0], (m, E, n, n, n))
    u = jax.random.normal(k[1], (3, E, n, n, n))
    Brx = jax.random.normal(k[2], (3, 3, E, q, q, q))
    return c, u, J, Dd, Brx, k[3]


def test_convection_kernel_derivative_rules():
    """The fused convection's tangent (two kernel launches, the linear primitive) and its transpose
    (the convt kernel) give the einsum form's JVP and VJP: in c and u apart, with c = u (the
    Navier–Stokes term), in Brx (shape derivatives), under jit and vmap. The kernels' values come
    from the einsum form (the emulated backend's), the rules are the CUDA backend's."""
    c, u, J, Dd, Brx, key = _case()
    ref = lambda c, u, B: advection_local(c, u, J, Dd, B)
    fused = lambda c, u, B: EMULATED.convection(c, u, J, Dd, B)
    k = jax.random.split(key, 4)
    dc, du, dB = (jax.random.normal(kk, a.shape) for kk, a in zip(k, (c, u, Brx)))
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    primals, tangents = (c, u, Brx), (dc, du, dB)
    for live in [(0,), (1,), (0, 1), (2,), (0, 1, 2)]:  # the others symbolically zero
        def only(f):
            def g(*xs):
                args = list(primals)
                for i, x in zip(live, xs):
                    args[i] = x
                return f(*args)
            return g
        p, t = tuple(primals[i] for i in live), tuple(tangents[i] for i in live)
        close(jax.jvp(only(fused), p, t)[1], jax.jvp(only(ref), p, t)[1])
    loss = lambda f: lambda c, u, B: jnp.sum(jnp.sin(f(c, u, B)))
    for a, b in zip(jax.jit(jax.grad(loss(fused), (0, 1, 2)))(c, u, Brx), jax.grad(loss(ref), (0, 1, 2))(c, u, Brx)):
        close(a, b)
    self_loss = lambda f: lambda u: jnp.sum(f(u, u, Brx) ** 2)  # c = u: both cotangents summed
    close(jax.grad(self_loss(fused))(u), jax.grad(self_loss(ref))(u))
    # second derivatives (forward over reverse) fall back to the einsum form's
    hvp = lambda f: jax.jvp(jax.grad(self_loss(f)), (u,), (du,))[1]
    close(hvp(fused), hvp(ref))
    batched = jax.vmap(lambda c: jax.vjp(lambda c: fused(c, u, Brx), c)[1](c)[0])(jnp.stack([c, 2 * c]))
    close(batched[1], 2 * batched[0])
