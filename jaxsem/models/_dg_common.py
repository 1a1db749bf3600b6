"""What the DG models (:mod:`~jaxsem.models.advection`, :mod:`~jaxsem.models.maxwell`) share.

The physics-free plumbing around a strong-form DG right-hand side
``rhs(dg, p, q, ..., exchange=...)`` with ``p`` the model's coefficient pytree
(a Transport, a Material): option checks, the reference derivative, the
``f(t, q, (dg, p))`` closure for :func:`jaxsem.timestepping.run`, the
power-iteration spectral radius and the relative L2 error.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..solvers import timestepping as ts
from ..parallel.comm import allreduce_sum
from ..discretization.dg import DG

# The power iteration approaches ρ from below; this margin covers its shortfall.
RHO_MARGIN = 1.05


def check_choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def ref_derivative(D, u, a, xp=jnp):
    """Reference derivative along axis a (0: r, 1: s, 2: t) of ``u: (..., E, n, n, n)`` [k, j, i]."""
    if a == 0:
        return xp.einsum("il,...kjl->...kji", D, u)
    if a == 1:
        return xp.einsum("jl,...kli->...kji", D, u)
    return xp.einsum("kl,...lji->...kji", D, u)


def rhs_fn(rhs: Callable, exchange: Callable | None, **options):
    """``f(t, q, (dg, p)) = rhs(dg, p, q, exchange=..., **options)`` for :func:`jaxsem.timestepping.run`.

    ``exchange``: ``(dg, fu) -> Σ copies``, bound to the ``dg`` of each call
    (``None``: the rhs's built-in :func:`jaxsem.dg.face_exchange`).
    """

    def f(t, q, args):
        dg, p = args
        ex = None if exchange is None else (lambda v: exchange(dg, v))
        return rhs(dg, p, q, exchange=ex, **options)

    return f


@functools.lru_cache(maxsize=None)
def _operator(f):
    return lambda v, args: f(0.0, v, args)


def spectral_radius(dg: DG, f: Callable, args, inner: Callable, lead: tuple = (), iterations: int = 60) -> float:
    """Power-iteration ρ of ``v ↦ f(0, v, args)``, ``v: (*lead, E, n, n, n)``, in the norm of ``inner``.

    ``f`` a cached :func:`rhs_fn` (the same object reuses the operator). The start
    vector is NumPy's seed-0 normal draw of the whole mesh's shape; distributed,
    each rank takes its elements' part of it and ``inner`` all-reduces, so every
    rank gets the serial ρ (up to the order of the sums).
    """
    apply = _operator(f)
    if dg.comm.size > 1:
        shape = lead + (dg.num_global_elements,) + (dg.n,) * 3
        mine = (slice(None),) * len(lead) + (np.asarray(dg.elements),)
        v = np.random.default_rng(0).standard_normal(shape)[mine]
        go = ts._power_fn(apply, inner, int(iterations))
        return float(go(jnp.asarray(v, dg.jac.dtype), args))
    like = jax.ShapeDtypeStruct(lead + dg.jac.shape, dg.jac.dtype)
    return ts.spectral_radius(apply, like, args, inner=inner, iterations=iterations)


def relative_error(dg: DG, q, q_exact) -> float:
    """Relative L2 error ‖q − q_ex‖ / ‖q_ex‖ (GLL rule, all ranks), ``q: ([C,] E, n, n, n)``."""
    return float(_relative_error(dg.mass, q, q_exact, dg.comm))


@jax.jit
def _relative_error(mass, q, q_exact, comm):
    def norm2(v):  # Σ mass |v|², the components (a leading axis beyond mass's) summed first
        v2 = v**2
        return jnp.sum(mass * (jnp.sum(v2, 0) if v2.ndim > mass.ndim else v2))

    num, den = allreduce_sum(jnp.stack([norm2(q - q_exact), norm2(q_exact)]), comm)
    return jnp.sqrt(num / den)
