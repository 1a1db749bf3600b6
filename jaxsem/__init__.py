"""jaxsem: differentiable spectral-element methods as pure JAX array programs.

Importing jaxsem enables float64 (``jax_enable_x64``): verification runs in
double precision by default; pass ``dtype=jnp.float32`` to ``discretize`` for
single precision. Importing jaxsem changes no environment variable: under
``mpirun``, call :func:`jaxsem.parallel.bind_local_device` first thing (one GPU per
process) before JAX picks its devices.
"""

import jax as _jax

_jax.config.update("jax_enable_x64", True)

from . import core, mesh, operators, solvers  # noqa: E402
from .core import basis, geometry  # noqa: E402
from .core.basis import gll_points, gauss_points, lagrange_matrix, derivative_matrix  # noqa: E402
from .core.geometry import Geometry, geometric_factors, quadrature  # noqa: E402
from .mesh import Mesh, box_mesh, Grading, read_gmsh, Numbering, number_nodes, partition_mesh  # noqa: E402
from .parallel import Comm, get_comm  # noqa: E402
from .discretization import SEM, discretize, DG, discretize_dg, GatherScatter, make_gs, gs_apply  # noqa: E402
from .discretization import to_mesh_order, from_mesh_order  # noqa: E402
from .discretization import dg  # noqa: E402
from .solvers import PCGInfo, pcg, timestepping  # noqa: E402
from . import elliptic  # noqa: E402
from .elliptic import Helmholtz, helmholtz  # noqa: E402
from .models import poisson, maxwell, inverse  # noqa: E402
from . import io  # noqa: E402
from .io import write_vtu  # noqa: E402

__version__ = "0.1.0"
