"""Splitting a mesh's elements among ranks.

Box meshes are cut on a 3-D processor grid (contiguous blocks of elements per
axis, sizes differing by at most one when the counts do not divide); general
meshes by recursive coordinate bisection of element centroids, with weights
proportional to the rank counts on each side, so any rank count works.
Host-side NumPy; every rank computes the same partition.
"""

from __future__ import annotations


import numpy as np

from .box import Mesh

__all__ = ["processor_grid", "partition_box", "partition_rcb", "partition_mesh"]


def _check_ranks(nranks, num_elements):
    if isinstance(nranks, bool) or not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
    if nranks > num_elements:
        raise ValueError(
            f"nranks = {nranks} exceeds the number of elements ({num_elements}): "
            "every rank needs at least one element; use fewer ranks or a finer mesh"
        )
    return int(nranks)


def processor_grid(nranks: int, elements) -> tuple[int, int, int]:
    """The factorization px·py·pz = nranks (p_d ≤ E_d) with the least cut area.

    The cut area counts element faces on rank boundaries:
    Σ_d (p_d − 1)·Π_{a≠d} E_a. Raises ``ValueError`` if no such grid exists
    (then use :func:`partition_rcb`).
    """
    E = tuple(int(e) for e in elements)
    best = None
    for px in range(1, nranks + 1):
        if nranks % px:
            continue
        for py in range(1, nranks // px + 1):
            if (nranks // px) % py:
                continue
            pz = nranks // (px * py)
            p = (px, py, pz)
            if any(p[d] > E[d] for d in range(3)):
                continue
            cut = sum((p[d] - 1) * np.prod([E[a] for a in range(3) if a != d]) for d in range(3))
            key = (cut, p[::-1])
            if best is None or key < best[0]:
                best = (key, p)
    if best is None:
        raise ValueError(f"no processor grid of {nranks} ranks fits elements {E}")
    return best[1]


def partition_box(elements, nranks: int, grid=None) -> np.ndarray:
    """Rank of each element of a box mesh (x fastest ordering): ``(E,)`` int64."""
    E = tuple(int(e) for e in elements)
    nranks = _check_ranks(nranks, int(np.prod(E)))
    grid = processor_grid(nranks, E) if grid is None else tuple(grid)
    owner = []
    for d in range(3):
        blocks = np.array_split(np.arange(E[d]), grid[d])
        o = np.empty(E[d], dtype=np.int64)
        for b, idx in enumerate(blocks):
            o[idx] = b
        owner.append(o)
    ez, ey, ex = np.meshgrid(np.arange(E[2]), np.arange(E[1]), np.arange(E[0]), indexing="ij")
    bx, by, bz = owner[0][ex], owner[1][ey], owner[2][ez]
    return (bx + grid[0] * (by + grid[1] * bz)).ravel().astype(np.int64)


def partition_rcb(centroids: np.ndarray, nranks: int) -> np.ndarray:
    """Recursive coordinate bisection of ``centroids: (E, 3)`` into ``nranks`` parts.

    Each split cuts the longest extent, giving the left part a share of the
    elements proportional to its rank count (⌊P/2⌋ of P). Parts differ in size
    by at most one element per level.
    """
    c = np.asarray(centroids, dtype=np.float64)
    nranks = _check_ranks(nranks, c.shape[0])
    part = np.zeros(c.shape[0], dtype=np.int64)

    def split(idx, lo, p):
        if p == 1:
            part[idx] = lo
            return
        pl = p // 2
        ext = c[idx].max(axis=0) - c[idx].min(axis=0)
        axis = int(np.argmax(ext))
        order = idx[np.argsort(c[idx, axis], kind="stable")]
        k = int(round(len(idx) * pl / p))
        split(order[:k], lo, pl)
        split(order[k:], lo + pl, p - pl)

    split(np.arange(c.shape[0]), 0, nranks)
    return part


def partition_mesh(mesh: Mesh, nranks: int, method: str = "auto") -> np.ndarray:
    """Rank of each element: a processor grid for box meshes (``"box"``), else RCB."""
    if method not in ("auto", "box", "rcb"):
        raise ValueError(f"method must be 'auto', 'box' or 'rcb', got {method!r}")
    _check_ranks(nranks, mesh.num_elements)
    if method in ("auto", "box") and mesh.elements is not None:
        try:
            return partition_box(mesh.elements, nranks)
        except ValueError:
            if method == "box":
                raise
    centroids = mesh.x.reshape(3, mesh.num_elements, -1).mean(axis=2).T
    return partition_rcb(centroids, nranks)


def rank_pairs(pairs):
    """Greedy edge colouring of rank pairs: rounds in which each rank has ≤ 1 partner.

    ``pairs``: iterable of ``(a, b)`` with a < b. Returns a list of rounds, each
    a list of pairs; every rank computes the same schedule, so pairwise
    ``sendrecv`` in round order cannot deadlock.
    """
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set] = []
    for a, b in sorted(set((int(min(p)), int(max(p))) for p in pairs)):
        for r, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[r].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds
