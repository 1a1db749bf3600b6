"""Derivatives of the fused Maxwell operator (jaxsem.backends._fused_dg).

The operator is linear in the fields; on affine elements its transpose is the same operator
between two pointwise scalings, Lᵀ = M P L P M⁻¹ (M the energy mass, P the sign flip of H),
which is what reverse mode through the fused kernel runs. On the CPU the emulated backend
(``EMULATED``: the CUDA backend's dispatch and rules, each kernel's value the einsum form's)
runs the derivative rules themselves against the einsum reference; the GPU test at the end
runs them with the CUDA kernel.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import timestepping as ts
from jaxsem.backends import EINSUM, EMULATED
from jaxsem.backends import cuda as ck
from jaxsem.discretization.dg import discretize_dg, is_affine
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx

CASES = [  # (deform, periodic, bc, flux)
    (0.0, (False, False, False), "pec", "upwind"),
    (0.0, (True, False, True), "pmc", "central"),
    (0.0, (True, True, True), "pec", "upwind"),
]


def rel(a, b):
    return float(jnp.linalg.norm(jnp.ravel(a - b)) / jnp.linalg.norm(jnp.ravel(b)))


def setup(deform, periodic, order=3, seed=0):
    """``({False: einsum DG, True: emulated fused DG}, eps, mu, q)`` of one mesh."""
    mesh = box_mesh((3, 2, 2), order, deform=deform, periodic=periodic, lengths=(1.0, 1.5, 0.8))
    dgs = {False: discretize_dg(mesh, backend=EINSUM), True: discretize_dg(mesh, backend=EMULATED)}
    rng = np.random.default_rng(seed)
    eps = 1.0 + rng.uniform(size=mesh.num_elements)  # per element: material interfaces inside
    mu = 1.0 + rng.uniform(size=dgs[False].jac.shape)  # per node
    q = jnp.asarray(rng.standard_normal((6,) + dgs[False].jac.shape))
    return dgs, eps, mu, q


def flip_h(q):
    return q * jnp.asarray([1.0] * 3 + [-1.0] * 3)[:, None, None, None, None]


def test_is_affine():
    x = np.asarray(box_mesh((2, 2, 1), 4).x)
    A = np.array([[1.0, 0.3, -0.2], [0.1, 2.0, 0.4], [0.0, -0.5, 0.7]])  # a shear: still affine
    assert is_affine(x) and is_affine(np.einsum("de,e...->d...", A, x) + 3.0)
    assert not is_affine(np.asarray(box_mesh((2, 2, 1), 4, deform=0.05).x))
    bent = x.copy()
    bent[0, 0, 1, 1, 1] += 1e-9  # one interior node of one element
    assert not is_affine(bent)
    assert discretize_dg(box_mesh(2, 3)).affine and not discretize_dg(box_mesh(2, 3, deform=0.1)).affine


@pytest.mark.parametrize("deform, periodic, bc, flux", CASES + [(0.1, (False,) * 3, "pec", "upwind")])
def test_transpose_is_the_operator_between_scalings(deform, periodic, bc, flux):
    """Lᵀw (JAX's transpose of the einsum form) = M P L(P M⁻¹ w) to round-off on affine meshes
    with material interfaces, walls and periodic axes; not on curved elements (chain form)."""
    dgs, eps, mu, q = setup(deform, periodic)
    dg = dgs[False]
    mat = mx.material(dg, eps, mu)
    L = lambda v: mx.rhs(dg, mat, v, flux, bc, form="chain")
    w = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape))
    want = jax.linear_transpose(L, q)(w)[0]
    m = jnp.stack([dg.mass * mat.eps] * 3 + [dg.mass * mat.mu] * 3)  # the energy mass M
    formula = m * flip_h(L(flip_h(w / m)))
    if deform == 0.0:
        assert rel(formula, want) < 1e-13
        # reverse mode through the fused operator runs that formula (the linear primitive's rule)
        fused = dgs[True]
        vjp = jax.vjp(lambda v: mx.rhs(fused, mx.material(fused, eps, mu), v, flux, bc), q)[1]
        assert rel(vjp(w)[0], want) < 1e-13
        assert "jaxsem_maxwell_linear" in str(jax.make_jaxpr(vjp)(w))
    else:
        assert rel(formula, want) > 1e-3  # why curved elements keep the einsum form's derivative


def integrate_loss(dgs, mu, flux, bc, fused, checkpointing, steps=6):
    """A loss of 6 steps with the emulated fused operator (``fused``) or the einsum reference."""
    dg = dgs[fused]

    def loss(eps, q0):
        mat = mx.material(dg, eps, mu)
        f = lambda t, v: mx.rhs(dg, mat, v, flux, bc, form="chain")
        y = ts.integrate(f, q0, 0.01, steps, checkpointing=checkpointing)
        return jnp.sum(y[:3] ** 2) + jnp.sum(jnp.sin(y[3:]) * q0[3:])

    return loss


@pytest.mark.parametrize("deform, periodic, bc, flux, every", [CASES[0] + (None,), CASES[1] + ("sqrt",),
                                                               (0.1, (True, False, False), "pec", "upwind", None)])
def test_gradient_through_lserk4_equals_einsum(deform, periodic, bc, flux, every):
    """jax.grad w.r.t. ε (per element) and the initial fields through 6 LSERK4 steps, plain and
    checkpointed: the fused operator's rules (transpose identity on affine meshes, the einsum
    tangent on curved ones, the material tangent's primitive) equal the einsum form's."""
    dgs, eps, mu, q = setup(deform, periodic, order=2)
    chk = ts.Checkpointing(every)
    grad = lambda fused: jax.jit(jax.grad(integrate_loss(dgs, mu, flux, bc, fused, chk), argnums=(0, 1)))(eps, q)
    (ge, gq), (fe, fq) = grad(False), grad(True)
    assert rel(fe, ge) < 1e-12 and rel(fq, gq) < 1e-12
    # the affine path really runs the transpose rule of the linear primitive; every path the
    # material tangent's primitive (whose transpose is the material adjoint kernel on a GPU)
    jaxpr = str(jax.make_jaxpr(jax.grad(integrate_loss(dgs, mu, flux, bc, True, chk), argnums=(0, 1)))(eps, q))
    assert ("jaxsem_maxwell_linear" in jaxpr) == (deform == 0.0)
    assert "jaxsem_maxwell_material_tangent" in str(jax.make_jaxpr(
        jax.linearize(integrate_loss(dgs, mu, flux, bc, True, chk), eps, q)[1])(eps, q))


def test_forward_mode_and_vmap():
    dgs, eps, mu, q = setup(0.0, (True, False, False))
    loss = integrate_loss(dgs, mu, "upwind", "pec", True, ts.Checkpointing(), steps=3)
    ref = integrate_loss(dgs, mu, "upwind", "pec", False, ts.Checkpointing(), steps=3)
    de = jnp.linspace(0.5, 1.5, eps.size)
    dq = jnp.cos(q)
    t_f = jax.jvp(loss, (eps, q), (de, dq))[1]
    t_e = jax.jvp(ref, (eps, q), (de, dq))[1]
    assert abs(float(t_f - t_e)) < 1e-12 * abs(float(t_e))
    # vmap over directions (the material tangent's primitive batched) equals the loop
    des = jnp.stack([de, jnp.cos(de), -de ** 2])
    batched = jax.vmap(lambda d: jax.jvp(loss, (eps, q), (d, dq))[1])(des)
    for k in range(3):
        want = jax.jvp(ref, (eps, q), (des[k], dq))[1]
        assert abs(float(batched[k] - want)) < 1e-12 * abs(float(want))
    # vmap of the tangent in q (the linear primitive batched) is the operator on each
    qs = jnp.stack([q, 2.0 * q[::-1], jnp.sin(q)])
    fused, mat = dgs[True], mx.material(dgs[True], eps, mu)
    lin = jax.vmap(lambda v: jax.jvp(lambda x: mx.rhs(fused, mat, x), (q,), (v,))[1])(qs)
    for k in range(3):
        assert rel(lin[k], mx.rhs(dgs[False], mx.material(dgs[False], eps, mu), qs[k], form="chain")) < 1e-14


@pytest.mark.skipif(not ck.cuda_available(), reason="needs a CUDA GPU and nvcc")
@pytest.mark.parametrize("deform", [0.0, 0.1])
@pytest.mark.parametrize("order", [3, 7])
def test_cuda_gradient_through_lserk4_equals_einsum(deform, order):
    """The same with the CUDA kernel (the default on a GPU): rhs dispatches to it (the default
    split form on the affine mesh, the chain form on the curved one)."""
    mesh = box_mesh((3, 2, 2), order, deform=deform, periodic=(True, False, False))
    dgs = {b: discretize_dg(mesh, backend=b) for b in ("einsum", "cuda")}
    _, eps, mu, q = setup(deform, (True, False, False), order)

    def loss(dg):
        def f(eps, q0):
            mat = mx.material(dg, eps, mu)
            form = "split" if deform == 0.0 else "chain"
            y = ts.integrate(lambda t, v: mx.rhs(dg, mat, v, "upwind", "pec", form=form), q0, 0.002, 4)
            return jnp.sum(y[:3] ** 2) + jnp.sum(jnp.sin(y[3:]) * q0[3:])
        return f

    (ge, gq), (fe, fq) = (jax.jit(jax.grad(loss(dgs[b]), argnums=(0, 1)))(eps, q) for b in ("einsum", "cuda"))
    assert rel(fe, ge) < 1e-12 and rel(fq, gq) < 1e-12
