import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.core.geometry import quadrature
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.operators import BK_SPECS, bk_apply, mass, stiffness, stiffness_gll
from jaxsem.operators.bk import bk_diagonal


def _dense_reference(mesh, kind, h1, h2, numbering_gid, num_global):
    """Global matrix built entry by entry: explicit Kronecker basis, NumPy geometry."""
    q = quadrature(mesh.order, kind)
    J, Dt, w = q.J, q.Dt, q.w
    Phi = np.kron(np.kron(J, J), J)  # (q³, n³), [k, j, i] order
    dPhi = [np.kron(np.kron(J, J), Dt), np.kron(np.kron(J, Dt), J), np.kron(np.kron(Dt, J), J)]
    w3 = np.kron(np.kron(w, w), w)
    A = np.zeros((num_global, num_global))
    for e in range(mesh.num_elements):
        xe = mesh.x[:, e].reshape(3, -1)
        jm = np.stack([[dPhi[a] @ xe[d] for a in range(3)] for d in range(3)])  # [d, a, q]
        jm = np.moveaxis(jm, -1, 0)  # (q³, 3 [x_d], 3 [r_a])
        det = np.linalg.det(jm)
        inv = np.linalg.inv(jm)  # [q, a, d] = ∂r_a/∂x_d
        grad = np.einsum("qad,aqm->dqm", inv, np.stack(dPhi))  # ∂φ_m/∂x_d at q
        K = h1 * np.einsum("dqm,q,dqn->mn", grad, w3 * det, grad) + h2 * Phi.T @ ((w3 * det)[:, None] * Phi)
        g = numbering_gid[e].ravel()
        np.add.at(A, (g[:, None], g[None, :]), K)
    return A


def _operator_matrix(sem, op):
    gid = np.asarray(sem.gs.gid).reshape(sem.mask.shape)
    G = sem.num_global
    first = np.zeros(G, int)
    first[gid.ravel()[::-1]] = np.arange(gid.size)[::-1]
    cols = []
    apply = jax.jit(op)
    for j in range(G):
        u = jnp.asarray((gid == j).astype(float))
        cols.append(np.asarray(apply(u)).ravel()[first])
    return np.stack(cols, 1)


@pytest.mark.parametrize("kind, h1, h2", [("gauss", 1.0, 0.0), ("gll", 1.0, 0.0), ("gauss", 0.0, 1.0), ("gauss", 0.7, 2.5)])
def test_assembled_operator_equals_dense_matrix(kind, h1, h2):
    mesh = box_mesh((2, 1, 1), order=2, deform=0.12, lengths=(1.0, 0.7, 1.3))
    sem = discretize(mesh, quadrature=kind, dirichlet=False)
    A = _operator_matrix(sem, poisson.operator(sem, h1, h2))
    gid = np.asarray(sem.gs.gid).reshape(sem.mask.shape)
    ref = _dense_reference(mesh, kind, h1, h2, gid, sem.num_global)
    assert np.abs(A - ref).max() < 1e-13 * np.abs(ref).max()
    np.testing.assert_allclose(A, A.T, atol=1e-13 * np.abs(A).max())
    # the Jacobi diagonal is the exact diagonal
    d = np.asarray(poisson.jacobi(sem, h1, h2)).ravel()[np.unique(gid.ravel(), return_index=True)[1]]
    np.testing.assert_allclose(1.0 / d, np.diag(ref), rtol=1e-13)


def test_dirichlet_operator_is_masked_block():
    mesh = box_mesh((2, 2, 1), order=2, deform=0.1)
    sem = discretize(mesh, quadrature="gll", dirichlet=True)
    A = _operator_matrix(sem, poisson.operator(sem))
    gid = np.asarray(sem.gs.gid).reshape(sem.mask.shape)
    interior = np.zeros(sem.num_global, bool)
    interior[gid[np.asarray(sem.mask) > 0]] = True
    ref = _dense_reference(mesh, "gll", 1.0, 0.0, gid, sem.num_global)
    blk = np.ix_(interior, interior)
    assert np.abs(A[blk] - ref[blk]).max() < 1e-13 * np.abs(ref).max()
    assert np.all(A[~interior] == 0)
    assert np.linalg.eigvalsh(A[blk]).min() > 0


@pytest.mark.parametrize("k", range(1, 7))
def test_bk_symmetric_psd_and_constants(k):
    spec = BK_SPECS[k]
    mesh = box_mesh((2, 2, 1), order=4, deform=0.1)
    sem = discretize(mesh, quadrature=spec.quadrature, dirichlet=spec.dirichlet)
    shape = ((3,) if spec.components == 3 else ()) + sem.mask.shape
    k1, k2 = jax.random.split(jax.random.PRNGKey(k))
    u, v = jax.random.normal(k1, shape), jax.random.normal(k2, shape)
    op = lambda a: bk_apply(spec, a, sem.J, sem.Dt, sem.geom.G, sem.geom.B)
    Au, Av = op(u), op(v)
    # element-wise symmetry and positive semi-definiteness (on E-vectors, per element)
    assert abs(float(jnp.vdot(v, Au) - jnp.vdot(u, Av))) < 1e-12 * float(jnp.abs(jnp.vdot(v, Au)))
    per_elem = jnp.sum((u * Au).reshape(-1, *sem.mask.shape).sum(0).reshape(sem.mask.shape[0], -1), axis=1)
    assert float(per_elem.min()) > 0
    if spec.operator == "stiffness":
        ones = jnp.ones(shape)
        assert float(jnp.abs(op(ones)).max()) < 1e-12 * float(jnp.abs(Au).max())
    if spec.components == 3:
        for c in range(3):
            sc = BK_SPECS[k - 1]
            np.testing.assert_allclose(Au[c], bk_apply(sc, u[c], sem.J, sem.Dt, sem.geom.G, sem.geom.B), rtol=1e-14, atol=1e-14)
    # the diagonal helper is the element operator's diagonal
    d = bk_diagonal(spec, sem.J, sem.Dt, sem.geom.G, sem.geom.B)
    e = jnp.zeros(sem.mask.shape).at[1, 2, 3, 1].set(1.0)
    col = bk_apply(BK_SPECS[1 if spec.operator == "mass" else (3 if spec.quadrature == "gauss" else 5)], e, sem.J, sem.Dt, sem.geom.G, sem.geom.B)
    assert abs(float(col[1, 2, 3, 1] - d[1, 2, 3, 1])) < 1e-14 * float(jnp.abs(d).max())


@pytest.mark.parametrize("order", [1, 3, 6])
def test_mass_integrates_polynomials_exactly(order):
    lengths = (1.5, 0.5, 2.0)
    mesh = box_mesh((2, 3, 1), order=order, lengths=lengths)
    sem = discretize(mesh, quadrature="gauss", dirichlet=False)
    x, y, z = sem.x
    u = x**order * (1 + y) ** order * z**order
    v = x + y * z
    # ∫ u dx = 1ᵀ M u (q = N + 2 Gauss is exact for this degree)
    exact_u = lengths[0] ** (order + 1) / (order + 1) * ((1 + lengths[1]) ** (order + 1) - 1) / (order + 1) * lengths[2] ** (order + 1) / (order + 1)
    Mu = mass(u, sem.J, sem.geom.B)
    assert abs(float(jnp.sum(Mu)) - exact_u) < 1e-13 * exact_u
    # vᵀ M u = ∫ u v, computed by a 1-D Gauss rule of high degree per axis
    from jaxsem.core.basis import gauss_points

    g, w = gauss_points(order + 4)
    X = [0.5 * lengths[d] * (g + 1) for d in range(3)]
    W = [0.5 * lengths[d] * w for d in range(3)]
    xx, yy, zz = np.meshgrid(*X, indexing="ij")
    ww = np.einsum("i,j,k->ijk", *W)
    ref = np.sum(ww * xx**order * (1 + yy) ** order * zz**order * (xx + yy * zz))
    assert abs(float(jnp.sum(v * Mu)) - ref) < 1e-13 * abs(ref)
