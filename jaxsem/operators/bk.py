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
:func:`bk_apply` runs the einsum reference, or the kernels of a discretization's
backend (:class:`jaxsem.backends.Backend`) when given one.
"""

from __future__ import annotations

import dataclasses

from .mass import mass, mass_diagonal
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


def bk_apply(spec: BKSpec, u, J, Dt, G, B, backend=None):
    """Apply BK ``spec`` to ``u: (E, n, n, n)`` or ``(3, E, n, n, n)``.

    ``J, Dt: (q, n)`` from :func:`jaxsem.geometry.quadrature`; ``G: (6, E, q, q, q)``,
    ``B: (E, q, q, q)`` from :func:`jaxsem.geometry.geometric_factors`. ``backend``: a
    :class:`jaxsem.backends.Backend` (``sem.backend``) whose kernels run, or None for
    the einsum reference. The vector kernels (BK2/4/6) are one call reading B or G once.
    """
    if spec.operator == "mass":
        return mass(u, J, B) if backend is None else backend.mass(u, J, B)
    if spec.quadrature == "gll":
        return stiffness_gll(u, Dt, G) if backend is None else backend.stiffness_gll(u, Dt, G)
    return stiffness(u, J, Dt, G) if backend is None else backend.stiffness(u, J, Dt, G)


def bk_diagonal(spec: BKSpec, J, Dt, G, B):
    """Exact diagonal of the element operator of ``spec``: ``(E, n, n, n)`` (same for each component)."""
    if spec.operator == "mass":
        return mass_diagonal(J, B)
    return stiffness_diagonal(J, Dt, G)
