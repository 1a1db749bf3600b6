"""Meshes: box meshes, graded and deformed, Gmsh import, periodic pairing, the DFG cylinder meshes,
global numbering of GLL nodes, partitioning."""

from .box import Mesh, box_mesh, element_nodes
from .cylinder import (DFG_2D, DFG_2D_1, DFG_2D_2, DFG_3D, DFG_3D_1Z, DFGCase, DFGGeometry, dfg_2d, dfg_3d,
                       dfg_mesh)
from .gmsh import read_gmsh
from .grading import Grading
from .numbering import Numbering, number_nodes
from .partition import partition_mesh
from .periodic import make_periodic

__all__ = ["Mesh", "box_mesh", "Grading", "element_nodes", "read_gmsh", "make_periodic", "dfg_2d", "dfg_3d",
           "dfg_mesh", "DFGGeometry", "DFGCase", "DFG_2D", "DFG_3D", "DFG_2D_1", "DFG_2D_2", "DFG_3D_1Z",
           "Numbering", "number_nodes", "partition_mesh"]
