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


def _first_appearance_ids(ids):
    """Reference: relabel ``ids`` 0, 1, … in order of first appearance in ``ids.ravel()``."""
    _, first, inverse = np.unique(ids.ravel(), return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse].reshape(ids.shape)


@pytest.mark.parametrize(
    "elements, order, periodic",
    [
        ((3, 4, 3), 3, (False, False, False)),
        ((4, 3, 5), 2, (True, True, True)),
        ((3, 3, 4), 4, (True, False, True)),
        ((1, 3, 2), 3, (True, True, False)),  # one periodic element: its two faces are one
        ((2, 1, 1), 1, (False, True, True)),
        ((3, 3, 3), 5, (False, True, False)),
    ],
)
def test_box_formula_equals_vertex_keys_and_coordinates(elements, order, periodic):
    """The box formula, the general vertex-key numbering (the same mesh without its box
    counts) and a brute-force coordinate numbering give the same ids, neighbours and
    boundary faces, bit for bit."""
    m = box_mesh(elements, order, periodic=periodic, deform=0.1)
    box = number_nodes(m)
    general = number_nodes(dataclasses.replace(m, elements=None))
    flat = box_mesh(elements, order, periodic=periodic)
    coords = _first_appearance_ids(_coord_ids(flat.x, (1, 1, 1), periodic))
    np.testing.assert_array_equal(box.gid, coords)
    np.testing.assert_array_equal(general.gid, coords)
    assert box.num_global == general.num_global == coords.max() + 1
    np.testing.assert_array_equal(box.face_neighbors, general.face_neighbors)
    np.testing.assert_array_equal(box.boundary_faces, general.boundary_faces)
    np.testing.assert_array_equal(box.boundary_nodes(), general.boundary_nodes())


def test_relabelled_box_takes_the_general_path_and_agrees():
    """A box mesh with permuted vertex ids is not box_mesh's topology: numbered by vertex keys,
    it gives the same ids (first appearance) as the formula."""
    m = box_mesh((3, 4, 3), 3, periodic=(True, False, True))
    perm = np.random.default_rng(1).permutation(m.vertices.shape[0])
    m2 = dataclasses.replace(m, cells=perm[m.cells])
    a, b = number_nodes(m), number_nodes(m2)
    np.testing.assert_array_equal(a.gid, b.gid)
    np.testing.assert_array_equal(a.face_neighbors, b.face_neighbors)


def test_partitioned_plans_of_the_box_formula_equal_the_general_ones():
    """Each rank's gather–scatter plan (partitioned box, periodic axis) is built from the
    numbering alone: the formula's and the vertex keys' plans are the same."""
    from jaxsem.discretization.gather_scatter import make_gs_distributed
    from jaxsem.mesh import partition_mesh
    from jaxsem.parallel.comm import Comm

    m = box_mesh((4, 3, 3), 2, periodic=(True, False, False))
    part = partition_mesh(m, 4)
    a, b = number_nodes(m), number_nodes(dataclasses.replace(m, elements=None))

    for r in range(4):  # each rank's view; building a plan sends nothing
        pa, ea, ha = make_gs_distributed(a.gid, part, Comm(rank=r, size=4))
        pb, eb, hb = make_gs_distributed(b.gid, part, Comm(rank=r, size=4))
        np.testing.assert_array_equal(ea, eb)
        np.testing.assert_array_equal(np.asarray(pa.gid), np.asarray(pb.gid))
        np.testing.assert_array_equal(ha, hb)
        for ia, ib in zip(pa.exchange.idx, pb.exchange.idx):
            np.testing.assert_array_equal(np.asarray(ia), np.asarray(ib))
