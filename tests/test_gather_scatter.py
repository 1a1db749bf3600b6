import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.backends.cuda import cuda_available
from jaxsem.discretization.gather_scatter import csr_gather, gs_apply, make_gs
from jaxsem.mesh import box_mesh
from jaxsem.mesh.numbering import number_nodes


@pytest.fixture(scope="module")
def numbering():
    return number_nodes(box_mesh((3, 2, 2), 3, periodic=(True, False, False)))


def _reference(gid, u):
    s = np.zeros(gid.max() + 1)
    np.add.at(s, gid.ravel(), u.ravel())
    return s[gid]


ON_GPU = cuda_available()


@pytest.mark.parametrize("layout", ["segment", pytest.param("csr", marks=pytest.mark.skipif(
    not ON_GPU, reason="layout 'csr' is the CUDA gather kernel: needs a CUDA GPU"))])
def test_layouts_equal_reference(numbering, layout):
    plan = make_gs(numbering.gid, numbering.num_global, layout)
    u = np.random.default_rng(1).standard_normal(numbering.gid.shape)
    np.testing.assert_allclose(gs_apply(plan, jnp.asarray(u)), _reference(numbering.gid, u), rtol=1e-14, atol=1e-14)
    # vector form: one gs per component
    v = np.random.default_rng(2).standard_normal((3,) + numbering.gid.shape)
    out = gs_apply(plan, jnp.asarray(v))
    for c in range(3):
        np.testing.assert_allclose(out[c], _reference(numbering.gid, v[c]), rtol=1e-14, atol=1e-14)
    # two leading axes (6 fields in one call), and its VJP is the same map (QQᵀ is symmetric)
    v2 = jnp.asarray(np.random.default_rng(3).standard_normal((2, 3) + numbering.gid.shape))
    out2 = gs_apply(plan, v2)
    assert out2.shape == v2.shape
    for a in range(2):
        for c in range(3):
            np.testing.assert_allclose(out2[a, c], _reference(numbering.gid, np.asarray(v2[a, c])), rtol=1e-14,
                                       atol=1e-14)
    _, vjp = jax.vjp(lambda x: gs_apply(plan, x), v2)
    np.testing.assert_allclose(vjp(v2[::-1])[0], gs_apply(plan, v2[::-1]), rtol=1e-13, atol=1e-13)


def test_multiplicity(numbering):
    plan = make_gs(numbering.gid, numbering.num_global)
    counts = gs_apply(plan, jnp.ones(numbering.gid.shape))
    np.testing.assert_allclose(plan.mult * counts, 1.0)
    # interior corner nodes are shared by 8 elements at most, element interiors by 1
    assert float(counts.max()) == 8.0 and float(counts.min()) == 1.0


def test_gs_is_symmetric_and_its_own_transpose(numbering):
    plan = make_gs(numbering.gid, numbering.num_global, "segment")
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    u = jax.random.normal(k1, numbering.gid.shape)
    v = jax.random.normal(k2, numbering.gid.shape)
    lhs = jnp.vdot(v, gs_apply(plan, u))
    rhs = jnp.vdot(gs_apply(plan, v), u)
    assert abs(float(lhs - rhs)) < 1e-12 * abs(float(lhs))
    _, vjp = jax.vjp(lambda a: gs_apply(plan, a), u)
    np.testing.assert_allclose(vjp(v)[0], gs_apply(plan, v), rtol=1e-13, atol=1e-13)


def test_bad_layout(numbering):
    with pytest.raises(ValueError, match="layout"):
        make_gs(numbering.gid, numbering.num_global, "fast")


def test_csr_rows_list_every_copy_in_one_order(numbering):
    """The "csr" plan: a shared node's copies each list all copies of the node, in the same
    order (so the GPU kernel gives them bit-identical sums); a node with one copy has an empty
    row. Its gather (here in JAX, on the GPU one kernel) equals the reference."""
    plan = make_gs(numbering.gid, numbering.num_global, "csr")
    off, idx = np.asarray(plan.csr_off), np.asarray(plan.csr_idx)
    flat = numbering.gid.reshape(-1)
    counts = np.bincount(flat)
    assert off[0] == 0 and off[-1] == idx.size == sum(c * c for c in counts if c > 1)
    for i in range(flat.size):
        row = idx[off[i]:off[i + 1]]
        if counts[flat[i]] == 1:
            assert row.size == 0
        else:
            assert sorted(row) == list(row) and set(row) == set(np.nonzero(flat == flat[i])[0])
    v = np.random.default_rng(4).standard_normal((3,) + numbering.gid.shape)
    got = csr_gather(jnp.asarray(v.reshape(3, -1)), plan.csr_off, plan.csr_idx).reshape(v.shape)
    for c in range(3):
        np.testing.assert_allclose(got[c], _reference(numbering.gid, v[c]), rtol=1e-14, atol=1e-14)
