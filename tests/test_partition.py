import numpy as np
import pytest

from jaxsem.mesh import box_mesh
from jaxsem.mesh.partition import partition_box, partition_mesh, partition_rcb, processor_grid, rank_pairs


def test_processor_grid_minimizes_cut():
    assert processor_grid(2, (4, 2, 2)) == (2, 1, 1)
    assert processor_grid(4, (4, 4, 1)) == (2, 2, 1)
    assert processor_grid(8, (4, 4, 4)) == (2, 2, 2)
    with pytest.raises(ValueError):
        processor_grid(7, (2, 2, 2))


@pytest.mark.parametrize("elements, P", [((5, 3, 2), 4), ((3, 3, 1), 2), ((4, 4, 4), 8), ((7, 1, 1), 3)])
def test_box_partition_balanced_blocks(elements, P):
    part = partition_box(elements, P)
    counts = np.bincount(part, minlength=P)
    assert counts.sum() == np.prod(elements) and counts.min() >= 1
    # blocks: each rank's elements form a box in index space
    idx = np.stack(np.meshgrid(*[np.arange(e) for e in elements[::-1]], indexing="ij"), -1).reshape(-1, 3)[:, ::-1]
    for r in range(P):
        sub = idx[part == r]
        ext = sub.max(0) - sub.min(0) + 1
        assert np.prod(ext) == len(sub)


@pytest.mark.parametrize("P", [1, 2, 3, 5, 6])
def test_rcb_any_rank_count(P):
    rng = np.random.default_rng(P)
    c = rng.random((40, 3))
    part = partition_rcb(c, P)
    counts = np.bincount(part, minlength=P)
    assert counts.sum() == 40 and counts.max() - counts.min() <= 2


def test_partition_mesh_falls_back_to_rcb():
    m = box_mesh((7, 1, 1), 2)
    part = partition_mesh(m, 5)  # 5 does not fit a grid on (7, 1, 1)? it does: (5,1,1)
    assert np.bincount(part).min() >= 1
    part = partition_mesh(box_mesh((2, 2, 1), 2), 3)  # no 3-grid fits (2,2,1): RCB
    assert sorted(np.bincount(part)) == [1, 1, 2]


def test_more_ranks_than_elements_is_an_error():
    with pytest.raises(ValueError, match="nranks = 9 exceeds the number of elements"):
        partition_mesh(box_mesh((2, 2, 2), 2), 9)


def test_rank_pairs_is_a_proper_edge_colouring():
    pairs = [(a, b) for a in range(6) for b in range(a + 1, 6) if (a + b) % 3 != 0]
    rounds = rank_pairs(pairs)
    seen = set()
    for rnd in rounds:
        ranks = [r for p in rnd for r in p]
        assert len(ranks) == len(set(ranks))  # each rank at most once per round
        seen.update(rnd)
    assert seen == set(pairs)
