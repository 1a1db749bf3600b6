import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import basis
from jaxsem.core.geometry import geometric_factors, quadrature, to_quadrature
from jaxsem.mesh import box_mesh


@pytest.mark.parametrize("kind", ["gll", "gauss"])
def test_volume_of_deformed_box(kind):
    m = box_mesh((2, 3, 2), order=5, lengths=(2.0, 1.0, 0.5), deform=0.15)
    g = geometric_factors(m.x, quadrature(5, kind))
    assert abs(float(g.B.sum()) - 1.0) < 1e-13
    assert float(g.jac.min()) > 0


def test_affine_element_factors_are_analytic():
    hx, hy, hz = 0.5, 0.25, 2.0
    m = box_mesh((2, 4, 1), order=3, lengths=(1.0, 1.0, 2.0))
    q = quadrature(3, "gll")
    g = geometric_factors(m.x, q)
    w3 = np.einsum("k,j,i->kji", q.w, q.w, q.w)
    jac = hx * hy * hz / 8
    np.testing.assert_allclose(g.jac, jac, rtol=1e-14)
    np.testing.assert_allclose(g.G[0], w3 * jac * (2 / hx) ** 2 + 0 * g.G[0], rtol=1e-13)
    np.testing.assert_allclose(g.G[3], w3 * jac * (2 / hy) ** 2 + 0 * g.G[3], rtol=1e-13)
    np.testing.assert_allclose(g.G[5], w3 * jac * (2 / hz) ** 2 + 0 * g.G[5], rtol=1e-13)
    for off in (1, 2, 4):
        assert float(jnp.abs(g.G[off]).max()) < 1e-14


@pytest.mark.parametrize("kind", ["gll", "gauss"])
def test_metric_terms_differentiate_polynomials_exactly(kind):
    # ∇u = Σ_a (∂u/∂r_a) ∇r_a must be exact for u linear in x, even on curved elements
    order = 4
    m = box_mesh((2, 2, 2), order, deform=0.1)
    q = quadrature(order, kind)
    g = geometric_factors(m.x, q)
    u = 2 * m.x[0] - 3 * m.x[1] + 0.5 * m.x[2]
    J, Dt = jnp.asarray(q.J), jnp.asarray(q.Dt)
    from jaxsem.operators.tensor import grad_ref

    ur, us, ut = grad_ref(jnp.asarray(u), J, Dt)
    grad = [ur * g.rx[0, d] + us * g.rx[1, d] + ut * g.rx[2, d] for d in range(3)]
    for d, c in enumerate((2.0, -3.0, 0.5)):
        assert float(jnp.abs(grad[d] - c).max()) < 1e-11


def test_gauss_points_coordinates():
    m = box_mesh((1, 1, 1), order=2)
    q = quadrature(2, "gauss")
    g = geometric_factors(m.x, q)
    xq, _ = basis.gauss_points(4)
    np.testing.assert_allclose(g.xq[0][0, 0, 0, :], 0.5 * (xq + 1), atol=1e-15)


def test_inverted_element_is_named():
    m = box_mesh((3, 1, 1), order=2)
    x = np.array(m.x)
    x[0, 1] = x[0, 1, :, :, ::-1]  # mirror element 1 in r
    with pytest.raises(ValueError, match="element 1 "):
        geometric_factors(x, quadrature(2, "gll"))


def test_geometry_is_differentiable_in_coordinates():
    m = box_mesh((1, 1, 1), order=3, deform=0.05)
    q = quadrature(3, "gauss")
    vol = lambda x: jnp.sum(geometric_factors(x, q).B)
    x = jnp.asarray(m.x)
    v = jax.random.normal(jax.random.PRNGKey(0), x.shape)
    g = jnp.vdot(jax.grad(vol)(x), v)
    eps = 1e-6
    fd = (vol(x + eps * v) - vol(x - eps * v)) / (2 * eps)
    assert abs(float(g - fd)) < 1e-7 * max(1.0, abs(float(fd)))


def test_with_coordinates_refuses_inverted_elements():
    """SEM.with_coordinates checks shape and orientation (mirroring an element inverts it)."""
    import jaxsem as js

    sem = js.discretize(js.box_mesh((2, 1, 1), 2, deform=0.1))
    with pytest.raises(ValueError, match="x must have shape"):
        sem.with_coordinates(sem.x[:, :1])
    x = np.array(sem.x)
    x[0, 1] = x[0, 1, :, :, ::-1]  # element 1 mirrored in r
    with pytest.raises(ValueError, match="element 1 is inverted"):
        sem.with_coordinates(x)
    assert sem.with_coordinates(sem.x * 2.0).x.shape == sem.x.shape


@pytest.mark.parametrize("kind", ["gll", "gauss"])
def test_blocked_factors_equal_the_whole_mesh_form(kind):
    """The set-up's block-at-a-time loop (last block shifted back, overlapping) gives the
    whole-mesh factors and the per-element Jacobian minima to round-off (XLA fuses differently
    for another shape): 1e-13 of each field's own scale, measured up to 1e-14 with the tests'
    XLA flags; a factor near zero, a difference of larger products, keeps their absolute error."""
    from jaxsem.core.geometry import _factors_blocked, factors

    m = box_mesh((3, 4, 3), order=3, deform=0.2)
    q = quadrature(3, kind)
    args = (jnp.asarray(q.J), jnp.asarray(q.Dt), jnp.asarray(q.w), q.collocated)
    x = jnp.asarray(m.x)
    whole = factors(x, *args)
    for block in (1, 7, 36):
        g, jmin = _factors_blocked(x, *args, block)
        for name in ("G", "B", "jac", "rx", "xq"):
            ref = np.asarray(getattr(whole, name))
            np.testing.assert_allclose(getattr(g, name), ref, rtol=1e-13, atol=1e-13 * np.max(np.abs(ref)))
        np.testing.assert_allclose(jmin, jnp.min(whole.jac.reshape(36, -1), axis=1), rtol=1e-14)
