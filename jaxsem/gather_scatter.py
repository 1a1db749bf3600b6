"""Gather–scatter (direct stiffness summation) QQᵀ on E-vectors.

An E-vector ``u: (..., E, n, n, n)`` holds one value per local node. ``Qᵀ``
sums the copies of each global node, ``Q`` copies the sums back, so
``gs(u) = take(segment_sum(u, gid), gid)``. Three layouts compute the same sum:

* ``"segment"``: ``segment_sum`` over the E-vector order (unsorted ids);
* ``"sorted"``: permute the E-vector so ids ascend, then ``segment_sum`` with
  ``indices_are_sorted=True``;
* ``"padded"``: for each global node, a fixed-width (max multiplicity, ≤ 8 for
  a conforming hex mesh without periodic wrap onto itself) list of its copies,
  padded with a pointer to a zero slot; a gather and a sum over that axis.

All are linear and their transposes are themselves (QQᵀ is symmetric), which
JAX's autodiff of ``segment_sum``/``take`` finds by itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["GatherScatter", "make_gs", "gs_apply", "LAYOUTS"]

LAYOUTS = ("segment", "sorted", "padded")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GatherScatter:
    """A gather–scatter plan (pytree; integer sizes are static).

    ``gid: (L,)`` int32 global id per local node (L = E·n³, E-vector order);
    ``perm: (L,)`` order that sorts ``gid`` (``"sorted"`` layout);
    ``copies: (num_global, width)`` local positions of each node's copies,
    padded with ``L`` (``"padded"`` layout); ``mult: (E, n, n, n)`` inverse
    multiplicity 1/(number of copies).
    """

    gid: jax.Array
    perm: jax.Array
    gid_sorted: jax.Array
    copies: jax.Array
    mult: jax.Array
    num_global: int = dataclasses.field(metadata=dict(static=True))
    layout: str = dataclasses.field(metadata=dict(static=True), default="segment")

    def __call__(self, u):
        return gs_apply(self, u)


def make_gs(gid: np.ndarray, num_global: int, layout: str = "segment", dtype=jnp.float64) -> GatherScatter:
    """Build a :class:`GatherScatter` from ``gid: (E, n, n, n)`` global ids."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    gid = np.asarray(gid)
    flat = gid.reshape(-1).astype(np.int64)
    L = flat.size
    counts = np.bincount(flat, minlength=num_global)
    perm = np.argsort(flat, kind="stable")
    width = int(counts.max()) if L else 1
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_in_node = np.arange(L) - starts[flat[perm]]
    copies = np.full((num_global, width), L, dtype=np.int64)
    copies[flat[perm], rank_in_node] = perm
    itype = np.int32 if L < 2**31 - 1 else np.int64
    mult = (1.0 / counts[flat]).reshape(gid.shape)
    return GatherScatter(
        gid=jnp.asarray(flat.astype(itype)),
        perm=jnp.asarray(perm.astype(itype)),
        gid_sorted=jnp.asarray(flat[perm].astype(itype)),
        copies=jnp.asarray(copies.astype(itype)),
        mult=jnp.asarray(mult, dtype=dtype),
        num_global=int(num_global),
        layout=layout,
    )


def _qt(plan: GatherScatter, v):
    """Qᵀ on a flat E-vector ``v: (L,)`` → ``(num_global,)``."""
    if plan.layout == "segment":
        return jax.ops.segment_sum(v, plan.gid, num_segments=plan.num_global)
    if plan.layout == "sorted":
        return jax.ops.segment_sum(
            v[plan.perm], plan.gid_sorted, num_segments=plan.num_global, indices_are_sorted=True
        )
    padded = jnp.concatenate([v, jnp.zeros((1,), v.dtype)])
    return jnp.sum(padded[plan.copies], axis=1)


def gs_apply(plan: GatherScatter, u):
    """QQᵀ u for ``u: (..., E, n, n, n)``: each node gets the sum of its copies."""
    shape = u.shape
    lead = shape[: u.ndim - 4]
    flat = u.reshape(lead + (-1,))
    if lead:
        f = lambda v: jnp.take(_qt(plan, v), plan.gid, axis=0)
        out = jax.vmap(f)(flat.reshape((-1, flat.shape[-1])))
        return out.reshape(shape)
    return jnp.take(_qt(plan, flat), plan.gid, axis=0).reshape(shape)


def global_to_local(plan: GatherScatter, ug):
    """Q: copy global values ``ug: (..., num_global)`` to an E-vector ``(..., L)``."""
    return jnp.take(ug, plan.gid, axis=-1)


def local_to_global(plan: GatherScatter, u):
    """Qᵀ on one flat E-vector ``u: (L,)`` → ``(num_global,)``."""
    return _qt(plan, u.reshape(-1))
