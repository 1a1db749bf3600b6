"""Meshes: box meshes and deformations, Gmsh import, global numbering of GLL nodes, partitioning."""

from .box import Mesh, box_mesh, element_nodes
from .gmsh import read_gmsh
from .numbering import Numbering, number_nodes
from .partition import partition_mesh

__all__ = ["Mesh", "box_mesh", "element_nodes", "read_gmsh", "Numbering", "number_nodes", "partition_mesh"]
