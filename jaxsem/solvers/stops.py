"""Why a time-stepping run stopped before its end: named, with the step and the time.

A run that stops never reports success. Each exception carries ``step`` (the step at which
the problem was found; the first failed one where the steps tell it), ``t`` and ``status``
(a short machine-readable reason for reports): :class:`UnstableRunError` (``"unstable"``) and
:class:`SolveFailedError` (``"solve_failed"``) are :class:`RunStopped`; :class:`NonFiniteError`
(``"non_finite"``) is a ``FloatingPointError``; :class:`RunInterrupted` (``"interrupted"``, by
SIGINT or SIGTERM) is a ``BaseException``, as ``KeyboardInterrupt`` is, so that a handler of
``Exception`` does not swallow it.
"""

from __future__ import annotations

import os
import signal

__all__ = ["RunStopped", "UnstableRunError", "SolveFailedError", "NonFiniteError", "RunInterrupted",
           "Terminated", "raise_on_signal", "take_pending_signal"]


class _Stop:
    """The fields of every stop (a mixin before the exception base): ``step``, ``t``, ``status``."""

    status = "stopped"

    def __init__(self, message: str, step: int, t: float):
        self.step, self.t = int(step), float(t)
        super().__init__(message)


class RunStopped(_Stop, RuntimeError):
    """A run stopped before its end; ``step``, ``t``, ``status`` say where and why."""


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


class NonFiniteError(_Stop, FloatingPointError):
    """The solution became NaN/Inf; ``step`` is the first step whose result is not finite."""

    status = "non_finite"

    def __init__(self, step: int, t: float, method: str, dt: float):
        super().__init__(f"non-finite values (NaN/Inf) appeared at step {step} (t = {t:.6g}) of a {method} run "
                         f"with dt = {dt:.6g}; the state before that step was finite", step, t)


class RunInterrupted(_Stop, BaseException):
    """A run stopped by SIGINT or SIGTERM after a whole chunk (and its checkpoint).

    Attributes: ``step`` and ``t`` reached, ``signal`` (its number), ``checkpoint`` (the
    file holding that state, or ``None`` where the run writes none). ``kept_at``: ``(step, t)``
    of the state the checkpoint holds where that is an earlier one (a run that checkpoints
    only at the end of its samples), else ``None``.
    """

    status = "interrupted"

    def __init__(self, step: int, t: float, signum: int, checkpoint: str | None,
                 kept_at: tuple[int, float] | None = None):
        self.signal = signum
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.kept_at = kept_at
        held = "this state" if kept_at is None else f"the state of step {kept_at[0]} (t = {kept_at[1]:.6g})"
        kept = (f"checkpoint {self.checkpoint} holds {held}" if checkpoint is not None
                else "no checkpoint was written")
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step} (t = {t:.6g}); {kept}",
                         step, t)


class Terminated(BaseException):
    """SIGTERM outside the time-step loop (set-up, compilation, output): ends a command as
    ``KeyboardInterrupt`` does for SIGINT."""


# Signals seen by :func:`raise_on_signal`. Python drops an exception raised while it runs a
# callback it cannot unwind (a ``__del__``, a garbage-collector callback such as XLA's), so a
# Ctrl-C there would be lost: the signal stays here until :func:`take_pending_signal` reads it.
_pending: list[int] = []


def raise_on_signal(signum: int, frame=None):
    """A signal handler: note ``signum``, then raise ``KeyboardInterrupt`` (SIGINT) or
    :class:`Terminated` (any other signal)."""
    _pending.append(int(signum))
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def take_pending_signal() -> int:
    """The last signal :func:`raise_on_signal` saw since the previous call (0: none); clears it."""
    sig = _pending[-1] if _pending else 0
    _pending.clear()
    return sig
