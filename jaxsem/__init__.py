"""jaxsem: differentiable spectral-element methods as pure JAX array programs.

Importing jaxsem enables float64 (``jax_enable_x64``): verification runs in
double precision by default; pass ``dtype=jnp.float32`` to ``discretize`` for
single precision.
"""

import jax as _jax

from .comm import bind_local_device as _bind_local_device

_bind_local_device()  # under mpirun: one GPU per process, before JAX picks devices
_jax.config.update("jax_enable_x64", True)

from . import basis, geometry, operators, solvers  # noqa: E402
from .basis import gll_points, gauss_points, lagrange_matrix, derivative_matrix  # noqa: E402
from .mesh import Mesh, box_mesh  # noqa: E402
from .gmsh import read_gmsh  # noqa: E402
from .numbering import Numbering, number_nodes  # noqa: E402
from .geometry import Geometry, geometric_factors, quadrature  # noqa: E402
from .gather_scatter import GatherScatter, make_gs, gs_apply  # noqa: E402
from .discretization import SEM, discretize  # noqa: E402
from .comm import Comm, get_comm  # noqa: E402
from .partition import partition_mesh  # noqa: E402
from .solvers import PCGInfo, pcg  # noqa: E402
from .models import poisson  # noqa: E402
from . import inverse  # noqa: E402
from . import dg, io, timestepping  # noqa: E402
from .dg import DG, discretize_dg  # noqa: E402
from .io import write_vtu  # noqa: E402
from .models import maxwell  # noqa: E402

__version__ = "0.1.0"
