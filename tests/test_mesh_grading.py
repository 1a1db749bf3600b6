"""Box meshes graded toward faces: breakpoints against their closed forms, the nodes and
integrals of graded meshes, periodic graded channels, and the refusal of bad specs."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem
from jaxsem.core import basis
from jaxsem.discretization.dg import is_affine
from jaxsem.mesh import Grading, box_mesh
from jaxsem.mesh.box import deform_box, element_nodes
from jaxsem.models import poisson

L, ORIGIN = 2.5, -0.75


def _rel(p, q):
    np.testing.assert_allclose(p, q, rtol=0, atol=4e-16 * L)


# ---------------------------------------------------------------- breakpoints


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("r", [0.6, 1.25, 3.0])
def test_geometric_breakpoints_are_the_geometric_sum(n, r):
    k = np.arange(n + 1)
    lower = ORIGIN + L * (r**k - 1) / (r**n - 1)  # h₀(1 + r + … + r^(k−1)), h₀ = L(r − 1)/(rⁿ − 1)
    _rel(Grading("geometric", r, faces="ymin").points(n, L, ORIGIN), lower)
    _rel(Grading("geometric", r, faces="ymax").points(n, L, ORIGIN), 2 * ORIGIN + L - lower[::-1])
    w = r ** np.minimum(np.arange(n), n - 1 - np.arange(n))  # both faces: h₀ r^min(k, n−1−k)
    _rel(Grading("geometric", r).points(n, L, ORIGIN), ORIGIN + L * np.concatenate([[0], np.cumsum(w)]) / w.sum())


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("beta", [0.5, 2.0, 3.5])
def test_tanh_breakpoints_are_nek_stretching(n, beta):
    xi = np.arange(n + 1) / n
    both = np.tanh(beta * (2 * xi - 1)) / np.tanh(beta)  # Nek/NekRS: y = tanh(β(2ξ − 1))/tanh β on [−1, 1]
    _rel(Grading("tanh", beta, faces="zmin").points(n, L, ORIGIN),
         ORIGIN + L * (1 + np.tanh(beta * (xi - 1)) / np.tanh(beta)))
    _rel(Grading("tanh", beta, faces="zmax").points(n, L, ORIGIN), ORIGIN + L * np.tanh(beta * xi) / np.tanh(beta))
    _rel(Grading("tanh", beta).points(n, L, ORIGIN), ORIGIN + L * (1 + both) / 2)


@pytest.mark.parametrize("grading", [Grading("geometric", 1.3, "xmin"), Grading("geometric", 0.8),
                                     Grading("tanh", 2.0), Grading("tanh", 1.0, "xmax")])
@pytest.mark.parametrize("n", [1, 5, 8])
def test_breakpoints_end_at_the_faces_exactly_and_increase(grading, n):
    p = grading.points(n, L, ORIGIN)
    assert p.shape == (n + 1,) and p[0] == ORIGIN and p[-1] == ORIGIN + L
    assert (np.diff(p) > 0).all()


@pytest.mark.parametrize("r", [0.5, 1.2, 2.0])
def test_neighbouring_widths_have_ratio_r_away_from_the_face(r):
    w = np.diff(Grading("geometric", r, faces="xmin").points(9, L))
    np.testing.assert_allclose(w[1:] / w[:-1], r, rtol=1e-13)
    w = np.diff(Grading("geometric", r, faces="xmax").points(9, L))
    np.testing.assert_allclose(w[:-1] / w[1:], r, rtol=1e-13)
    for n in (8, 9):  # both faces: r from each face to the centre
        w = np.diff(Grading("geometric", r).points(n, L))
        np.testing.assert_allclose(w[1:n // 2] / w[:n // 2 - 1], r, rtol=1e-13)
        np.testing.assert_allclose(w[-n // 2:-1] / w[-n // 2 + 1:], r, rtol=1e-13)


@pytest.mark.parametrize("grading", [Grading("geometric", 1.4), Grading("tanh", 2.5)])
@pytest.mark.parametrize("n", [6, 7])
def test_both_faces_is_symmetric(grading, n):
    p = grading.points(n, L, ORIGIN)
    _rel((p - ORIGIN) + (p[::-1] - ORIGIN), np.full(n + 1, L))
    w = np.diff(p)
    np.testing.assert_allclose(w, w[::-1], rtol=1e-14)
    assert w[0] < w[n // 2]  # finest at the faces


def test_geometric_ratio_one_is_uniform():
    np.testing.assert_allclose(Grading("geometric", 1.0).points(6, L, ORIGIN), ORIGIN + np.linspace(0, L, 7),
                               rtol=0, atol=1e-15)


# ---------------------------------------------------------------- graded box meshes

CHANNEL = dict(elements=(3, 6, 3), order=4, lengths=(2.0, 2.0, 1.0), origin=(0.0, -1.0, 0.0),
               periodic=(True, False, True))


def test_default_grading_is_bit_identical_to_the_uniform_mesh():
    base = box_mesh(**CHANNEL)
    grids = [o + np.linspace(0.0, length, e + 1) for o, length, e in zip(CHANNEL["origin"], CHANNEL["lengths"],
                                                                       CHANNEL["elements"])]
    for grading in [None, (None, None, None), grids, [None, list(grids[1]), None]]:
        m = box_mesh(**CHANNEL, grading=grading)
        for name in ("x", "vertices", "cells", "periodic_faces"):
            assert np.array_equal(getattr(m, name), getattr(base, name)), (grading, name)


def _graded(**kw):
    gx = np.array([0.0, 0.3, 1.1, 2.0])  # a periodic axis graded by its breakpoints
    return box_mesh(**{**CHANNEL, **kw}, grading=(gx, Grading("tanh", 2.0), Grading("geometric", 1.5, "zmin")))


@pytest.mark.parametrize("deform", [0.0, 0.15])
def test_graded_nodes_are_the_isoparametric_map_of_the_graded_vertices(deform):
    m = _graded(deform=deform)
    for d, p in enumerate([np.array([0.0, 0.3, 1.1, 2.0]), Grading("tanh", 2.0).points(6, 2.0, -1.0),
                           Grading("geometric", 1.5, "zmin").points(3, 1.0)]):
        assert np.array_equal(np.unique(m.vertices[:, d]), p)
    ref = element_nodes(m.vertices[m.cells].reshape(-1, 2, 2, 2, 3), m.order)
    if deform:
        ref = deform_box(ref, deform, CHANNEL["lengths"], CHANNEL["origin"])
    np.testing.assert_allclose(m.x, ref, rtol=0, atol=1e-14)
    assert is_affine(m.x) == (deform == 0.0)


def test_mapping_acts_on_the_graded_nodes():
    shear = lambda x: np.stack([x[0] + 0.2 * x[1], x[1], x[2]])
    np.testing.assert_allclose(_graded(mapping=shear).x, shear(_graded().x), rtol=0, atol=1e-15)


def test_boundary_groups_and_topology_are_unchanged():
    for kw in ({}, dict(periodic=(False, False, False))):
        m, base = _graded(**kw), box_mesh(**{**CHANNEL, **kw})
        assert sorted(m.boundaries) == sorted(base.boundaries)
        for name in base.boundaries:
            assert np.array_equal(m.boundary(name), base.boundary(name))
        assert np.array_equal(m.cells, base.cells) and np.array_equal(m.periodic_faces, base.periodic_faces)
    ymin = m.boundary("ymin")
    np.testing.assert_array_equal(m.x[1][ymin[:, 0], :, 0, :], -1.0)  # face 2: s = −1, node index j = 0


def test_first_node_off_the_wall_is_at_the_documented_height():
    m = _graded()
    h = np.diff(Grading("tanh", 2.0).points(6, 2.0, -1.0))[0]
    xi1 = basis.gll_points(m.order)[0][1]
    y = np.unique(m.x[1].round(14))
    np.testing.assert_allclose(y[1] - y[0], h * (1 + xi1) / 2, rtol=1e-12)


def test_graded_mesh_integrates_volume_and_polynomials_exactly():
    m = _graded(periodic=(False, False, False))
    sem = jaxsem.discretize(m)
    vol = float(sem.integrate(jnp.ones_like(sem.x[0])))
    assert abs(vol - 4.0) < 1e-13
    # x²y⁶z⁷: within the GLL rule's degree 2N − 1 = 7 per axis on affine elements
    got = float(sem.integrate(sem.interpolate(lambda x, y, z: x**2 * y**6 * z**7)))
    exact = (2.0**3 / 3) * (2.0 / 7) * (1.0 / 8)
    assert abs(got - exact) < 1e-13 * abs(exact)
    got = float(sem.integrate(sem.interpolate(lambda x, y, z: x**3 * y**4 * z**6)))
    exact = (2.0**4 / 4) * (2.0 / 5) * (1.0 / 7)
    assert abs(got - exact) < 1e-13 * abs(exact)


def test_graded_periodic_channel_pairs_faces_and_solves_poisson_exactly():
    """u = y − y³ between walls at y = ±1, periodic in x and z: −∇²u = 6y, in the space for N ≥ 3."""
    m = _graded()
    num = jaxsem.number_nodes(m)
    (ex, ey, ez), N = CHANNEL["elements"], CHANNEL["order"]
    assert num.num_global == (ex * N) * (ey * N + 1) * (ez * N)  # x and z wrap around
    sem = jaxsem.discretize(m)
    u, info = poisson.solve(sem, lambda x, y, z: 6.0 * y, tol=1e-13)
    exact = sem.interpolate(lambda x, y, z: y - y**3)
    assert float(jnp.abs(u - exact).max()) < 1e-11, info


# ---------------------------------------------------------------- bad specs


@pytest.mark.parametrize("make, match", [
    (lambda: Grading("cubic", 1.0), r"Grading kind must be one of \('geometric', 'tanh'\), got 'cubic'"),
    (lambda: Grading("geometric", 0.0), r"Grading strength \(the ratio r of neighbouring widths\) must be finite "
                                        r"and > 0, got 0\.0"),
    (lambda: Grading("geometric", -1.2), r"Grading strength .* got -1\.2"),
    (lambda: Grading("tanh", 0), r"Grading strength \(β\) must be finite and > 0, got 0"),
    (lambda: Grading("tanh", float("nan")), r"Grading strength \(β\)"),
    (lambda: Grading("tanh", 2.0, faces="top"), r"Grading faces must be one of \('both', 'xmin'.*got 'top'"),
    (lambda: Grading("tanh", 2.0).points(0), r"num_elements must be an int >= 1, got 0"),
    (lambda: Grading("tanh", 2.0).points(4, -1.0), r"length must be finite and > 0, got -1\.0"),
])
def test_bad_grading_is_refused_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("grading, match", [
    ((None, Grading("tanh", 2.0, faces="xmin"), None),
     r"grading\[1\] = Grading\(.*\): faces 'xmin' is not a face of the y axis; allowed: \('both', 'ymin', 'ymax'\)"),
    ((None, [-1.0, 0.0, 1.0], None), r"grading\[1\]: element boundaries must have shape \(elements\[1\] \+ 1,\) = "
                                     r"\(7,\), got \(3,\)"),
    ((None, [-1.0, -0.9, -0.5, 0.5, 0.4, 0.9, 1.0], None),
     r"grading\[1\]: element boundaries must increase strictly, got 0\.5 then 0\.4 at entries 3, 4"),
    (([0.0, 0.5, 0.5, 2.0], None, None), r"grading\[0\]: element boundaries must increase strictly"),
    ((None, None, [0.0, 0.2, 0.6, 0.9]), r"grading\[2\]: element boundaries must span the box's \[origin, origin "
                                         r"\+ length\] = \[0\.0, 1\.0\] on that axis, got \[0\.0, 0\.9\]"),
    ((None, None, [0.0, 0.2, np.nan, 1.0]), r"grading\[2\]: element boundaries must be finite"),
    ((None, Grading("geometric", 1e4, faces="ymax"), None), r"grading\[1\]: .* widths below round-off"),
    ((None, Grading("tanh", 2.0)), r"grading must be None or one spec per axis"),
    (Grading("tanh", 2.0), r"grading must be None or one spec per axis"),
])
def test_bad_box_grading_is_refused_naming_grading(grading, match):
    with pytest.raises(ValueError, match=match):
        box_mesh(**CHANNEL, grading=grading)


def test_a_spec_of_another_type_is_refused_naming_grading():
    with pytest.raises(TypeError, match=r"grading\[1\] must be None, a Grading or an array of element boundaries"):
        box_mesh(**CHANNEL, grading=(None, "tanh", None))
