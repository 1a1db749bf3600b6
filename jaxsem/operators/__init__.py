"""Element-local matrix-free operators (einsum reference implementations).

Every operator maps an E-vector ``u: (..., E, n, n, n)`` (a leading component
axis of 3 gives the vector forms BK2/BK4/BK6) to ``w = A_e u`` element by
element, with no assembly. See :mod:`jaxsem.operators.bk` for the bake-off
kernels BK1–BK6.
"""

from .tensor import interp, interp_t, grad_ref, grad_ref_t
from .convection import advection_local
from .mass import mass, mass_diagonal
from .stiffness import (stiffness, stiffness_assembled, stiffness_gll, stiffness_gll_assembled, stiffness_diagonal, helmholtz,
                        helmholtz_diagonal)
from .bk import BK_SPECS, BKSpec, bk_apply

__all__ = [
    "interp", "interp_t", "grad_ref", "grad_ref_t", "advection_local",
    "mass", "mass_diagonal",
    "stiffness", "stiffness_assembled", "stiffness_gll", "stiffness_gll_assembled", "stiffness_diagonal", "helmholtz", "helmholtz_diagonal",
    "BK_SPECS", "BKSpec", "bk_apply",
]
