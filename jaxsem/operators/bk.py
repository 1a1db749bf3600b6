"""The CEED bake-off kernels BK1–BK6 (Fischer et al. 2020, Table 1).

| BK | field    | operator  | quadrature           |
|----|----------|-----------|----------------------|
| 1  | scalar   | mass      | q = N + 2 Gauss      |
| 2  | 3-vector | mass      | q = N + 2 Gauss      |
| 3  | scalar   | stiffness | q = N + 2 Gauss      |
| 4  | 3-vector | stiffness | q = N + 2 Gauss      |
| 5  | scalar   | stiffness | q = N + 1 GLL (B = I)|
| 6  | 3-vector | stiffness | q = N + 1 GLL        |

A BK applies the unassembled element operator to an E-vector: no gather–scatter.
"""

from __future__ import annotations

import dataclasses

from .mass import mass, mass_diagonal
from .fused import stiffness_gll_auto
from .stiffness import stiffness, stiffness_diagonal, stiffness_gll


@dataclasses.dataclass(frozen=True)
class BKSpec:
    """Static description of one bake-off kernel/problem."""

    number: int
    operator: str  # "mass" or "stiffness"
    quadrature: str  # "gauss" or "gll"
    components: int  # 1 or 3
    dirichlet: bool

    @property
    def name(self) -> str:
        return f"bk{self.number}"


BK_SPECS = {
    k: BKSpec(k, op, quad, comps, op == "stiffness")
    for k, op, quad, comps in [
        (1, "mass", "gauss", 1),
        (2, "mass", "gauss", 3),
        (3, "stiffness", "gauss", 1),
        (4, "stiffness", "gauss", 3),
        (5, "stiffness", "gll", 1),
        (6, "stiffness", "gll", 3),
    ]
}


def bk_apply(spec: BKSpec, u, J, Dt, G, B, impl: str = "einsum"):
    """Apply BK ``spec`` to ``u: (E, n, n, n)`` or ``(3, E, n, n, n)``.

    ``J, Dt: (q, n)`` from :func:`jaxsem.geometry.quadrature`; ``G: (6, E, q, q, q)``,
    ``B: (E, q, q, q)`` from :func:`jaxsem.geometry.geometric_factors`.
    ``impl`` (BK5/BK6 only): ``"einsum"`` reference, ``"pallas"`` fused kernel,
    or ``"auto"`` (Pallas on GPU) — see :mod:`jaxsem.operators.fused`.
    """
    if spec.operator == "mass":
        return mass(u, J, B)
    if spec.quadrature == "gll":
        return stiffness_gll_auto(u, Dt, G, impl=impl)
    return stiffness(u, J, Dt, G)


def bk_diagonal(spec: BKSpec, J, Dt, G, B):
    """Exact diagonal of the element operator of ``spec``: ``(E, n, n, n)`` (same for each component)."""
    if spec.operator == "mass":
        return mass_diagonal(J, B)
    return stiffness_diagonal(J, Dt, G)
