"""Krylov solvers, p-multigrid preconditioning and time steppers as compiled loops."""

from . import chebyshev, multigrid, timestepping
from .multigrid import PMG as PMG, PMGOptions as PMGOptions
from .pcg import PCGInfo, pcg, linear_solve
from .timestepping import Checkpointing as Checkpointing, RunOptions as RunOptions

__all__ = ["PCGInfo", "pcg", "linear_solve", "timestepping", "Checkpointing", "RunOptions",
           "chebyshev", "multigrid", "PMG", "PMGOptions"]
