"""Weighted inner products as one variadic reduction (the sums of PCG and of norms)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

__all__ = ["weighted_dots"]


def weighted_dots(weight, allreduce: Callable | None = None) -> Callable:
    """``[(u, v), …] ↦ (Σ u·v·weight, …)`` as *one* variadic reduction: ``(len(pairs),)``.

    ``jnp.stack([jnp.sum(u * v * w) for …])`` is one reduction per pair, and XLA
    (CPU always, GPU when its multi-output fusion declines) then reads the shared
    operands once per pair and materializes z = M r between them; a single
    ``lax.reduce`` over the tuple of products reads every operand once and fuses
    the producers (r ← r − αw, z = M r) into the same pass. ``allreduce``: applied
    to the local sums (e.g. ``lambda s: allreduce_sum(s, comm)``). Same sums as the
    per-pair form up to summation order.
    """
    def dots(pairs):
        prods = tuple(u * v * weight for u, v in pairs)
        zeros = tuple(jnp.zeros((), x.dtype) for x in prods)
        sums = lax.reduce(prods, zeros, lambda a, b: tuple(x + y for x, y in zip(a, b)),
                          tuple(range(prods[0].ndim)))
        local = jnp.stack(sums)
        return local if allreduce is None else allreduce(local)

    return dots
