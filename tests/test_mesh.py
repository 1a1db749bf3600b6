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
