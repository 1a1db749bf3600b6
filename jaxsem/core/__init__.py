"""One element's mathematics: GLL/Gauss bases, derivative and interpolation matrices, geometric factors."""

from . import basis, geometry
from .basis import derivative_matrix, gauss_points, gll_points, lagrange_matrix
from .geometry import Geometry, geometric_factors, quadrature

__all__ = ["basis", "geometry", "gll_points", "gauss_points", "lagrange_matrix", "derivative_matrix",
           "Geometry", "geometric_factors", "quadrature"]
