"""jaxsem.discretization.sem: the memory estimate the CLI checks before building a mesh."""

import pytest

from jaxsem.discretization import memory_bytes


def test_memory_bytes_counts_values_per_element():
    # one element of order 1 (n = q = 2): 7·8 + 20·8 + 6·8 = 264 values of 8 bytes
    assert memory_bytes(1, 1) == 264 * 8
    assert memory_bytes(10, 7, q=9, components=3, itemsize=4) == 10 * (7 * 512 + 20 * 729 + 18 * 512) * 4
    assert memory_bytes(2, 5) == 2 * memory_bytes(1, 5)


@pytest.mark.parametrize("kw,name", [(dict(num_elements=0), "num_elements"), (dict(order=-1), "order"),
                                     (dict(q=0), "q"), (dict(components=1.5), "components"),
                                     (dict(itemsize=True), "itemsize")])
def test_memory_bytes_names_a_bad_argument(kw, name):
    args = dict(num_elements=4, order=3) | kw
    with pytest.raises(ValueError, match=name):
        memory_bytes(**args)
