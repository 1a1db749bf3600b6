"""Boundary conditions of a flow, one per named boundary group of the mesh.

A condition is a small frozen object (static: it is part of the compiled program, its
data functions compared by identity):

* :class:`Velocity` — the velocity is given, ``u = u_b(x, y, z, t)`` (an inflow, a moving
  wall); ``Velocity()`` is a no-slip wall (:data:`NO_SLIP`).
* :class:`Symmetry` — a plane of symmetry normal to a coordinate axis: the normal velocity is
  0 and the tangential components are free (zero shear); the pressure has no condition.
* :class:`Outflow` — the pressure is given, ``p = p_b`` (0 by default), and the viscous
  flux ``ν ∂u/∂n = g`` (0 by default): Nek's ``O``, the "do-nothing" zero (pseudo-)traction
  ``ν ∂u/∂n − p n = 0``; with data, the traction ``g − p_b n`` given by its pressure and
  viscous parts.

:func:`resolve` checks a ``{group: condition}`` mapping against the mesh and turns it into
:class:`Conditions`: which groups carry the velocity's Dirichlet nodes and which the
pressure's, and the nodal weights that spread each group's data onto its nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...discretization import surface as surf_
from ...discretization.sem import SEM, group_indicator
from ...mesh.box import Mesh
from ...mesh.numbering import Numbering, face_slice

__all__ = ["Velocity", "Outflow", "Symmetry", "NO_SLIP", "Conditions", "resolve", "SYMMETRY_TOL"]

# A symmetry group's nodes lie on one plane x_a = const when their spread along axis a is below
# this times the mesh's bounding-box diagonal.
SYMMETRY_TOL = 1e-10


@dataclasses.dataclass(frozen=True, eq=False)
class Velocity:
    """The velocity given on the group: ``data(x, y, z, t) -> (3, ...)`` written with jnp
    (coordinates shaped alike, ``t`` a scalar), or None for a no-slip wall (u = 0).

    ``params``: None, or a pytree of arrays (an inflow amplitude, a profile's coefficients)
    passed as ``data(x, y, z, t, params)``; they are leaves of the flow problem, so ``jax.grad``
    reaches them (:meth:`Conditions.with_params` replaces them)."""

    data: Callable | None = None
    params: object = None

    def __post_init__(self):
        if self.data is not None and not callable(self.data):
            raise TypeError(f"Velocity.data must be None or a callable u_b(x, y, z, t) -> (3, ...), got {self.data!r}")


NO_SLIP = Velocity()


@dataclasses.dataclass(frozen=True)
class Outflow:
    """An open boundary: the pressure ``p = pressure`` (a number, or ``p_b(x, y, z, t) -> (...)``)
    and the viscous flux ``ν ∂u/∂n = flux(x, y, z, t) -> (3, ...)`` (None: 0). The defaults are
    the zero-traction "do-nothing" outflow (Nek's ``O``)."""

    pressure: Callable | float = 0.0
    flux: Callable | None = None

    def __post_init__(self):
        p = self.pressure
        if not callable(p) and (isinstance(p, bool) or not isinstance(p, (int, float)) or not np.isfinite(p)):
            raise TypeError(f"Outflow.pressure must be a finite number or a callable p_b(x, y, z, t), got {p!r}")
        if self.flux is not None and not callable(self.flux):
            raise TypeError(f"Outflow.flux must be None or a callable g(x, y, z, t) -> (3, ...), got {self.flux!r}")


@dataclasses.dataclass(frozen=True)
class Symmetry:
    """A plane of symmetry normal to a coordinate axis (found from the group's nodes): u·n = 0,
    ν ∂u_t/∂n = 0 for the tangential components, no pressure condition."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Conditions:
    """The boundary conditions of a flow on its discretization (pytree).

    Attributes (E elements, n GLL points per axis):
      velocity_weight: ``(G, E, n, n, n)`` the share of group g's velocity data at each
        velocity Dirichlet node (where groups meet, their data are averaged), for the G
        :class:`Velocity` groups with data; ``(0, ...)`` when none.
      pressure_weight: ``(H, E, n, n, n)`` likewise for the H :class:`Outflow` groups with a
        pressure other than 0.
      velocity_params: the :class:`Velocity` ``params`` of those groups (None where not given).
      velocity_data, pressure_data: static, the data functions (or numbers) of those groups;
      velocity_names: static, the names of the groups with velocity data.
      surfaces: the :class:`~jaxsem.discretization.Surface` of each outflow group with viscous
        flux data, in the order of ``flux_groups``.
      flux_groups: static, ``(name, flux)`` of the outflow groups with viscous flux data.
      velocity_groups, outflow_groups: static names: the velocity's Dirichlet groups and the
        pressure's.
      walls: static, the velocity has Dirichlet nodes (data or no-slip).
      component_mask: ``(3, E, n, n, n)`` the velocity's mask per component where symmetry
        planes hold one component (the normal one) at 0, ``(0, ...)`` when there are none.
      symmetry_groups: static ``(name, axis)`` of the :class:`Symmetry` groups.
    """

    velocity_weight: jax.Array
    pressure_weight: jax.Array
    surfaces: tuple
    velocity_params: tuple
    velocity_data: tuple = dataclasses.field(metadata=dict(static=True))
    pressure_data: tuple = dataclasses.field(metadata=dict(static=True))
    flux_groups: tuple = dataclasses.field(metadata=dict(static=True))
    velocity_groups: tuple = dataclasses.field(metadata=dict(static=True))
    outflow_groups: tuple = dataclasses.field(metadata=dict(static=True))
    walls: bool = dataclasses.field(metadata=dict(static=True))
    component_mask: jax.Array | None = None
    velocity_names: tuple = dataclasses.field(default=(), metadata=dict(static=True))
    symmetry_groups: tuple = dataclasses.field(default=(), metadata=dict(static=True))

    def with_params(self, group: str, params) -> "Conditions":
        """The same conditions with the velocity data ``params`` of ``group`` replaced (for
        ``jax.grad`` w.r.t. an inflow's parameters: ``dataclasses.replace(ns, bc=ns.bc.with_params(…))``)."""
        if group not in self.velocity_names:
            raise ValueError(f"group {group!r} has no velocity data; groups with data: {list(self.velocity_names)}")
        i = self.velocity_names.index(group)
        if self.velocity_params[i] is None:
            raise ValueError(f"the Velocity of group {group!r} was given without params")
        ps = list(self.velocity_params)
        ps[i] = jax.tree.map(jnp.asarray, params)
        return dataclasses.replace(self, velocity_params=tuple(ps))

    @property
    def inflow(self) -> bool:
        """Energy may enter or leave (velocity data or an open boundary)."""
        return bool(self.velocity_data or self.outflow_groups)

    def velocity(self, s: SEM, t):
        """The velocity data at time ``t`` on the Dirichlet nodes, 0 elsewhere: ``(3, E, n, n, n)``
        (rank-local)."""
        out = jnp.zeros((3,) + s.mask.shape, s.x.dtype)
        for w, f, a in zip(self.velocity_weight, self.velocity_data, self.velocity_params):
            v = f(s.x[0], s.x[1], s.x[2], t) if a is None else f(s.x[0], s.x[1], s.x[2], t, a)
            out = out + w * jnp.asarray(v, s.x.dtype)
        return out

    def flux(self, s: SEM, t):
        """∮ v·g dA of the viscous flux data g at time ``t`` for each test function v (a node's):
        ``(3, E, n, n, n)`` element contributions, not assembled (rank-local); None without flux data."""
        if not self.flux_groups:
            return None
        like = jnp.zeros((3,) + s.mask.shape, s.x.dtype)
        out = like
        for sf, (_, f) in zip(self.surfaces, self.flux_groups):
            xf = surf_.face_values(sf, s.x)  # (3, F, n, n)
            g = jnp.asarray(f(xf[0], xf[1], xf[2], t), s.x.dtype)
            out = out + surf_.face_scatter(sf, sf.weight * g, like)
        return out

    def pressure(self, s: SEM, t):
        """The pressure data at time ``t`` on the outflow nodes, 0 elsewhere: ``(E, n, n, n)``
        (rank-local); None when every outflow pressure is 0."""
        if not self.pressure_data:
            return None
        out = jnp.zeros(s.mask.shape, s.x.dtype)
        for w, f in zip(self.pressure_weight, self.pressure_data):
            out = out + w * (jnp.asarray(f(s.x[0], s.x[1], s.x[2], t), s.x.dtype) if callable(f) else f)
        return out


def check_groups(mesh: Mesh, numbering: Numbering, boundary: dict) -> None:
    """``ValueError`` unless ``boundary`` gives a condition to known groups that cover every
    boundary face of ``mesh`` (naming the unknown groups, or the uncovered faces' count and the
    groups not given)."""
    if not isinstance(boundary, dict):
        raise TypeError(f"boundary must be a dict {{group: Velocity | Outflow}}, got {type(boundary).__name__}")
    unknown = [g for g in boundary if g not in mesh.boundaries]
    if unknown:
        raise ValueError(f"boundary names group(s) {unknown} the mesh does not have; its groups: "
                         f"{sorted(mesh.boundaries)}")
    for g, c in boundary.items():
        if not isinstance(c, (Velocity, Outflow, Symmetry)):
            raise TypeError(f"boundary[{g!r}] must be a Velocity, an Outflow or a Symmetry, got {c!r}")
    missing = covered(mesh, numbering, boundary)
    if missing:
        rest = sorted(set(mesh.boundaries) - set(boundary))
        raise ValueError(f"boundary gives no condition to {len(missing)} boundary face(s) (the first: face "
                         f"{missing[0] % 6} of element {missing[0] // 6}); groups not given: {rest}")


def covered(mesh: Mesh, numbering: Numbering, boundary: dict) -> list:
    """The boundary faces of ``mesh`` (as ``6·element + face``) no group of ``boundary`` holds."""
    given = set()
    for g in boundary:
        rows = mesh.boundary(g)
        given.update((rows[:, 0] * 6 + rows[:, 1]).tolist())
    faces = numbering.boundary_faces
    return [k for k in (faces[:, 0] * 6 + faces[:, 1]).tolist() if k not in given]


def resolve(sem: SEM, boundary: dict) -> Conditions:
    """:class:`Conditions` of ``boundary`` (checked by :func:`check_groups`) on ``sem``, whose
    Dirichlet nodes are the :class:`Velocity` groups' (host set-up)."""
    vel = tuple(g for g, c in boundary.items() if isinstance(c, Velocity))
    out = tuple(g for g, c in boundary.items() if isinstance(c, Outflow))
    sym = tuple((g, symmetry_axis(sem.source.mesh, g)) for g, c in boundary.items() if isinstance(c, Symmetry))
    shape = sem.mask.shape
    like = lambda k: jnp.zeros((k,) + shape, sem.x.dtype)
    ind = {g: group_indicator(sem, (g,)) for g in vel}
    data = [g for g in vel if boundary[g].data is not None]
    if data:
        total = sum(ind.values())
        share = lambda g: ind[g] * (1 - sem.mask) / jnp.maximum(total, 1.0)
        vw = jnp.stack([share(g) for g in data])
    else:
        vw = like(0)
    pdata = [g for g in out if callable(boundary[g].pressure) or boundary[g].pressure != 0]
    if pdata:
        pind = {g: group_indicator(sem, (g,)) for g in out}
        ptotal = sum(pind.values())
        pw = jnp.stack([pind[g] / jnp.maximum(ptotal, 1.0) for g in pdata])
    else:
        pw = like(0)
    fluxes = tuple((g, boundary[g].flux) for g in out if boundary[g].flux is not None)
    return Conditions(
        velocity_weight=vw, pressure_weight=pw, surfaces=tuple(surf_.surface(sem, (g,)) for g, _ in fluxes),
        velocity_params=tuple(None if boundary[g].params is None else jax.tree.map(jnp.asarray, boundary[g].params)
                              for g in data),
        velocity_data=tuple(boundary[g].data for g in data), velocity_names=tuple(data),
        pressure_data=tuple(boundary[g].pressure for g in pdata),
        flux_groups=fluxes,
        velocity_groups=vel, outflow_groups=out, walls=bool(vel), symmetry_groups=sym,
        component_mask=jnp.stack([sem.mask * (1.0 - group_indicator(sem, tuple(g for g, a in sym if a == c)))
                                  for c in range(3)]) if sym else None)


def symmetry_axis(mesh: Mesh, group: str) -> int:
    """The axis a whose coordinate is constant on the nodes of boundary ``group``'s faces (within
    :data:`SYMMETRY_TOL` times the mesh's diagonal); ``ValueError`` naming the group if none is."""
    rows = mesh.boundary(group)
    pts = [mesh.x[:, rows[rows[:, 1] == f, 0]][(slice(None), slice(None)) + face_slice(f, mesh.order)[1:]]
           .reshape(3, -1) for f in range(6) if (rows[:, 1] == f).any()]
    if not pts:
        raise ValueError(f"symmetry group {group!r} has no faces")
    pts = np.concatenate(pts, axis=1)
    spread = pts.max(axis=1) - pts.min(axis=1)
    diag = float(np.linalg.norm(mesh.x.reshape(3, -1).max(axis=1) - mesh.x.reshape(3, -1).min(axis=1)))
    flat = np.nonzero(spread <= SYMMETRY_TOL * diag)[0]
    if len(flat) != 1:
        raise ValueError(f"symmetry group {group!r} is not a plane normal to a coordinate axis (the spread of "
                         f"its nodes along x, y, z: {[float(f'{v:.3g}') for v in spread]}); Symmetry needs one")
    return int(flat[0])
