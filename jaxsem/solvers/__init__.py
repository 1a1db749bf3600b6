"""Krylov solvers, p-multigrid preconditioning and time steppers as compiled loops."""

from . import chebyshev, driver, multigrid, stops, timestepping
from .multigrid import PMG as PMG, PMGOptions as PMGOptions
from .pcg import PCGInfo, pcg, linear_solve
from .timestepping import Checkpointing as Checkpointing
from .driver import RunOptions as RunOptions

__all__ = ["PCGInfo", "pcg", "linear_solve", "timestepping", "driver", "stops", "Checkpointing", "RunOptions",
           "chebyshev", "multigrid", "PMG", "PMGOptions"]
