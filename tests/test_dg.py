"""DG building blocks: face-point pairing and orientation, normals, sJ, lift, the exchange."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import basis, dg
from jaxsem.mesh import box_mesh


def rotate_elements(mesh, seed=0):
    """The same mesh with each element's local axes rotated (one of 24 proper rotations).

    Node arrays and corner ids get the same index permutation, so the geometry is
    unchanged but every element sees its neighbours in another orientation.
    """
    rng = np.random.default_rng(seed)
    E, n = mesh.num_elements, mesh.n
    x = np.array(mesh.x)
    cells = np.array(mesh.cells).reshape(E, 2, 2, 2)  # [e, c3, b, a] = [e, k, j, i]

    def rot(a, r):  # a: (..., k, j, i); r in 0..23
        cyc, flips = divmod(r, 4)
        a = np.moveaxis(a, (-3, -2, -1), [(-3, -2, -1), (-2, -1, -3), (-1, -3, -2)][cyc % 3])
        if cyc >= 3:  # odd permutation (swap two axes) + flip one: still a rotation
            a = np.swapaxes(a, -1, -2)[..., ::-1]
        if flips & 1:
            a = a[..., ::-1, ::-1, :]
        if flips & 2:
            a = a[..., :, ::-1, ::-1]
        return a

    for e in range(E):
        r = int(rng.integers(0, 24)) if e % 2 == 0 or E == 1 else int(rng.integers(1, 24))
        x[:, e] = rot(x[:, e], r)
        cells[e] = rot(cells[e], r)
    return dataclasses.replace(mesh, x=x, cells=cells.reshape(E, 8))


def _flat_faces(a):
    return np.asarray(dg.faces(jnp.asarray(a))).reshape(a.shape[0], -1)


@pytest.mark.parametrize("deform", [0.0, 0.15])
def test_partners_coincide_under_rotated_elements(deform):
    mesh = rotate_elements(box_mesh((3, 2, 2), 4, deform=deform), seed=1)
    conn = dg.face_connectivity(mesh)
    xf = _flat_faces(mesh.x)
    p = conn.partner.ravel()
    has = p >= 0
    assert np.abs(xf[:, has] - xf[:, p[has]]).max() < 1e-12
    assert np.array_equal(p[p[has]], np.nonzero(has)[0])  # an involution
    # Ids: every id is shared by exactly the point and its partner.
    counts = np.bincount(conn.fid.ravel())
    assert np.array_equal(counts[conn.fid.ravel()], np.where(has, 2, 1))
    assert np.array_equal(conn.fid.ravel()[has], conn.fid.ravel()[p[has]])
    assert conn.boundary.sum() == 2 * (3 * 2 + 2 * 2 + 3 * 2)  # faces on the box surface


def test_periodic_partners_single_element_axes():
    # One element along y and z: faces 2/3 and 4/5 of each element are each other's partners.
    L = (2.0, 1.0, 0.5)
    mesh = box_mesh((2, 1, 1), 3, lengths=L, periodic=(False, True, True), deform=0.1)
    conn = dg.face_connectivity(mesh)
    assert conn.boundary.sum() == 2 and conn.periodic.sum() == 2 * 4
    xf = _flat_faces(mesh.x)
    p = conn.partner.ravel()
    has = p >= 0
    d = xf[:, has] - xf[:, p[has]]
    # Partners coincide or differ by one period along a periodic axis.
    ok = np.isclose(d, 0, atol=1e-12) | np.isclose(np.abs(d), np.array(L)[:, None], atol=1e-12)
    assert ok.all()
    assert np.all(np.isclose(d[0], 0, atol=1e-12))  # x is not periodic


def test_faces_and_lift_are_transposes():
    rng = np.random.default_rng(0)
    u = jnp.asarray(rng.standard_normal((2, 3, 5, 5, 5)))
    F = jnp.asarray(rng.standard_normal((2, 3, 6, 5, 5)))
    lhs = jnp.sum(dg.faces(u) * F)
    rhs = jnp.sum(u * dg.lift_faces(F))
    assert abs(float(lhs - rhs)) < 1e-12 * float(jnp.sum(jnp.abs(F)))
    # lift of ones counts how many faces each node lies on (1 face, 2 edge, 3 corner).
    cnt = np.asarray(dg.lift_faces(jnp.ones((1, 6, 5, 5))))[0]
    assert cnt[0, 0, 0] == 3 and cnt[0, 0, 2] == 2 and cnt[0, 2, 2] == 1 and cnt[2, 2, 2] == 0


@pytest.mark.parametrize("deform", [0.0, 0.1])
def test_normals_and_surface_jacobian(deform):
    mesh = rotate_elements(box_mesh((2, 2, 2), 4, lengths=(1.0, 2.0, 1.5), deform=deform), seed=3)
    d = dg.discretize_dg(mesh)
    conn = dg.face_connectivity(mesh)
    nrm = np.asarray(d.normal).reshape(3, -1)
    assert np.allclose(np.linalg.norm(nrm, axis=0), 1.0, atol=1e-14)
    p = conn.partner.ravel()
    has = p >= 0
    assert np.abs(nrm[:, has] + nrm[:, p[has]]).max() < 1e-12  # n⁺ = −n⁻
    sJ = np.asarray(d.sJ).ravel()
    assert np.abs(sJ[has] - sJ[p[has]]).max() < 1e-12
    # Outward on the box surface: n = ±e_axis; total area of the box.
    w = basis.gll_points(4)[1]
    wf = np.asarray(d.sJ) * w[None, None, :, None] * w[None, None, None, :]
    bnd = conn.boundary
    assert np.isclose(wf[bnd].sum(), 2 * (1 * 2 + 2 * 1.5 + 1 * 1.5), rtol=1e-12)
    xf = np.asarray(dg.faces(d.x))
    centre = np.asarray(d.x).mean(axis=(2, 3, 4))[:, :, None, None, None]
    out = np.sum(np.asarray(d.normal) * (xf - centre), axis=0)
    assert (out > 0).all()


@pytest.mark.parametrize("deform", [0.0, 0.1])
def test_lift_gives_divergence_theorem(deform):
    # Σ_nodes mass · lift(F·n) = ∮ F·n dS = ∫ ∇·F dV per element; F = x (∇·F = 3).
    mesh = box_mesh((2, 2, 2), 4, deform=deform)
    d = dg.discretize_dg(mesh)
    Fn = jnp.sum(dg.faces(d.x) * d.normal, axis=0)  # (E, 6, n, n)
    flux = jnp.sum(d.mass * dg.lift_faces(d.lift * Fn), axis=(1, 2, 3))
    vol = jnp.sum(d.mass, axis=(1, 2, 3))
    assert np.allclose(np.asarray(flux), 3 * np.asarray(vol), rtol=1e-10)


def test_exchange_returns_own_plus_neighbour_for_all_components():
    mesh = box_mesh((2, 2, 2), 4, periodic=(True, False, False), deform=0.1)  # (periodic pairs: unrotated)
    d = dg.discretize_dg(mesh)
    conn = dg.face_connectivity(mesh)
    rng = np.random.default_rng(0)
    fu = jnp.asarray(rng.standard_normal((6,) + conn.fid.shape))
    s = np.asarray(dg.face_exchange(d, fu)).reshape(6, -1)
    own = np.asarray(fu).reshape(6, -1)
    p = conn.partner.ravel()
    want = own + np.where(p >= 0, own[:, np.maximum(p, 0)], 0.0)
    assert np.allclose(s, want, rtol=0, atol=1e-14)
    nb = np.asarray(dg.neighbor_values(d, fu)).reshape(6, -1)
    assert np.allclose(nb, want - own, atol=1e-14)


def test_bad_inputs():
    with pytest.raises(TypeError, match="mesh"):
        dg.face_connectivity("not a mesh")
    with pytest.raises(ValueError, match="dtype"):
        dg.discretize_dg(box_mesh((1, 1, 1), 2), dtype=jnp.int32)


def test_float32_plan():
    d = dg.discretize_dg(box_mesh((2, 1, 1), 3), dtype=jnp.float32)
    assert d.normal.dtype == jnp.float32 and d.lift.dtype == jnp.float32 and d.fgs.mult.dtype == jnp.float32


@pytest.mark.parametrize("rotated", [True, False])
def test_neighbor_node_map_reads_the_partner(rotated):
    """dg.nbr (what the fused kernels read neighbours through): the volume node behind each face
    point holds the partner face point's value, for any field; -1 exactly on boundary faces.
    Rotated elements (every face orientation), or a periodic axis."""
    mesh = box_mesh((3, 2, 2), 3, deform=0.15, periodic=(False, False, False) if rotated else (True, False, True))
    mesh = rotate_elements(mesh, seed=2) if rotated else mesh
    d = dg.discretize_dg(mesh)
    conn = dg.face_connectivity(mesh)
    nbr = np.asarray(d.nbr).ravel()
    p = conn.partner.ravel()
    np.testing.assert_array_equal(nbr < 0, p < 0)
    u = np.random.default_rng(1).standard_normal((2,) + d.jac.shape)  # two fields
    uf = _flat_faces(u)
    has = p >= 0
    np.testing.assert_array_equal(u.reshape(2, -1)[:, nbr[has]], uf[:, p[has]])
    for rank in range(2):  # a rank's part: its own neighbours only (-1 where remote), in its numbering
        part = dg.discretize_dg(mesh, comm=dg.Comm(size=2, rank=rank))
        el = np.asarray(part.elements)
        pl = conn.partner[el].ravel()
        local = (pl >= 0) & np.isin(np.maximum(pl, 0) // (6 * d.n**2), el)
        nbr_r = np.asarray(part.nbr).ravel()
        np.testing.assert_array_equal(nbr_r >= 0, local)
        assert local.any() and (~local & (pl >= 0)).any()  # both kinds of neighbour occur
        ul = u[:, el]
        np.testing.assert_array_equal(ul.reshape(2, -1)[:, nbr_r[local]], uf[:, pl[local]])
        # face_vol: the volume node of a copy of each plan node here (the coordinates agree,
        # modulo the box on periodic axes)
        phase = np.exp(2j * np.pi * np.asarray(part.x) / np.asarray(mesh.lengths)[:, None, None, None, None])
        fv = np.asarray(part.face_vol)[np.asarray(part.fgs.gid)]
        np.testing.assert_allclose(phase.reshape(3, -1)[:, fv], _flat_faces(phase.real) + 1j * _flat_faces(phase.imag),
                                   atol=1e-12)
