"""Statistics of a flow over long runs: running time averages, plane profiles, wall shear.

:class:`Averages` accumulates weighted sums of the velocity, the pressure, the scalars and the
second moments uᵢuⱼ and uᵢθ, one state at a time (:func:`accumulate`: pure, jit-able, a pytree
that a checkpoint holds with the state); :func:`means` turns them into time averages and the
Reynolds stresses ⟨uᵢ'uⱼ'⟩ = ⟨uᵢuⱼ⟩ − ⟨uᵢ⟩⟨uⱼ⟩ and turbulent fluxes ⟨uᵢ'θ'⟩.
:func:`plane_average` averages a field over the planes normal to an axis (the homogeneous
directions of a channel: a profile against the wall distance), mass-weighted, on the host;
:func:`plane_moments` gives a homogeneous flow's profiles of the means and of the Reynolds
stresses averaged over time and planes together.
:func:`wall_shear` is the mean viscous traction of the flow on a wall group and
:func:`friction_velocity` u_τ = √|τ_w|.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ...discretization import surface as sf
from .scheme import NavierStokes, State, _grad

__all__ = ["Averages", "start", "accumulate", "means", "plane_average", "wall_shear", "friction_velocity",
           "plane_moments", "PAIRS"]

# the six components of a symmetric second moment, in the order of Averages.uu
PAIRS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Averages:
    """Weighted sums over the accumulated states (pytree; E elements, n GLL points, S scalars).

    ``weight: ()`` the sum of the weights (e.g. the time each state stands for); ``u: (3, E, n,
    n, n)`` Σ w u; ``p: (E, n, n, n)`` Σ w p; ``uu: (6, E, n, n, n)`` Σ w uᵢuⱼ in the order of
    :data:`PAIRS`; ``theta: (S, E, n, n, n)`` Σ w θ; ``utheta: (S, 3, E, n, n, n)`` Σ w uᵢθ.
    """

    weight: jax.Array
    u: jax.Array
    p: jax.Array
    uu: jax.Array
    theta: jax.Array
    utheta: jax.Array


def start(ns: NavierStokes, state: State) -> Averages:
    """Empty sums laid out like ``state``'s fields."""
    z = jnp.zeros_like
    th = state.theta
    return Averages(weight=jnp.zeros((), state.t.dtype), u=z(state.u), p=z(state.p),
                    uu=jnp.concatenate([z(state.u), z(state.u)]), theta=z(th),
                    utheta=z(jnp.broadcast_to(th[:, None], (th.shape[0], 3) + th.shape[1:])))


def accumulate(avg: Averages, state: State, weight=1.0) -> Averages:
    """``avg`` plus ``weight`` times the current fields of ``state`` and their second moments."""
    u, th = state.u, state.theta
    w = jnp.asarray(weight, avg.weight.dtype)
    uu = jnp.stack([u[i] * u[j] for i, j in PAIRS])
    return Averages(weight=avg.weight + w, u=avg.u + w * u, p=avg.p + w * state.p, uu=avg.uu + w * uu,
                    theta=avg.theta + w * th, utheta=avg.utheta + w * u[None] * th[:, None])


def means(avg: Averages) -> dict:
    """The time averages: ``u``, ``p``, ``theta``, the Reynolds stresses ``stress: (6, ...)``
    ⟨uᵢ'uⱼ'⟩ (order :data:`PAIRS`) and the turbulent fluxes ``flux: (S, 3, ...)`` ⟨uᵢ'θ'⟩.
    ``ValueError`` if nothing was accumulated."""
    if float(avg.weight) <= 0:
        raise ValueError("means: no state was accumulated (the weights sum to 0)")
    w = avg.weight
    u, th = avg.u / w, avg.theta / w
    stress = avg.uu / w - jnp.stack([u[i] * u[j] for i, j in PAIRS])
    return dict(u=u, p=avg.p / w, theta=th, stress=stress, flux=avg.utheta / w - u[None] * th[:, None])


def plane_average(ns: NavierStokes, field, axis: int, tol: float = 1e-9):
    """Averages of ``field: (..., E, n, n, n)`` over the planes normal to ``axis`` (its nodes
    grouped by their coordinate along the axis, within ``tol`` times the domain's extent, and
    mass-weighted): ``(coordinates (K,), values (..., K))``, the planes in increasing order. For
    meshes whose nodes lie on planes (box meshes, graded or not); the host gathers the field."""
    if axis not in (0, 1, 2):
        raise ValueError(f"axis must be 0, 1 or 2, got {axis!r}")
    from ...discretization import to_mesh_order

    s = ns.sem
    x = np.asarray(to_mesh_order(s, s.x[axis])).ravel()
    b = np.asarray(to_mesh_order(s, s.bmass)).ravel()
    f = np.asarray(to_mesh_order(s, jnp.asarray(field)))
    f = f.reshape(f.shape[:-4] + (-1,))
    extent = max(float(x.max() - x.min()), 1e-300)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    breaks = np.flatnonzero(np.diff(xs) > tol * extent) + 1
    groups = np.split(order, breaks)
    coords = np.array([x[g].mean() for g in groups])
    vals = np.stack([(f[..., g] * b[g]).sum(-1) / b[g].sum() for g in groups], axis=-1)
    return coords, vals


def plane_moments(ns: NavierStokes, avg: Averages, axis: int):
    """Profiles of a flow homogeneous in the planes normal to ``axis``, averaged over time and
    planes together: ``(coordinates (K,), U (3, K), stress (6, K))`` with U the plane average of
    the time-mean velocity and stress the second moments about it, ⟨uᵢuⱼ⟩ − UᵢUⱼ (order
    :data:`PAIRS`), as a channel's DNS defines them. Unlike the plane average of :func:`means`'s
    pointwise stresses, these count the spatial variation of the time means (streaks that a
    finite average has not yet washed out) as fluctuation. ``ValueError`` if nothing was
    accumulated."""
    if float(avg.weight) <= 0:
        raise ValueError("plane_moments: no state was accumulated (the weights sum to 0)")
    w = avg.weight
    y, prof = plane_average(ns, jnp.concatenate([avg.u / w, avg.uu / w]), axis)
    U, raw = prof[:3], prof[3:]
    return y, U, raw - np.stack([U[i] * U[j] for i, j in PAIRS])


def wall_shear(ns: NavierStokes, state: State, group: str):
    """``(3,)`` the mean viscous traction of the flow on the wall ``group``, τ_w =
    (1/A) ∮ ν(∇u + ∇uᵀ)n dA with n into the flow (the wall's side): the shear stress the flow
    exerts on the wall (density 1), tangential on a no-slip wall."""
    surf = sf.surface(ns.sem, (group,))
    g = ns.sem.local_map(lambda s, u: _grad(s, u), state.u)
    gf, nf = sf.face_values(surf, g), -surf.normal
    t = ns.nu * (jnp.einsum("ij...,i...->j...", gf, nf) + jnp.einsum("ji...,i...->j...", gf, nf))
    return sf.integrate(ns.sem, surf, t) / sf.area(ns.sem, surf)


def friction_velocity(ns: NavierStokes, state: State, groups) -> jax.Array:
    """``()`` u_τ = √|τ_w| averaged over the wall ``groups`` (a name or names), each weighted by
    its area."""
    groups = (groups,) if isinstance(groups, str) else tuple(groups)
    areas = [sf.area(ns.sem, sf.surface(ns.sem, (g,))) for g in groups]
    tau = sum(a * jnp.linalg.norm(wall_shear(ns, state, g)) for a, g in zip(areas, groups)) / sum(areas)
    return jnp.sqrt(tau)
