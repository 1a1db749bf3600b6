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

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform as _platform
import sys
import warnings

from ..backends import BACKENDS
from ..core.basis import MAX_ORDER

__all__ = ["main", "build_parser"]

DEFAULTS = dict(bp=5, order=6, elements=(3, 3, 3), deform=0.1, maxiter=1000)
DEFAULT_TOL = {"float64": 1e-10, "float32": 1e-5}
BENCH_DEFAULTS = dict(order=7, elements=(8, 8, 8), iterations=100)
MAX_DEFORM = 0.27  # box_mesh keeps the Jacobian positive for |deform| < 0.27
PROBLEMS = ("poisson", "maxwell", "advection")
TIME_DEFAULTS = dict(t_final=0.5, flux="upwind", cfl=0.5, method="lserk4")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), no usage dump."""

    def error(self, message):
        from ..parallel.comm import launcher_rank

        msg = " ".join(str(message).split())
        if launcher_rank() in (None, 0):  # under mpirun: one message, every rank exits 2
            sys.stderr.write(f"{self.prog}: error: {msg}\n")
        sys.exit(2)


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> _Parser:
    p = _Parser(
        prog="jaxsem",
        description="Differentiable spectral elements in JAX. Without a command: solve a small "
        "default problem (Poisson BP5, order 6, 3x3x3 elements, deform 0.1) and report.",
    )
    p.add_argument("--version", action="version", version=f"jaxsem {_version()}")
    sub = p.add_subparsers(dest="command", metavar="command")

    def common(sp):
        sp.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="floating-point precision (default float64)")
        sp.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")

    def mesh_args(sp, order, elements):
        sp.add_argument("--order", type=int, default=order,
                        help=f"polynomial order p, 1..{MAX_ORDER} (default {order})")
        sp.add_argument("--elements", type=int, nargs="+", default=list(elements), metavar="E",
                        help="element counts: 3 values (Ex Ey Ez) or 1 for all axes "
                        f"(default {' '.join(map(str, elements))})")
        sp.add_argument("--deform", type=float, default=DEFAULTS["deform"],
                        help=f"smooth box deformation amplitude, |deform| < {MAX_DEFORM} (default 0.1)")

    s = sub.add_parser("solve", help="solve a problem and compare with its exact solution",
                       description="Solve a problem with a known exact solution and report the error. "
                       "'jaxsem solve PROBLEM --help' lists that problem's options.")
    probs = s.add_subparsers(dest="problem", metavar="problem")
    helps = dict(poisson="Helmholtz/Poisson, the bake-off problems BP1..BP6 (PCG; p-multigrid by default)",
                 maxwell="Maxwell (SEDG): exact PEC cavity mode or periodic plane wave",
                 advection="linear advection (DG): a Gaussian around the periodic unit box")
    for name in PROBLEMS:
        sp = probs.add_parser(name, help=helps[name], description=helps[name] + ", on the deformed unit box.")
        mesh_args(sp, DEFAULTS["order"], DEFAULTS["elements"])
        if name == "poisson":
            sp.add_argument("--bp", type=int, default=DEFAULTS["bp"],
                            help="bake-off problem 1..6 (operator, quadrature, BCs, components; default 5)")
            sp.add_argument("--tol", type=float, default=None,
                            help="relative residual tolerance, 10 eps <= tol < 1 (default 1e-10; 1e-5 for float32)")
            sp.add_argument("--maxiter", type=int, default=DEFAULTS["maxiter"],
                            help="PCG iteration cap, >= 1 (default 1000)")
            sp.add_argument("--backend", choices=BACKENDS, default="auto",
                            help="element kernels: the CUDA kernels where they run and einsum elsewhere "
                                 "(auto, default), or force one")
            sp.add_argument("--precond", choices=("pmg", "jacobi"), default="pmg",
                            help="preconditioner: p-multigrid with Chebyshev smoothing (pmg, default) or the "
                                 "inverse diagonal (jacobi)")
        else:
            sp.add_argument("--t-final", type=float, default=TIME_DEFAULTS["t_final"],
                            help="final time > 0, in units of the unit box's light/transit time (default 0.5)")
            sp.add_argument("--flux", choices=("upwind", "central"), default=TIME_DEFAULTS["flux"],
                            help="numerical flux (default upwind)")
            sp.add_argument("--cfl", type=float, default=TIME_DEFAULTS["cfl"],
                            help="time step as a fraction of the stable limit, 0 < cfl <= 1 (default 0.5)")
            sp.add_argument("--method", choices=("lserk4", "rk4", "ssprk3"), default=TIME_DEFAULTS["method"],
                            help="time integrator (default lserk4)")
        if name == "maxwell":
            sp.add_argument("--bc", choices=("pec", "periodic"), default="pec",
                            help="pec cavity mode or periodic plane wave (default pec)")
        if name == "advection":
            sp.add_argument("--velocity", type=float, nargs=3, metavar="C", default=[1.0, 0.5, 0.25],
                            help="constant velocity cx cy cz (default 1 0.5 0.25)")
            sp.add_argument("--schedule", choices=("bulk", "overlap"), default="bulk",
                            help="distributed: exchange then compute (bulk, default), or compute the local part "
                                 "while the face data travel (overlap)")
        fields = dict(poisson="u, the exact solution and the error", maxwell="E and H", advection="u and the exact u")
        sp.add_argument("--vtu", metavar="PATH", default=None,
                        help=f"write {fields[name]} to this .vtu file for ParaView (under mpirun with the mpi "
                             "transport: one file per rank, PATH.rank<r>.vtu)")
        sp.add_argument("--devices", type=int, default=None, metavar="N",
                        help="split the elements over N devices of this process (JAX's own transport; on a CPU "
                             "set XLA_FLAGS=--xla_force_host_platform_device_count=N first); default 1")
        sp.add_argument("--transport", choices=("mpi", "shard"), default=None,
                        help="under mpirun/srun: one process per device with mpi4jax (mpi, default) or one JAX "
                             "program over every process's devices (shard, jax.distributed)")
        common(sp)
    t = probs.add_parser("tgv", help="Taylor-Green vortex at Re = 1600 (Navier-Stokes) against the 512^3 DNS",
                         description="Incompressible Navier-Stokes (PN-PN, BDF3/EXT3, p-multigrid pressure): the "
                         "Taylor-Green vortex on the periodic box [-pi, pi]^3; E_k, -dE_k/dt, 2 nu Z and Z against "
                         "the 512^3 spectral DNS reference (read from ../shared/data/tgv or $JAXSEM_TGV_REFERENCE).")
    t.add_argument("--order", type=int, default=5, help=f"polynomial order p, 2..{MAX_ORDER} (default 5)")
    t.add_argument("--elements", type=int, nargs="+", default=[4], metavar="E",
                   help="element counts: 3 values or 1 for all axes (default 4)")
    t.add_argument("--t-final", type=float, default=1.0, help="final time in convective units (default 1)")
    t.add_argument("--dt", type=float, default=None,
                   help="time step (default: the largest with initial CFL <= --cfl that divides --sample)")
    t.add_argument("--cfl", type=float, default=0.4, help="CFL target for the default dt, 0 < cfl <= 1 (default 0.4)")
    t.add_argument("--sample", type=float, default=0.1, help="output interval (default 0.1)")
    t.add_argument("--reynolds", type=float, default=1600.0, help="Reynolds number 1/nu (default 1600)")
    t.add_argument("--out", metavar="DIR", default=None, help="write tgv.csv and tgv.png (against the DNS) there")
    t.add_argument("--vtu", metavar="PATH", default=None,
                   help="write velocity, pressure and vorticity magnitude at t-final to this .vtu file")
    t.add_argument("--vtu-every", type=float, default=None, metavar="T",
                   help="with --vtu: also a snapshot at every multiple of T (a multiple of --sample), "
                        "PATH stem + _t<time>.vtu")
    t.add_argument("--checkpoint", metavar="PATH", default=None, help="write a checkpoint after every sample")
    t.add_argument("--resume", metavar="PATH", default=None, help="continue from this checkpoint")
    t.add_argument("--backend", choices=BACKENDS, default="auto", help="element kernels (default auto)")
    t.add_argument("--devices", type=int, default=None, metavar="N", help="split the elements over N devices")
    t.add_argument("--transport", choices=("mpi", "shard"), default=None, help="under mpirun/srun, as for poisson")
    t.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    t.set_defaults(dtype="float64", deform=0.0)
    p.problem_parsers = probs.choices

    b = sub.add_parser("bench", help="bake-off kernel (bk1..bk6) or problem (bp1..bp6) throughput")
    b.add_argument("problem", type=str.lower, metavar="problem",
                   help="bake-off kernel bk1..bk6 or problem bp1..bp6")
    mesh_args(b, BENCH_DEFAULTS["order"], BENCH_DEFAULTS["elements"])
    b.add_argument("--iterations", type=int, default=None,
                   help="Jacobi-preconditioned PCG iterations per timed solve, bp only (default 100)")
    b.add_argument("--repeats", type=int, default=None,
                   help="timed runs; the median is reported (default 10 for bk, 5 for bp)")
    b.add_argument("--tol", type=float, default=None,
                   help="bp only: also time the p-multigrid solve to this relative residual (default 1e-8, "
                        "1e-5 in float32; 0 skips it)")
    b.add_argument("--bandwidth", default=None, metavar="GBPS",
                   help="memory bandwidth in GB/s for percent_of_ceiling, or 'measure'")
    b.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="element kernels: the CUDA kernels where they run and einsum elsewhere "
                        "(auto, default), or force one")
    common(b)

    i = sub.add_parser("info", help="devices, versions, x64 flag, MPI availability")
    i.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.commands = {"solve": s, "bench": b, "info": i, **{f"solve {k}": v for k, v in probs.choices.items()}}
    return p


# ----------------------------------------------------------------------------- validation

def _validate_devices(args, fail) -> None:
    """--devices and --transport, before any solve (JAX counts its devices, nothing more)."""
    from ..parallel.comm import launcher_size

    launched = (launcher_size() or 1) > 1
    if args.transport is not None and not launched:
        fail("argument --transport: applies under mpirun/srun only (one process: --devices N)")
    if args.devices is None:
        return
    if launched:
        fail("argument --devices: under mpirun/srun use --transport shard (every process's devices)")
    if args.devices < 1:
        fail(f"argument --devices: must be >= 1, got {args.devices}")
    import jax

    if args.devices > jax.device_count():
        hint = (" (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before starting)"
                if jax.default_backend() == "cpu" else "")
        fail(f"argument --devices: {args.devices} asked, JAX sees {jax.device_count()}{hint}")


def _memory_limits() -> tuple[int, int | None]:
    """(host RAM, memory of one device or None if JAX does not say), in bytes."""
    import jax

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    stats = jax.local_devices()[0].memory_stats() or {}
    return host, stats.get("bytes_limit")


def _validate_memory(args, fail) -> None:
    """Refuse a mesh that cannot fit before building it (an estimate, see memory_bytes)."""
    from ..discretization import memory_bytes

    E = math.prod(args.elements)
    problem = getattr(args, "problem", "poisson")
    if problem in ("maxwell", "advection"):
        q, components = args.order + 1, 6 if problem == "maxwell" else 1
    elif problem == "tgv":  # dealiasing metrics on the 3/2 rule; BDF3/EXT3 history of u and N(u)
        q, components = math.ceil(1.5 * (args.order + 1)), 6
    else:  # a bake-off problem: BPk / BKk, k odd scalar, even 3-vector; 1-4 Gauss, 5-6 GLL
        k = getattr(args, "bp", None) or int(problem[-1]) if problem[-1:].isdigit() else 5
        q, components = args.order + (1 if k >= 5 else 2), 3 if k % 2 == 0 else 1
    need = memory_bytes(E, args.order, q, components, 4 if args.dtype == "float32" else 8)
    devices = max(1, getattr(args, "devices", None) or 1)
    host, device = _memory_limits()
    gb = lambda b: f"{b / 1e9:.3g} GB"
    if device is not None and need / devices > device:
        fail(f"argument --elements: {E} elements of order {args.order} need about {gb(need / devices)} "
             f"per device, the device has {gb(device)}")
    if 2 * need > host:  # the host builds the mesh, numbering and plans before they move to devices
        fail(f"argument --elements: {E} elements of order {args.order} need about {gb(2 * need)} of host "
             f"memory to build, this machine has {gb(host)}")


def _validate_out_folder(folder: str, names, fail) -> None:
    """``--out``: the files ``names`` in ``folder`` writable (no directory or symlink in their place), or,
    for a folder still to be made, its nearest existing parent a folder this process can create entries in."""
    from ..io import check_writable

    try:
        if os.path.isdir(folder):
            for name in names:
                check_writable(os.path.join(folder, name), "output file")
            return
        missing = os.path.abspath(folder)
        while not os.path.lexists(os.path.dirname(missing)) and os.path.dirname(missing) != missing:
            missing = os.path.dirname(missing)
        check_writable(missing, "output folder")
    except ValueError as e:
        fail(f"argument --out: {e}")


def _validate_resume(args, fail) -> None:
    """``--resume``: this process's checkpoint file (``PATH.rank<r>-of-<P>`` under mpirun with the mpi
    transport) exists and holds a checkpoint (its container and metadata; shapes are checked at set-up)."""
    from ..parallel.comm import Comm, launcher_rank, launcher_size
    from ..solvers.timestepping import checkpoint_meta

    size = launcher_size() or 1
    own = args.resume
    if size > 1 and args.transport != "shard":
        own += Comm(rank=launcher_rank() or 0, size=size).file_suffix
    if not os.path.isfile(own):
        fail(f"argument --resume: no such file: {own}")
    try:
        checkpoint_meta(own)
    except (OSError, ValueError) as e:
        fail(f"argument --resume: {e}")


def _validate(parser: _Parser, args) -> None:
    """Range checks argparse cannot do; one-line error and exit 2 on failure."""
    fail = parser.commands[f"solve {args.problem}" if args.command == "solve" else args.command].error
    if args.command == "info":
        return
    if not 1 <= args.order <= MAX_ORDER:
        fail(f"argument --order: must be an integer in 1..{MAX_ORDER}, got {args.order}")
    if len(args.elements) not in (1, 3):
        fail(f"argument --elements: expected 1 or 3 integers, got {len(args.elements)}")
    if len(args.elements) == 1:
        args.elements = args.elements * 3
    if any(e < 1 for e in args.elements):
        fail(f"argument --elements: each count must be >= 1, got {' '.join(map(str, args.elements))}")
    if not (math.isfinite(args.deform) and abs(args.deform) < MAX_DEFORM):
        fail(f"argument --deform: must satisfy |deform| < {MAX_DEFORM}, got {args.deform}")
    _validate_memory(args, fail)
    if getattr(args, "backend", None) == "cuda":
        from ..backends.cuda import cuda_available
        if not cuda_available():
            fail("argument --backend: 'cuda' needs a CUDA GPU as JAX's backend and nvcc (or $JAXSEM_CUDA_LIB)")
    if args.command == "solve":
        _validate_devices(args, fail)
        if args.problem == "tgv":
            for name in ("t_final", "sample", "reynolds"):
                v = getattr(args, name)
                if not (math.isfinite(v) and v > 0):
                    fail(f"argument --{name.replace('_', '-')}: must be a finite number > 0, got {v}")
            if args.dt is not None and not (math.isfinite(args.dt) and 0 < args.dt <= args.sample):
                fail(f"argument --dt: must satisfy 0 < dt <= --sample ({args.sample}), got {args.dt}")
            for name in ("sample", "t_final") if args.dt is not None else ():
                span = getattr(args, name)  # the step count must be whole, as navier_stokes.run demands
                if not math.isclose(round(span / args.dt) * args.dt, span, rel_tol=1e-9, abs_tol=1e-12):
                    fail(f"argument --dt: must divide --{name.replace('_', '-')} ({span:g}) into whole steps, "
                         f"got dt = {args.dt:g} ({span / args.dt:.6g} steps)")
            if not (math.isfinite(args.cfl) and 0 < args.cfl <= 1):
                fail(f"argument --cfl: must satisfy 0 < cfl <= 1, got {args.cfl}")
            if args.order < 2:
                fail(f"argument --order: must be >= 2 for Navier-Stokes, got {args.order}")
            if args.out is not None:
                if not importlib.util.find_spec("matplotlib"):
                    fail("argument --out: the plot needs matplotlib (pip install matplotlib)")
                if os.path.exists(args.out) and not os.path.isdir(args.out):
                    fail(f"argument --out: {args.out!r} exists and is not a folder")
                _validate_out_folder(args.out, ("tgv.csv", "tgv.png"), fail)
            if args.vtu and not importlib.util.find_spec("meshio"):
                fail("argument --vtu: writing VTU needs meshio (pip install meshio)")
            for name in ("vtu", "checkpoint"):
                if getattr(args, name):
                    from ..io import check_writable

                    try:
                        check_writable(getattr(args, name), "output path" if name == "vtu" else "checkpoint")
                    except ValueError as e:
                        fail(f"argument --{name}: {e}")
            if args.vtu_every is not None:
                if not args.vtu:
                    fail("argument --vtu-every: needs --vtu PATH")
                if args.checkpoint or args.resume:
                    fail("argument --vtu-every: not with --checkpoint or --resume")
                n = args.vtu_every / args.sample
                if not (math.isfinite(n) and n >= 1 - 1e-9 and abs(n - round(n)) < 1e-9):
                    fail(f"argument --vtu-every: must be a whole multiple of --sample ({args.sample}), "
                         f"got {args.vtu_every}")
            if args.resume:
                _validate_resume(args, fail)
            from ..models.flows import tgv_reference

            try:  # the comparison reads it at the end of the run: a bad file must fail now
                tgv_reference()
            except (OSError, ValueError) as e:
                fail(str(e))
            return
        if args.vtu:
            from ..io import check_writable

            if not importlib.util.find_spec("meshio"):
                fail("argument --vtu: writing VTU needs meshio (pip install meshio)")
            try:
                check_writable(args.vtu)
            except ValueError as e:
                fail(f"argument --vtu: {e}")
        if args.problem in ("advection", "maxwell"):
            if not (math.isfinite(args.t_final) and args.t_final > 0):
                fail(f"argument --t-final: must be a finite number > 0, got {args.t_final}")
            if not (math.isfinite(args.cfl) and 0 < args.cfl <= 1):
                fail(f"argument --cfl: must satisfy 0 < cfl <= 1 (a fraction of the stable time step), "
                     f"got {args.cfl}")
        if args.problem == "advection":
            if not all(math.isfinite(c) for c in args.velocity) or not any(args.velocity):
                fail(f"argument --velocity: must be 3 finite numbers, not all 0, "
                     f"got {' '.join(map(str, args.velocity))}")
            return
        if args.problem == "maxwell":
            return
        if not 1 <= args.bp <= 6:
            fail(f"argument --bp: must be one of 1..6, got {args.bp}")
        if args.tol is None:
            args.tol = DEFAULT_TOL[args.dtype]
        from ..solvers.pcg import min_tol

        lo = min_tol(args.dtype)
        if not (math.isfinite(args.tol) and lo <= args.tol < 1):
            fail(f"argument --tol: must satisfy {lo:.3g} <= tol < 1 for {args.dtype} (10 eps), got {args.tol}")
        if args.maxiter < 1:
            fail(f"argument --maxiter: must be an integer >= 1, got {args.maxiter}")
    else:
        from .bench import PROBLEMS

        if args.problem not in PROBLEMS:
            fail(f"argument problem: invalid choice: {args.problem!r} (choose from bk1..bk6, bp1..bp6)")
        if args.problem.startswith("bk") and args.iterations is not None:
            fail("argument --iterations: applies to bp1..bp6 only (a bk times single applies)")
        if args.problem.startswith("bk") and args.tol is not None:
            fail("argument --tol: applies to bp1..bp6 only")
        if args.iterations is None:
            args.iterations = BENCH_DEFAULTS["iterations"]
        if args.problem.startswith("bp"):
            if args.tol is None:
                args.tol = 1e-5 if args.dtype == "float32" else 1e-8
            if not (args.tol == 0 or 0 < args.tol < 1):
                fail(f"argument --tol: must be 0 (skip) or in (0, 1), got {args.tol}")
        if args.iterations < 1:
            fail(f"argument --iterations: must be an integer >= 1, got {args.iterations}")
        if args.repeats is not None and args.repeats < 1:
            fail(f"argument --repeats: must be an integer >= 1, got {args.repeats}")
        if args.bandwidth is not None and args.bandwidth != "measure":
            try:
                gbps = float(args.bandwidth)
            except ValueError:
                gbps = float("nan")
            if not (math.isfinite(gbps) and gbps > 0):
                fail(f"argument --bandwidth: must be a positive number of GB/s or 'measure', "
                     f"got {args.bandwidth!r}")
            args.bandwidth = gbps * 1e9


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
                ranks=ranks, jax_version=d["jax_version"], jaxsem_version=_version())


def _reporter() -> bool:
    """Whether this process prints the result: process 0 of a multi-controller run, MPI rank 0."""
    import jax

    from ..parallel.comm import get_comm

    return jax.process_index() == 0 if jax.process_count() > 1 else get_comm().rank == 0


def _placement(args) -> dict:
    """Where the run's elements live: ``dict(comm=...)`` (serial, MPI) or ``dict(devices=...)``."""
    import jax

    from ..parallel.comm import get_comm, launcher_size

    if (launcher_size() or 1) > 1 and args.transport == "shard":
        return dict(devices=jax.devices())  # every process's (main called init_distributed)
    if args.devices not in (None, 1):
        return dict(devices=args.devices)
    return dict(comm=get_comm())


def _fmt_device(r: dict) -> str:
    return r["platform"] if r["device"] == r["platform"] else f"{r['platform']} ({r['device']})"


def _fmt_where(r: dict) -> str:
    """Where a solve ran, for the reports: device kind, devices used, transport, processes."""
    return (f"{_fmt_device(r)}, {r['devices']} of {r['num_devices']} device(s), {r['transport']} transport, "
            f"{r['ranks']} process(es), jax {r['jax_version']}")


def _fmt_precond(r: dict) -> str:
    if r["precond"] == "jacobi":
        return "Jacobi preconditioner"
    orders = " > ".join(map(str, r["pmg_orders"]))
    return f"p-multigrid preconditioner (orders {orders}, setup {r['setup_seconds']:.2f} s)"


def _fmt_rate(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3e}"


# ----------------------------------------------------------------------------- solve

def _report_solve(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    bc = "Dirichlet" if r["operator"] == "stiffness" else "Neumann"
    quad = "GLL" if r["quadrature"] == "gll" else "Gauss"
    field = "3-vector" if r["components"] == 3 else "scalar"
    status = "converged" if r["converged"] else "NOT converged"
    return "\n".join([
        f"jaxsem {r['jaxsem_version']}: Poisson BP{r['bp']} ({field} {r['operator']}, {quad} quadrature, "
        f"{bc}) on the unit box",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} (components x E x p^3)",
        f"  PCG         {r['iterations']} iterations, {status} (tol {r['tol']:g}, "
        f"relative residual {r['residual']:.2e}), {_fmt_precond(r)}",
        f"  error       relative L2 {r['error_l2']:.3e}, max {r['error_max']:.3e}",
        f"  time        {r['seconds']:.4f} s solve ({_fmt_rate(r['dofs_per_second'])} DOFs/s), "
        f"{r['compile_seconds']:.2f} s compile, {r['backend']} element kernels",
        f"  device      {_fmt_where(r)}",
    ])


def _report_maxwell(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    case = "PEC cavity mode (1,1,1)" if r["bc"] == "pec" else "periodic plane wave k=2pi(1,1,0)"
    lines = [
        f"jaxsem {r['jaxsem_version']}: Maxwell SEDG, {case} in the unit box, {r['flux']} flux",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} per field component (E x p^3; 6 components)",
    ]
    if not r["converged"]:
        return "\n".join(lines + [f"  BLOW-UP     {r['message']}"])
    return "\n".join(lines + [
        f"  time        t_final {r['t_final']:g}: {r['steps']} {r['method']} steps, dt {r['dt']:.3e} "
        f"(cfl {r['cfl']:g} of the stable limit {r['dt_limit']:.3e})",
        f"  error       relative L2 {r['error_l2']:.3e} (E, H vs exact), energy ratio {r['energy_ratio']:.12f}",
        f"  speed       {r['seconds']:.4f} s stepping ({_fmt_rate(r['gflops'])} GFLOPS, NekCEM model), "
        f"{r['compile_seconds']:.2f} s setup+compile",
        f"  device      {_fmt_where(r)}",
    ])


def _report_advection(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    c = " ".join(f"{v:g}" for v in r["velocity"])
    lines = [
        f"jaxsem {r['jaxsem_version']}: advection DG, periodic Gaussian (width {r['width']:g}) in the unit box, "
        f"velocity ({c}), {r['flux']} flux",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} (E x p^3)",
    ]
    if not r["converged"]:
        return "\n".join(lines + [f"  BLOW-UP     {r['message']}"])
    return "\n".join(lines + [
        f"  time        t_final {r['t_final']:g}: {r['steps']} {r['method']} steps, dt {r['dt']:.3e} "
        f"(cfl {r['cfl']:g} of the stable limit {r['dt_limit']:.3e})",
        f"  error       relative L2 {r['error_l2']:.3e} (vs the exact translated Gaussian), "
        f"mass drift {r['mass_drift']:.1e}, energy ratio {r['energy_ratio']:.12f}",
        f"  speed       {r['seconds']:.4f} s stepping, {r['compile_seconds']:.2f} s setup+compile",
        f"  device      {_fmt_where(r)}",
    ])


def _report_tgv(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [f"jaxsem {r['jaxsem_version']}: Taylor-Green vortex, Re {r['reynolds']:g}, periodic [-pi, pi]^3",
             f"  mesh        order {r['order']}, {el} elements, {r['dofs']} points, BDF{r['time_order']}/EXT"
             f"{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    ref = r.get("reference") or {}
    fmt = lambda v: "-" if v is None else f"{v:.5g}"
    lines += [
        f"  t_final     {r['t_final']:g}: {r['steps']} steps in {r['seconds']:.2f} s including the first chunk's "
        f"compilation ({1e3 * r['seconds_per_step']:.2f} ms per step), setup {r['setup_seconds']:.1f} s",
        f"  E_k         {fmt(r['kinetic_energy'][-1])} at t_final; t = 5: {fmt(r['kinetic_energy_t5'])} "
        f"(DNS {fmt(ref.get('kinetic_energy_t5'))}), t = 10: {fmt(r['kinetic_energy_t10'])} "
        f"(DNS {fmt(ref.get('kinetic_energy_t10'))})",
        f"  peak eps    {fmt(r['peak_dissipation'])} at t = {fmt(r['peak_dissipation_time'])} "
        f"(DNS {fmt(ref.get('peak_dissipation'))} at t = {fmt(ref.get('peak_dissipation_time'))})",
        f"  solves      pressure {fmt(r['pressure_iterations'][-1])}, velocity {fmt(r['velocity_iterations'][-1])} "
        f"iterations (last step); max CFL {fmt(max(c for c in r['cfl'] if c is not None))}",
        f"  device      {_fmt_where(r)}",
    ]
    return "\n".join(lines)


def _report_bench(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [
        f"jaxsem {r['jaxsem_version']}: {r['problem'].upper()}, order {r['order']}, {el} elements, "
        f"{r['dtype']}",
        f"  DOFs        {r['dofs']} (components x E x p^3)",
    ]
    if r["problem"].startswith("bp"):
        lines.append(f"  time        {r['seconds']:.4g} s per {r['iterations']}-iteration solve "
                     f"(median of {r['repeats']}), compile {r['compile_seconds']:.2f} s")
    else:
        lines.append(f"  time        {r['seconds']:.4g} s per apply (median of {r['repeats']}), "
                     f"compile {r['compile_seconds']:.2f} s")
    lines.append(f"  rate        {_fmt_rate(r['dofs_per_second'])} DOFs/s, model "
                 f"{r['bytes_per_dof']:.1f} B/DOF -> {r['bytes_per_second'] / 1e9:.1f} GB/s")
    if "percent_of_ceiling" in r:
        lines.append(f"  ceiling     {r['bandwidth'] / 1e9:.1f} GB/s -> "
                     f"{_fmt_rate(r['ceiling_dofs_per_second'])} DOFs/s, "
                     f"{r['percent_of_ceiling']:.1f}% of it")
    if "tts_seconds" in r:
        lines.append(f"  to {r['tts_tol']:g}     {r['tts_seconds']:.4g} s, {r['tts_iterations']} p-multigrid PCG "
                     f"iterations (Jacobi: {r['tts_jacobi_iterations']}), setup {r['tts_setup_seconds']:.2f} s")
    lines.append(f"  device      {_fmt_device(r)}, jax {r['jax_version']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- info

def _info() -> dict:
    import jax
    import numpy as np

    from .bench import device_info

    def version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    d = device_info()
    return dict(
        jaxsem_version=_version(), jax_version=jax.__version__, jaxlib_version=version("jaxlib"),
        numpy_version=np.__version__, python_version=_platform.python_version(),
        x64=bool(jax.config.jax_enable_x64), platform=d["platform"], device=d["device_kind"],
        num_devices=d["num_devices"], devices=d["devices"], ranks=_ranks(),
        mpi4jax_available=importlib.util.find_spec("mpi4jax") is not None,
        mpi4py_available=importlib.util.find_spec("mpi4py") is not None,
    )


def _ranks() -> int:
    """Number of MPI ranks, without initializing MPI just for ``info``."""
    from ..parallel.comm import launcher_size

    return launcher_size() or 1


def _report_info(r: dict) -> str:
    return "\n".join([
        f"jaxsem {r['jaxsem_version']} (python {r['python_version']})",
        f"  jax {r['jax_version']}, jaxlib {r['jaxlib_version']}, numpy {r['numpy_version']}, x64 {r['x64']}",
        f"  devices     {r['num_devices']} x {_fmt_device(r)}: {', '.join(r['devices'])}",
        f"  MPI         mpi4jax {'available' if r['mpi4jax_available'] else 'not installed'}, "
        f"mpi4py {'available' if r['mpi4py_available'] else 'not installed'}",
    ])


# ----------------------------------------------------------------------------- main

class _Terminated(BaseException):
    """SIGTERM outside the time-step loop (set-up, compilation, output): ends the command as Ctrl-C does."""


@contextlib.contextmanager
def _terminate_raises():
    """SIGTERM raises :class:`_Terminated` while the command runs (the time-step loop catches
    SIGINT and SIGTERM itself and stops between chunks); the previous handler comes back after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _interrupted(args, e: BaseException) -> tuple[dict, str, int]:
    """``(record, one-line message, exit code 128 + signal)`` of a command ended by SIGINT or SIGTERM."""
    import signal

    from ..solvers.timestepping import RunInterrupted

    checkpoint = getattr(args, "checkpoint", None)  # the path --resume takes (per-rank files under MPI)
    if isinstance(e, RunInterrupted):
        signum, step, t, text = e.signal, e.step, e.t, str(e)
        checkpoint = checkpoint if e.checkpoint is not None else None
    else:
        signum = signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT
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
        text = _report_info(result)
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
                             vtu_every=args.vtu_every, progress=log,
                             progress_bar=not quiet and first)
            report = _report_tgv
        elif args.problem == "maxwell":
            result = verify.verify_maxwell(args.order, args.elements, args.t_final, flux=args.flux, bc=args.bc,
                                           deform=args.deform, cfl=args.cfl, method=args.method,
                                           dtype=args.dtype, vtu=args.vtu, progress=log,
                                           progress_bar=not quiet and first, place=place)
            report = _report_maxwell
        elif args.problem == "advection":
            result = verify.verify_advection(args.order, args.elements, args.t_final,
                                             velocity=tuple(args.velocity), flux=args.flux, deform=args.deform,
                                             cfl=args.cfl, method=args.method, dtype=args.dtype, vtu=args.vtu,
                                             schedule=args.schedule, progress=log,
                                             progress_bar=not quiet and first, place=place)
            report = _report_advection
        else:
            result = verify.solve_poisson(args.bp, args.order, args.elements, args.deform, args.tol,
                                          args.maxiter, args.dtype, progress=log, backend=args.backend, vtu=args.vtu,
                                          precond=args.precond,
                                          place=place)
            report = _report_solve
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
        text = _report_bench(result)
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


def main(argv=None) -> int:
    """Entry point of the ``jaxsem`` console script; returns the exit code."""
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
            from ..parallel.comm import init_distributed

            init_distributed()  # under a launcher: before anything asks JAX for its devices
        _validate(parser, args)
    except SystemExit as e:  # argparse errors (2), --help / --version (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)

    import jax

    from ..parallel.comm import get_comm

    from ..parallel.comm import launcher_rank

    _compilation_cache(jax)
    # a warning (a shortened p-multigrid schedule, a large start CFL) is one line for the user
    warnings.formatwarning = lambda message, category, *_, **__: f"jaxsem: {category.__name__}: {message}\n"

    quiet = getattr(args, "quiet", False) or args.command == "info" or launcher_rank() not in (None, 0)
    log = (lambda m: None) if quiet else (lambda m: print(f"jaxsem: {m}", file=sys.stderr, flush=True))

    from ..solvers.timestepping import RunInterrupted

    interrupted = refused = False
    with _stdout_to_stderr() as out, _terminate_raises():
        try:
            result, text, code = _dispatch(args, log, quiet)
        except ValueError as e:  # refused after set-up (e.g. a time step past the stable one): named, no traceback
            result = dict(problem=args.command if args.command != "solve" else args.problem, status="refused",
                          converged=False, message=str(e))
            text, code = f"error: {e}", 2
            if _reporter():
                print(f"jaxsem: error: {e}", file=sys.stderr, flush=True)
            refused = True
        except (RunInterrupted, KeyboardInterrupt, _Terminated) as e:
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
