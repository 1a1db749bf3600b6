"""The ``jaxsem`` command: ``solve``, ``bench`` and ``info``; ``--json`` for machines.

Contract (other tools depend on it):

* ``jaxsem`` alone solves a small default problem (Poisson BP5, order 6,
  3×3×3 elements, deform 0.1) and prints a short report.
* ``--json``: stdout is exactly one JSON object; progress goes to stderr.
* Exit codes: 0 success; 1 a solve that did not converge (its result is still
  printed); 2 bad arguments, reported as ONE line on stderr naming the
  argument, before any JAX work.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform as _platform
import signal
import sys
import warnings

from .args import DEFAULTS, build_parser, validate, version  # DEFAULTS: the default problem, for callers
from .report import (report_advection, report_bench, report_cylinder, report_info, report_kovasznay, report_maxwell,
                     report_channel, report_rbc, report_solve, report_tgv)

__all__ = ["main", "build_parser", "DEFAULTS"]

# ----------------------------------------------------------------------------- output helpers

@contextlib.contextmanager
def _stdout_to_stderr():
    """Send everything written to stdout (Python and, when real, fd 1) to stderr.

    Yields the original ``sys.stdout`` for the one thing meant for stdout, which
    must be written after the block, once fd 1 is restored.
    """
    out = sys.stdout
    saved = None
    try:
        fd, err_fd = out.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        fd = err_fd = None
    if fd == 1 and err_fd != 1:
        out.flush()
        saved = os.dup(1)
        os.dup2(err_fd, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield out
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _clean(obj):
    """JSON-safe copy: non-finite floats become None, numpy/jax scalars plain Python."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):
        return _clean(obj.item())
    return str(obj)


def _env() -> dict:
    import jax

    from .bench import device_info

    from ..parallel.comm import get_comm

    d = device_info()
    ranks = jax.process_count() if jax.process_count() > 1 else get_comm().size
    return dict(device=d["device_kind"], platform=d["platform"], num_devices=d["num_devices"],
                ranks=ranks, jax_version=d["jax_version"], jaxsem_version=version())


def _reporter() -> bool:
    """Whether this process prints the result: process 0 of a multi-controller run, MPI rank 0."""
    import jax

    from ..parallel.comm import get_comm

    return jax.process_index() == 0 if jax.process_count() > 1 else get_comm().rank == 0


def _placement(args) -> dict:
    """Where the run's elements live: ``dict(comm=...)`` (serial, MPI) or ``dict(devices=...)``."""
    import jax

    from ..parallel.comm import get_comm
    from ..parallel.launch import launcher_size

    if (launcher_size() or 1) > 1 and args.transport == "shard":
        return dict(devices=jax.devices())  # every process's (main called init_distributed)
    if args.devices not in (None, 1):
        return dict(devices=args.devices)
    return dict(comm=get_comm())


# ----------------------------------------------------------------------------- info

def _info() -> dict:
    import jax
    import numpy as np

    from .bench import device_info

    def installed(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    d = device_info()
    return dict(
        jaxsem_version=version(), jax_version=jax.__version__, jaxlib_version=installed("jaxlib"),
        numpy_version=np.__version__, python_version=_platform.python_version(),
        x64=bool(jax.config.jax_enable_x64), platform=d["platform"], device=d["device_kind"],
        num_devices=d["num_devices"], devices=d["devices"], ranks=_ranks(),
        mpi4jax_available=importlib.util.find_spec("mpi4jax") is not None,
        mpi4py_available=importlib.util.find_spec("mpi4py") is not None,
    )


def _ranks() -> int:
    """Number of MPI ranks, without initializing MPI just for ``info``."""
    from ..parallel.launch import launcher_size

    return launcher_size() or 1


# ----------------------------------------------------------------------------- main

@contextlib.contextmanager
def _signals_raise():
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM :class:`~jaxsem.solvers.stops.Terminated`
    while the command runs, and both are noted so that one whose exception Python drops (raised
    inside a garbage-collector callback) still ends the command (the time-step loop catches them
    itself and stops between chunks); the previous handlers come back after."""
    import signal
    import threading

    from ..solvers.stops import Terminated, raise_on_signal, take_pending_signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    take_pending_signal()
    previous = {s: signal.signal(s, raise_on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook

    def quiet_stop(u):  # a stop dropped inside a callback is noted and acted on: no traceback for it
        if not (u.exc_type is not None and issubclass(u.exc_type, (KeyboardInterrupt, Terminated))):
            hook(u)

    sys.unraisablehook = quiet_stop
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        take_pending_signal()  # acted on, or the command ended: a later run in this process starts clean


def _interrupted(args, e: BaseException) -> tuple[dict, str, int]:
    """``(record, one-line message, exit code 128 + signal)`` of a command ended by SIGINT or SIGTERM."""
    import signal

    from ..solvers.stops import RunInterrupted, Terminated

    checkpoint = getattr(args, "checkpoint", None)  # the path --resume takes (per-rank files under MPI)
    if isinstance(e, RunInterrupted):
        signum, step, t, text = e.signal, e.step, e.t, str(e)
        checkpoint = (checkpoint or e.checkpoint) if e.checkpoint is not None else None
    else:
        signum = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        step = t = None
        text = (f"interrupted by {signal.Signals(signum).name} outside the time steps (set-up, compilation "
                "or output)")
    resume = f"; continue with --resume {checkpoint}" if checkpoint and step is not None else ""
    problem = getattr(args, "problem", None) if args.command in ("solve", "bench") else args.command
    record = dict(problem=problem, status="interrupted", converged=False, signal=signal.Signals(signum).name,
                  step=step, t=t, checkpoint=checkpoint, message=text + resume)
    return record, text + resume, 128 + int(signum)


def _dispatch(args, log, quiet: bool):
    """Run the command: ``(result, report text, exit code)``."""
    import jax

    if args.command == "info":
        result = _info()
        text = report_info(result)
        code = 0
    elif args.command == "solve":
        from . import verify

        place = _placement(args)
        first = jax.process_index() == 0 and ("comm" not in place or place["comm"].rank == 0)
        if args.problem == "tgv":
            from .tgv import run_tgv

            result = run_tgv(args.order, args.elements, args.t_final, dt=args.dt, reynolds=args.reynolds,
                             sample=args.sample, cfl=args.cfl, out=args.out, vtu=args.vtu, backend=args.backend,
                             place=place, checkpoint=args.checkpoint, resume=args.resume,
                             checkpoint_every=args.checkpoint_every, vtu_every=args.vtu_every, progress=log,
                             pmg_dtype=args.pmg_dtype,
                             pressure_tol=args.pressure_tol, velocity_tol=args.velocity_tol,
                             pressure_projection=args.pressure_projection, progress_bar=not quiet and first)
            report = report_tgv
        elif args.problem == "kovasznay":
            from .kovasznay import run_kovasznay

            result = run_kovasznay(args.order, args.elements, reynolds=args.reynolds, outflow=args.outflow,
                                   t_final=args.t_final, dt=args.dt, cfl=args.cfl, sample=args.sample,
                                   steady_tol=args.steady_tol, backend=args.backend, place=place, progress=log,
                                   progress_bar=not quiet and first)
            report = report_kovasznay
        elif args.problem == "channel":
            from .channel import relaxation_option, run_channel

            result = run_channel(args.order, args.elements, reynolds_bulk=args.reynolds_bulk, lengths=args.lengths,
                                 grading=args.grading, t_final=args.t_final, average_from=args.average_from,
                                 sample=args.sample, dt=args.dt, cfl=args.cfl, out=args.out, backend=args.backend,
                                 place=place, checkpoint=args.checkpoint, resume=args.resume,
                                 relaxation=relaxation_option(args.relaxation_modes, args.relaxation), progress=log,
                                 progress_bar=not quiet and first)
            report = report_channel
        elif args.problem == "rbc":
            from .rbc import run_rbc

            result = run_rbc(args.order, args.elements, rayleigh=args.rayleigh, prandtl=args.prandtl,
                             wavenumber=args.wavenumber, t_final=args.t_final, dt=args.dt, sample=args.sample,
                             amplitude=args.amplitude, backend=args.backend, place=place, progress=log,
                             progress_bar=not quiet and first)
            report = report_rbc
        elif args.problem == "cylinder":
            from .cylinder import run_cylinder

            result = run_cylinder(args.case, args.order, args.level, t_final=args.t_final, dt=args.dt, cfl=args.cfl,
                                  sample=args.sample, steady_tol=args.steady_tol, out=args.out, vtu=args.vtu,
                                  backend=args.backend, place=place, progress=log)
            report = report_cylinder
        elif args.problem == "maxwell":
            result = verify.verify_maxwell(args.order, args.elements, args.t_final, flux=args.flux, bc=args.bc,
                                           deform=args.deform, cfl=args.cfl, method=args.method,
                                           dtype=args.dtype, vtu=args.vtu, progress=log,
                                           progress_bar=not quiet and first, place=place)
            report = report_maxwell
        elif args.problem == "advection":
            result = verify.verify_advection(args.order, args.elements, args.t_final,
                                             velocity=tuple(args.velocity), flux=args.flux, deform=args.deform,
                                             cfl=args.cfl, method=args.method, dtype=args.dtype, vtu=args.vtu,
                                             progress=log,
                                             progress_bar=not quiet and first, place=place)
            report = report_advection
        else:
            result = verify.solve_poisson(args.bp, args.order, args.elements, args.deform, args.tol,
                                          args.maxiter, args.dtype, progress=log, backend=args.backend, vtu=args.vtu,
                                          precond=args.precond, pmg_dtype=args.pmg_dtype,
                                          place=place)
            report = report_solve
        result.update(_env())
        text = report(result)
        code = 0 if result["converged"] else 1
    else:
        from .bench import bench, measure_bandwidth

        bw = args.bandwidth
        if bw == "measure":
            log("measuring memory bandwidth...")
            bw = measure_bandwidth()
        kw = {} if args.repeats is None else dict(repeats=args.repeats)
        if args.problem.startswith("bp"):
            kw["tol"] = args.tol
        result = bench(args.problem, args.order, args.elements, iterations=args.iterations,
                       dtype=args.dtype, deform=args.deform, bandwidth=bw, progress=log, backend=args.backend, **kw)
        result.update(_env())
        text = report_bench(result)
        code = 0
    return result, text, code


def _compilation_cache(jax) -> None:
    """JAX's persistent compilation cache in ``<kernel cache>/xla`` (``~/.cache/jaxsem/xla``), so a
    second run of the same problem loads its programs instead of compiling them again.
    ``JAXSEM_COMPILATION_CACHE=0`` turns it off; a ``JAX_COMPILATION_CACHE_DIR`` already set is kept."""
    if os.environ.get("JAXSEM_COMPILATION_CACHE", "1") == "0" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    try:
        from ..backends.cache import cache_dir, trusted_dir

        folder = trusted_dir(cache_dir()) / "xla"
        folder.mkdir(mode=0o700, exist_ok=True)
    except (OSError, ValueError) as e:  # an unusable cache costs compile time, never the run
        print(f"jaxsem: note: no persistent compilation cache ({e})", file=sys.stderr)
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # set-up compiles many small programs (geometry and a Lanczos run per p-multigrid level), each
    # under JAX's default 1 s threshold for caching: keep them too, so a second run loads them all
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)


def main(argv=None) -> int:
    """Entry point of the ``jaxsem`` console script; returns the exit code."""
    from ..parallel.launch import bind_local_device

    bind_local_device()  # under mpirun: one GPU per process, before JAX picks its devices
    parser = build_parser()
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["solve"] and (len(argv) == 1 or (argv[1].startswith("-") and argv[1] not in ("-h", "--help"))):
        argv.insert(1, "poisson")  # 'jaxsem solve [options]' solves the Poisson problem
    try:
        args = parser.parse_args(argv)
        if args.command is None:  # the default demonstration solve
            args = parser.parse_args(["solve", "poisson"])
        if getattr(args, "transport", None) == "shard":
            from ..parallel.launch import init_distributed

            init_distributed()  # under a launcher: before anything asks JAX for its devices
        validate(parser, args)
    except SystemExit as e:  # argparse errors (2), --help / --version (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)

    import jax

    from ..parallel.launch import launcher_rank

    _compilation_cache(jax)
    # a warning (a shortened p-multigrid schedule, a large start CFL) is one line for the user
    warnings.formatwarning = lambda message, category, *_, **__: f"jaxsem: {category.__name__}: {message}\n"

    quiet = getattr(args, "quiet", False) or args.command == "info" or launcher_rank() not in (None, 0)
    log = (lambda m: None) if quiet else (lambda m: print(f"jaxsem: {m}", file=sys.stderr, flush=True))

    from ..solvers.stops import RunInterrupted, Terminated, take_pending_signal

    interrupted = refused = False
    with _stdout_to_stderr() as out, _signals_raise():
        try:
            result, text, code = _dispatch(args, log, quiet)
            lost = take_pending_signal()  # a signal whose exception was lost after the steps (output)
            if lost:
                raise KeyboardInterrupt if lost == signal.SIGINT else Terminated
        except ValueError as e:  # refused after set-up (e.g. a time step past the stable one): named, no traceback
            result = dict(problem=args.command if args.command != "solve" else args.problem, status="refused",
                          converged=False, message=str(e))
            text, code = f"error: {e}", 2
            if _reporter():
                print(f"jaxsem: error: {e}", file=sys.stderr, flush=True)
            refused = True
        except (RunInterrupted, KeyboardInterrupt, Terminated) as e:
            result, text, code = _interrupted(args, e)
            interrupted = True
            if _reporter():
                print(f"jaxsem: {text}", file=sys.stderr, flush=True)
    if (args.command == "info" or _reporter()) and (args.json or not (interrupted or refused)):
        if args.json:
            out.write(json.dumps(_clean(result), allow_nan=False) + "\n")
        else:
            out.write(text + "\n")
        out.flush()
    if interrupted and argv_given is None:
        # Stopped inside set-up or compilation, XLA's threads may still run, and the
        # interpreter's shutdown then crashes (SIGSEGV): the program ends here, with its code.
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
