"""Discretizations of a mesh: the continuous SEM and the DG one, with their gather–scatter plans."""

from .dg import DG, discretize_dg
from .gather_scatter import GatherScatter, gs_apply, make_gs
from .sem import SEM, discretize, memory_bytes, with_dirichlet
from .probes import Probes
from .shard import from_mesh_order, to_mesh_order
from .surface import Surface  # the modules .surface and .probes hold their functions

__all__ = ["SEM", "discretize", "with_dirichlet", "DG", "discretize_dg", "GatherScatter", "gs_apply", "make_gs",
           "to_mesh_order", "from_mesh_order", "memory_bytes",
           "Surface", "Probes"]
