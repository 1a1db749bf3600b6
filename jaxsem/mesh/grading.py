"""Element boundaries along one axis of a box mesh: uniform, graded toward faces, or given.

:func:`jaxsem.mesh.box_mesh` takes ``grading=(gx, gy, gz)``, one spec per axis: ``None``
(uniform), a :class:`Grading` (geometric or tanh spacing toward chosen faces), or the
``(E_d + 1,)`` element boundary coordinates themselves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Grading"]

KINDS = ("geometric", "tanh")
AXES = "xyz"

# Given breakpoints must end within this times the box's length on their axis of its faces; the ends
# are then set to the faces exactly, so that the first and last element layers lie on them.
ENDPOINT_TOL = 1e-12


@dataclasses.dataclass(frozen=True)
class Grading:
    """Element widths along one axis of a box mesh, graded toward ``faces``.

    Attributes:
      kind: ``"geometric"``: neighbouring widths in the ratio ``strength`` = r, from the graded
        face(s) inward (r > 1: finest at the face, r < 1: coarsest, r = 1: uniform).
        ``"tanh"``: the stretching of Nek5000/NekRS channel meshes, ``strength`` = β > 0 (larger
        is finer at the face): breakpoints at the fractions ``t(ξ_k)``, ``ξ_k = k/E`` of
        ``t = (1 + tanh(β(2ξ − 1))/tanh β)/2`` (both faces), ``1 + tanh(β(ξ − 1))/tanh β``
        (the lower face), ``tanh(βξ)/tanh β`` (the upper face).
      strength: r (geometric) or β (tanh), finite and > 0.
      faces: ``"both"``, or the one face graded toward, by its :data:`jaxsem.mesh.box.BOX_FACES`
        name (``"ymin"``, ``"ymax"`` on the y axis); geometric on both faces has widths
        ``h₀ r^min(k, E−1−k)``, symmetric about the centre.

    ``Grading("tanh", 2.0)`` clusters elements at both walls of a channel;
    ``Grading("geometric", 1.2, faces="ymin")`` at the floor of a boundary layer.
    """

    kind: str
    strength: float
    faces: str = "both"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Grading kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float, np.integer, np.floating)):
            raise TypeError(f"Grading strength must be a number, got {self.strength!r}")
        if not (np.isfinite(self.strength) and self.strength > 0):
            what = "the ratio r of neighbouring widths" if self.kind == "geometric" else "β"
            raise ValueError(f"Grading strength ({what}) must be finite and > 0, got {self.strength!r}")
        faces = ("both",) + tuple(a + s for a in AXES for s in ("min", "max"))
        if self.faces not in faces:
            raise ValueError(f"Grading faces must be one of {faces}, got {self.faces!r}")
        object.__setattr__(self, "strength", float(self.strength))

    def points(self, num_elements: int, length: float = 1.0, origin: float = 0.0) -> np.ndarray:
        """The ``(num_elements + 1,)`` element boundaries on ``[origin, origin + length]``, increasing.

        ``np.diff(points)[0]`` is the width of the element at the lower face; the first GLL node off
        that face sits at ``width·(1 + ξ₁)/2``, ξ₁ = ``gll_points(order)[0][1]``.
        """
        if isinstance(num_elements, bool) or not isinstance(num_elements, (int, np.integer)) or num_elements < 1:
            raise ValueError(f"num_elements must be an int >= 1, got {num_elements!r}")
        if not (np.isfinite(length) and length > 0):
            raise ValueError(f"length must be finite and > 0, got {length!r}")
        side = "both" if self.faces == "both" else self.faces[1:]
        with np.errstate(over="ignore", invalid="ignore"):
            t = _fractions(self.kind, self.strength, side, int(num_elements))
        steps = np.diff(t)
        if not (np.isfinite(t).all() and (steps > 0).all()):
            raise ValueError(f"{self!r} on {num_elements} elements gives element widths below round-off "
                             f"(smallest {np.nanmin(steps):.3g} of the length); lower the strength")
        return float(origin) + float(length) * t


def _fractions(kind: str, strength: float, side: str, n: int) -> np.ndarray:
    """The ``n + 1`` breakpoints on ``[0, 1]`` graded toward ``side`` (``"min"``, ``"max"``,
    ``"both"``), 0 and 1 exactly at the ends."""
    if side == "max":  # the mirror image of the lower face's
        return 1.0 - _fractions(kind, strength, "min", n)[::-1]
    k = np.arange(n // 2 + 1 if side == "both" else n + 1)
    if kind == "geometric":
        r = strength
        # Σ_{j<k} r^j, the first k widths in units of the first
        s = k.astype(np.float64) if r == 1.0 else np.expm1(k * np.log(r)) / np.expm1(np.log(r))
        m = n // 2  # on both faces, s[m] is one half; an odd n has a middle element r^m wide
        t = s / (s[n] if side == "min" else 2.0 * s[m] + (r ** m if n % 2 else 0.0))
    else:
        b = strength
        t = (1.0 + np.tanh(b * (2 * k - n) / n) / np.tanh(b)) / 2 if side == "both" \
            else 1.0 + np.tanh(b * (k - n) / n) / np.tanh(b)
    t[0] = 0.0
    if side == "both":  # the upper half mirrors the lower: symmetric to round-off
        t = np.concatenate([t, 1.0 - t[n - len(t)::-1]])
    t[-1] = 1.0
    return t


def axis_points(spec, axis: int, num_elements: int, length: float, origin: float) -> np.ndarray:
    """The ``(num_elements + 1,)`` element boundaries of one box axis from ``box_mesh``'s
    ``grading[axis]`` spec: ``None`` (uniform), a :class:`Grading`, or the boundaries themselves
    (increasing, spanning ``[origin, origin + length]``). ``ValueError`` naming ``grading[axis]``."""
    name = f"grading[{axis}]"
    if spec is None:
        return origin + np.linspace(0.0, length, num_elements + 1)
    if isinstance(spec, Grading):
        allowed = ("both", AXES[axis] + "min", AXES[axis] + "max")
        if spec.faces not in allowed:
            raise ValueError(f"{name} = {spec!r}: faces {spec.faces!r} is not a face of the "
                             f"{AXES[axis]} axis; allowed: {allowed}")
        try:
            return spec.points(num_elements, length, origin)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    if isinstance(spec, str):
        raise TypeError(f"{name} must be None, a Grading or an array of element boundaries, got {spec!r}")
    try:
        p = np.array(spec, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be None, a Grading or an array of element boundaries, "
                        f"got {type(spec).__name__}") from None
    if p.shape != (num_elements + 1,):
        raise ValueError(f"{name}: element boundaries must have shape (elements[{axis}] + 1,) = "
                         f"({num_elements + 1},), got {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError(f"{name}: element boundaries must be finite, got {p.tolist()}")
    steps = np.diff(p)
    if (steps <= 0).any():
        k = int(np.argmax(steps <= 0))
        raise ValueError(f"{name}: element boundaries must increase strictly, got {float(p[k])} then {float(p[k + 1])} "
                         f"at entries {k}, {k + 1}")
    lo, hi = origin, origin + length
    tol = ENDPOINT_TOL * length
    if abs(p[0] - lo) > tol or abs(p[-1] - hi) > tol:
        raise ValueError(f"{name}: element boundaries must span the box's [origin, origin + length] = "
                         f"[{lo}, {hi}] on that axis, got [{float(p[0])}, {float(p[-1])}]")
    p[0], p[-1] = lo, hi
    return p
