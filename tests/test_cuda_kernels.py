"""CUDA (XLA FFI) kernels: input checks everywhere; equality with einsum on a GPU.

The GPU tests run where JAX's backend is a CUDA GPU and nvcc is found
(``cuda_kernels.cuda_available()``), e.g. ``python -m pytest tests/test_cuda_kernels.py``
on the device machine; on CPU machines they are skipped and the checks of the
argument validation run.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import geometry
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.backends import cuda as ck
from jaxsem.operators.mass import mass
from jaxsem.operators.stiffness import stiffness, stiffness_gll

gpu = pytest.mark.skipif(not ck.cuda_available(), reason="needs a CUDA GPU and nvcc")


def _data(order, E, comps=1, quad="gauss", seed=0):
    qd = geometry.quadrature(order, quad)
    n, q = order + 1, qd.J.shape[0]
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    u = jax.random.normal(k1, ((comps,) if comps > 1 else ()) + (E, n, n, n), jnp.float64)
    B = 1.0 + jax.random.uniform(k2, (E, q, q, q), jnp.float64)
    G = jax.random.normal(k3, (6, E, q, q, q), jnp.float64)
    return u, jnp.asarray(qd.J), jnp.asarray(qd.Dt), B, G


def test_supported_shapes():
    u = jnp.zeros((5, 4, 4, 4))
    assert ck.cuda_supported(u)
    assert ck.cuda_supported(u, jnp.zeros((5, 4)))
    assert not ck.cuda_supported(u, jnp.zeros((6, 4)))  # only q = n + 1
    assert not ck.cuda_supported(jnp.zeros((5, 17, 17, 17)))
    assert not ck.cuda_supported(jnp.zeros((5, 4, 4, 3)))
    assert not ck.cuda_supported(jnp.zeros((5, 4, 4, 4), jnp.int32))


def test_default_variants_exist_for_their_operator():
    """Every default (scalar and vector tables, every order) is a variant its operator has, so
    no default launch can raise "variant must be one of"."""
    for op in ck._ALLOWED:
        for n in range(2, ck.MAX_N + 1):
            for comps in (1, 3):
                for dt in ("float64", "float32"):
                    assert ck.default_variant(op, n, comps, dt) in ck._ALLOWED[op], (op, n, comps, dt)
    assert ck.default_variant("mass", 8, 3) == 10 and ck.default_variant("mass", 8, 1) == 9
    assert ck.default_variant("bk5", 6, 3) == 10 and ck.default_variant("bk5", 6, 1) == 6
    # FP32 has its own winners: BK6 at p = 7 by lines with the prefetch, FP64 the element kernel
    assert ck.default_variant("bk5", 8, 3, "float32") == 10 and ck.default_prefetch("bk5", 8, 3, "float32")
    assert ck.default_variant("bk5", 8, 3, "float64") == 4 and not ck.default_prefetch("bk5", 8, 3)
    u32 = jnp.zeros((3, 2, 8, 8, 8), jnp.float32)
    assert ck._variant(None, None, "bk5", u32) == 10 | ck.PREFETCH_L2


@pytest.mark.skipif(ck.cuda_available(), reason="checks the error off GPU")
def test_cuda_off_gpu_is_a_clear_error():
    u, J, Dt, B, G = _data(2, 3)
    with pytest.raises(ValueError, match="need a CUDA GPU"):
        ck.mass_cuda(u, J, B)
    with pytest.raises(ValueError, match="variant must be one of"):
        ck.stiffness_cuda(u, J, Dt, G, variant=1)  # no slice kernel for BK3/BK4
    with pytest.raises(ValueError, match="variant must be one of"):
        ck.stiffness_cuda(u, J, Dt, G, variant=10)
    with pytest.raises(ValueError, match="variant must be one of"):
        ck.mass_cuda(u, J, B, variant=11)
    with pytest.raises(ValueError, match="variant must be one of"):
        ck.stiffness_gll_cuda(u, Dt, G, variant=9)  # Gauss kernels only
    with pytest.raises(ValueError, match="prefetch must be"):
        ck.mass_cuda(u, J, B, prefetch="yes")
    with pytest.raises(ValueError, match="n <= 16"):
        ck.stiffness_gll_cuda(jnp.zeros((2, 17, 17, 17)), jnp.eye(17), jnp.zeros((6, 2, 17, 17, 17)))


@gpu
@pytest.mark.parametrize("order", [1, 2, 4, 5, 7, 8, 10, 15])
def test_equal_to_einsum(order):
    E = 37  # ragged for every elements-per-block
    u, J, Dt, B, G = _data(order, E)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert rel(ck.mass_cuda(u, J, B), mass(u, J, B)) < 1e-13
    assert rel(ck.stiffness_cuda(u, J, Dt, G), stiffness(u, J, Dt, G)) < 1e-13
    ug, Jg, Dg, _, Gg = _data(order, E, quad="gll")
    assert rel(ck.stiffness_gll_cuda(ug, Dg, Gg), stiffness_gll(ug, Dg, Gg)) < 1e-13


@gpu
@pytest.mark.parametrize("variant", ck.VARIANTS)
@pytest.mark.parametrize("order", [1, 7, 9, 12])
def test_every_variant_equal_to_einsum(variant, order):
    """Variants 4-9 take the operator matrices from constant memory (4/5 D rows from registers
    up to n = 10, above it from shared memory; 8/9 contract by lines): each against einsum,
    3 components."""
    u, J, Dt, B, G = _data(order, 11, comps=3)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    if variant in ck._ALLOWED["mass"]:
        assert rel(ck.mass_cuda(u, J, B, variant=variant), mass(u, J, B)) < 1e-13
    if variant in ck._ALLOWED["stiffness"]:
        assert rel(ck.stiffness_cuda(u, J, Dt, G, variant=variant), stiffness(u, J, Dt, G)) < 1e-13
    if variant in ck._ALLOWED["bk5"]:
        ug, _, Dg, _, Gg = _data(order, 11, comps=3, quad="gll")
        assert rel(ck.stiffness_gll_cuda(ug, Dg, Gg, variant=variant), stiffness_gll(ug, Dg, Gg)) < 1e-13


def test_prefetch_bit_rides_on_the_variant():
    u = jnp.zeros((3, 5, 8, 8, 8))
    assert ck._variant(9, True, "mass", u) == 9 | ck.PREFETCH_L2
    assert ck._variant(9, False, "mass", u) == 9
    assert ck._variant(None, None, "mass", u) == ck.default_variant("mass", 8, 3) | (
        ck.PREFETCH_L2 if ck.default_prefetch("mass", 8, 3) else 0)
    assert max(ck.VARIANTS) < ck.PREFETCH_L2  # the bit is free


@gpu
@pytest.mark.parametrize("variant", ck.VARIANTS)
@pytest.mark.parametrize("order", [1, 7, 13])
def test_prefetch_changes_nothing(variant, order):
    """The L2 prefetch is a hint: with it on, every variant's result is bit-identical to off
    (3 components, a ragged last block)."""
    u, J, Dt, B, G = _data(order, 11, comps=3)
    ug, _, Dg, _, Gg = _data(order, 11, comps=3, quad="gll")
    calls = []
    if variant in ck._ALLOWED["mass"]:
        calls.append(lambda pf: ck.mass_cuda(u, J, B, variant=variant, prefetch=pf))
    if variant in ck._ALLOWED["stiffness"]:
        calls.append(lambda pf: ck.stiffness_cuda(u, J, Dt, G, variant=variant, prefetch=pf))
    if variant in ck._ALLOWED["bk5"]:
        calls.append(lambda pf: ck.stiffness_gll_cuda(ug, Dg, Gg, variant=variant, prefetch=pf))
    for call in calls:
        np.testing.assert_array_equal(np.asarray(call(True)), np.asarray(call(False)))


@gpu
@pytest.mark.parametrize("variant", [4, 6, 8, 9, 10])
def test_constant_memory_follows_each_call(variant):
    """The constant-memory copy of D/J is refreshed for every launch: one jitted function with two
    different matrices of the same order, and two orders, gives each call its own result."""
    u, J, Dt, B, G = _data(5, 7)
    ug, _, Dg, _, Gg = _data(5, 7, quad="gll")
    u2, J2, Dt2, B2, G2 = _data(3, 7, seed=1)

    vm = 8 if variant == 9 else variant  # no 9 for BK5
    vs = 11 if variant == 10 else variant  # no 10 for BK3

    @jax.jit
    def both(u, ug, u2):
        return (ck.stiffness_gll_cuda(ug, Dg, Gg, variant=vm),
                ck.stiffness_gll_cuda(ug, 2.0 * Dg, Gg, variant=vm),
                ck.mass_cuda(u, J, B, variant=vm), ck.mass_cuda(u, 0.5 * J, B, variant=vm),
                ck.stiffness_cuda(u, J, Dt, G, variant=vs),
                ck.stiffness_cuda(u2, J2, Dt2, G2, variant=vs))

    got = both(u, ug, u2)
    want = (stiffness_gll(ug, Dg, Gg), stiffness_gll(ug, 2.0 * Dg, Gg), mass(u, J, B), mass(u, 0.5 * J, B),
            stiffness(u, J, Dt, G), stiffness(u2, J2, Dt2, G2))
    for a, b in zip(got, want):
        assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) < 1e-13


@gpu
def test_vector_forms_and_float32():
    u, J, Dt, B, G = _data(6, 21, comps=3)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert rel(ck.mass_cuda(u, J, B), mass(u, J, B)) < 1e-13
    assert rel(ck.stiffness_cuda(u, J, Dt, G), stiffness(u, J, Dt, G)) < 1e-13
    ug, _, Dg, _, Gg = _data(6, 21, comps=3, quad="gll")
    assert rel(ck.stiffness_gll_cuda(ug, Dg, Gg), stiffness_gll(ug, Dg, Gg)) < 1e-13
    w32 = ck.stiffness_gll_cuda(ug[0].astype(jnp.float32), Dg.astype(jnp.float32), Gg.astype(jnp.float32))
    assert w32.dtype == jnp.float32 and rel(w32.astype(jnp.float64), stiffness_gll(ug[0], Dg, Gg)) < 1e-5


@gpu
def test_derivatives_are_the_references():
    u, J, Dt, B, G = _data(3, 9)
    f = lambda G, u: jnp.sum(jnp.sin(ck.stiffness_cuda(u, J, Dt, G)))
    g = lambda G, u: jnp.sum(jnp.sin(stiffness(u, J, Dt, G)))
    for a, b in zip(jax.grad(f, (0, 1))(G, u), jax.grad(g, (0, 1))(G, u)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


@gpu
@pytest.mark.parametrize("bp", [1, 3, 5])
def test_solve_with_cuda_kernels(bp):
    """Same iterates up to rounding (iteration counts within one), same solution, same
    gradient: the kernel in every forward and adjoint PCG iteration."""
    mesh = box_mesh((3, 3, 2), 5, deform=0.1)
    sems = {b: poisson.bp_discretize(mesh, bp, backend=b) for b in ("einsum", "cuda")}
    assert poisson.bp_discretize(mesh, bp).backend.name == "cuda"  # auto prefers CUDA
    h1, h2 = poisson.coefficients(bp)
    B = sems["einsum"].geom.B
    f = 1.0 + 0.5 * jnp.cos(jnp.arange(B.size).reshape(B.shape))
    ue, ie = poisson.solve(sems["einsum"], f, h1, h2, tol=1e-12)
    uc, ic = poisson.solve(sems["cuda"], f, h1, h2, tol=1e-12)
    assert abs(int(ic.iterations) - int(ie.iterations)) <= 1
    np.testing.assert_allclose(uc, ue, rtol=0, atol=1e-9 * float(jnp.max(jnp.abs(ue))))
    loss = lambda b: lambda f: jnp.sum(poisson.solve(sems[b], f, h1, h2, tol=1e-12)[0] ** 2)
    dc, de = jax.grad(loss("cuda"))(f), jax.grad(loss("einsum"))(f)
    np.testing.assert_allclose(dc, de, rtol=0, atol=1e-8 * float(jnp.max(jnp.abs(de))))


def test_gs_csr_cuda_checks_its_arguments():
    u = jnp.zeros((3, 10))
    with pytest.raises(ValueError, match="u must be"):
        ck.gs_csr_cuda(jnp.zeros(10), jnp.zeros(11, jnp.int32), jnp.zeros(0, jnp.int32))
    with pytest.raises(ValueError, match="off must be"):
        ck.gs_csr_cuda(u, jnp.zeros(10, jnp.int32), jnp.zeros(0, jnp.int32))


@gpu
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_gs_csr_kernel_equals_segment_and_copies_agree(lead):
    """The CUDA gather–scatter ("csr", what discretize takes on one GPU) against the segment
    form; every copy of a node holds the bit-identical sum; its VJP is the same map."""
    from jaxsem.discretization.gather_scatter import gs_apply, make_gs
    from jaxsem.mesh.numbering import number_nodes

    nb = number_nodes(box_mesh((3, 2, 2), 4, periodic=(True, False, False)))
    seg = make_gs(nb.gid, nb.num_global, "segment")
    csr = make_gs(nb.gid, nb.num_global, "csr")
    assert csr.layout == "csr" and csr.csr_off is not None
    u = jax.random.normal(jax.random.PRNGKey(5), lead + nb.gid.shape)
    got, want = gs_apply(csr, u), gs_apply(seg, u)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    flat = np.asarray(got).reshape((-1, nb.gid.size))
    gid = nb.gid.reshape(-1)
    for row in flat:  # every copy of a node holds the same bits: max == min over its copies
        hi, lo = np.full(nb.num_global, -np.inf), np.full(nb.num_global, np.inf)
        np.maximum.at(hi, gid, row)
        np.minimum.at(lo, gid, row)
        assert np.array_equal(hi, lo)
    v = jax.random.normal(jax.random.PRNGKey(6), u.shape)
    _, vjp = jax.vjp(lambda x: gs_apply(csr, x), u)
    np.testing.assert_allclose(vjp(v)[0], gs_apply(seg, v), rtol=1e-13, atol=1e-13)
    # float32 too
    np.testing.assert_allclose(gs_apply(csr, u.astype(jnp.float32)), want, rtol=1e-5, atol=1e-5)


@gpu
def test_solve_and_gradient_same_with_gs_kernel():
    """The CUDA backend's gather–scatter (the gather kernel on one GPU) and element kernels
    against the einsum backend's segment sums: same solution and same gradient (the kernel's
    derivative is the segment form's)."""
    mesh = box_mesh((3, 3, 2), 4, deform=0.1)
    a = poisson.bp_discretize(mesh, 5, backend="cuda")
    b = poisson.bp_discretize(mesh, 5, backend="einsum")
    assert a.gs.layout == "csr" and b.gs.layout == "segment"
    f = 1.0 + 0.5 * jnp.cos(jnp.arange(a.geom.B.size).reshape(a.geom.B.shape))
    ua, ia = poisson.solve(a, f, tol=1e-12)
    ub, ib = poisson.solve(b, f, tol=1e-12)
    assert abs(int(ia.iterations) - int(ib.iterations)) <= 1
    np.testing.assert_allclose(ua, ub, rtol=0, atol=1e-10 * float(jnp.max(jnp.abs(ub))))
    loss = lambda sem: lambda f: jnp.sum(poisson.solve(sem, f, tol=1e-12)[0] ** 2)
    ga, gb = jax.grad(loss(a))(f), jax.grad(loss(b))(f)
    np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-9 * float(jnp.max(jnp.abs(gb))))
