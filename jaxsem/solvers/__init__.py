"""Krylov solvers and time steppers as compiled loops."""

from . import timestepping
from .pcg import PCGInfo, pcg, linear_solve

__all__ = ["PCGInfo", "pcg", "linear_solve", "timestepping"]
