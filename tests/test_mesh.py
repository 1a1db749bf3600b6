import dataclasses

import numpy as np
import pytest

from jaxsem.mesh import box_mesh


def test_box_mesh_shapes_and_corner_coordinates():
    m = box_mesh((3, 2, 4), order=3, lengths=(3.0, 1.0, 2.0))
    assert m.x.shape == (3, 24, 4, 4, 4)
    assert m.cells.shape == (24, 8)
    # GLL corner nodes sit on the element's vertices (lexicographic corners)
    for c in range(8):
        k, j, i = ((c >> 2) & 1) * 3, ((c >> 1) & 1) * 3, (c & 1) * 3
        np.testing.assert_allclose(m.x[:, :, k, j, i].T, m.vertices[m.cells[:, c]], atol=1e-15)
    assert np.isclose(m.x[0].min(), 0) and np.isclose(m.x[0].max(), 3.0)
    assert np.isclose(m.x[2].max(), 2.0)


def test_deformation_is_curved_and_keeps_boundary():
    flat = box_mesh((2, 2, 2), order=4)
    m = box_mesh((2, 2, 2), order=4, deform=0.1)
    moved = np.abs(m.x - flat.x).max()
    assert moved > 0.05
    on_boundary = np.zeros(flat.x.shape[1:], bool)
    for d in range(3):
        on_boundary |= np.isclose(flat.x[d], 0) | np.isclose(flat.x[d], 1)
    assert np.abs(m.x - flat.x)[:, on_boundary].max() < 1e-15
    # genuinely non-affine: an element edge midpoint is off the chord of its end points
    e = 0
    mid = m.x[:, e, 2, 2, 2]
    chord = 0.5 * (m.x[:, e, 0, 0, 0] + m.x[:, e, 4, 4, 4])
    assert np.linalg.norm(mid - chord) > 1e-3


def test_periodic_face_pairs():
    m = box_mesh((3, 2, 1), order=2, periodic=(True, False, True))
    # x: Ey*Ez = 2 pairs, z: Ex*Ey = 6 pairs
    assert m.periodic_faces.shape == (8, 4)
    for ea, fa, eb, fb in m.periodic_faces:
        axis = fa // 2
        assert fb // 2 == axis and fa % 2 == 1 and fb % 2 == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(elements=(0, 1, 1)), "elements"),
        (dict(elements=(1, 1)), "elements"),
        (dict(order=0), "order"),
        (dict(order=21), "order"),
        (dict(lengths=(1, -1, 1)), "lengths"),
        (dict(deform=0.5), "deform"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        box_mesh(**kwargs)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: dict(x=m.x[:, :1]),
         r"x must have shape \(3, E, n, n, n\) = \(3, 2, 4, 4, 4\).*got \(3, 1, 4, 4, 4\)"),
        (lambda m: dict(x=m.x[:2]), r"x must have shape .*got \(2, 2, 4, 4, 4\)"),
        (lambda m: dict(x=m.x.reshape(3, 2, -1)), r"x must have shape .*got \(3, 2, 64\)"),
        (lambda m: dict(order=2), r"x must have shape \(3, E, n, n, n\) = \(3, 2, 3, 3, 3\)"),
        (lambda m: dict(x=np.where(m.x > 0.9, np.nan, m.x)), r"x has \d+ non-finite"),
        (lambda m: dict(cells=m.cells[:, :4]), r"cells must have shape \(E, 8\).*got \(2, 4\)"),
        (lambda m: dict(cells=m.cells[:0]), r"cells must have shape \(E, 8\) with E >= 1"),
        (lambda m: dict(cells=m.cells + 100), r"cells must hold vertex ids in \[0, 12\)"),
        (lambda m: dict(cells=m.cells.astype(float)), r"cells must be an integer array"),
        (lambda m: dict(vertices=m.vertices[:, :2]), r"vertices must have shape \(V, 3\).*got \(12, 2\)"),
        (lambda m: dict(periodic_faces=np.zeros((1, 3), np.int64)), r"periodic_faces must have shape \(P, 4\)"),
        (lambda m: dict(periodic_faces=np.array([[0, 7, 1, 0]])), r"periodic_faces rows"),
        (lambda m: dict(elements=(3, 1, 1)), r"elements must be 3 counts whose product is E = 2"),
        (lambda m: dict(order=0), "order"),
    ],
)
def test_mesh_checks_its_arrays_and_names_them(change, match):
    """Mesh(...) refuses arrays of the wrong shape (before: accepted, failing later somewhere else)."""
    m = box_mesh((2, 1, 1), order=3)
    with pytest.raises((ValueError, TypeError), match=match):
        dataclasses.replace(m, **change(m))


def test_mesh_keeps_good_arrays_as_float64_and_int64():
    m = box_mesh((2, 1, 1), order=2)
    m2 = dataclasses.replace(m, x=m.x.astype(np.float32), cells=m.cells.astype(np.int32))
    assert m2.x.dtype == np.float64 and m2.cells.dtype == np.int64
    assert m.x is dataclasses.replace(m).x  # no copy when already right


# ---------------------------------------------------------------- periodic pairs


def _bulge(x):
    """Moves the x = 1 faces by a bump in y: paired with x = 0, not a translation."""
    return np.stack([x[0] + 0.02 * np.sin(np.pi * x[1]) * x[0], x[1], x[2]])


def _shear(x):
    """y += 0.3 x: the x = 0 and x = 1 faces stay translates (by (1, 0.3, 0)), a skewed period."""
    return np.stack([x[0], x[1] + 0.3 * x[0], x[2]])


@pytest.mark.parametrize("elements, periodic, deform, mapping", [
    ((3, 3, 3), (True, True, True), 0.2, None),
    ((3, 4, 3), (True, False, True), 0.0, _shear),
    ((1, 1, 1), (True, True, True), 0.1, None),
    ((3, 1, 5), (False, True, False), 0.25, None),
])
def test_periodic_pairs_that_are_translates_are_accepted(elements, periodic, deform, mapping):
    m = box_mesh(elements, order=4, periodic=periodic, deform=deform, mapping=mapping)
    assert len(m.periodic_faces) == sum(int(np.prod(elements)) // elements[d] for d in range(3) if periodic[d])


def _pair(pf, p):
    """The start of the error that refuses row ``p`` of ``pf``."""
    ea, fa, eb, fb = (int(v) for v in pf[p])
    return (rf"periodic_faces\[{p}\] = \[{ea}, {fa}, {eb}, {fb}\]: face {fa} of element {ea} and face {fb} "
            rf"of element {eb} are not translates of each other")


def test_a_face_moved_off_the_translation_is_refused_naming_the_pair():
    """Before: accepted, and the numbering merged nodes 0.0173 apart."""
    with pytest.raises(ValueError, match=r"periodic_faces\[0\] = \[2, 1, 0, 0\]: face 1 of element 2 and face 0 of "
                                         r"element 0 are not translates.*0\.0173 off the translation \[-1\.0, 0\.0, "
                                         r"0\.0\].*9 of 9 pairs mismatch"):
        box_mesh((3, 3, 3), order=4, periodic=(True, False, False), mapping=_bulge)


@pytest.mark.parametrize("offset, refused", [(1e-6, True), (1e-3, True), (1e-13, False)])
@pytest.mark.parametrize("p", [0, 4, 8])
def test_one_node_off_the_translation(offset, refused, p):
    """One interior node of a paired face moved: refused above PERIODIC_TOL times the faces' size, naming it."""
    m = box_mesh((3, 3, 3), order=3, periodic=(True, False, False), deform=0.1)
    x = m.x.copy()
    eb, fb = m.periodic_faces[p, 2:]
    assert fb == 0  # r = -1: face-local (u, v) = (j, k)
    x[1, eb, 1, 2, 0] += offset
    if not refused:
        dataclasses.replace(m, x=x)
        return
    where = r": at face node \(u, v\) = \(2, 1\).*1 of 9 pairs mismatch"
    with pytest.raises(ValueError, match=_pair(m.periodic_faces, p) + where):
        dataclasses.replace(m, x=x)


@pytest.mark.parametrize("fb", [2, 3, 4, 5])
def test_a_face_paired_with_a_face_of_another_direction_is_refused(fb):
    m = box_mesh((3, 3, 3), order=2, periodic=(True, False, False))
    pf = m.periodic_faces.copy()
    pf[3, 3] = fb
    with pytest.raises(ValueError, match=_pair(pf, 3)):
        dataclasses.replace(m, periodic_faces=pf)


def _rotate_element(m, e, turns):
    """``m`` with element ``e``'s local frame turned about its r axis (the same element, other local order)."""
    x, cells = m.x.copy(), m.cells.copy()
    x[:, e] = np.rot90(m.x[:, e], turns, axes=(1, 2))  # node axes [k, j, i]
    cells[e] = np.rot90(m.cells[e].reshape(2, 2, 2), turns, axes=(0, 1)).ravel()  # corners [c3, b, a]
    return dataclasses.replace(m, x=x, cells=cells)


@pytest.mark.parametrize("turns", [1, 2, 3])
@pytest.mark.parametrize("p", [0, 5])
def test_a_rotated_element_paired_node_for_node_is_refused(turns, p):
    """A mesh whose elements are not all oriented alike (as a Gmsh file may be) pairs a face whose
    (u, v) order is turned: the pair is no translation, node for node."""
    m = box_mesh((3, 3, 3), order=3, periodic=(True, False, False))
    e = int(m.periodic_faces[p, 2])  # the element whose r = -1 face is paired
    with pytest.raises(ValueError, match=_pair(m.periodic_faces, p)):
        _rotate_element(m, e, turns)


@pytest.mark.parametrize("rows, match", [
    ([[2, 1, 2, 1]], r"periodic_faces \[\[2, 1, 2, 1\]\] pairs face 1 of element 2 with itself"),
    ([[2, 1, 0, 0], [2, 1, 1, 0]], r"pair face 1 of element 2 more than once \(rows \[0, 1\]\)"),
    ([[2, 1, 0, 0], [5, 1, 0, 0]], r"pair face 0 of element 0 more than once \(rows \[0, 1\]\)"),
])
def test_a_face_may_be_paired_once(rows, match):
    m = box_mesh((3, 3, 3), order=2)
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(m, periodic_faces=np.array(rows))


@pytest.mark.parametrize("deform", [0.0, 0.12])
def test_separable_box_nodes_equal_the_isoparametric_map(deform):
    """box_mesh's per-axis node tables give element_nodes of its vertices (then deform_box)."""
    from jaxsem.mesh.box import deform_box, element_nodes

    L, origin = (2.0, 1.0, 0.5), (-1.0, 0.5, 3.0)
    m = box_mesh((3, 4, 2), order=5, lengths=L, origin=origin, deform=deform)
    ref = element_nodes(m.vertices[m.cells].reshape(-1, 2, 2, 2, 3), 5)
    if deform:
        ref = deform_box(ref, deform, L, origin)
    np.testing.assert_allclose(m.x, ref, rtol=0, atol=1e-14)
