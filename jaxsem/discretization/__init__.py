"""Discretizations of a mesh: the continuous SEM and the DG one, with their gather–scatter plans."""

from .dg import DG, discretize_dg
from .gather_scatter import GatherScatter, gs_apply, make_gs
from .sem import SEM, discretize

__all__ = ["SEM", "discretize", "DG", "discretize_dg", "GatherScatter", "gs_apply", "make_gs"]
