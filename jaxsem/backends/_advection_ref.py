"""The DG advection right-hand side in einsum form: the reference every backend is tested against.

``u: (E, n, n, n)``; ``tr`` the model's transport pytree (fields ``A: (3, E, n, n, n)`` the
contravariant velocity, ``an, vn, lw: (E, 6, n, n)`` the face weights,
:class:`jaxsem.models.advection.Transport`); ``dg`` a :class:`jaxsem.discretization.dg.DG`.
The physics is documented in :mod:`jaxsem.models.advection`:

    du/dt = −c·∇u + L[ (c·n) u⁻ − f* ],   f* = (c·n)(u⁻ + u⁺)/2 + α |c·n| (u⁻ − u⁺)/2

As for Maxwell (:mod:`jaxsem.backends._maxwell_ref`), :func:`rhs` exchanges the face values
and then computes (bulk-synchronous, the faster structure for einsum contractions), and
:func:`rhs_local` + :func:`remote_flux` is what a fused kernel computes: the neighbours held
here read in place (remote ones counted as 0), then the remote neighbours' flux on the halo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._maxwell_ref import ref_derivative as _d


def volume(dg, tr, u, form):
    """Σ_a A_a ∂_a u (``"chain"``), Σ_a ∂_a(A_a u) (``"conservative"``) or their average (``"split"``)."""
    vol = 0.0
    if form in ("split", "conservative"):
        vol = vol + sum(_d(dg.D, tr.A[a] * u, a) for a in range(3))
    if form in ("split", "chain"):
        vol = vol + sum(tr.A[a] * _d(dg.D, u, a) for a in range(3))
    return 0.5 * vol if form == "split" else vol


def _surface(dg, tr, uf, up, flux):
    fstar = 0.5 * tr.vn * (uf + up)
    if flux == "upwind":
        fstar = fstar + 0.5 * jnp.abs(tr.vn) * (uf - up)
    return dg.lift_faces(tr.lw * (tr.an * uf - fstar))


def rhs(dg, tr, u, flux, form):
    """du/dt with the face exchange (bulk-synchronous): the reference right-hand side.

    Distributed, an ``optimization_barrier`` keeps the compiler from starting the volume term
    before the exchange has finished (measured faster than overlapping them, docs/multi-gpu.md).
    """
    uf = dg.faces(u)  # (E, 6, n, n): one component through the exchange
    total = dg.face_exchange(uf[None])[0]
    if dg.fgs.exchange is not None:
        u, total = jax.lax.optimization_barrier((u, total))
    up = total - uf  # neighbour (0 = inflow on the boundary)
    return _surface(dg, tr, uf, up, flux) - volume(dg, tr, u, form) / dg.jac


def rhs_local(dg, tr, u, flux, form):
    """The fused kernel's operator in einsum form: the neighbours read through ``dg.nbr``, inflow
    0 where ``nbr < 0`` (on one device :func:`rhs` itself; distributed, the rank's part with the
    remote neighbours counted as 0)."""
    return _surface(dg, tr, dg.faces(u), dg.local_neighbors(u), flux) - volume(dg, tr, u, form) / dg.jac


def remote_flux(dg, tr, u, flux):
    """``(H, n, n, n)``: the remote neighbours' part of the flux on the halo elements ``dg.halo``.

    The flux is linear in the neighbour value u⁺: with the remote values ``dup: (H, 6, n, n)``
    (0 where the neighbour is not remote), f* grows by (½vn − ½α|vn|) u⁺ and the lifted term
    is −f*."""
    dup = dg.remote_values(u)[0]
    h = dg.halo
    vn = tr.vn[h]
    dflux = 0.5 * vn * dup
    if flux == "upwind":
        dflux = dflux - 0.5 * jnp.abs(vn) * dup
    return dg.lift_faces(-tr.lw[h] * dflux)
