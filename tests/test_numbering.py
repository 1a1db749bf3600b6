import dataclasses

import numpy as np
import pytest

from jaxsem.mesh import box_mesh
from jaxsem.mesh.numbering import number_nodes


def _same_partition(gid_a, gid_b):
    """Two numberings identify exactly the same pairs of local nodes."""
    a, b = gid_a.ravel(), gid_b.ravel()
    pairs = np.unique(np.stack([a, b], 1), axis=0)
    return len(pairs) == len(np.unique(a)) == len(np.unique(b))


def _coord_ids(x, lengths, periodic):
    """Test-only reference numbering by rounding coordinates (wrapped when periodic)."""
    pts = x.reshape(3, -1).T.copy()
    for d in range(3):
        if periodic[d]:
            pts[:, d] = np.mod(pts[:, d], lengths[d])
            pts[np.isclose(pts[:, d], lengths[d]), d] = 0.0
    _, ids = np.unique(np.round(pts, 9), axis=0, return_inverse=True)
    return ids.reshape(x.shape[1:])


@pytest.mark.parametrize(
    "elements, order, periodic",
    [
        ((2, 3, 4), 3, (False, False, False)),
        ((1, 1, 1), 1, (False, False, False)),
        ((1, 2, 1), 5, (False, False, False)),
        ((3, 2, 2), 4, (True, False, False)),
        ((1, 2, 3), 2, (True, True, True)),
        ((2, 2, 2), 3, (True, True, True)),
        ((2, 1, 3), 4, (False, True, True)),
    ],
)
def test_counts_and_coordinates(elements, order, periodic):
    m = box_mesh(elements, order, periodic=periodic)
    nb = number_nodes(m)
    expected = np.prod([e * order + (0 if p else 1) for e, p in zip(elements, periodic)])
    assert nb.num_global == expected
    assert nb.gid.min() == 0 and nb.gid.max() == expected - 1
    assert _same_partition(nb.gid, _coord_ids(m.x, (1, 1, 1), periodic))
    n_boundary = sum(
        0 if periodic[d] else 2 * np.prod([elements[a] for a in range(3) if a != d]) for d in range(3)
    )
    assert len(nb.boundary_faces) == n_boundary


def test_face_neighbors_are_symmetric():
    nb = number_nodes(box_mesh((3, 2, 2), 2, periodic=(True, False, False)))
    for e in range(nb.gid.shape[0]):
        for f in range(6):
            e2, f2 = nb.face_neighbors[e, f]
            if e2 >= 0:
                assert tuple(nb.face_neighbors[e2, f2]) == (e, f)
                assert f2 // 2 == f // 2 and f2 != f


def test_numbering_ignores_vertex_labels():
    m = box_mesh((3, 3, 2), 4)
    rng = np.random.default_rng(0)
    perm = rng.permutation(m.vertices.shape[0])
    m2 = dataclasses.replace(m, cells=perm[m.cells])
    a, b = number_nodes(m), number_nodes(m2)
    assert a.num_global == b.num_global
    assert _same_partition(a.gid, b.gid)


def test_boundary_nodes_of_box():
    m = box_mesh((2, 2, 2), 3)
    nb = number_nodes(m)
    on = nb.boundary_nodes()
    ref = np.zeros(on.shape, bool)
    for d in range(3):
        ref |= np.isclose(m.x[d], 0) | np.isclose(m.x[d], 1)
    np.testing.assert_array_equal(on, ref)


def test_repeated_vertex_is_an_error():
    m = box_mesh((1, 1, 1), 2)
    cells = m.cells.copy()
    cells[0, 7] = cells[0, 0]
    with pytest.raises(ValueError, match="element 0"):
        number_nodes(dataclasses.replace(m, cells=cells))


@pytest.mark.parametrize("row, shared", [
    ([0, 1, 1, 0], "face 1 of element 0, which element 1 already shares \\(its face 0\\)"),
    ([0, 1, 2, 0], "face 1 of element 0, which element 1 already shares \\(its face 0\\)"),
    ([2, 1, 1, 0], "face 0 of element 1, which element 0 already shares \\(its face 1\\)"),
    ([6, 3, 3, 2], "face 2 of element 3, which element 0 already shares \\(its face 3\\)"),
])
def test_pairing_a_shared_face_is_refused_naming_it(row, shared):
    """Interior faces are translates of other faces too, so only the topology can refuse them."""
    m = box_mesh((3, 3, 3), order=2)
    m = dataclasses.replace(m, periodic_faces=np.array([row]))
    with pytest.raises(ValueError, match=rf"periodic_faces\[0\] = \[{', '.join(map(str, row))}\] pairs {shared}; "
                                         r"only boundary faces may be paired"):
        number_nodes(m)
