"""High-pass-filter relaxation (HPF-RT): the stabilisation Nek5000, NekRS and Neko use for runs
whose finest scales are under-resolved (transition, turbulent channels at DNS-like resolution).

The momentum equation gets the explicit term −χ H(u), H = I − F the high-pass filter of each
element: F = F₁ ⊗ F₁ ⊗ F₁, F₁ = V diag(σ) V⁻¹ with V the Legendre Vandermonde matrix on the GLL
nodes (``V[i, k] = P_k(ξ_i)``), σ_k = 1 for k ≤ k₀ = N − modes and σ_k = 1 − ((k − k₀)/modes)²
above it (Nek's transfer function: the top mode removed, the ones below it damped
quadratically). H vanishes on polynomials of degree ≤ k₀ in each variable, so a resolved field
is not touched and the term drains energy only from the top ``modes`` modes of each element,
at the rate χ. It is linear in u (differentiable like the rest of the step) and enters the
explicit part of BDFk/EXTk with the convective term (Negi, Mishra & Hanifi 2018, Nek5000's
``hpf.f``; NekRS's ``regularization = hpfrt + nModes + scalingCoeff``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ...core import basis

__all__ = ["Relaxation", "low_pass"]


@dataclasses.dataclass(frozen=True)
class Relaxation:
    """HPF-RT settings (static, hashable; :attr:`NSOptions.relaxation`).

    Attributes:
      modes: how many of the top Legendre modes per axis the filter acts on (1 ≤ modes ≤ N).
      strength: χ ≥ 0, the relaxation rate (1/time, in the flow's units): the top mode of a
        frozen field decays like exp(−χt). NekRS's channel example uses 5 with one mode.
    """

    modes: int = 1
    strength: float = 5.0

    def __post_init__(self):
        if isinstance(self.modes, bool) or not isinstance(self.modes, (int, np.integer)) or self.modes < 1:
            raise ValueError(f"Relaxation.modes must be an integer >= 1, got {self.modes!r}")
        v = self.strength
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ValueError(f"Relaxation.strength must be a finite number >= 0, got {v!r}")


@functools.lru_cache(maxsize=None)
def low_pass(order: int, modes: int) -> np.ndarray:
    """F₁ ``(N + 1, N + 1)`` float64: the 1-D low-pass filter on the GLL nodes of order N (see the
    module). ``F₁ @ u`` filters nodal values ``u`` of one element along one axis."""
    if not 1 <= modes <= order:
        raise ValueError(f"Relaxation.modes must be in [1, {order}] at order {order}, got {modes}")
    x, _ = basis.gll_points(order)
    V = np.stack([basis.legendre(k, x)[0] for k in range(order + 1)], axis=1)
    k0 = order - modes
    sigma = np.array([1.0 if k <= k0 else 1.0 - ((k - k0) / modes) ** 2 for k in range(order + 1)])
    F = V @ np.diag(sigma) @ np.linalg.inv(V)
    F.setflags(write=False)
    return F
