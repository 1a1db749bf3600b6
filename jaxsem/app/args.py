"""Arguments of the ``jaxsem`` command: the parser, its defaults, and the checks that run
before any JAX work (a bad argument is one line on stderr naming it, exit 2)."""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import sys

from ..backends import BACKENDS
from ..core.basis import MAX_ORDER

__all__ = ["build_parser", "validate", "DEFAULTS", "DEFAULT_TOL", "BENCH_DEFAULTS", "PROBLEMS", "TIME_DEFAULTS"]

DEFAULTS = dict(bp=5, order=6, elements=(3, 3, 3), deform=0.1, maxiter=1000)
DEFAULT_TOL = {"float64": 1e-10, "float32": 1e-5}
BENCH_DEFAULTS = dict(order=7, elements=(8, 8, 8), iterations=100)
MAX_DEFORM = 0.27  # box_mesh keeps the Jacobian positive for |deform| < 0.27
PROBLEMS = ("poisson", "maxwell", "advection")
TIME_DEFAULTS = dict(t_final=0.5, flux="upwind", cfl=0.5, method="lserk4")
KOVASZNAY_DEFAULTS = dict(order=6, elements=(3, 4, 1), t_final=20.0, steady_tol=1e-9)
CHANNEL_DEFAULTS = dict(order=7, elements=(8, 8, 8), t_final=200.0, average_from=60.0, sample=0.5)
RBC_DEFAULTS = dict(order=5, elements=(3, 1, 3), rayleigh=1800.0, t_final=1.0, sample=0.1, dt=0.002)
# per DFG case: (t_final, sample) in seconds
CYLINDER_DEFAULTS = {"2D-1": (30.0, 0.1), "2D-2": (8.0, 0.01), "3D-1Z": (30.0, 0.1)}
CYLINDER_STEADY_TOL = 1e-5  # a steady case stops below this change; its coefficients settle well before


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), no usage dump."""

    def error(self, message):
        from ..parallel.launch import launcher_rank

        msg = " ".join(str(message).split())
        if launcher_rank() in (None, 0):  # under mpirun: one message, every rank exits 2
            sys.stderr.write(f"{self.prog}: error: {msg}\n")
        sys.exit(2)


def version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> _Parser:
    p = _Parser(
        prog="jaxsem",
        description="Differentiable spectral elements in JAX. Without a command: solve a small "
        "default problem (Poisson BP5, order 6, 3x3x3 elements, deform 0.1) and report.",
    )
    p.add_argument("--version", action="version", version=f"jaxsem {version()}")
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
            sp.add_argument("--pmg-dtype", choices=("float64", "float32"), default=None,
                            help="precision of the p-multigrid V-cycle (default: the solve's; float32 halves its "
                                 "bytes, the outer PCG stays in the solve's precision)")
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
    t.add_argument("--pressure-tol", type=float, default=1e-8, metavar="TOL",
                   help="relative residual of the pressure solve, started from the extrapolated pressure "
                        "(default 1e-8; NekRS's and Neko's runs use 1e-4 to 1e-6)")
    t.add_argument("--velocity-tol", type=float, default=1e-10, metavar="TOL",
                   help="relative residual of the velocity solves (default 1e-10)")
    t.add_argument("--pressure-projection", type=int, default=8, metavar="L",
                   help="start each pressure solve from its projection onto the last L pressure "
                        "solutions, as NekRS does (default 8; 0: from the extrapolated pressure)")
    t.add_argument("--pmg-dtype", choices=("float64", "float32"), default="float32",
                   help="precision of the pressure's p-multigrid V-cycle inside the float64 solve (default "
                        "float32, as NekRS's multigrid: half the bytes per smoothing pass; float64: the solve's)")
    t.add_argument("--checkpoint", metavar="PATH", default=None,
                   help="write a checkpoint every --checkpoint-every, at the end, and when stopped by a signal")
    t.add_argument("--checkpoint-every", type=float, default=None, metavar="T",
                   help="with --checkpoint: its interval in time units, a whole multiple of --sample "
                        "(default: every sample)")
    t.add_argument("--resume", metavar="PATH", default=None, help="continue from this checkpoint")
    t.add_argument("--backend", choices=BACKENDS, default="auto", help="element kernels (default auto)")
    t.add_argument("--devices", type=int, default=None, metavar="N", help="split the elements over N devices")
    t.add_argument("--transport", choices=("mpi", "shard"), default=None, help="under mpirun/srun, as for poisson")
    t.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    t.set_defaults(dtype="float64", deform=0.0)
    _flow_parsers(probs)
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


def _flow_parsers(probs) -> None:
    """``solve kovasznay`` and ``solve cylinder``: Navier-Stokes with inflow, walls and an outflow."""
    k = probs.add_parser("kovasznay", help="Kovasznay flow (Navier-Stokes, inflow and outflow) against its exact "
                         "solution",
                         description="Incompressible Navier-Stokes to the steady Kovasznay flow on "
                         "[-0.5, 1] x [-0.5, 1.5] (periodic in z, one element deep by default): the exact velocity "
                         "on xmin, ymin, ymax, an outflow on xmax; relative L2 errors of velocity and pressure.")
    k.add_argument("--order", type=int, default=KOVASZNAY_DEFAULTS["order"],
                   help=f"polynomial order p, 2..{MAX_ORDER} (default {KOVASZNAY_DEFAULTS['order']})")
    k.add_argument("--elements", type=int, nargs=3, default=list(KOVASZNAY_DEFAULTS["elements"]), metavar="E",
                   help="element counts Ex Ey Ez; z is Ez elements of the y width deep (default 3 4 1)")
    k.add_argument("--reynolds", type=float, default=40.0, help="Reynolds number 1/nu (default 40)")
    k.add_argument("--outflow", choices=("traction", "zero"), default="traction",
                   help="on xmax: the exact traction (traction, default) or zero traction (zero: the error is "
                        "then the boundary condition's)")
    k.add_argument("--t-final", type=float, default=KOVASZNAY_DEFAULTS["t_final"],
                   help="the latest time, a whole number of --sample (default 20)")
    k.add_argument("--sample", type=float, default=0.1, help="interval of the steady-state check (default 0.1)")
    k.add_argument("--steady-tol", type=float, default=KOVASZNAY_DEFAULTS["steady_tol"],
                   help="stop at the first sample whose |u^{n+1} - u^n|/(dt |u|) is below this; 0: run to "
                        "--t-final (default 1e-9)")
    c = probs.add_parser("cylinder", help="DFG flow around a cylinder (Schaefer-Turek 2D-1, 2D-2, 3D-1Z) against "
                         "the benchmark's drag, lift, pressure difference and Strouhal number",
                         description="Incompressible Navier-Stokes around the DFG cylinder (Schaefer & Turek "
                         "1996) on the Gmsh hex mesh (needs the gmsh package: pip install 'jaxsem[gmsh]'): "
                         "steady 2D-1 and 3D-1Z to a steady state, periodic 2D-2 to --t-final.")
    c.add_argument("--case", choices=tuple(CYLINDER_DEFAULTS), default="2D-1", help="benchmark case (default 2D-1)")
    c.add_argument("--order", type=int, default=4, help=f"polynomial order p, 2..{MAX_ORDER} (default 4)")
    c.add_argument("--level", type=int, default=0, help="mesh level 0..6, each doubles the divisions (default 0)")
    c.add_argument("--t-final", type=float, default=None,
                   help="the latest time (s), a whole number of --sample (default 30 for the steady cases, 8 for 2D-2)")
    c.add_argument("--sample", type=float, default=None,
                   help="interval (s) of the series and of the steady-state check (default 0.1; 0.01 for 2D-2)")
    c.add_argument("--steady-tol", type=float, default=CYLINDER_STEADY_TOL,
                   help="steady cases: stop at the first sample whose |u^{n+1} - u^n|/(dt |u|) is below this; "
                        "0: run to --t-final (default 1e-5)")
    c.add_argument("--out", metavar="DIR", default=None,
                   help="write cylinder.csv (time, c_D, c_L, dp, change, cfl) and cylinder.png there")
    c.add_argument("--vtu", metavar="PATH", default=None,
                   help="write velocity and pressure at the end to this .vtu file")
    for sp in (k, c):
        sp.add_argument("--dt", type=float, default=None,
                        help="time step (default: the largest with initial CFL <= --cfl that divides --sample)")
        sp.add_argument("--cfl", type=float, default=0.4, help="CFL target for the default dt, 0 < cfl <= 1 "
                        "(default 0.4)")
    r = probs.add_parser("rbc", help="Rayleigh-Benard convection between rigid walls: growth rate and Nusselt "
                         "number of a small roll (the onset of convection, Ra_c = 1707.76)",
                         description="Boussinesq convection in thermal-diffusion units (nu = Pr, kappa = 1) in a "
                         "cell one wavelength wide (periodic x, y), no-slip walls at theta = 1 (z = 0) and 0 (z = 1), "
                         "from the conduction profile plus a small roll: the growth rate of its kinetic energy and "
                         "the bottom wall's Nusselt number per sample.")
    r.add_argument("--rayleigh", type=float, default=RBC_DEFAULTS["rayleigh"],
                   help=f"Rayleigh number (default {RBC_DEFAULTS['rayleigh']:g})")
    r.add_argument("--prandtl", type=float, default=1.0, help="Prandtl number (default 1)")
    r.add_argument("--wavenumber", type=float, default=3.117, help="the roll's wavenumber k; the cell is 2 pi / k "
                   "wide (default 3.117, the critical one)")
    r.add_argument("--amplitude", type=float, default=1e-3, help="the roll's initial temperature amplitude "
                   "(default 1e-3)")
    r.add_argument("--order", type=int, default=RBC_DEFAULTS["order"],
                   help=f"polynomial order p, 2..{MAX_ORDER} (default {RBC_DEFAULTS['order']})")
    r.add_argument("--elements", type=int, nargs=3, default=list(RBC_DEFAULTS["elements"]), metavar="E",
                   help="element counts Ex Ey Ez (default 3 1 3)")
    r.add_argument("--t-final", type=float, default=RBC_DEFAULTS["t_final"],
                   help="the end time (thermal-diffusion units), a whole number of --sample (default 1)")
    r.add_argument("--sample", type=float, default=RBC_DEFAULTS["sample"],
                   help="interval of the growth rate and Nusselt series (default 0.1)")
    r.add_argument("--dt", type=float, default=RBC_DEFAULTS["dt"], help="time step, dividing --sample "
                   "(default 0.002)")
    h = probs.add_parser("channel", help="turbulent channel flow at a held bulk Reynolds number, averaged, against "
                         "the DNS at Re_tau = 180", description="Incompressible Navier-Stokes between walls at y = +-1 "
                         "(periodic x, z; tanh-graded toward the walls), the bulk velocity held at 1 (Nek's flow-rate "
                         "correction), from a disturbed laminar start; from --average-from on, time and plane averages: "
                         "Re_tau, U+(y+), rms velocities and -<u'v'>+ against Moser, Kim & Mansour (1999).")
    h.add_argument("--order", type=int, default=CHANNEL_DEFAULTS["order"],
                   help=f"polynomial order p, 2..{MAX_ORDER} (default {CHANNEL_DEFAULTS['order']})")
    h.add_argument("--elements", type=int, nargs=3, default=list(CHANNEL_DEFAULTS["elements"]), metavar="E",
                   help="element counts Ex Ey Ez (default 8 8 8)")
    h.add_argument("--reynolds-bulk", type=float, default=5600.0, help="U_b 2h / nu (default 5600, the DNS's)")
    h.add_argument("--lengths", type=float, nargs=2, default=[2 * math.pi, math.pi], metavar="L",
                   help="Lx Lz in half heights (default 2pi pi)")
    h.add_argument("--grading", type=float, default=2.0, help="tanh grading strength toward the walls (default 2)")
    h.add_argument("--t-final", type=float, default=CHANNEL_DEFAULTS["t_final"],
                   help="the end time in h/U_b, a whole number of --sample (default 200)")
    h.add_argument("--average-from", type=float, default=CHANNEL_DEFAULTS["average_from"],
                   help="averages from this time on (default 60)")
    h.add_argument("--sample", type=float, default=CHANNEL_DEFAULTS["sample"],
                   help="interval of the series and of the averages (default 0.5)")
    h.add_argument("--dt", type=float, default=None,
                   help="time step (default: the largest with initial CFL <= --cfl that divides --sample)")
    h.add_argument("--cfl", type=float, default=0.4, help="CFL target of the default dt, which is cut at the end of "
                   "a sample whose CFL passed 1.25 times it and lengthened after one below half of it (default 0.4)")
    h.add_argument("--relaxation", type=float, default=5.0, metavar="CHI",
                   help="strength of the high-pass-filter relaxation, 1/time (NekRS's hpfrt; default 5, 0: off)")
    h.add_argument("--relaxation-modes", type=int, default=1, metavar="M",
                   help="top Legendre modes per axis the relaxation acts on, 1..order (default 1)")
    h.add_argument("--out", metavar="DIR", default=None, help="write channel.csv (profiles) and channel.png there")
    h.add_argument("--checkpoint", metavar="PATH", default=None,
                   help="rewrite this file after every sample (state, averages, series) for --resume")
    h.add_argument("--resume", metavar="PATH", default=None, help="continue the run a --checkpoint file holds")
    h.set_defaults(steady_tol=0.0)
    for sp in (k, c, r, h):
        sp.add_argument("--backend", choices=BACKENDS, default="auto", help="element kernels (default auto)")
        sp.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
        sp.set_defaults(dtype="float64", deform=0.0, devices=None, transport=None)
    r.set_defaults(cfl=0.4, steady_tol=0.0)


# ----------------------------------------------------------------------------- validation

def _validate_devices(args, fail) -> None:
    """--devices and --transport, before any solve (JAX counts its devices, nothing more)."""
    from ..parallel.launch import launcher_size

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


def _validate_memory(args, fail, count: int | None = None, name: str = "--elements") -> None:
    """Refuse a mesh that cannot fit before building it (an estimate, see memory_bytes); ``count``
    elements (default: the product of ``--elements``), the argument ``name`` blamed."""
    from ..discretization import memory_bytes

    E = math.prod(args.elements) if count is None else count
    problem = getattr(args, "problem", "poisson")
    if problem in ("maxwell", "advection"):
        q, components = args.order + 1, 6 if problem == "maxwell" else 1
    elif problem in ("tgv", "kovasznay", "cylinder", "rbc", "channel"):  # 3/2-rule metrics; BDF3/EXT3 history of u and N(u)
        q, components = math.ceil(1.5 * (args.order + 1)), 6
    else:  # a bake-off problem: BPk / BKk, k odd scalar, even 3-vector; 1-4 Gauss, 5-6 GLL
        k = getattr(args, "bp", None) or int(problem[-1]) if problem[-1:].isdigit() else 5
        q, components = args.order + (1 if k >= 5 else 2), 3 if k % 2 == 0 else 1
    need = memory_bytes(E, args.order, q, components, 4 if args.dtype == "float32" else 8)
    devices = max(1, getattr(args, "devices", None) or 1)
    host, device = _memory_limits()
    gb = lambda b: f"{b / 1e9:.3g} GB"
    if device is not None and need / devices > device:
        fail(f"argument {name}: {E} elements of order {args.order} need about {gb(need / devices)} "
             f"per device, the device has {gb(device)}")
    if 2 * need > host:  # the host builds the mesh, numbering and plans before they move to devices
        fail(f"argument {name}: {E} elements of order {args.order} need about {gb(2 * need)} of host "
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
    from ..parallel.comm import Comm
    from ..parallel.launch import launcher_rank, launcher_size
    from ..io.checkpoint import checkpoint_meta

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


def _validate_flow(args, fail) -> None:
    """``solve kovasznay`` and ``solve cylinder``: ranges, whole numbers of steps, output paths, gmsh."""
    if not 2 <= args.order <= MAX_ORDER:
        fail(f"argument --order: must be an integer in 2..{MAX_ORDER} for Navier-Stokes, got {args.order}")
    if args.problem in ("kovasznay", "rbc", "channel"):
        if any(e < 1 for e in args.elements):
            fail(f"argument --elements: each count must be >= 1, got {' '.join(map(str, args.elements))}")
        numbers = dict(kovasznay=("reynolds",), rbc=("rayleigh", "prandtl", "wavenumber"),
                       channel=("reynolds_bulk", "grading"))[args.problem]
        for arg in numbers:
            v = getattr(args, arg)
            if not (math.isfinite(v) and v > 0):
                fail(f"argument --{arg.replace('_', '-')}: must be a finite number > 0, got {v}")
        if args.problem == "channel":
            if not all(math.isfinite(v) and v > 0 for v in args.lengths):
                fail(f"argument --lengths: must be 2 finite numbers > 0, got {args.lengths}")
            if not (math.isfinite(args.relaxation) and args.relaxation >= 0):
                fail(f"argument --relaxation: must be a finite number >= 0, got {args.relaxation}")
            if not 1 <= args.relaxation_modes <= args.order:
                fail(f"argument --relaxation-modes: must be in 1..--order ({args.order}), got {args.relaxation_modes}")
            if not (math.isfinite(args.average_from) and 0 <= args.average_from <= args.t_final):
                fail(f"argument --average-from: must satisfy 0 <= average_from <= --t-final ({args.t_final:g}), "
                     f"got {args.average_from}")
            for arg in ("checkpoint", "resume"):
                path = getattr(args, arg)
                if arg == "resume" and path is not None and not os.path.isfile(path):
                    fail(f"argument --resume: no checkpoint file at {path!r}")
        if args.problem == "rbc" and not (math.isfinite(args.amplitude) and args.amplitude >= 0):
            fail(f"argument --amplitude: must be a finite number >= 0, got {args.amplitude}")
        count, name = math.prod(args.elements), "--elements"
    else:
        if not importlib.util.find_spec("gmsh"):
            fail("argument --case: the DFG meshes are built with the gmsh Python API, which is not installed "
                 "(pip install 'jaxsem[gmsh]')")
        if not 0 <= args.level <= 6:
            fail(f"argument --level: must be an integer in 0..6, got {args.level}")
        t_final, sample = CYLINDER_DEFAULTS[args.case]
        args.t_final = t_final if args.t_final is None else args.t_final
        args.sample = sample if args.sample is None else args.sample
        per_layer = 176 if args.case.startswith("2D") else 184  # jaxsem.mesh.dfg_2d / dfg_3d at level 0
        layers = 1 if args.case.startswith("2D") else 4 * 2**args.level
        count, name = per_layer * 4**args.level * layers, "--level"
    for arg in ("t_final", "sample"):
        v = getattr(args, arg)
        if not (math.isfinite(v) and v > 0):
            fail(f"argument --{arg.replace('_', '-')}: must be a finite number > 0, got {v}")
    n = args.t_final / args.sample
    if not math.isclose(round(n) * args.sample, args.t_final, rel_tol=1e-9, abs_tol=1e-12) or round(n) < 1:
        fail(f"argument --t-final: must be a whole number of --sample ({args.sample:g}) intervals, "
             f"got {args.t_final:g} ({n:.6g} intervals)")
    if args.dt is not None:
        if not (math.isfinite(args.dt) and 0 < args.dt <= args.sample):
            fail(f"argument --dt: must satisfy 0 < dt <= --sample ({args.sample:g}), got {args.dt}")
        k = args.sample / args.dt
        if not math.isclose(round(k) * args.dt, args.sample, rel_tol=1e-9, abs_tol=1e-12):
            fail(f"argument --dt: must divide --sample ({args.sample:g}) into whole steps, got dt = {args.dt:g} "
                 f"({k:.6g} steps)")
    if not (math.isfinite(args.cfl) and 0 < args.cfl <= 1):
        fail(f"argument --cfl: must satisfy 0 < cfl <= 1, got {args.cfl}")
    if not (math.isfinite(args.steady_tol) and args.steady_tol >= 0):
        fail(f"argument --steady-tol: must be a finite number >= 0 (0: run to --t-final), got {args.steady_tol}")
    args.steady_tol = args.steady_tol or None
    _validate_memory(args, fail, count, name)
    if getattr(args, "backend", None) == "cuda":
        from ..backends.cuda import cuda_available

        if not cuda_available():
            fail("argument --backend: 'cuda' needs a CUDA GPU as JAX's backend and nvcc (or $JAXSEM_CUDA_LIB)")
    _validate_devices(args, fail)
    if getattr(args, "out", None) is not None:
        if not importlib.util.find_spec("matplotlib"):
            fail("argument --out: the plot needs matplotlib (pip install matplotlib)")
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            fail(f"argument --out: {args.out!r} exists and is not a folder")
        names = ("channel.csv", "channel.png") if args.problem == "channel" else ("cylinder.csv", "cylinder.png")
        _validate_out_folder(args.out, names, fail)
    if getattr(args, "vtu", None):
        from ..io import check_writable

        if not importlib.util.find_spec("meshio"):
            fail("argument --vtu: writing VTU needs meshio (pip install meshio)")
        try:
            check_writable(args.vtu, "output path")
        except ValueError as e:
            fail(f"argument --vtu: {e}")


def validate(parser: _Parser, args) -> None:
    """Range checks argparse cannot do; one-line error and exit 2 on failure."""
    fail = parser.commands[f"solve {args.problem}" if args.command == "solve" else args.command].error
    if args.command == "info":
        return
    if args.command == "solve" and args.problem in ("kovasznay", "cylinder", "rbc", "channel"):
        _validate_flow(args, fail)
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
            from ..solvers.pcg import min_tol

            for name in ("pressure_tol", "velocity_tol"):
                v, lo = getattr(args, name), min_tol("float64")
                if not (math.isfinite(v) and lo <= v < 1):
                    fail(f"argument --{name.replace('_', '-')}: must satisfy {lo:.3g} <= tol < 1, got {v}")
            if not 0 <= args.pressure_projection <= 64:
                fail(f"argument --pressure-projection: must satisfy 0 <= L <= 64, got {args.pressure_projection}")
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
            if args.checkpoint_every is not None:
                if not args.checkpoint:
                    fail("argument --checkpoint-every: needs --checkpoint PATH")
                n = args.checkpoint_every / args.sample
                if not (math.isfinite(n) and n >= 1 - 1e-9 and abs(n - round(n)) < 1e-9):
                    fail(f"argument --checkpoint-every: must be a whole multiple of --sample ({args.sample}), "
                         f"got {args.checkpoint_every}")
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


