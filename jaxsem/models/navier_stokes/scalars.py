"""Scalars carried by a flow (temperature, a concentration) and the buoyancy they drive.

A :class:`Scalar` θ obeys ∂θ/∂t + u·∇θ = ∇·(κ∇θ) + q, advanced with the flow's BDFk/EXTk
scheme: the advection explicit (extrapolated, on the flow's dealiasing rule), the diffusion
implicit (one Helmholtz solve per scalar and step). Its boundary conditions are given per
named boundary group, like the velocity's:

* :class:`Value` — θ = θ_b (a number or ``θ_b(x, y, z, t)``): a wall held at a temperature;
* :class:`Flux` — κ ∂θ/∂n = g on the outward normal (a number or ``g(x, y, z, t)``);
  :data:`INSULATED` is ``Flux(0)``.

:class:`Buoyancy` couples one scalar back into the momentum equation (Boussinesq): the force
per unit mass ``vector·(θ − reference)``, e.g. ``vector = (0, 0, Ra·Pr)`` for Rayleigh–Bénard
convection in thermal-diffusion units (ν = Pr, κ = 1). Each step solves the scalars first
(their advection uses the velocity of the past levels), then the flow with the new θ in its
force. κ, the buoyancy vector and its reference are leaves of the flow problem: ``jax.grad``
reaches them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...discretization import surface as surf_
from ...discretization.sem import SEM, group_indicator, with_dirichlet
from ...mesh.box import Mesh
from ...mesh.numbering import Numbering

__all__ = ["Scalar", "Value", "Flux", "INSULATED", "Buoyancy", "ScalarField", "BuoyancyTerm"]


def _check_data(owner: str, data):
    if callable(data):
        return
    if isinstance(data, bool) or not isinstance(data, (int, float, np.floating, np.integer)) or not np.isfinite(data):
        raise TypeError(f"{owner} must be a finite number or a callable f(x, y, z, t), got {data!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """The scalar given on the group: a number or ``data(x, y, z, t) -> (...)`` (jnp, coordinates
    shaped alike, ``t`` a scalar)."""

    data: Callable | float = 0.0

    def __post_init__(self):
        _check_data("Value.data", self.data)


@dataclasses.dataclass(frozen=True, eq=False)
class Flux:
    """The diffusive flux κ ∂θ/∂n on the outward normal given on the group: a number or
    ``data(x, y, z, t) -> (...)``; 0 (the default) is an insulated wall."""

    data: Callable | float = 0.0

    def __post_init__(self):
        _check_data("Flux.data", self.data)


INSULATED = Flux()


@dataclasses.dataclass(frozen=True, eq=False)
class Scalar:
    """A scalar field of the flow.

    Attributes:
      name: how the state, the initial values and :class:`Buoyancy` refer to it.
      diffusivity: κ > 0 (length²/time).
      boundary: ``{group: Value | Flux}`` covering every boundary face of the mesh (None: a
        mesh without boundary faces, all periodic).
      source: None, or ``q(x, y, z, t) -> (...)`` per unit volume and time.
    """

    name: str
    diffusivity: float
    boundary: dict | None = None
    source: Callable | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Scalar.name must be a non-empty string, got {self.name!r}")
        k = self.diffusivity
        if isinstance(k, bool) or not isinstance(k, (int, float, np.floating, np.integer)) \
                or not (np.isfinite(k) and k > 0):
            raise ValueError(f"Scalar.diffusivity of {self.name!r} must be a positive finite number, got {k!r}")
        if self.boundary is not None and not isinstance(self.boundary, dict):
            raise TypeError(f"Scalar.boundary of {self.name!r} must be None or a dict {{group: Value | Flux}}, "
                            f"got {self.boundary!r}")
        if self.source is not None and not callable(self.source):
            raise TypeError(f"Scalar.source of {self.name!r} must be None or a callable q(x, y, z, t), "
                            f"got {self.source!r}")


@dataclasses.dataclass(frozen=True)
class Buoyancy:
    """The force per unit mass ``vector·(θ − reference)`` of the scalar named ``scalar`` on the
    flow (Boussinesq): ``vector`` is −βg, 3 numbers."""

    scalar: str
    vector: tuple
    reference: float = 0.0

    def __post_init__(self):
        try:
            v = tuple(float(c) for c in self.vector)
        except TypeError:
            raise TypeError(f"Buoyancy.vector must be 3 numbers, got {self.vector!r}") from None
        if len(v) != 3 or not all(np.isfinite(v)):
            raise ValueError(f"Buoyancy.vector must be 3 finite numbers, got {self.vector!r}")
        if not np.isfinite(float(self.reference)):
            raise ValueError(f"Buoyancy.reference must be a finite number, got {self.reference!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScalarField:
    """One scalar on the flow's discretization (pytree).

    Attributes (E elements, n GLL points per axis):
      kappa: ``()`` the diffusivity κ (a leaf).
      mask: ``(E, n, n, n)`` 0 on the nodes of its :class:`Value` groups, 1 elsewhere.
      value_weight: ``(G, E, n, n, n)`` each Value group's share of a node's value (averaged
        where groups meet).
      surfaces: the :class:`~jaxsem.discretization.Surface` of each :class:`Flux` group with
        data other than 0.
      name, value_data, flux_data, source, dirichlet: static (the data, the Value groups).
    """

    kappa: jax.Array
    mask: jax.Array
    value_weight: jax.Array
    surfaces: tuple
    name: str = dataclasses.field(metadata=dict(static=True))
    value_data: tuple = dataclasses.field(metadata=dict(static=True))
    flux_data: tuple = dataclasses.field(metadata=dict(static=True))
    source: object = dataclasses.field(metadata=dict(static=True))
    dirichlet: object = dataclasses.field(metadata=dict(static=True))

    def sem(self, s: SEM) -> SEM:
        """The velocity's (rank-local) discretization with this scalar's Dirichlet nodes."""
        return s.with_mask(self.mask, self.dirichlet)

    def values(self, s: SEM, t):
        """The Value data at time ``t`` on the Dirichlet nodes, 0 elsewhere: ``(E, n, n, n)``."""
        out = jnp.zeros(s.mask.shape, s.x.dtype)
        for w, f in zip(self.value_weight, self.value_data):
            out = out + w * (jnp.asarray(f(s.x[0], s.x[1], s.x[2], t), s.x.dtype) if callable(f) else f)
        return out

    def flux(self, s: SEM, t):
        """∮ v g dA of the Flux data at time ``t`` for each node's test function v: element
        contributions ``(E, n, n, n)`` (not assembled), or None without flux data."""
        if not self.flux_data:
            return None
        like = jnp.zeros(s.mask.shape, s.x.dtype)
        out = like
        for sf, f in zip(self.surfaces, self.flux_data):
            xf = surf_.face_values(sf, s.x)
            g = jnp.asarray(f(xf[0], xf[1], xf[2], t), s.x.dtype) if callable(f) else jnp.full(xf.shape[1:], f,
                                                                                                s.x.dtype)
            out = out + surf_.face_scatter(sf, sf.weight * g, like)
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BuoyancyTerm:
    """:class:`Buoyancy` on the flow (pytree): ``vector: (3,)`` and ``reference: ()`` leaves,
    ``index`` (static) the scalar's place in the state."""

    vector: jax.Array
    reference: jax.Array
    index: int = dataclasses.field(metadata=dict(static=True))


def check_scalars(scalars, buoyancy) -> tuple:
    """The scalars as a tuple, checked (unique names; the buoyancy's scalar among them)."""
    if scalars is None:
        scalars = ()
    if isinstance(scalars, Scalar):
        scalars = (scalars,)
    scalars = tuple(scalars)
    for c in scalars:
        if not isinstance(c, Scalar):
            raise TypeError(f"scalars must be Scalar objects, got {c!r}")
    names = [c.name for c in scalars]
    if len(set(names)) != len(names):
        raise ValueError(f"scalars must have distinct names, got {names}")
    if buoyancy is not None:
        if not isinstance(buoyancy, Buoyancy):
            raise TypeError(f"buoyancy must be None or a Buoyancy, got {buoyancy!r}")
        if buoyancy.scalar not in names:
            raise ValueError(f"buoyancy names scalar {buoyancy.scalar!r}; the scalars are {names}")
    return scalars


def check_groups(mesh: Mesh, numbering: Numbering, scalar: Scalar) -> None:
    """``ValueError`` unless the scalar's conditions name known groups and cover every boundary
    face (named: the scalar, the unknown groups or the uncovered faces)."""
    from .boundary import covered

    bc = scalar.boundary or {}
    unknown = [g for g in bc if g not in mesh.boundaries]
    if unknown:
        raise ValueError(f"scalar {scalar.name!r}: boundary names group(s) {unknown} the mesh does not have; its "
                         f"groups: {sorted(mesh.boundaries)}")
    for g, c in bc.items():
        if not isinstance(c, (Value, Flux)):
            raise TypeError(f"scalar {scalar.name!r}: boundary[{g!r}] must be a Value or a Flux, got {c!r}")
    missing = covered(mesh, numbering, bc)
    if missing:
        rest = sorted(set(mesh.boundaries) - set(bc))
        raise ValueError(f"scalar {scalar.name!r}: boundary gives no condition to {len(missing)} boundary face(s) "
                         f"(the first: face {missing[0] % 6} of element {missing[0] // 6}); groups not given: {rest}")


def resolve(sem: SEM, scalar: Scalar) -> ScalarField:
    """:class:`ScalarField` of ``scalar`` (checked by :func:`check_groups`) on ``sem`` (host set-up)."""
    bc = scalar.boundary or {}
    vals = tuple(g for g, c in bc.items() if isinstance(c, Value))
    ts = with_dirichlet(sem, vals or False)
    mask = ts.mask
    if vals:
        ind = {g: group_indicator(sem, (g,)) for g in vals}
        total = sum(ind.values())
        vw = jnp.stack([ind[g] * (1 - mask) / jnp.maximum(total, 1.0) for g in vals])
    else:
        vw = jnp.zeros((0,) + mask.shape, sem.x.dtype)
    fluxes = tuple(g for g, c in bc.items() if isinstance(c, Flux) and (callable(c.data) or c.data != 0))
    return ScalarField(kappa=jnp.asarray(float(scalar.diffusivity), sem.x.dtype), mask=mask, value_weight=vw,
                       surfaces=tuple(surf_.surface(sem, (g,)) for g in fluxes), name=scalar.name,
                       value_data=tuple(bc[g].data for g in vals), flux_data=tuple(bc[g].data for g in fluxes),
                       source=scalar.source, dirichlet=ts.dirichlet)
