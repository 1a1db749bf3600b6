"""Why a time-stepping run stopped before its end: named, with the step and the time.

A run that stops never reports success. Each exception carries ``step`` (the step at which
the problem was found; the first failed one where the steps tell it), ``t`` and ``status``
(a short machine-readable reason for reports: ``"unstable"``, ``"solve_failed"``).
:class:`jaxsem.solvers.timestepping.NonFiniteError` (``status = "non_finite"``) is the third.
"""

from __future__ import annotations

__all__ = ["RunStopped", "UnstableRunError", "SolveFailedError"]


class RunStopped(RuntimeError):
    """A run stopped before its end; ``step``, ``t``, ``status`` say where and why."""

    status = "stopped"

    def __init__(self, message: str, step: int, t: float):
        self.step, self.t = int(step), float(t)
        super().__init__(message)


class UnstableRunError(RunStopped):
    """A quantity grew as no stable run allows (``quantity``, ``value``, ``limit``): the step is
    past the scheme's stability limit, and the run stopped before overflow."""

    status = "unstable"

    def __init__(self, step: int, t: float, quantity: str, value: float, limit: float, hint: str = ""):
        self.quantity, self.value, self.limit = quantity, float(value), float(limit)
        super().__init__(f"unstable run: {quantity} = {value:.4g} exceeds {limit:.4g} at step {step} "
                         f"(t = {t:.6g}){'; ' + hint if hint else ''}", step, t)


class SolveFailedError(RunStopped):
    """A linear solve of a step missed its tolerance (``solve`` names which, ``residual`` its
    relative residual): the step's result is not the scheme's."""

    status = "solve_failed"

    def __init__(self, step: int, t: float, solve: str, residual: float, failures: int, hint: str = ""):
        self.solve, self.residual, self.failures = solve, float(residual), int(failures)
        super().__init__(f"{solve} solve missed its tolerance at step {step} (t = {t:.6g}): relative residual "
                         f"{residual:.3g}; {failures} failed solve(s) in the sample"
                         f"{'; ' + hint if hint else ''}", step, t)
