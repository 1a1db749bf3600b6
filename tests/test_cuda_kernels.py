"""CUDA (XLA FFI) kernels: input checks everywhere; equality with einsum on a GPU.

The GPU tests run where JAX's backend is a CUDA GPU and nvcc is found
(``cuda.cuda_available()``), e.g. ``python -m pytest tests/test_cuda_kernels.py``
on the device machine; on CPU machines they are skipped, and the checks of the
tuning table and of the argument validation run. A test selects a kernel variant
the way every call does: through the tuning table (patched for the test).
"""

import re

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


KEYS = [(op, n, vector, dtype) for op in ck.OPS for n in range(2, ck.MAX_N + 1) for vector in (False, True)
        for dtype in ("float64", "float32")]


def _u(n, vector, dtype):
    return jax.ShapeDtypeStruct(((3,) if vector else ()) + (5, n, n, n), jnp.dtype(dtype))


def _table_problems():
    """What is wrong with the tuning table as :func:`ck.defaults` reads it: a key whose variant its
    operator lacks, a listed key no call can have, a variant no key selects, a variant number
    the source has no ``case`` for in its operator's launch function, a prefetch that is not a bool."""
    problems = []
    chosen = {op: set() for op in ck.OPS}
    for op, n, vector, dtype in KEYS:
        variant, prefetch = ck.defaults(op, _u(n, vector, dtype))
        chosen[op].add(variant)
        if variant not in ck.VARIANTS[op] or not isinstance(prefetch, bool):
            problems.append(f"{op} n={n} vector={vector} {dtype}: ({variant!r}, {prefetch!r})")
    problems += [f"listed key {k} is not a kernel call" for k in ck.TUNING if k not in KEYS]
    source = ck.SOURCE.read_text()
    for op in ck.OPS:
        problems += [f"{op} variant {v}: no key selects it" for v in set(ck.VARIANTS[op]) - chosen[op]]
        body = source[source.index(f"bool launch_{op}("):]
        body = body[:body.index("\n}\n")]
        cases = {int(c) for c in re.findall(r"case (\d+):", body)}
        if cases != set(ck.VARIANTS[op]):
            problems.append(f"{op}: VARIANTS {ck.VARIANTS[op]}, launch_{op} has cases {sorted(cases)}")
        problems += [f"{op} variant {v} collides with PREFETCH_L2" for v in ck.VARIANTS[op] if v >= ck.PREFETCH_L2]
    return problems


def test_tuning_table_covers_every_key_with_a_variant_that_exists(monkeypatch):
    """Every (operator, n, vector form, dtype) resolves, listed or by DEFAULT, to a variant its
    operator has in the CUDA source, and every variant is some key's choice."""
    assert _table_problems() == []
    # the check fails where it should: the mass has no DEFAULT variant (2), and a stray key
    monkeypatch.delitem(ck.TUNING, ("mass", 8, False, "float64"))
    monkeypatch.setitem(ck.TUNING, ("bk1", 8, False, "float64"), (2, False))
    assert len(_table_problems()) == 2


def test_tuning_table_values():
    """Spot checks of the table (docs/kernels.md): vector forms and FP32 have their own winners."""
    d = lambda op, n, vector=False, dtype="float64": ck.defaults(op, _u(n, vector, dtype))
    assert d("mass", 8, True) == (10, False) and d("mass", 8) == (9, True)
    assert d("bk5", 6, True) == (10, True) and d("bk5", 6) == (6, False)
    assert d("bk5", 8, True, "float32") == (10, True) and d("bk5", 8, True) == (4, False)
    assert d("bk5", 8) == ck.DEFAULT == (2, False) and d("stiffness", 16, True, "float32") == ck.DEFAULT
    assert d("stiffness", 8) == (8, True)  # BK3 p = 7 with the L2 prefetch
    assert ck.defaults("bk5", jnp.zeros((1, 4, 8, 8, 8))) == d("bk5", 8)  # one component: scalar form


def test_bad_calls_are_clear_errors(monkeypatch):
    u, J, Dt, B, G = _data(2, 3)
    if not ck.cuda_available():
        with pytest.raises(ValueError, match="need a CUDA GPU"):
            ck.mass_cuda(u, J, B)
    with pytest.raises(ValueError, match="n <= 16"):
        ck.stiffness_gll_cuda(jnp.zeros((2, 17, 17, 17)), jnp.eye(17), jnp.zeros((6, 2, 17, 17, 17)))
    idx = jnp.zeros((3, 3, 3, 3), jnp.int32)  # assembled BK3: J, Dt must be (n + 1, n) for idx's n
    with pytest.raises(ValueError, match=re.escape("J and Dt must be (4, 3) for n = 3")):
        ck.stiffness_assembled_cuda(jnp.zeros(10), idx, jnp.zeros((5, 3)), jnp.zeros((5, 3)), G)
    with pytest.raises(ValueError, match="idx: \\(E, n, n, n\\) int32"):
        ck.stiffness_assembled_cuda(jnp.zeros(10), idx.astype(jnp.float32), J, Dt, G)
    monkeypatch.setitem(ck.TUNING, ("stiffness", 3, False, "float64"), (1, False))  # no slice kernel
    with pytest.raises(ValueError, match=re.escape(f"stiffness has variants {ck.VARIANTS['stiffness']}")):
        ck.stiffness_cuda(u, J, Dt, G)


def test_build_keys_are_checked():
    assert ("bk5", "float64", 8) in ck.libraries() and ("gs", "float32", None) in ck.libraries()
    assert len(ck.libraries()) == (len(ck.OPS + ck.DERIVATIVE_OPS) * 2 * (ck.MAX_N - 1)
                                   + len(ck.TRANSFER_OPS) * 2 * (ck.MAX_N - 2) + 2)
    assert ("interp", "float32", 8) in ck.libraries() and ("interp", "float32", 2) not in ck.libraries()
    with pytest.raises(ValueError, match="keys must be"):
        ck.build([("bk5", "float64", 17)])


# f64 orders and libraries the GPU tests below use, built in parallel once
ORDERS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 15)


@pytest.fixture(scope="module")
def built():
    ck.build([(op, "float64", p + 1) for op in ck.OPS for p in ORDERS]
             + [("bk5", "float32", 7), ("gs", "float64", None), ("gs", "float32", None)])


@gpu
@pytest.mark.parametrize("order", [1, 2, 4, 5, 7, 8, 10, 15])
def test_equal_to_einsum(built, order):
    E = 37  # ragged for every elements-per-block
    u, J, Dt, B, G = _data(order, E)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert rel(ck.mass_cuda(u, J, B), mass(u, J, B)) < 1e-13
    assert rel(ck.stiffness_cuda(u, J, Dt, G), stiffness(u, J, Dt, G)) < 1e-13
    ug, Jg, Dg, _, Gg = _data(order, E, quad="gll")
    assert rel(ck.stiffness_gll_cuda(ug, Dg, Gg), stiffness_gll(ug, Dg, Gg)) < 1e-13


# The operators _run dispatches (the others have their own tests below).
OP_VARIANTS = [(op, v) for op in ("bk5", "mass", "stiffness") for v in ck.VARIANTS[op]]


def _run(op, u, J, Dt, B, G, ug, Dg, Gg):
    """``op`` through its public function (``ug, Dg, Gg``: the GLL data for BK5)."""
    if op == "mass":
        return ck.mass_cuda(u, J, B)
    if op == "stiffness":
        return ck.stiffness_cuda(u, J, Dt, G)
    return ck.stiffness_gll_cuda(ug, Dg, Gg)


def _want(op, u, J, Dt, B, G, ug, Dg, Gg):
    if op == "mass":
        return mass(u, J, B)
    if op == "stiffness":
        return stiffness(u, J, Dt, G)
    return stiffness_gll(ug, Dg, Gg)


@gpu
@pytest.mark.parametrize("op,variant", OP_VARIANTS)
@pytest.mark.parametrize("order", [1, 7, 9, 12])
def test_every_variant_equal_to_einsum(built, monkeypatch, op, variant, order):
    """Each variant, selected through the tuning table, against einsum: 3 components."""
    u, J, Dt, B, G = _data(order, 11, comps=3)
    ug, _, Dg, _, Gg = _data(order, 11, comps=3, quad="gll")
    monkeypatch.setitem(ck.TUNING, (op, order + 1, True, "float64"), (variant, False))
    got, want = _run(op, u, J, Dt, B, G, ug, Dg, Gg), _want(op, u, J, Dt, B, G, ug, Dg, Gg)
    assert float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) < 1e-13


@gpu
@pytest.mark.parametrize("op,variant", OP_VARIANTS)
@pytest.mark.parametrize("order", [1, 7, 13])
def test_prefetch_changes_nothing(built, monkeypatch, op, variant, order):
    """The L2 prefetch is a hint: with it on, every variant's result is bit-identical to off
    (3 components, a ragged last block)."""
    u, J, Dt, B, G = _data(order, 11, comps=3)
    ug, _, Dg, _, Gg = _data(order, 11, comps=3, quad="gll")
    out = {}
    for pf in (True, False):
        monkeypatch.setitem(ck.TUNING, (op, order + 1, True, "float64"), (variant, pf))
        out[pf] = np.asarray(_run(op, u, J, Dt, B, G, ug, Dg, Gg))
    np.testing.assert_array_equal(out[True], out[False])


@gpu
@pytest.mark.parametrize("op,variant", [(op, v) for op, v in OP_VARIANTS if v >= 4])
def test_constant_memory_follows_each_call(built, monkeypatch, op, variant):
    """The constant-memory copy of D/J is refreshed for every launch: one jitted function with two
    different matrices of the same order, and two orders, gives each call its own result."""
    for n in (4, 6):
        monkeypatch.setitem(ck.TUNING, (op, n, False, "float64"), (variant, False))
    u, J, Dt, B, G = _data(5, 7)
    ug, _, Dg, _, Gg = _data(5, 7, quad="gll")
    u2, J2, Dt2, B2, G2 = _data(3, 7, seed=1)
    ug2, _, Dg2, _, Gg2 = _data(3, 7, quad="gll", seed=1)
    cases = [(u, J, Dt, B, G, ug, Dg, Gg), (u, 0.5 * J, 2.0 * Dt, B, G, ug, 2.0 * Dg, Gg),
             (u2, J2, Dt2, B2, G2, ug2, Dg2, Gg2)]
    got = jax.jit(lambda cases: [_run(op, *c) for c in cases])(cases)
    for g, c in zip(got, cases):
        want = _want(op, *c)
        assert float(jnp.max(jnp.abs(g - want)) / jnp.max(jnp.abs(want))) < 1e-13


@gpu
def test_vector_forms_and_float32(built):
    u, J, Dt, B, G = _data(6, 21, comps=3)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert rel(ck.mass_cuda(u, J, B), mass(u, J, B)) < 1e-13
    assert rel(ck.stiffness_cuda(u, J, Dt, G), stiffness(u, J, Dt, G)) < 1e-13
    ug, _, Dg, _, Gg = _data(6, 21, comps=3, quad="gll")
    assert rel(ck.stiffness_gll_cuda(ug, Dg, Gg), stiffness_gll(ug, Dg, Gg)) < 1e-13
    w32 = ck.stiffness_gll_cuda(ug[0].astype(jnp.float32), Dg.astype(jnp.float32), Gg.astype(jnp.float32))
    assert w32.dtype == jnp.float32 and rel(w32.astype(jnp.float64), stiffness_gll(ug[0], Dg, Gg)) < 1e-5


@gpu
def test_derivatives_are_the_references(built):
    u, J, Dt, B, G = _data(3, 9)
    f = lambda G, u: jnp.sum(jnp.sin(ck.stiffness_cuda(u, J, Dt, G)))
    g = lambda G, u: jnp.sum(jnp.sin(stiffness(u, J, Dt, G)))
    for a, b in zip(jax.grad(f, (0, 1))(G, u), jax.grad(g, (0, 1))(G, u)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


@gpu
@pytest.mark.parametrize("bp", [1, 3, 4, 5, 6])
def test_solve_with_cuda_kernels(bp):
    """Same iterates up to rounding (iteration counts within one), same solution, same
    gradient: the kernel in every forward and adjoint PCG iteration (BP5/BP6: the fused
    kernel on assembled vectors)."""
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


@gpu
@pytest.mark.parametrize("op, variant", [("bk5a", v) for v in ck.VARIANTS["bk5a"]]
                         + [("stiffnessa", v) for v in ck.VARIANTS["stiffnessa"]])
@pytest.mark.parametrize("order, comps", [(1, 1), (3, 3), (7, 1), (7, 3), (12, 1), (15, 1)])
def test_assembled_kernel_equals_reference(monkeypatch, op, variant, order, comps):
    """BK5 (bk5a) and BK3 (stiffnessa) on assembled vectors (gather, element operator, atomic
    sum in one launch) against take + einsum + segment_sum, on a mesh with Dirichlet nodes and
    a ragged last block."""
    from jaxsem.backends import EINSUM

    bp = 5 if op == "bk5a" else 3
    sem = poisson.bp_discretize(box_mesh((3, 2, 2), order, deform=0.1), bp, backend="einsum")
    a = sem.assembled
    monkeypatch.setitem(ck.TUNING, (op, order + 1, comps > 1, "float64"), (variant, False))
    x = jax.random.normal(jax.random.PRNGKey(order), ((comps,) if comps > 1 else ()) + (a.size,))
    G = jax.random.normal(jax.random.PRNGKey(1), sem.geom.G.shape)
    if op == "bk5a":
        fused = lambda x: ck.stiffness_gll_assembled_cuda(x, a.idx, sem.D, G)
        ref = lambda x: EINSUM.stiffness_gll_assembled(x, a.idx, sem.D, G)
    else:
        fused = lambda x: ck.stiffness_assembled_cuda(x, a.idx, sem.J, sem.Dt, G)
        ref = lambda x: EINSUM.stiffness_assembled(x, a.idx, sem.J, sem.Dt, G)
    got, want = fused(x), ref(x)
    assert float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) < 1e-13
    free = np.zeros(a.size, bool)
    free[np.asarray(a.idx)[np.asarray(a.idx) < a.size]] = True
    assert float(jnp.max(jnp.abs(got[..., ~free]))) == 0.0  # Dirichlet slots untouched
    dx = jax.random.normal(jax.random.PRNGKey(9), x.shape)
    t_got = jax.jvp(fused, (x,), (dx,))[1]
    np.testing.assert_allclose(t_got, ref(dx), rtol=1e-12, atol=1e-12 * float(jnp.max(jnp.abs(t_got))))


@gpu
@pytest.mark.parametrize("variant", ck.VARIANTS["maxwell"])
@pytest.mark.parametrize("order", [1, 3, 7, 14])
@pytest.mark.parametrize("flux, bc", [("upwind", "pec"), ("central", "pmc")])
def test_fused_maxwell_rhs_equals_einsum(monkeypatch, variant, order, flux, bc):
    """The fused Maxwell right-hand side against the einsum form: curved elements, one periodic
    axis and walls, per-node ε, μ, random fields; then its gradient w.r.t. ε."""
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import maxwell as mx

    monkeypatch.setitem(ck.TUNING, ("maxwell", order + 1, False, "float64"), (variant, False))

    mesh = box_mesh((3, 2, 2), order, deform=0.1, periodic=(True, False, False))
    dgs = {b: discretize_dg(mesh, backend=b) for b in ("einsum", "cuda")}
    assert dgs["cuda"].nbr is not None and discretize_dg(mesh).backend.name == "cuda"
    shape = dgs["cuda"].jac.shape
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(order), 3)
    eps = 1.0 + jax.random.uniform(k1, shape)
    mu = 1.0 + jax.random.uniform(k2, shape)
    q = jax.random.normal(k3, (6,) + shape)
    out = {b: mx.rhs(dg, mx.material(dg, eps, mu), q, flux, bc, form="chain") for b, dg in dgs.items()}
    scale = float(jnp.max(jnp.abs(out["einsum"])))
    assert float(jnp.max(jnp.abs(out["cuda"] - out["einsum"]))) < 1e-13 * scale

    def loss(dg):
        return lambda eps: jnp.sum(jnp.sin(mx.rhs(dg, mx.material(dg, eps, mu), q, flux, bc, form="chain")))
    ge, gc = (jax.grad(loss(dgs[b]))(eps) for b in ("einsum", "cuda"))
    np.testing.assert_allclose(gc, ge, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(ge))))

    # On an affine mesh the default (split) form runs the kernel too: the same operator.
    mesh = box_mesh((3, 2, 2), order, periodic=(True, False, False))
    dgs = {b: discretize_dg(mesh, backend=b) for b in ("einsum", "cuda")}
    f = {b: jax.jit(lambda q, dg=dg: mx.rhs(dg, mx.material(dg, eps, mu), q, flux, bc)) for b, dg in dgs.items()}
    assert "jaxsem_maxwell" in f["cuda"].lower(q).as_text()
    out = {b: f[b](q) for b in dgs}
    scale = float(jnp.max(jnp.abs(out["einsum"])))
    assert float(jnp.max(jnp.abs(out["cuda"] - out["einsum"]))) < 1e-12 * scale


@gpu
@pytest.mark.parametrize("variant", ck.VARIANTS["maxwell"])
@pytest.mark.parametrize("order", [1, 3, 7, 14])
@pytest.mark.parametrize("flux, bc", [("upwind", "pec"), ("central", "pmc"), ("upwind", "pmc")])
def test_maxwell_material_adjoint_kernel_equals_einsum(monkeypatch, variant, order, flux, bc):
    """The material adjoint kernel (cotangents of ε, μ and the four flux coefficients for a random
    cotangent of the right-hand side) equals JAX's transpose of the written-out material tangent:
    curved elements, one periodic axis and walls, per-node ε, μ; the a-terms 0 with the central flux."""
    from jaxsem.backends import EMULATED
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import maxwell as mx

    monkeypatch.setitem(ck.TUNING, ("maxwell", order + 1, False, "float64"), (variant, False))
    mesh = box_mesh((3, 2, 2), order, deform=0.1, periodic=(True, False, False))
    dgs = {b: discretize_dg(mesh, backend=b) for b in ("cuda", EMULATED)}  # EMULATED: JAX's transpose
    shape = dgs["cuda"].jac.shape
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(10 + order), 4)
    eps, mu = 1.0 + jax.random.uniform(k1, shape), 1.0 + jax.random.uniform(k2, shape)
    q, ct = jax.random.normal(k3, (6,) + shape), jax.random.normal(k4, (6,) + shape)
    got, want = (dg.backend.maxwell_material_kernel_vjp(dg, mx.material(dg, eps, mu), q, ct, flux, bc)
                 for dg in dgs.values())
    for name in ("eps", "mu", "cE", "aE", "cH", "aH"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.shape == w.shape, name
        if flux == "central" and name in ("aE", "aH"):
            assert float(jnp.max(jnp.abs(g))) == 0.0 and float(jnp.max(jnp.abs(w))) == 0.0
            continue
        scale = float(jnp.max(jnp.abs(w)))
        assert scale > 0 and float(jnp.max(jnp.abs(g - w))) < 1e-13 * scale, (name, float(jnp.max(jnp.abs(g - w))), scale)


def _advection_case(order, periodic=(True, False, True)):
    """Both backends' DG of a curved mesh with walls and periodic axes, a Transport each, random u."""
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import advection as adv

    mesh = box_mesh((3, 2, 2), order, deform=0.1, periodic=periodic)
    dgs = {b: discretize_dg(mesh, backend=b) for b in ("einsum", "cuda")}
    trs = {b: adv.transport(dg, (1.0, -0.7, 0.4)) for b, dg in dgs.items()}
    u = jax.random.normal(jax.random.PRNGKey(order), dgs["einsum"].jac.shape)
    return dgs, trs, u


@gpu
@pytest.mark.parametrize("variant", ck.VARIANTS["advection"])
@pytest.mark.parametrize("order", [1, 3, 7, 14])
def test_fused_advection_rhs_equals_einsum(monkeypatch, variant, order):
    """The fused advection right-hand side against the einsum form, every form and flux: curved
    elements, walls (inflow u⁺ = 0) and two periodic axes, a ragged last block, random u."""
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import advection as adv

    monkeypatch.setitem(ck.TUNING, ("advection", order + 1, False, "float64"), (variant, False))
    dgs, trs, u = _advection_case(order)
    assert dgs["cuda"].nbr is not None and discretize_dg(box_mesh((1, 1, 1), order)).backend.name == "cuda"
    for form in adv.FORMS:
        for flux in adv.FLUXES:
            out = {b: adv.rhs(dg, trs[b], u, flux, form) for b, dg in dgs.items()}
            scale = float(jnp.max(jnp.abs(out["einsum"])))
            err = float(jnp.max(jnp.abs(out["cuda"] - out["einsum"])))
            assert err < 1e-13 * scale, (form, flux, err / scale)


@gpu
@pytest.mark.parametrize("form", ["split", "conservative", "chain"])
def test_fused_advection_gradient_through_steps(form):
    """jax.grad through three LSERK4 steps of ``timestepping.integrate``, w.r.t. the initial
    state and a scale of the velocity (through the Transport): the same with the fused kernel
    (its tangent is the einsum form's) as with einsum."""
    import dataclasses

    from jaxsem.models import advection as adv
    from jaxsem.solvers import timestepping as ts

    dgs, trs, u0 = _advection_case(3)

    def loss(b):
        dg, tr = dgs[b], trs[b]

        def f(u0, s):
            trs_ = dataclasses.replace(tr, A=s * tr.A, an=s * tr.an, vn=s * tr.vn)
            rhs = lambda t, u: adv.rhs(dg, trs_, u, "upwind", form)
            return jnp.sum(jnp.sin(ts.integrate(rhs, u0, 0.01, 3)))
        return f

    (gu_e, gs_e), (gu_c, gs_c) = (jax.grad(loss(b), (0, 1))(u0, 1.0) for b in ("einsum", "cuda"))
    np.testing.assert_allclose(gu_c, gu_e, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(gu_e))))
    np.testing.assert_allclose(gs_c, gs_e, rtol=1e-10)


def test_maxwell_material_vjp_cuda_checks_its_arguments():
    E, n = 3, 4
    q = jnp.zeros((6, E, n, n, n))
    D, rx, m, nrm, fa = (jnp.zeros((n, n)), jnp.zeros((3, 3, E, n, n, n)), jnp.ones((E, n, n, n)),
                         jnp.zeros((3, E, 6, n, n)), jnp.zeros((E, 6, n, n)))
    nbr = jnp.full((E, 6, n, n), -1, jnp.int32)
    call = lambda q=q, lam=q, nbr=nbr: ck.maxwell_material_vjp_cuda(q, lam, D, rx, m, m, nrm, fa, fa, fa, fa, nbr,
                                                                     True, False)
    with pytest.raises(ValueError, match=re.escape("q must be (6, E, n, n, n)")):
        call(q=q[:3], lam=q[:3])
    with pytest.raises(ValueError, match=re.escape("lam must be shaped as q (6, 3, 4, 4, 4)")):
        call(lam=q[:, :2])
    with pytest.raises(ValueError, match="nbr must be"):
        call(nbr=nbr.astype(jnp.int64))
    if not ck.cuda_available():
        with pytest.raises(ValueError, match="need a CUDA GPU"):
            call()


def test_advection_rhs_cuda_checks_its_arguments():
    E, n = 3, 4
    u = jnp.zeros((E, n, n, n))
    D, A, jac, fa = jnp.zeros((n, n)), jnp.zeros((3, E, n, n, n)), jnp.ones((E, n, n, n)), jnp.zeros((E, 6, n, n))
    nbr = jnp.full((E, 6, n, n), -1, jnp.int32)
    with pytest.raises(ValueError, match="u must be"):
        ck.advection_rhs_cuda(jnp.zeros((2, E, n, n, n)), D, A, jac, fa, fa, fa, nbr, "split", True)
    with pytest.raises(ValueError, match=re.escape("A must be (3, 3, 4, 4, 4)")):
        ck.advection_rhs_cuda(u, D, A[:2], jac, fa, fa, fa, nbr, "split", True)
    with pytest.raises(ValueError, match="lw must be"):
        ck.advection_rhs_cuda(u, D, A, jac, fa, fa, fa[:, :5], nbr, "split", True)
    with pytest.raises(ValueError, match="nbr must be"):
        ck.advection_rhs_cuda(u, D, A, jac, fa, fa, fa, nbr.astype(jnp.int64), "split", True)
    with pytest.raises(ValueError, match="form must be one of"):
        ck.advection_rhs_cuda(u, D, A, jac, fa, fa, fa, nbr, "skew", True)
    if not ck.cuda_available():
        with pytest.raises(ValueError, match="need a CUDA GPU"):
            ck.advection_rhs_cuda(u, D, A, jac, fa, fa, fa, nbr, "split", True)


def test_advection_throughput_models():
    """The bytes and flop models of experiments/advection_throughput.py, exact values."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                        "advection_throughput.py")
    spec = importlib.util.spec_from_file_location("advection_throughput", path)
    at = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(at)
    b = at.bytes_per_step(7, 1)  # n = 512 nodes, 384 face points, 5 stages, float64
    assert b == dict(fields=81920, geometry=81920, faces=53760, total=217600)
    assert b["total"] / 512 == 425.0  # bytes per point-step at N = 7: 5 × (64 + 0.75 × 28)
    assert at.bytes_per_step(14, 1)["total"] / 15**3 == 376.0  # 5 × (64 + 0.4 × 28)
    assert at.bytes_per_step(7, 4096, word=4)["total"] == 220 * 4096 * 512  # 5 × (32 + 0.75 × 16)
    assert at.flops_per_step(7, 1) == 5 * (115 * 512 + 11 * 384)  # split, upwind
    assert at.flops_per_step(7, 1, "chain", "central") == 5 * (60 * 512 + 7 * 384)
    assert at.flops_per_step(14, 2, "conservative") == 5 * 2 * (102 * 3375 + 11 * 1350)


def test_interp_cuda_checks_its_arguments():
    J = jnp.zeros((8, 5))
    assert ck.transfer_supported(jnp.zeros((2, 5, 5, 5)), J, False)
    assert ck.transfer_supported(jnp.zeros((3, 2, 8, 8, 8)), J, True)
    assert not ck.transfer_supported(jnp.zeros((2, 8, 8, 8)), J, False)  # prolongation takes the coarse size
    assert not ck.transfer_supported(jnp.zeros((2, 5, 5, 5)), J.T, False)  # m < n
    assert not ck.transfer_supported(jnp.zeros((2, 5, 5, 5), jnp.int32), J, False)
    with pytest.raises(ValueError, match="2 <= m < n <= 16"):
        ck.interp_cuda(jnp.zeros((2, 17, 17, 17)), jnp.zeros((17, 9)), back=True)


@gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n, m, lead", [(8, 5, ()), (5, 3, (2,)), (3, 2, ()), (16, 15, ()), (16, 2, (3,)), (9, 5, ())])
def test_transfer_kernels_equal_einsum(dtype, n, m, lead):
    """Prolongation and the restriction's transpose interpolation as one kernel equal the einsum
    form (E ragged for every elements-per-block), and their tangents are the einsum form's."""
    from jaxsem.core import basis
    from jaxsem.operators.tensor import interp, interp_t

    E = 37
    J = jnp.asarray(basis.interp_matrix(m, n, "gll", "gll")[0], dtype)
    assert J.shape == (n, m)
    uc = jax.random.normal(jax.random.PRNGKey(n), lead + (E, m, m, m), dtype)
    vf = jax.random.normal(jax.random.PRNGKey(m), lead + (E, n, n, n), dtype)
    tol = 1e-13 if dtype == "float64" else 2e-6
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    up, rv = ck.interp_cuda(uc, J), ck.interp_cuda(vf, J, back=True)
    assert up.shape == vf.shape and rv.shape == uc.shape and up.dtype == rv.dtype == jnp.dtype(dtype)
    # against the float64 einsum form of the same inputs (XLA's float32 dot on a GPU is TF32)
    f64 = lambda a: a.astype(jnp.float64)
    assert rel(up, interp(f64(uc), f64(J))) < tol and rel(rv, interp_t(f64(vf), f64(J))) < tol
    # the transpose pair: <P u, v> = <u, Pᵀ v>
    assert abs(float(jnp.vdot(up, vf) - jnp.vdot(uc, rv))) < 10 * tol * float(jnp.sum(jnp.abs(up * vf)))
    if dtype == "float64":
        g = jax.grad(lambda u: jnp.vdot(ck.interp_cuda(u, J), vf))(uc)
        assert rel(g, interp_t(vf, J)) < 1e-13


def test_gs_csr_cuda_checks_its_arguments():
    u = jnp.zeros((3, 10))
    with pytest.raises(ValueError, match="u must be"):
        ck.gs_csr_cuda(jnp.zeros(10), jnp.zeros(11, jnp.int32), jnp.zeros(0, jnp.int32))
    with pytest.raises(ValueError, match="off must be"):
        ck.gs_csr_cuda(u, jnp.zeros(10, jnp.int32), jnp.zeros(0, jnp.int32))


@gpu
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_gs_csr_kernel_equals_segment_and_copies_agree(built, lead):
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
def test_solve_and_gradient_same_with_gs_kernel(built):
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


def _convection_data(order, E, m, seed=1):
    n = order + 1
    qd = geometry.quadrature(order, "gauss", q=ck.convection_q(n))
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    c = jax.random.normal(k1, (m, E, n, n, n), jnp.float64)
    u = jax.random.normal(k2, (3, E, n, n, n), jnp.float64)
    q = qd.J.shape[0]
    Brx = jax.random.normal(k3, (3, 3, E, q, q, q), jnp.float64)
    return c, u, jnp.asarray(qd.J), jnp.asarray(qd.Dt), Brx


def test_convection_bad_calls_are_clear_errors():
    c, u, J, Dd, Brx = _convection_data(2, 3, 1)
    with pytest.raises(ValueError, match=re.escape("J must be (5, 3)")):
        ck.convection_cuda(c, u, J[:4], Dd, Brx)
    with pytest.raises(ValueError, match=re.escape("u must be (3, 3, 3, 3, 3)")):
        ck.convection_cuda(c, u[:2], J, Dd, Brx)
    with pytest.raises(ValueError, match="c must be \\(m, E, n, n, n\\)"):
        ck.convection_cuda(c[0], u, J, Dd, Brx)
    if not ck.cuda_available():
        with pytest.raises(ValueError, match="need a CUDA GPU"):
            ck.convection_cuda(c, u, J, Dd, Brx)


@gpu
@pytest.mark.parametrize("order,m", [(1, 1), (2, 3), (4, 1), (5, 3), (7, 3), (7, 1), (9, 2)])
def test_convection_equal_to_einsum(order, m):
    """The fused convection kernel and its transpose (convt) equal their einsum forms (random fields
    and factors, E ragged for every elements-per-block); tangent and gradient are the einsum form's."""
    from jaxsem.operators.convection import advection_local

    c, u, J, Dd, Brx = _convection_data(order, 37, m)
    ref = advection_local(c, u, J, Dd, Brx)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert rel(ck.convection_cuda(c, u, J, Dd, Brx), ref) < 1e-13
    assert rel(jax.jit(ck.convection_cuda)(c, u, J, Dd, Brx), ref) < 1e-13
    _, t = jax.jvp(lambda c, u: ck.convection_cuda(c, u, J, Dd, Brx), (c, u), (u[:m], c[:1].repeat(3, 0)))
    _, t_ref = jax.jvp(lambda c, u: advection_local(c, u, J, Dd, Brx), (c, u), (u[:m], c[:1].repeat(3, 0)))
    assert rel(t, t_ref) < 1e-13
    cbar, ubar = ck.convection_vjp_cuda(ref, c, u, J, Dd, Brx)
    cbar_ref, ubar_ref = ck.convection_vjp_reference(ref, c, u, J, Dd, Brx)
    assert rel(cbar, cbar_ref) < 1e-13 and rel(ubar, ubar_ref) < 1e-13
    g = jax.grad(lambda u, B: jnp.sum(ck.convection_cuda(c, u, J, Dd, B) ** 2), (0, 1))(u, Brx)
    g_ref = jax.grad(lambda u, B: jnp.sum(advection_local(c, u, J, Dd, B) ** 2), (0, 1))(u, Brx)
    assert all(rel(a, b) < 1e-12 for a, b in zip(g, g_ref))


@gpu
@pytest.mark.parametrize("op", ["bk5", "bk5a"])
@pytest.mark.parametrize("order", [3, 7])
def test_compact_affine_factors_equal_the_full_ones(monkeypatch, op, order):
    """On an affine mesh the kernels given the compact factors ``(6, E, 1, 1, 1)`` (recomputing
    G from the weights) equal the reference with the full factors, in every element variant,
    one and three components, with h₁ a scalar, per element and per node (expanded)."""
    from jaxsem.backends import EINSUM
    from jaxsem.operators.stiffness import affine_factors

    sem = poisson.bp_discretize(box_mesh((3, 2, 2), order, lengths=(1.0, 2.0, 0.5)), 5, backend="einsum")
    c, G, a = affine_factors(sem.geom.G), sem.geom.G, sem.assembled
    assert c is not None
    E, n = sem.num_elements, order + 1
    hs = (None, 0.7, 1.0 + jnp.arange(E, dtype=float).reshape(E, 1, 1, 1),
          1.0 + jax.random.uniform(jax.random.PRNGKey(1), (E, n, n, n)))
    for variant in ck.VARIANTS[op]:
        if variant not in ck._ELEMENT_VARIANTS:  # the affine form has element variants only
            continue
        for comps in (1, 3):
            monkeypatch.setitem(ck.TUNING, (op, n, comps > 1, "float64"), (variant, False))
            lead = (comps,) if comps > 1 else ()
            if op == "bk5":
                x = jax.random.normal(jax.random.PRNGKey(order), lead + sem.mask.shape)
                fused = lambda x, h: ck.stiffness_gll_cuda(x, sem.D, c, h)
                ref = lambda x, h: EINSUM.stiffness_gll(x, sem.D, G, h)
            else:
                x = jax.random.normal(jax.random.PRNGKey(order), lead + (a.size,))
                fused = lambda x, h: ck.stiffness_gll_assembled_cuda(x, a.idx, sem.D, c, h)
                ref = lambda x, h: EINSUM.stiffness_gll_assembled(x, a.idx, sem.D, G, h)
            for h in hs:
                got, want = fused(x, h), ref(x, h)
                err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
                assert err < 1e-13, (variant, comps, None if h is None else jnp.shape(h), err)
    dx = jax.random.normal(jax.random.PRNGKey(9), x.shape)
    t_got = jax.jvp(lambda x: fused(x, 0.7), (x,), (dx,))[1]
    np.testing.assert_allclose(t_got, ref(dx, 0.7), rtol=1e-12, atol=1e-12 * float(jnp.max(jnp.abs(t_got))))


@gpu
def test_cuda_backend_takes_the_compact_factors_on_affine_meshes():
    """``backend="cuda"`` keeps the compact factors on a box and solves as the reference; a
    deformed mesh keeps the full ones."""
    mesh = box_mesh((3, 2, 2), 3)
    cu, ref = (poisson.bp_discretize(mesh, 5, backend=b) for b in ("cuda", "einsum"))
    assert cu.affine is not None and ref.affine is None
    assert poisson.bp_discretize(box_mesh((3, 2, 2), 3, deform=0.1), 5, backend="cuda").affine is None
    B = ref.geom.B
    f = 1.0 + 0.5 * jnp.cos(jnp.arange(B.size).reshape(B.shape))
    (uc, ic), (ur, ir) = (poisson.solve(s, f, 1.0, 0.5, tol=1e-12) for s in (cu, ref))
    assert bool(ic.converged) and abs(int(ic.iterations) - int(ir.iterations)) <= 1
    assert float(jnp.max(jnp.abs(uc - ur)) / jnp.max(jnp.abs(ur))) < 1e-10
