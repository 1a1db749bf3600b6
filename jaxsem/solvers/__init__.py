"""Krylov solvers as compiled loops."""

from .pcg import PCGInfo, pcg, linear_solve

__all__ = ["PCGInfo", "pcg", "linear_solve"]
