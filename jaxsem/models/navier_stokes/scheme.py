"""The Navier–Stokes scheme: options, the discretized problem, one BDF/EXT step, diagnostics
(:mod:`jaxsem.models.navier_stokes` describes the scheme)."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...core import basis
from ...core import geometry as geo
from ...discretization import probes as probes_
from ...discretization import surface as sf
from ...discretization.sem import SEM, discretize, group_indicator, with_dirichlet
from ...discretization.shard import replicated
from ...elliptic import Helmholtz, helmholtz, pure_neumann, solve_local, unit_diagonals
from ...mesh.box import Mesh
from ...mesh.numbering import number_nodes
from ...operators.tensor import interp
from ...parallel.comm import gpu_devices
from ...solvers import multigrid
from ...solvers.pcg import PCGInfo, min_tol
from ...solvers.timestepping import Checkpointing, checkpointed_scan
from . import driving
from . import scalars as scalars_
from .boundary import Conditions, Velocity, check_groups, resolve
from .relaxation import Relaxation, low_pass

__all__ = ["NSOptions", "NavierStokes", "State", "StepInfo", "StabilityWarning", "Diagnostics",
           "surface_force", "scalar_flux", "with_coordinates", "setup", "initial_state", "step", "simulate", "diagnostics", "vorticity", "bdf_ext"]

def bdf_ext(k: int):
    """``(β, a)`` of BDFk/EXTk for a fixed step: β = (β₀, β₁, …, β_k) with
    (β₀uⁿ⁺¹ − Σᵢ βᵢuⁿ⁺¹⁻ⁱ)/Δt ≈ ∂u/∂t, and a = (a₁, …, a_k) with Σᵢ aᵢ fⁿ⁺¹⁻ⁱ ≈ fⁿ⁺¹."""
    table = {1: ((1.0, 1.0), (1.0,)),
             2: ((1.5, 2.0, -0.5), (2.0, -1.0)),
             3: ((11 / 6, 3.0, -1.5, 1 / 3), (3.0, -3.0, 1.0))}
    if k not in table:
        raise ValueError(f"time order must be 1, 2 or 3, got {k!r}")
    return table[k]


def _coefficient_tables(k: int, dtype):
    """``(k, k+1)`` β rows and ``(k, k)`` a rows for orders 1..k, zero-padded (the ramp-up)."""
    B = np.zeros((k, k + 1))
    A = np.zeros((k, k))
    for j in range(1, k + 1):
        b, a = bdf_ext(j)
        B[j - 1, : j + 1] = b
        A[j - 1, :j] = a
    return jnp.asarray(B, dtype), jnp.asarray(A, dtype)


@dataclasses.dataclass(frozen=True)
class NSOptions:
    """How the Navier–Stokes steps are taken (static, hashable).

    Attributes:
      time_order: k of BDFk/EXTk (1, 2 or 3).
      pressure_tol, velocity_tol: relative residual tolerances of the pressure and
        velocity solves (relative to the right-hand side's norm).
      pressure_maxiter, velocity_maxiter: iteration caps.
      dealias: evaluate the convective term on the 3/2 Gauss rule (else on the GLL nodes).
      pmg: :class:`jaxsem.solvers.multigrid.PMGOptions` of the pressure preconditioner.
      max_cfl: the largest CFL number (:class:`Diagnostics`) :func:`run` accepts: a start
        above it is refused, and a run whose CFL passes it stops. The explicit convection of
        EXTk is stable to a CFL number below 1 with this measure, further only where the
        (implicit) viscous term damps the growing modes; a CFL number of several means a run
        growing without bound. A start above 1 warns (:class:`StabilityWarning`).
      relaxation: None, or a :class:`~jaxsem.models.navier_stokes.relaxation.Relaxation`: the
        high-pass-filter relaxation term −χ(I − F)u of Nek's under-resolved runs, explicit
        with the convective term (velocity only).
      pressure_projection: L ≥ 1 starts each pressure solve from the best approximation, in
        the pressure operator's norm, of its solution in the span of the last L solutions
        (projection onto previous solutions, as Nek5000 and NekRS do; the state keeps the L
        fields and their Gram matrix, which one operator application a step updates); 0 starts
        it from the pressures of the past levels, extrapolated. Values differ only within the
        solves' tolerance.
    """

    time_order: int = 3
    pressure_tol: float = 1e-8
    velocity_tol: float = 1e-10
    pressure_maxiter: int = 300
    velocity_maxiter: int = 1000
    dealias: bool = True
    pmg: multigrid.PMGOptions = multigrid.PMGOptions()
    max_cfl: float = 4.0
    relaxation: Relaxation | None = None
    pressure_projection: int = 0

    def __post_init__(self):
        if isinstance(self.time_order, bool) or self.time_order not in (1, 2, 3):
            raise ValueError(f"NSOptions.time_order must be 1, 2 or 3, got {self.time_order!r}")
        for name in ("pressure_tol", "velocity_tol"):
            v = getattr(self, name)
            lo = min_tol(jnp.float64)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v < 1):
                raise ValueError(f"NSOptions.{name} must be a number in [{lo:.3g}, 1), got {v!r}")
        for name in ("pressure_maxiter", "velocity_maxiter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"NSOptions.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.dealias, bool):
            raise TypeError(f"NSOptions.dealias must be True or False, got {self.dealias!r}")
        if not isinstance(self.pmg, multigrid.PMGOptions):
            raise TypeError(f"NSOptions.pmg must be a PMGOptions, got {type(self.pmg).__name__}")
        v = self.max_cfl
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"NSOptions.max_cfl must be a positive finite number, got {v!r}")
        if self.relaxation is not None and not isinstance(self.relaxation, Relaxation):
            raise TypeError(f"NSOptions.relaxation must be None or a Relaxation, got {self.relaxation!r}")
        v = self.pressure_projection
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 64:
            raise ValueError(f"NSOptions.pressure_projection must be an integer in [0, 64], got {v!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NavierStokes:
    """A discretized incompressible flow problem (pytree; built by :func:`setup`).

    Attributes (E elements, n = N + 1 GLL points, q dealiasing points per axis):
      sem: velocity discretization (mask 0 on the Dirichlet nodes of non-periodic faces).
      pressure: the pressure's :class:`jaxsem.elliptic.Helmholtz` (−∇², pure Neumann on the
        velocity's nodes, p-multigrid preconditioned); its ``sem`` is :attr:`psem`.
      nu: ``()`` kinematic viscosity (a leaf: ``jax.grad`` reaches it).
      dt: ``()`` time step Δt (a leaf: a run with another Δt reuses the compiled programs;
        the host drivers read it with ``float``).
      binv: ``(E, n, n, n)`` inverse assembled GLL mass (0 on pads).
      Jd: ``(q, n)`` GLL → Gauss interpolation of the dealiasing rule (``(n, n)`` identity
        without dealiasing).
      Dd: ``(q, n)`` the derivative of the GLL interpolant at the rule's points (the GLL
        derivative matrix without dealiasing).
      Brx: ``(3, 3, E, q, q, q)`` B·∂r_a/∂x_d on the dealiasing rule.
      bc: the boundary :class:`~jaxsem.models.navier_stokes.boundary.Conditions`.
      force_weight: ``(F, E, n, n, n)`` 1 on the nodes of each boundary group whose force
        :class:`StepInfo` reports (static names in ``force_groups``), ``(0, ...)`` when none.
      probes: the :class:`~jaxsem.discretization.probes.Probes` whose velocity and pressure
        :func:`run`'s series records at every sample, or None.
      options: static :class:`NSOptions`; volume: static |Ω|.
      scalars: the :class:`~jaxsem.models.navier_stokes.scalars.ScalarField` of each scalar
        (``()``: none), in the order of the state's ``T``.
      buoyancy: the :class:`~jaxsem.models.navier_stokes.scalars.BuoyancyTerm` a scalar drives,
        or None.
      drive: the :class:`~jaxsem.models.navier_stokes.driving.Drive` (a held flow rate or a
        pressure gradient along a periodic axis), or None.
      diagonals: ``(dA, dB)``, each ``(E, n, n, n)``: the assembled diagonals of −∇² and of the
        mass matrix on the velocity's nodes (:func:`jaxsem.elliptic.unit_diagonals`): the
        Jacobi preconditioner of the velocity and scalar solves in each step, without element work
        (None: from the coefficients in each solve).
    """

    sem: SEM
    pressure: Helmholtz
    nu: jax.Array
    dt: jax.Array
    binv: jax.Array = dataclasses.field(metadata=dict(pad=0))
    Jd: jax.Array
    Dd: jax.Array
    Brx: jax.Array = dataclasses.field(metadata=dict(pad=0))
    bc: Conditions
    force_weight: jax.Array
    probes: object
    options: NSOptions = dataclasses.field(metadata=dict(static=True))
    force_groups: tuple = dataclasses.field(metadata=dict(static=True))
    volume: float = dataclasses.field(metadata=dict(static=True))
    scalars: tuple = ()
    buoyancy: object = None
    drive: object = None
    diagonals: tuple | None = None

    @property
    def scalar_names(self) -> tuple:
        """The names of the scalars, in the order of the state's ``T``."""
        return tuple(f.name for f in self.scalars)

    @property
    def walls(self) -> bool:
        """The velocity has Dirichlet nodes."""
        return self.bc.walls

    @property
    def psem(self) -> SEM:
        """The pressure's discretization: the velocity's nodes, all free (pure Neumann)."""
        return self.pressure.sem


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """The solution and its BDF/EXT history (pytree).

    ``U: (k, 3, E, n, n, n)`` velocities uⁿ, uⁿ⁻¹, … (newest first); ``F: (k − 1, 3, E, n, n, n)``
    the explicit terms N(uⁿ⁻¹), N(uⁿ⁻²), … of the past levels (the next step adds N(uⁿ)); ``P: (k, E, n, n, n)`` the
    pressures pⁿ, pⁿ⁻¹, … (zero mean; extrapolated, they start the next pressure solve);
    ``step: ()`` int32 steps taken; ``t: ()`` time; ``past: ()`` int32 past levels held (the
    next step runs at order min(past + 1, k)); ``T: (k, S, E, n, n, n)`` the S scalars θⁿ,
    θⁿ⁻¹, … and ``FT: (k − 1, S, E, n, n, n)`` their advection terms of the past levels (S = 0:
    no scalars); ``X: (L, E, n, n, n)`` the last L pressure solutions, the span the next pressure
    solve starts from (L = ``NSOptions.pressure_projection``; 0: none), slot ``i`` the solution
    of the last step ``m < nx`` with ``m % L == i``, ``G: (L, L)`` their Gram matrix
    (xᵢ, A xⱼ), ``nx: ()`` int32 the solutions taken (0 in empty slots).
    """

    U: jax.Array
    F: jax.Array
    P: jax.Array
    step: jax.Array
    t: jax.Array
    past: jax.Array
    T: jax.Array
    FT: jax.Array
    X: jax.Array
    G: jax.Array
    nx: jax.Array

    @property
    def u(self):
        """``(3, E, n, n, n)`` the current velocity."""
        return self.U[0]

    @property
    def p(self):
        """``(E, n, n, n)`` the current pressure (zero mean; 0 before the first step)."""
        return self.P[0]

    @property
    def theta(self):
        """``(S, E, n, n, n)`` the current scalars."""
        return self.T[0]


class StabilityWarning(UserWarning):
    """A run starts with a CFL number above 1: stable only where viscosity damps the convection."""


class StepInfo(NamedTuple):
    """The solves of one step: pressure and velocity :class:`PCGInfo`; ``force: (F, 3)`` the
    force of the flow on each of ``ns.force_groups`` at the new time level (density 1), from
    the residual of the discrete momentum equation on the group's nodes
    (:func:`_forces_local`), ``(0, 3)`` when none is asked for; ``scalar``: the scalars' solves
    merged (the most iterations, the largest residuals, converged only if all did; an empty
    converged solve without scalars); ``drive: (2,)`` with a drive, the bulk velocity along its
    axis after the step and the force per unit mass applied (the mean pressure gradient), zeros
    without one."""

    pressure: PCGInfo
    velocity: PCGInfo
    force: jax.Array
    scalar: PCGInfo
    drive: jax.Array


class Diagnostics(NamedTuple):
    """Volume averages of the current state (scalars): ``kinetic_energy`` ⟨½|u|²⟩,
    ``enstrophy`` ⟨½|ω|²⟩, ``divergence`` ‖∇·u‖/‖∇u‖ (L2, element-local derivatives),
    ``cfl`` Δt·max Σ_a |u·∇r_a|/Δr_a (the local GLL spacing Δr; not differentiated w.r.t. u)."""

    kinetic_energy: jax.Array
    enstrophy: jax.Array
    divergence: jax.Array
    cfl: jax.Array


def setup(mesh: Mesh, nu: float, dt: float, *, boundary: Callable | dict | None = None,
          forces=(), probes=None, scalars=None, buoyancy=None, drive=None, options: NSOptions = NSOptions(),
          backend: str = "auto", devices=None, comm=None, partition=None) -> NavierStokes:
    """Discretize a flow problem on ``mesh`` and build the pressure preconditioner.

    Args:
      mesh: a :class:`jaxsem.mesh.Mesh` (periodic axes from the mesh).
      nu: kinematic viscosity ν > 0 (1/Re in convective units).
      dt: time step Δt > 0.
      boundary: the conditions on the non-periodic boundary:
        a dict ``{group: condition}`` over the mesh's boundary groups (``mesh.boundaries``),
        each a :class:`~jaxsem.models.navier_stokes.boundary.Velocity` (given velocity or
        no-slip) or an :class:`~jaxsem.models.navier_stokes.boundary.Outflow`, covering every
        boundary face; or one velocity ``u_b(x, y, z, t) -> (3, ...)`` (jnp) on every boundary
        face; or None (no-slip everywhere). Data functions are static: problems built with the
        same function objects (not new closures each time) share compiled programs.
      forces: names of boundary groups whose force :class:`StepInfo` reports each step.
      probes: ``(P, 3)`` points (in the mesh) whose velocity and pressure :func:`run`'s series
        records at every sample (``Series.probe``), or None.
      scalars: None, or :class:`~jaxsem.models.navier_stokes.scalars.Scalar` s (one or a
        sequence) carried by the flow, each with its diffusivity, conditions per group and
        source; their solves use ``options``' velocity tolerance and iteration cap.
      buoyancy: None, or a :class:`~jaxsem.models.navier_stokes.scalars.Buoyancy`: the
        force per unit mass one scalar exerts on the flow (Boussinesq).
      drive: None, a :class:`~jaxsem.models.navier_stokes.driving.FlowRate` (the bulk
        velocity along a periodic axis held every step) or a
        :class:`~jaxsem.models.navier_stokes.driving.PressureGradient` (a uniform force along it).
      options: :class:`NSOptions`.
      backend, devices, comm, partition: as :func:`jaxsem.discretize`.
    Raises ``ValueError`` naming the argument for a bad ``nu``, ``dt``, ``boundary`` (unknown
    groups, faces without a condition), ``forces``, ``scalars``, ``buoyancy`` or ``drive``.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    for name, v in (("nu", nu), ("dt", dt)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                or not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    if boundary is not None and not callable(boundary) and not isinstance(boundary, dict):
        raise TypeError(f"boundary must be None, a dict {{group: Velocity | Outflow}} or a callable "
                        f"u_b(x, y, z, t) -> (3, ...), got {boundary!r}")
    forces = (forces,) if isinstance(forces, str) else tuple(forces)
    unknown = [g for g in forces if g not in mesh.boundaries]
    if unknown:
        raise ValueError(f"forces names group(s) {unknown} the mesh does not have; its groups: "
                         f"{sorted(mesh.boundaries)}")
    if not isinstance(options, NSOptions):
        raise TypeError(f"options must be an NSOptions, got {type(options).__name__}")
    if options.relaxation is not None and options.relaxation.modes > mesh.order:
        raise ValueError(f"options.relaxation.modes must be <= the mesh's order {mesh.order}, "
                         f"got {options.relaxation.modes}")
    scalars = scalars_.check_scalars(scalars, buoyancy)
    if drive is not None and not isinstance(drive, (driving.FlowRate, driving.PressureGradient)):
        raise TypeError(f"drive must be None, a FlowRate or a PressureGradient, got {drive!r}")
    numbering = number_nodes(mesh)
    for c in scalars:
        scalars_.check_groups(mesh, numbering, c)
    kw = dict(backend=backend, devices=devices, comm=comm, partition=partition, numbering=numbering)
    if isinstance(boundary, dict):
        check_groups(mesh, numbering, boundary)
        vel = tuple(g for g, c in boundary.items() if isinstance(c, Velocity))
        sem = discretize(mesh, dirichlet=vel or False, **kw)
        bc = resolve(sem, boundary)
    else:
        sem = discretize(mesh, dirichlet=True, **kw)
        walls = float(sem.comm.allreduce(jnp.sum((sem.mask == 0) * sem.valid))) > 0
        data = boundary is not None and walls
        bc = Conditions(
            velocity_weight=((1.0 - sem.mask) * sem.valid)[None] if data else jnp.zeros((0,) + sem.mask.shape, sem.x.dtype),
            pressure_weight=jnp.zeros((0,) + sem.mask.shape, sem.x.dtype), surfaces=(),
            velocity_params=(None,) if data else (),
            velocity_data=(boundary,) if data else (),
            pressure_data=(), flux_groups=(), velocity_groups=(), outflow_groups=(), walls=walls)
    if bc.outflow_groups:
        pressure = helmholtz(with_dirichlet(sem, bc.outflow_groups), 1.0, 0.0, precond="pmg", options=options.pmg)
    else:
        pressure = helmholtz(pure_neumann(sem) if bc.walls else sem, 1.0, 0.0, precond="pmg", options=options.pmg,
                             nullspace=True)
    if bc.velocity_data:
        for f, a in zip(bc.velocity_data, bc.velocity_params):
            probe = jax.eval_shape(f, sem.x[0], sem.x[1], sem.x[2], 0.0, *(() if a is None else (a,)))
            if probe.shape != (3,) + sem.x.shape[1:]:
                raise ValueError(f"boundary velocity data must return (3, ...) shaped like its coordinates, got "
                                 f"{probe.shape} for coordinates {sem.x.shape[1:]}")
    Jd, Dd, wd = _dealias_rule(sem.order, sem.n, options.dealias, sem.x.dtype)
    binv, Brx = sem.local_map(_fields, Jd, Dd, wd)
    volume = float(sem.integrate(jnp.ones_like(sem.mask)))
    fw = (jnp.stack([group_indicator(sem, (g,)) for g in forces]) if forces
          else jnp.zeros((0,) + sem.mask.shape, sem.x.dtype))
    located = None
    if probes is not None:
        located = probes_.locate(sem, np.asarray(probes, dtype=np.float64).reshape(-1, 3))
    fields = tuple(scalars_.resolve(sem, c) for c in scalars)
    for c in scalars:
        for f in (c.source,) + tuple(getattr(v, "data", None) for v in (c.boundary or {}).values()):
            if callable(f):
                probe = jax.eval_shape(f, sem.x[0], sem.x[1], sem.x[2], 0.0)
                if probe.shape not in ((), sem.x.shape[1:]):
                    raise ValueError(f"scalar {c.name!r}: data must return values shaped like its coordinates "
                                     f"{sem.x.shape[1:]}, got {probe.shape}")
    lift = None
    if buoyancy is not None:
        lift = scalars_.BuoyancyTerm(vector=jnp.asarray(buoyancy.vector, sem.x.dtype),
                                     reference=jnp.asarray(float(buoyancy.reference), sem.x.dtype),
                                     index=[c.name for c in scalars].index(buoyancy.scalar))
    return NavierStokes(sem=sem, pressure=pressure, nu=jnp.asarray(float(nu), sem.x.dtype),
                        dt=jnp.asarray(float(dt), sem.x.dtype), binv=binv, Jd=Jd, Dd=Dd, Brx=Brx, bc=bc,
                        force_weight=fw,
                        probes=located,
                        options=options, force_groups=forces, volume=volume, scalars=fields, buoyancy=lift,
                        drive=driving.resolve(sem, drive), diagonals=sem.local_map(unit_diagonals))


def _dealias_rule(order: int, n: int, dealias: bool, dtype):
    """``(Jd, Dd, wd)``: GLL → the convection's quadrature (the 3/2 Gauss rule, or the GLL nodes)."""
    if dealias:
        rule = geo.quadrature(order, "gauss", q=math.ceil(3 * n / 2))
        return tuple(jnp.asarray(a, dtype) for a in (rule.J, rule.Dt, rule.w))
    gll = geo.quadrature(order, "gll")
    return (jnp.eye(n, dtype=dtype), jnp.asarray(gll.Dt, dtype), jnp.asarray(basis.gll_points(order)[1], dtype))


def with_coordinates(ns: NavierStokes, x) -> NavierStokes:
    """The same flow problem on moved nodes ``x: (3, E, n, n, n)`` (same topology, groups and
    data): every geometric quantity is recomputed from ``x`` with jnp, so ``jax.grad`` through a
    run on the result gives shape derivatives (e.g. of the drag w.r.t. a body's surface moved
    into the volume). The pressure preconditioner is kept (built for the old nodes: the solves
    converge to the new operator's solution all the same); ``ns.volume`` (diagnostics and the
    pure-Neumann pressure's mean) stays the old one."""
    sem = ns.sem.with_coordinates(x)
    psem = ns.pressure.sem.with_coordinates(x)
    Jd, Dd, wd = _dealias_rule(sem.order, sem.n, ns.options.dealias, sem.x.dtype)
    binv, Brx = sem.local_map(_fields, Jd, Dd, wd)
    bc = ns.bc
    if bc.surfaces:
        bc = dataclasses.replace(bc, surfaces=tuple(sf.surface(sem, s_.groups) for s_ in bc.surfaces))
    fields = tuple(dataclasses.replace(f, surfaces=tuple(sf.surface(sem, s_.groups) for s_ in f.surfaces))
                   for f in ns.scalars)
    return dataclasses.replace(ns, sem=sem, pressure=dataclasses.replace(ns.pressure, sem=psem), binv=binv,
                               Jd=Jd, Dd=Dd, Brx=Brx, bc=bc, scalars=fields, diagonals=sem.local_map(unit_diagonals))


def _fields(s: SEM, Jd, Dd, wd):
    d = s.dssum(s.bmass)
    binv = s.valid / jnp.where(d > 0, d, 1.0)
    g = geo.factors(s.x, Jd, Dd, wd, False)
    return binv, g.B * g.rx * s.valid


# --- spatial terms (rank-local: called inside SEM.local_map) ------------------------------

def _grad(s: SEM, u):
    """``g[i, j] = ∂u_j/∂x_i`` element by element: ``u: (c, E, n, n, n) -> (3, c, E, n, n, n)``."""
    ur, us, ut = s.backend.grad_gll(u, s.D)
    rx = s.geom.rx
    return jnp.stack([rx[0, i] * ur + rx[1, i] * us + rx[2, i] * ut for i in range(3)])


def _curl_local(s: SEM, u):
    g = _grad(s, u)
    return jnp.stack([g[1, 2] - g[2, 1], g[2, 0] - g[0, 2], g[0, 1] - g[1, 0]])


def _average(ns: NavierStokes, s: SEM, w):
    """The mass-weighted average of an element-local field over shared nodes: continuous."""
    return ns.binv * s.dssum(s.bmass * w)


def _curl(ns, s, u):
    """∇×u at the nodes, mass-averaged: ``(3, E, n, n, n)``."""
    return _average(ns, s, _curl_local(s, u))


def _convection(ns: NavierStokes, s: SEM, u):
    """N(u) = −(u·∇)u nodal (weak on the dealiasing rule, assembled, times B⁻¹): ``(3, E, n, n, n)``."""
    return _advection(ns, s, u, u)


def _explicit(ns: NavierStokes, s: SEM, u):
    """The explicit momentum terms at one time level: N(u), and −χ(I − F)u (mass-averaged to a
    continuous field) with :attr:`NSOptions.relaxation`: ``(3, E, n, n, n)``."""
    f = _convection(ns, s, u)
    r = ns.options.relaxation
    if r is None or r.strength == 0:
        return f
    F = jnp.asarray(low_pass(s.order, r.modes), u.dtype)
    return f - r.strength * _average(ns, s, u - interp(u, F))


def _advection(ns: NavierStokes, s: SEM, u, c):
    """−(u·∇)c nodal for fields ``c: (m, E, n, n, n)`` carried by ``u: (3, E, n, n, n)`` (weak on
    the dealiasing rule — the backend's :meth:`~jaxsem.backends.Backend.convection` —, assembled,
    times B⁻¹): ``(m, E, n, n, n)``."""
    return -ns.binv * s.dssum(s.backend.convection(c, u, ns.Jd, ns.Dd, ns.Brx))


def _weak_grad_t(s: SEM, R):
    """(∇φ, R) element by element: ``R: (3, E, n, n, n) -> (E, n, n, n)``."""
    rx, B = s.geom.rx, s.bmass
    w = [B * (rx[a, 0] * R[0] + rx[a, 1] * R[1] + rx[a, 2] * R[2]) for a in range(3)]
    return s.backend.grad_gll_t(w[0], w[1], w[2], s.D)


def _lift(ns: NavierStokes, s: SEM, t):
    """The velocity data at time t on the Dirichlet nodes, 0 elsewhere: ``(3, E, n, n, n)``."""
    return ns.bc.velocity(s, t)


def _pressure_solve(ns: NavierStokes, bp, p0, t, guess=None, basis=None):
    """(∇q, ∇p) = bp with the pressure data at time ``t`` on the outflow nodes (lifted), or
    pure Neumann (the solution orthogonal to the constants: zero mean), p-multigrid PCG from
    ``p0``, or with ``basis = (X, G, nx)`` (:class:`State`) from the projection onto it;
    ``(p, PCGInfo, basis)``, the basis updated; ``guess``: the adjoint solve's
    (:func:`step`). Rank-local."""
    o, P = ns.options, ns.pressure
    pb = ns.bc.pressure(P.sem, t)
    if pb is not None:
        bp = bp - P.apply(pb)
    if basis is not None:
        p0 = _projection(P, basis, lax.stop_gradient(bp))
    p, info = solve_local(P, bp, x0=P.sem.mask * p0, tol=o.pressure_tol, maxiter=o.pressure_maxiter,
                          adjoint_guess=guess)
    if basis is not None:
        basis = _remember(P, basis, lax.stop_gradient(p))
    if P.nullspace:
        p = p - ns.psem.integrate(p) / ns.volume
    return (p if pb is None else p + pb), info, basis


def _projection(P: Helmholtz, basis, b):
    """x̄: the best approximation, in the A-norm, of the solution of A x = ``b`` in the span of
    the past solutions ``basis = (X, G, nx)`` (:class:`State`): x̄ = Σ cᵢ xᵢ with G c = (xᵢ, b),
    solved on the eigenvectors of G above 10⁻¹² of its largest eigenvalue (past solutions are
    nearly parallel; an empty slot is a zero row)."""
    X, G, _ = basis
    g = P.sem.dots([(X[i], b) for i in range(X.shape[0])])
    lam, V = jnp.linalg.eigh(G)
    keep = lam > 1e-12 * jnp.max(lam)
    c = V @ (jnp.where(keep, (V.T @ g) / jnp.where(keep, lam, 1), 0))
    return jnp.tensordot(c, X, 1)


def _remember(P: Helmholtz, basis, x):
    """The basis with the solution ``x`` in the slot of the oldest one, and its row and column
    (xᵢ, A x) of the Gram matrix (one operator application)."""
    X, G, nx = basis
    L = X.shape[0]
    j = nx % L
    X = lax.dynamic_update_index_in_dim(X, x, j, 0)
    ax = P.apply(x)
    row = P.sem.dots([(X[i], ax) for i in range(L)])
    G = G.at[j, :].set(row).at[:, j].set(row)
    return jax.tree.map(lax.stop_gradient, (X, G, nx + 1))


def _velocity(ns: NavierStokes, h2) -> Helmholtz:
    """(h₂B + νA) on the velocity space, Jacobi-preconditioned (no set-up: built each step)."""
    return Helmholtz.of(ns.sem, ns.nu, h2, diagonals=ns.diagonals)


def _velocity_by_component(ns: NavierStokes, s: SEM, h2, w, ux, L):
    """The velocity solve where symmetry planes hold some components: one solve per component,
    each with its own Dirichlet nodes (``ns.bc.component_mask``); ``w``: the element right-hand
    side. Returns the homogeneous part ``(3, E, n, n, n)`` and the :class:`PCGInfo` of the three
    (most iterations, largest residuals, converged only if all did)."""
    o, m = ns.options, ns.bc.component_mask
    us, infos = [], []
    for c in range(3):
        V = Helmholtz.of(s.with_mask(m[c], s.dirichlet), ns.nu, h2, diagonals=ns.diagonals)
        b = m[c] * s.dssum(w[c])
        if L is not None:
            b = b - V.apply(L[c])
        u, info = solve_local(V, b, x0=m[c] * ux[c], tol=o.velocity_tol, maxiter=o.velocity_maxiter)
        us.append(u)
        infos.append(info)
    return jnp.stack(us), _merge(infos)


def _merge(infos) -> PCGInfo:
    """Several solves as one :class:`PCGInfo`: the most iterations, the largest residuals,
    converged only if all did."""
    merge = {"converged": lambda a: jnp.all(a, axis=0), "breakdown": lambda a: jnp.any(a, axis=0),
             "history": lambda a: jnp.nanmax(a, axis=0)}
    return PCGInfo(*(merge.get(f, lambda a: jnp.max(a, axis=0))(jnp.stack([getattr(i, f) for i in infos]))
                     for f in PCGInfo._fields))


def _no_solve(ns: NavierStokes) -> PCGInfo:
    """The :class:`PCGInfo` of no solve (a flow without scalars): converged, 0 iterations."""
    dtype = ns.sem.x.dtype
    zero = jnp.zeros((), dtype)
    return PCGInfo(iterations=jnp.zeros((), jnp.int32), residual=zero, residual0=zero,
                   converged=jnp.asarray(True), history=jnp.full((ns.options.velocity_maxiter + 1,), jnp.nan, dtype),
                   true_relative_residual=zero, breakdown=jnp.asarray(False))


def _scalars_local(ns: NavierStokes, s: SEM, st: State, beta, a, t1):
    """The scalars at the new level: ``(T, FT, PCGInfo)``. Advection extrapolated from the past
    levels' velocity and scalars; (β₀/Δt B + κA)θ = B(Σβᵢθⁿ⁺¹⁻ⁱ/Δt + Σaᵢ N_θ + q) + ∮ v g,
    θ = θ₀ + the Value data."""
    if not ns.scalars:
        return st.T, st.FT, _no_solve(ns)
    o, dt = ns.options, ns.dt
    FT = jnp.concatenate([_advection(ns, s, st.U[0], st.T[0])[None], st.FT])  # k levels; the state keeps k − 1
    Tb = jnp.tensordot(beta[1:], st.T, 1) / dt
    Fx = jnp.tensordot(a, FT, 1)
    Tx = jnp.tensordot(a, st.T, 1)
    h2 = beta[0] / dt
    out, infos = [], []
    for i, f in enumerate(ns.scalars):
        ts = f.sem(s)
        H = Helmholtz.of(ts, f.kappa, h2, diagonals=ns.diagonals)
        w = s.bmass * (Tb[i] + Fx[i])
        if f.source is not None:
            w = w + s.bmass * jnp.asarray(f.source(s.x[0], s.x[1], s.x[2], t1), s.x.dtype)
        g = f.flux(s, t1)
        b = ts.mask * s.dssum(w if g is None else w + g)
        L = f.values(s, t1) if f.value_data else None
        if L is not None:
            b = b - H.apply(L)
        th, info = solve_local(H, b, x0=ts.mask * Tx[i], tol=o.velocity_tol, maxiter=o.velocity_maxiter)
        out.append(th if L is None else th + L)
        infos.append(info)
    return jnp.concatenate([jnp.stack(out)[None], st.T[:-1]]), FT[:-1], _merge(infos)


def _step_local(ns: NavierStokes, st: State, guess=None):
    s, ps, o = ns.sem, ns.psem, ns.options
    k, dt = o.time_order, ns.dt
    dtype = s.x.dtype
    Btab, Atab = _coefficient_tables(k, dtype)
    j = jnp.minimum(st.past, k - 1)  # ramp-up: order min(past + 1, k)
    beta, a = Btab[j], Atab[j]
    t1 = st.t + dt

    T, FT, sinfo = _scalars_local(ns, s, st, beta, a, t1)
    F = jnp.concatenate([_explicit(ns, s, st.U[0])[None], st.F])  # k levels; the state keeps k − 1
    Fx = jnp.tensordot(a, F, 1)
    if ns.buoyancy is not None:  # the new scalar's force (Boussinesq)
        bu = ns.buoyancy
        Fx = Fx + bu.vector[:, None, None, None, None] * (T[0, bu.index] - bu.reference)[None]
    dr = ns.drive
    if dr is not None and not dr.flow_rate:  # a uniform force along the axis
        Fx = Fx.at[dr.axis].add(dr.value * s.valid)
    Ub = jnp.tensordot(beta[1:], st.U, 1) / dt
    ux = jnp.tensordot(a, st.U, 1)
    R = Ub + Fx - ns.nu * _curl(ns, s, _curl(ns, s, ux))

    # pressure: (∇q, ∇p) = (∇q, R) − β₀/Δt ∮ q u_b·n
    bp = _weak_grad_t(s, R)
    L = None
    if ns.walls:
        L = _lift(ns, s, t1)
        g = _grad(s, L)
        bp = bp - beta[0] / dt * (_weak_grad_t(s, L) + s.bmass * (g[0, 0] + g[1, 1] + g[2, 2]))
    # the pressure history is one level shorter than the velocity's (no p⁰): EXT of order min(step, k)
    pa = Atab[jnp.clip(jnp.minimum(st.step, st.past) - 1, 0, k - 1)]
    guess = guess or {}
    basis = (st.X, st.G, st.nx) if o.pressure_projection else None
    p, pinfo, basis = _pressure_solve(ns, ps.dssum(bp), jnp.tensordot(pa, st.P, 1), t1, guess.get("p"), basis)
    X, G, nx = basis if basis is not None else (st.X, st.G, st.nx)

    # velocity: (β₀/Δt) B u + ν A u = B(Ub + Fx − ∇p), u = u₀ + L
    h2 = beta[0] / dt
    V = _velocity(ns, h2)
    gp = _grad(s, p[None])[:, 0]
    w = s.bmass * (Ub + Fx - gp)
    g = ns.bc.flux(s, t1)
    bv = s.mask * s.dssum(w if g is None else w + g)
    x0 = s.mask * ux
    if L is not None:
        bv = bv - V.apply(L)
    if ns.bc.symmetry_groups:
        u0, vinfo = _velocity_by_component(ns, s, h2, w if g is None else w + g, ux, L)
    else:
        u0, vinfo = solve_local(V, bv, x0=x0, tol=o.velocity_tol, maxiter=o.velocity_maxiter,
                                adjoint_guess=guess.get("u"))
    u = u0 if L is None else u0 + L
    drive = jnp.zeros((2,), dtype)
    if dr is not None:
        push = dr.value
        if dr.flow_rate:  # u* + α u_s, u_s the step's response to a unit force along the axis
            us, uinfo = solve_local(V, s.mask * s.dssum(s.bmass), x0=jnp.zeros_like(s.mask), tol=o.velocity_tol,
                                    maxiter=o.velocity_maxiter)
            vinfo = _merge([vinfo, uinfo])
            push = (dr.value - s.integrate(u[dr.axis]) / ns.volume) / (s.integrate(us) / ns.volume)
            u = u.at[dr.axis].add(push * us)
            Fx = Fx.at[dr.axis].add(push * s.valid)
        drive = jnp.stack([s.integrate(u[dr.axis]) / ns.volume, push])
    U = jnp.concatenate([u[None], st.U[:-1]])
    P = jnp.concatenate([p[None], st.P[:-1]])
    force = _forces_local(ns, s, V, u, p, Ub + Fx)
    return (State(U=U, F=F[:-1], P=P, step=st.step + 1, t=t1, past=st.past + 1, T=T, FT=FT, X=X, G=G, nx=nx),
            StepInfo(pinfo, vinfo, force, sinfo, drive))


def _forces_local(ns: NavierStokes, s: SEM, V: Helmholtz, u, p, f):
    """``(F, 3)`` the force of the flow on each group of ``ns.force_groups``: −∮ φ (ν∂u/∂n − p n),
    the traction's integral read off the residual of the discrete momentum equation
    (β₀/Δt B + νA)u − B f − (∇·(φ eᵢ), p) at the group's nodes (φ = 1 there, 0 at every other
    node), as Nek computes drag and lift: it is exact for the discrete solution, needs no
    normals, and converges faster than the surface integral of the traction. ``f``: the
    explicit part of the right-hand side, Σβᵢuⁿ⁺¹⁻ⁱ/Δt + F (nodal, ``(3, E, n, n, n)``)."""
    if not ns.force_groups:
        return jnp.zeros((0, 3), s.x.dtype)
    r = V.apply_elements(u) - s.bmass * f  # (3, E, n, n, n), element-local: φ is continuous
    out = []
    for phi in ns.force_weight:
        dphi = _grad(s, phi[None])[:, 0]  # (3, E, n, n, n)
        t = jnp.stack([jnp.sum(phi * r[i]) - jnp.sum(s.bmass * p * dphi[i]) for i in range(3)])
        out.append(-s.comm.allreduce(t))
    return jnp.stack(out)


def step(ns: NavierStokes, state: State, guess=None):
    """One time step: ``(State, StepInfo)``. Pure; differentiable w.r.t. ``ns.nu`` and the state.

    ``guess``: None, or ``adjoint_guess(state)``'s dict (``"p"``, ``"u"``): the guesses that start
    the adjoint pressure and velocity solves, whose cotangents are those solves' results
    (:func:`jaxsem.solvers.pcg.linear_solve`); the binomial schedule of :func:`simulate` hands
    them from step to step. Values and forward derivatives do not depend on them."""
    return ns.sem.local_map(lambda _, ns, st, g: _step_local(ns, st, g), ns, state, guess)


def adjoint_guess(state: State) -> dict:
    """Zero guesses for :func:`step`'s adjoint solves: ``{"p": (E, n, n, n), "u": (3, E, n, n, n)}``."""
    return dict(p=jnp.zeros_like(state.P[0]), u=jnp.zeros_like(state.U[0]))


def simulate(ns: NavierStokes, state: State, num_steps: int, *, info: bool = False,
             checkpointing: Checkpointing = Checkpointing()):
    """``num_steps`` steps as one ``lax.scan`` (pure, differentiable). Returns the final state;
    with ``info=True`` ``(state, StepInfo)``, the :class:`StepInfo` of every step stacked
    (``converged: (num_steps,)`` and so on), so that a loss can see whether its solves converged
    (return it as ``has_aux``). An adjoint solve that misses its tolerance warns
    (:class:`jaxsem.solvers.pcg.AdjointNotConvergedWarning`).

    ``checkpointing``: the memory schedule of ``jax.grad`` through the steps
    (:class:`jaxsem.solvers.timestepping.Checkpointing`): the default keeps every step's
    residuals (memory ∝ ``num_steps``); ``Checkpointing("sqrt")`` stores one state (with its
    BDF/EXT history) per chunk of ⌈√num_steps⌉ steps and recomputes each chunk in the reverse
    pass, for one more forward run; ``Checkpointing(snapshots=s)`` stores at most ``s + 1``
    states and recomputes the fewest steps any schedule with that memory can (binomial
    schedule; about ``t`` more forward runs where ``C(s + t, t) ≥ num_steps``). Values do not
    depend on it; gradients only to the solves' tolerances, since the binomial schedule starts
    each step's adjoint pressure and velocity solves from those of the steps after it
    (extrapolated as the forward pass extrapolates the pressure) instead of from zero.

    Raises ``NotImplementedError`` for the binomial schedule on a run sharded over several GPUs
    (``setup(devices=...)``): XLA's GPU compiler (jax 0.11.2) crashes the process compiling that
    gradient, and under its GSPMD partitioner the gradient is not yet checked (docs/gradients.md);
    ``Checkpointing("sqrt")`` runs there. ``JAXSEM_TRY_SHARDED_BINOMIAL=1`` lets it through, to
    check a newer JAX (``python -m experiments.ns_gradient_compile_check cuda 2 binomial 4``)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
    _refuse_sharded_binomial_on_gpus(ns.sem.comm, checkpointing)

    def body(st, _, g):
        st, i = step(ns, st, g)
        return st, (i if info else None)

    st, infos = checkpointed_scan(body, state, int(num_steps), checkpointing, adjoint_guess=adjoint_guess(state))
    return (st, infos) if info else st


def _refuse_sharded_binomial_on_gpus(comm, checkpointing) -> None:
    """The binomial schedule under ``ShardComm`` over several GPUs: a clear error, not the
    segmentation fault of XLA's GPU compiler under Shardy (experiments/results/shardy_crash_h200x4.json).
    Under GSPMD the same program's gradient came out NaN at 18³ elements; on CPU devices the same
    failure was an adjoint-guess defect, since fixed (ns_binomial_sharded_cpu.json), but the GPU
    run has not been repeated, so the refusal stands until it is."""
    if (not isinstance(checkpointing, Checkpointing) or checkpointing.snapshots is None
            or os.environ.get("JAXSEM_TRY_SHARDED_BINOMIAL") == "1"):
        return
    gpus = gpu_devices(comm)
    if gpus > 1:
        raise NotImplementedError(
            f"checkpointing=Checkpointing(snapshots={checkpointing.snapshots}) on a run sharded over "
            f"{gpus} GPUs: XLA's GPU compiler (jax {jax.__version__}) crashes the process compiling "
            "this gradient (docs/gradients.md); take it with Checkpointing(\"sqrt\") over the GPUs "
            "(measured equal to one GPU's), or on one GPU")


def initial_state(ns: NavierStokes, velocity, t0: float = 0.0, past: Callable | None = None,
                  scalars: dict | None = None) -> State:
    """The state at ``t0`` from ``velocity``: a callable ``(x, y, z) -> (3, ...)`` (jnp) or a
    ``(3, E, n, n, n)`` array of nodal values; on Dirichlet nodes the boundary data at ``t0``
    replaces it.

    ``scalars``: ``{name: θ₀}`` the initial value of each scalar of ``ns``, a number, a callable
    ``(x, y, z) -> (...)`` or an ``(E, n, n, n)`` array (a scalar not given starts at 0); on its
    :class:`~jaxsem.models.navier_stokes.scalars.Value` nodes the data at ``t0`` replaces it.

    ``past``: None (the first steps ramp the order up, 1, 2, …, k, as Nek does: the
    first-order start limits the global error to O(Δt²) for k = 3), or ``u(x, y, z, t)``
    giving the velocity at ``t0 − Δt``, ``t0 − 2Δt``, … (an exact solution), so that every
    step runs at order k.
    """
    if past is not None and ns.scalars:
        raise ValueError("past (an exact velocity history) is not supported with scalars: start them at order 1")
    s = ns.sem
    u = velocity(s.x[0], s.x[1], s.x[2]) if callable(velocity) else velocity
    levels = [_nodal(ns, u, t0, "velocity")]
    k = ns.options.time_order
    if past is not None:
        if not callable(past):
            raise TypeError(f"past must be None or a callable u(x, y, z, t) -> (3, ...), got {past!r}")
        levels += [_nodal(ns, past(s.x[0], s.x[1], s.x[2], t0 - i * ns.dt), t0 - i * ns.dt, "past")
                   for i in range(1, k)]
    U = jnp.stack(levels + [levels[-1]] * (k - len(levels)))
    F = (jnp.stack([ns.sem.local_map(lambda s_, ns_, v: _explicit(ns_, s_, v), ns, U[i]) for i in range(1, k)])
         if past is not None and k > 1 else jnp.zeros_like(U[1:]))
    step, t, past_ = replicated(s, (np.int32(0), np.asarray(t0, s.x.dtype), np.int32(len(levels) - 1)))
    th = _scalar_start(ns, scalars or {}, t0)
    T = jnp.stack([th] * k)
    L = ns.options.pressure_projection
    X = s.local_map(lambda s_: jnp.zeros((L,) + s_.mask.shape, s_.x.dtype))  # laid out as the fields
    G, nx = replicated(s, (np.zeros((L, L), s.x.dtype), np.int32(0)))
    return State(U=U, F=F, P=jnp.zeros_like(U[:, 0]), step=step, t=t, past=past_, T=T, FT=jnp.zeros_like(T[1:]),
                 X=X, G=G, nx=nx)


def _scalar_start(ns: NavierStokes, given: dict, t0) -> jax.Array:
    """``(S, E, n, n, n)`` the scalars' start values (checked), with their Value data at ``t0``."""
    if not isinstance(given, dict):
        raise TypeError(f"scalars must be a dict {{name: initial value}}, got {type(given).__name__}")
    unknown = [k for k in given if k not in ns.scalar_names]
    if unknown:
        raise ValueError(f"scalars names {unknown}, which the flow does not carry; its scalars: "
                         f"{list(ns.scalar_names)}")
    s = ns.sem
    out = []
    for f in ns.scalars:
        v = given.get(f.name, 0.0)
        v = v(s.x[0], s.x[1], s.x[2]) if callable(v) else v
        v = jnp.broadcast_to(jnp.asarray(v, s.x.dtype), s.mask.shape)
        if not isinstance(v, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(v))):
            raise ValueError(f"scalars[{f.name!r}] has NaN/Inf values")

        def local(s_, f_, v_):
            return s_.valid * (f_.mask * v_ + (f_.values(s_, t0) if f_.value_data else 0.0))

        out.append(s.local_map(local, f, v))
    if out:
        return jnp.stack(out)
    return s.local_map(lambda s_: jnp.zeros((0,) + s_.mask.shape, s_.x.dtype))  # laid out as the fields


def _nodal(ns: NavierStokes, u, t, name):
    """Velocity values ``(3, E, n, n, n)`` checked, with the boundary data at ``t`` on Dirichlet nodes."""
    s = ns.sem
    u = jnp.asarray(u, s.x.dtype)
    if u.shape != (3,) + s.mask.shape:
        raise ValueError(f"{name} must give shape {(3,) + s.mask.shape}, got {u.shape}")
    if not isinstance(u, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(u))):
        raise ValueError(f"{name} has NaN/Inf values")
    if not ns.walls and ns.bc.component_mask is None:
        return s.valid * u
    t = jnp.asarray(t, s.x.dtype)
    m = s.mask if ns.bc.component_mask is None else ns.bc.component_mask
    return s.valid * (m * u + s.local_map(lambda s_, bc, t_: bc.velocity(s_, t_), ns.bc, t))


def _diagnostics_local(ns: NavierStokes, st: State):
    s = ns.sem
    u = st.U[0]
    w = _curl(ns, s, u)
    g = _grad(s, u)
    div = g[0, 0] + g[1, 1] + g[2, 2]
    ek = 0.5 * s.integrate(jnp.sum(u * u, 0)) / ns.volume
    z = 0.5 * s.integrate(jnp.sum(w * w, 0)) / ns.volume
    dn = jnp.sqrt(s.integrate(div * div) / jnp.maximum(s.integrate(jnp.sum(g * g, (0, 1))), 1e-300))
    # local GLL spacing along each reference axis (the smaller neighbour gap)
    r = jnp.asarray(basis.gll_points(s.order)[0], s.x.dtype)
    gap = jnp.diff(r)
    dr = jnp.minimum(jnp.concatenate([gap[:1], gap]), jnp.concatenate([gap, gap[-1:]]))
    rx = s.geom.rx
    c = 0.0
    for a, shape in zip(range(3), ((1, 1, -1), (1, -1, 1), (-1, 1, 1))):
        c = c + jnp.abs(rx[a, 0] * u[0] + rx[a, 1] * u[1] + rx[a, 2] * u[2]) / dr.reshape(shape)
    # not differentiated (a max over ranks has no derivative rule): jax.grad of another field passes
    cfl = s.comm.allreduce(jax.lax.stop_gradient(jnp.max(s.valid * c)), "max") * ns.dt
    return Diagnostics(ek, z, dn, cfl)


def surface_force(ns: NavierStokes, state: State, group: str):
    """``(3,)`` the force of the flow on the boundary ``group`` as the plain surface integral
    −∮ (−p n + ν(∇u + ∇uᵀ)n) dA of the traction of ``state`` (density 1; n out of the flow).
    A check of the residual force of :class:`StepInfo`, which converges faster: the velocity
    gradient here is element-local and read on the boundary."""
    surf = sf.surface(ns.sem, (group,))
    g = ns.sem.local_map(lambda s, u: _grad(s, u), state.u)  # g[i, j] = ∂u_j/∂x_i
    gf, pf, nf = sf.face_values(surf, g), sf.face_values(surf, state.p), surf.normal
    # traction_j = −p n_j + ν Σ_i (∂u_j/∂x_i + ∂u_i/∂x_j) n_i
    t = -pf * nf + ns.nu * (jnp.einsum("ij...,i...->j...", gf, nf) + jnp.einsum("ji...,i...->j...", gf, nf))
    return -sf.integrate(ns.sem, surf, t)


def scalar_flux(ns: NavierStokes, state: State, scalar: str, group: str):
    """``()`` the diffusive flux of ``scalar`` into the flow through the boundary ``group``,
    ∮ κ ∇θ·n dA of ``state`` (n out of the flow, so that the flux −κ∇θ·n leaving through the
    wall is its negative; the gradient element-local, read on the boundary): a wall's heat
    flux, from which a Nusselt number follows. ``ValueError`` naming an unknown scalar."""
    if scalar not in ns.scalar_names:
        raise ValueError(f"scalar {scalar!r} is not carried by this flow; its scalars: {list(ns.scalar_names)}")
    i = ns.scalar_names.index(scalar)
    surf = sf.surface(ns.sem, (group,))
    g = ns.sem.local_map(lambda s, th: _grad(s, th[None])[:, 0], state.T[0, i])  # (3, E, n, n, n)
    return ns.scalars[i].kappa * sf.flux(ns.sem, surf, g)


def vorticity(ns: NavierStokes, state: State):
    """ω = ∇×u of ``state`` at the nodes (mass-averaged over shared nodes): ``(3, E, n, n, n)``."""
    return ns.sem.local_map(lambda s_, ns_, u: _curl(ns_, s_, u), ns, state.u)


def _kinetic_energy(ns: NavierStokes, st: State):
    return ns.sem.local_map(lambda s, ns_, u: 0.5 * s.integrate(jnp.sum(u * u, 0)) / ns_.volume, ns, st.u)


def diagnostics(ns: NavierStokes, state: State) -> Diagnostics:
    """:class:`Diagnostics` of ``state`` (global: summed over every rank and device)."""
    return ns.sem.local_map(lambda _, ns, st: _diagnostics_local(ns, st), ns, state)
