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

    def local(dg, p, q):
        ex = None if exchange is None else (lambda v: exchange(dg, v))
        return rhs(dg, p, q, exchange=ex, **options)

    def f(t, q, args):
        dg, p = args
        return dg.local_map(local, p, q)

    return f


@functools.lru_cache(maxsize=None)
def _operator(f):
    return lambda v, args: f(0.0, v, args)


def spectral_radius(dg: DG, f: Callable, args, inner: Callable, lead: tuple = (), iterations: int = 60) -> float:
    """Power-iteration ρ of ``v ↦ f(0, v, args)``, ``v: (*lead, E, n, n, n)``, in the norm of ``inner``.

    ``f`` a cached :func:`rhs_fn` (the same object reuses the operator). The start
    vector is NumPy's seed-0 normal draw of the whole mesh's shape, of which each
    rank or device block takes its elements (zero on pads), so every transport gets
    the serial ρ (up to the order of the sums).
    """
    el = dg.host_elements()
    shape = lead + (dg.num_global_elements or el.size,) + (dg.n,) * 3
    v = np.take(np.random.default_rng(0).standard_normal(shape), np.maximum(el, 0), axis=-4)
    v = v * (el >= 0)[:, None, None, None]  # pads start (and stay) at zero
    like = jax.ShapeDtypeStruct(v.shape, dg.jac.dtype)
    return ts.spectral_radius(_operator(f), like, args, inner=inner, iterations=iterations, start=v)


def relative_error(dg: DG, q, q_exact) -> float:
    """Relative L2 error ‖q − q_ex‖ / ‖q_ex‖ (GLL rule, all ranks), ``q: ([C,] E, n, n, n)``."""
    return float(_relative_error(dg.mass, q, q_exact, dg.comm))


@jax.jit
def _relative_error(mass, q, q_exact, comm):
    def norm2(v):  # Σ mass |v|², the components (a leading axis beyond mass's) summed first
        v2 = v**2
        return jnp.sum(mass * (jnp.sum(v2, 0) if v2.ndim > mass.ndim else v2))

    num, den = comm.allreduce(jnp.stack([norm2(q - q_exact), norm2(q_exact)]))
    return jnp.sqrt(num / den)
