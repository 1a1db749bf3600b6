"""What drives a flow along a periodic direction: a held flow rate or a given pressure gradient.

* :class:`FlowRate` — the bulk velocity ``U_b = (1/|Ω|) ∫ u·e dV`` along the axis ``e`` is held
  at ``bulk`` every step, as Nek does: the step's velocity u* plus α times the step's response
  u_s to a unit force along e, (β₀/Δt B + νA) u_s = B e, with α = (U_b − bulk(u*))/bulk(u_s).
  α is the mean pressure gradient −dP/dx the flow needs (reported each step). Exact for the
  discrete step: the step is linear in a uniform force, whose pressure is constant when no
  boundary face has a normal along e.
* :class:`PressureGradient` — a uniform force ``value`` per unit mass along the axis (a mean
  pressure gradient −dP/dx = value); the bulk velocity follows.

Both need the axis free of boundary faces (periodic, or walls parallel to it), checked at
set-up.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FlowRate", "PressureGradient", "Drive"]


def _check(owner, axis, value, positive=False):
    if isinstance(axis, bool) or axis not in (0, 1, 2):
        raise ValueError(f"{owner}.axis must be 0, 1 or 2, got {axis!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not np.isfinite(value):
        raise ValueError(f"{owner} needs a finite number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class FlowRate:
    """Hold the bulk velocity along ``axis`` (0, 1, 2 for x, y, z) at ``bulk``."""

    axis: int
    bulk: float

    def __post_init__(self):
        _check("FlowRate", self.axis, self.bulk)


@dataclasses.dataclass(frozen=True)
class PressureGradient:
    """A uniform force ``value`` per unit mass along ``axis`` (the mean pressure gradient −dP/dx)."""

    axis: int
    value: float

    def __post_init__(self):
        _check("PressureGradient", self.axis, self.value)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Drive:
    """A drive on the flow's discretization (pytree): ``value: ()`` the bulk velocity held or the
    force applied (a leaf: ``jax.grad`` reaches it); ``axis`` and ``flow_rate`` static."""

    value: jax.Array
    axis: int = dataclasses.field(metadata=dict(static=True))
    flow_rate: bool = dataclasses.field(metadata=dict(static=True))


def resolve(sem, drive) -> Drive | None:
    """:class:`Drive` of ``drive`` on ``sem``; ``ValueError`` if a boundary face has a normal along
    its axis (the drive needs the axis periodic or walls parallel to it)."""
    if drive is None:
        return None
    if not isinstance(drive, (FlowRate, PressureGradient)):
        raise TypeError(f"drive must be None, a FlowRate or a PressureGradient, got {drive!r}")
    from ...discretization import surface as surf_

    groups = tuple(sem.source.mesh.boundaries)
    if groups:
        sf = surf_.surface(sem, groups)
        along = float(sem.comm.allreduce(jnp.max(jnp.abs(sf.normal[drive.axis]) * (sf.weight > 0), initial=0.0)))
        if along > 1e-8:
            raise ValueError(f"drive: axis {drive.axis} crosses boundary faces (a face normal has component "
                             f"{along:.3g} along it); a drive needs the axis periodic or walls parallel to it")
    value = drive.bulk if isinstance(drive, FlowRate) else drive.value
    return Drive(value=jnp.asarray(float(value), sem.x.dtype), axis=int(drive.axis),
                 flow_rate=isinstance(drive, FlowRate))
