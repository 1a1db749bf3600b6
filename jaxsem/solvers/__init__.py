"""Krylov solvers and time steppers as compiled loops."""

from . import timestepping
from .pcg import PCGInfo, pcg, linear_solve
from .timestepping import Checkpointing as Checkpointing, RunOptions as RunOptions

__all__ = ["PCGInfo", "pcg", "linear_solve", "timestepping", "Checkpointing", "RunOptions"]
