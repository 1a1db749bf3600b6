"""Incompressible Navier–Stokes: the PN–PN splitting of Nek5000, NekRS and Neko.

∂u/∂t + (u·∇)u = −∇p + ν∇²u, ∇·u = 0 (density 1), velocity and pressure both of
order N on the GLL nodes. One step from tⁿ to tⁿ⁺¹ (BDFk/EXTk, k = 1, 2, 3, fixed Δt;
Karniadakis, Israeli & Orszag 1991, in the form of Tomboulides, Lee & Orszag 1997):

1. N(uⁿ) = −(uⁿ·∇)uⁿ, weak, on a Gauss rule of q = ⌈3(N+1)/2⌉ points per axis (the
   3/2 rule, no aliasing of the quadratic term), made nodal with the assembled
   inverse mass; extrapolated: F = Σᵢ aᵢ N(uⁿ⁺¹⁻ⁱ).
2. R = Σᵢ βᵢ uⁿ⁺¹⁻ⁱ/Δt + F − ν ∇×ω̃, ω̃ = ∇×(Σᵢ aᵢ uⁿ⁺¹⁻ⁱ) (the rotational form of
   the viscous term, ν∇²u = −ν∇×∇×u for ∇·u = 0: the pressure's Neumann condition
   follows the extrapolated vorticity, no spurious boundary layer).
3. Pressure Poisson, weak, with its Neumann data built in:
   (∇q, ∇p) = (∇q, R) − (β₀/Δt) ∮ q u_b·n, the boundary integral taken as
   (∇q, L) + (q, ∇·L) of the lift L of the velocity data; pure Neumann (constants
   removed from the right-hand side), p-multigrid PCG from the previous pressure.
4. Velocity Helmholtz, three components in one Jacobi-PCG:
   (β₀/Δt) B u + ν A u = B(Σᵢ βᵢ uⁿ⁺¹⁻ⁱ/Δt + F − ∇p), Dirichlet data lifted.

The first steps ramp the order up (1, 2, …, k), as Nek does. Periodic axes come
from the mesh; every other boundary face carries the velocity data ``boundary``
(no-slip when None). :func:`step` and :func:`simulate` are pure and differentiable
(the solves by implicit differentiation); :func:`run` is the host driver (chunks,
progress bar, NaN check naming the step, checkpoints that carry the BDF history, a
time series of diagnostics). Sharded over devices or under MPI the same code runs
per rank inside :meth:`SEM.local_map`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis
from ..core import geometry as geo
from ..discretization.sem import SEM, discretize
from ..discretization.shard import replicated
from ..mesh.box import Mesh
from ..operators import stiffness_diagonal
from ..operators.tensor import grad_gll, grad_gll_t, interp, interp_t
from ..solvers import multigrid
from ..solvers import timestepping as ts
from ..solvers.pcg import PCGInfo, linear_solve, min_tol
from ..solvers.stops import SolveFailedError, UnstableRunError
from . import poisson

__all__ = ["NSOptions", "NavierStokes", "State", "StepInfo", "StabilityWarning", "Diagnostics", "Series",
           "setup", "initial_state", "step", "simulate", "diagnostics", "vorticity", "run", "bdf_ext"]

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
    """

    time_order: int = 3
    pressure_tol: float = 1e-8
    velocity_tol: float = 1e-10
    pressure_maxiter: int = 300
    velocity_maxiter: int = 1000
    dealias: bool = True
    pmg: multigrid.PMGOptions = multigrid.PMGOptions()
    max_cfl: float = 4.0

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NavierStokes:
    """A discretized incompressible flow problem (pytree; built by :func:`setup`).

    Attributes (E elements, n = N + 1 GLL points, q dealiasing points per axis):
      sem: velocity discretization (mask 0 on the Dirichlet nodes of non-periodic faces).
      psem: pressure discretization (the same nodes, no mask: pure Neumann).
      pmg: the pressure's p-multigrid preconditioner.
      nu: ``()`` kinematic viscosity (a leaf: ``jax.grad`` reaches it).
      dt: ``()`` time step Δt (a leaf: a run with another Δt reuses the compiled programs;
        the host drivers read it with ``float``).
      binv: ``(E, n, n, n)`` inverse assembled GLL mass (0 on pads).
      Jd: ``(q, n)`` GLL → Gauss interpolation of the dealiasing rule (``(n, n)`` identity
        without dealiasing).
      Brx: ``(3, 3, E, q, q, q)`` B·∂r_a/∂x_d on the dealiasing rule.
      options: static :class:`NSOptions`; boundary: static
        ``u_b(x, y, z, t) -> (3, ...)`` or None (no-slip); walls: static, the velocity
        has Dirichlet nodes; volume: static |Ω|.
    """

    sem: SEM
    psem: SEM
    pmg: multigrid.PMG
    nu: jax.Array
    dt: jax.Array
    binv: jax.Array = dataclasses.field(metadata=dict(pad=0))
    Jd: jax.Array
    Brx: jax.Array = dataclasses.field(metadata=dict(pad=0))
    options: NSOptions = dataclasses.field(metadata=dict(static=True))
    boundary: Callable | None = dataclasses.field(metadata=dict(static=True))
    walls: bool = dataclasses.field(metadata=dict(static=True))
    volume: float = dataclasses.field(metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """The solution and its BDF/EXT history (pytree).

    ``U: (k, 3, E, n, n, n)`` velocities uⁿ, uⁿ⁻¹, … (newest first); ``F: (k, 3, E, n, n, n)``
    the convective terms N(uⁿ⁻¹), N(uⁿ⁻²), … of the past levels; ``P: (k, E, n, n, n)`` the
    pressures pⁿ, pⁿ⁻¹, … (zero mean; extrapolated, they start the next pressure solve);
    ``step: ()`` int32 steps taken; ``t: ()`` time; ``past: ()`` int32 past levels held (the
    next step runs at order min(past + 1, k)).
    """

    U: jax.Array
    F: jax.Array
    P: jax.Array
    step: jax.Array
    t: jax.Array
    past: jax.Array

    @property
    def u(self):
        """``(3, E, n, n, n)`` the current velocity."""
        return self.U[0]

    @property
    def p(self):
        """``(E, n, n, n)`` the current pressure (zero mean; 0 before the first step)."""
        return self.P[0]


class StabilityWarning(UserWarning):
    """A run starts with a CFL number above 1: stable only where viscosity damps the convection."""


class StepInfo(NamedTuple):
    """The solves of one step: pressure and velocity :class:`PCGInfo`."""

    pressure: PCGInfo
    velocity: PCGInfo


class Diagnostics(NamedTuple):
    """Volume averages of the current state (scalars): ``kinetic_energy`` ⟨½|u|²⟩,
    ``enstrophy`` ⟨½|ω|²⟩, ``divergence`` ‖∇·u‖/‖∇u‖ (L2, element-local derivatives),
    ``cfl`` Δt·max Σ_a |u·∇r_a|/Δr_a (the local GLL spacing Δr; not differentiated w.r.t. u)."""

    kinetic_energy: jax.Array
    enstrophy: jax.Array
    divergence: jax.Array
    cfl: jax.Array


def _all_free(sem):
    """The assembled-storage map of ``sem`` with no Dirichlet nodes (the pressure's), or None."""
    if sem.assembled is None:
        return None
    a = sem.assembled
    return dataclasses.replace(a, idx=jnp.where(sem.valid > 0, sem.gs.gid.reshape(sem.mask.shape), a.size).astype(jnp.int32))


def setup(mesh: Mesh, nu: float, dt: float, *, boundary: Callable | None = None,
          options: NSOptions = NSOptions(), backend: str = "auto", devices=None, comm=None,
          partition=None, collective: str = "auto") -> NavierStokes:
    """Discretize a flow problem on ``mesh`` and build the pressure preconditioner.

    Args:
      mesh: a :class:`jaxsem.mesh.Mesh` (periodic axes from the mesh; every other boundary
        face is a velocity Dirichlet boundary).
      nu: kinematic viscosity ν > 0 (1/Re in convective units).
      dt: time step Δt > 0.
      boundary: Dirichlet velocity data ``u_b(x, y, z, t) -> (3, ...)`` written with jnp,
        or None (no-slip walls); unused on a fully periodic mesh. It is static: problems
        built with the same function object (not a new closure each time) share compiled
        programs.
      options: :class:`NSOptions`.
      backend, devices, comm, partition, collective: as :func:`jaxsem.discretize`.
    Raises ``ValueError`` naming the argument for a bad ``nu``, ``dt`` or ``boundary``.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    for name, v in (("nu", nu), ("dt", dt)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                or not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    if boundary is not None and not callable(boundary):
        raise TypeError(f"boundary must be None or a callable u_b(x, y, z, t) -> (3, ...), got {boundary!r}")
    if not isinstance(options, NSOptions):
        raise TypeError(f"options must be an NSOptions, got {type(options).__name__}")
    sem = discretize(mesh, dirichlet=True, backend=backend, devices=devices, comm=comm, partition=partition,
                     collective=collective)
    walls = float(sem.comm.allreduce(jnp.sum((sem.mask == 0) * sem.valid))) > 0
    psem = dataclasses.replace(sem, mask=jnp.broadcast_to(sem.valid, sem.mask.shape) * jnp.ones_like(sem.mask),
                               assembled=_all_free(sem)) if walls else sem
    pmg = poisson.pmg(psem, mesh, 1.0, 0.0, options=options.pmg, partition=partition)
    if boundary is not None and walls:
        probe = jax.eval_shape(boundary, sem.x[0], sem.x[1], sem.x[2], 0.0)
        if probe.shape != (3,) + sem.x.shape[1:]:
            raise ValueError(f"boundary must return (3, ...) shaped like its coordinates, got {probe.shape} "
                             f"for coordinates {sem.x.shape[1:]}")
    n = sem.n
    if options.dealias:
        q = math.ceil(3 * n / 2)
        rule = geo.quadrature(sem.order, "gauss", q=q)
        Jd, Dd, wd = (jnp.asarray(a, sem.x.dtype) for a in (rule.J, rule.Dt, rule.w))
    else:
        Jd = jnp.eye(n, dtype=sem.x.dtype)
        Dd = sem.D
        wd = jnp.asarray(basis.gll_points(sem.order)[1], sem.x.dtype)
    binv, Brx = sem.local_map(_fields, Jd, Dd, wd)
    volume = float(sem.integrate(jnp.ones_like(sem.mask)))
    return NavierStokes(sem=sem, psem=psem, pmg=pmg, nu=jnp.asarray(float(nu), sem.x.dtype),
                        dt=jnp.asarray(float(dt), sem.x.dtype), binv=binv, Jd=Jd, Brx=Brx, options=options,
                        boundary=boundary if walls else None, walls=walls, volume=volume)


def _fields(s: SEM, Jd, Dd, wd):
    d = s.dssum(s.bmass)
    binv = s.valid / jnp.where(d > 0, d, 1.0)
    g = geo.factors(s.x, Jd, Dd, wd, False)
    return binv, g.B * g.rx * s.valid


# --- spatial terms (rank-local: called inside SEM.local_map) ------------------------------

def _grad(s: SEM, u):
    """``g[i, j] = ∂u_j/∂x_i`` element by element: ``u: (c, E, n, n, n) -> (3, c, E, n, n, n)``."""
    ur, us, ut = grad_gll(u, s.D)
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
    J = ns.Jd
    ur, us, ut = grad_gll(u, s.D)
    uq = interp(u, J)
    c = [ns.Brx[a, 0] * uq[0] + ns.Brx[a, 1] * uq[1] + ns.Brx[a, 2] * uq[2] for a in range(3)]
    w = c[0] * interp(ur, J) + c[1] * interp(us, J) + c[2] * interp(ut, J)
    return -ns.binv * s.dssum(interp_t(w, J))


def _weak_grad_t(s: SEM, R):
    """(∇φ, R) element by element: ``R: (3, E, n, n, n) -> (E, n, n, n)``."""
    rx, B = s.geom.rx, s.bmass
    w = [B * (rx[a, 0] * R[0] + rx[a, 1] * R[1] + rx[a, 2] * R[2]) for a in range(3)]
    return grad_gll_t(w[0], w[1], w[2], s.D)


def _lift(ns: NavierStokes, s: SEM, t):
    """The velocity data at time t on the Dirichlet nodes, 0 elsewhere: ``(3, E, n, n, n)``."""
    if ns.boundary is None:
        return jnp.zeros((3,) + s.mask.shape, s.x.dtype)
    ub = jnp.asarray(ns.boundary(s.x[0], s.x[1], s.x[2], t), s.x.dtype)
    return (1.0 - s.mask) * s.valid * ub


def _velocity_operator(s: SEM, nu, h2):
    Ke = poisson.local_operator(s, 1.0, 0.0)
    return lambda u: s.mask * s.dssum(nu * Ke(u) + h2 * s.bmass * u)


def _velocity_jacobi(s: SEM, nu, h2):
    d = s.dssum(nu * stiffness_diagonal(s.J, s.Dt, s.geom.G) + h2 * s.bmass)
    return s.mask / jnp.where(s.mask > 0, d, 1.0)


def _pressure_solve(ns: NavierStokes, bp, p0):
    """(∇q, ∇p) = bp on the pure-Neumann pressure space, p-multigrid PCG from ``p0`` kept
    orthogonal to the constants (removed from ``bp`` and from each preconditioned residual);
    ``(p with zero mean, PCGInfo)``. Rank-local."""
    ps, o = ns.psem, ns.options
    method = "flexible" if ns.pmg.dtype != ps.x.dtype else "classic"
    p, info = linear_solve(poisson.operator(ps, 1.0, 0.0), bp, dot=ps.dot, dots=ps.dots,
                           project=lambda u: ps.dssum(ps.mult * u), weight=ps.mult,
                           precond=lambda r: multigrid.vcycle(ns.pmg, r), tol=o.pressure_tol,
                           maxiter=o.pressure_maxiter, method=method, transposable=ps.backend.transposable,
                           keep_z=True, x0=p0, nullspace=ps.valid * jnp.ones_like(bp))
    return p - ps.integrate(p) / ns.volume, info


def _velocity_solve(ns: NavierStokes, bv, x0, h2):
    """(h₂B + νA) u = bv for the three components at once, Jacobi-PCG from ``x0``. Rank-local."""
    s, o = ns.sem, ns.options
    dinv = _velocity_jacobi(s, ns.nu, h2)
    return linear_solve(_velocity_operator(s, ns.nu, h2), bv, dot=s.dot, dots=s.dots,
                        project=lambda u: s.mask * s.dssum(s.mult * u), weight=s.mult * s.mask,
                        precond=lambda r: dinv * r, tol=o.velocity_tol, maxiter=o.velocity_maxiter,
                        transposable=s.backend.transposable, x0=x0)


def _step_local(ns: NavierStokes, st: State):
    s, ps, o = ns.sem, ns.psem, ns.options
    k, dt = o.time_order, ns.dt
    dtype = s.x.dtype
    Btab, Atab = _coefficient_tables(k, dtype)
    j = jnp.minimum(st.past, k - 1)  # ramp-up: order min(past + 1, k)
    beta, a = Btab[j], Atab[j]
    t1 = st.t + dt

    F = jnp.concatenate([_convection(ns, s, st.U[0])[None], st.F[:-1]])
    Fx = jnp.tensordot(a, F, 1)
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
    p, pinfo = _pressure_solve(ns, ps.dssum(bp), jnp.tensordot(pa, st.P, 1))

    # velocity: (β₀/Δt) B u + ν A u = B(Ub + Fx − ∇p), u = u₀ + L
    h2 = beta[0] / dt
    Av = _velocity_operator(s, ns.nu, h2)
    gp = _grad(s, p[None])[:, 0]
    bv = s.mask * s.dssum(s.bmass * (Ub + Fx - gp))
    x0 = s.mask * ux
    if L is not None:
        bv = bv - Av(L)
    u0, vinfo = _velocity_solve(ns, bv, x0, h2)
    u = u0 if L is None else u0 + L
    U = jnp.concatenate([u[None], st.U[:-1]])
    P = jnp.concatenate([p[None], st.P[:-1]])
    return State(U=U, F=F, P=P, step=st.step + 1, t=t1, past=st.past + 1), StepInfo(pinfo, vinfo)


def step(ns: NavierStokes, state: State):
    """One time step: ``(State, StepInfo)``. Pure; differentiable w.r.t. ``ns.nu`` and the state."""
    return ns.sem.local_map(lambda _, ns, st: _step_local(ns, st), ns, state)


def simulate(ns: NavierStokes, state: State, num_steps: int, *, info: bool = False):
    """``num_steps`` steps as one ``lax.scan`` (pure, differentiable; for ``jax.grad`` through
    short runs). Returns the final state; with ``info=True`` ``(state, StepInfo)``, the
    :class:`StepInfo` of every step stacked (``converged: (num_steps,)`` and so on), so that a
    loss can see whether its solves converged (return it as ``has_aux``). An adjoint solve that
    misses its tolerance warns (:class:`jaxsem.solvers.pcg.AdjointNotConvergedWarning`)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")

    def body(st, _):
        st, i = step(ns, st)
        return st, (i if info else None)

    st, infos = jax.lax.scan(body, state, None, length=int(num_steps))
    return (st, infos) if info else st


def initial_state(ns: NavierStokes, velocity, t0: float = 0.0, past: Callable | None = None) -> State:
    """The state at ``t0`` from ``velocity``: a callable ``(x, y, z) -> (3, ...)`` (jnp) or a
    ``(3, E, n, n, n)`` array of nodal values; on Dirichlet nodes the boundary data at ``t0``
    replaces it.

    ``past``: None (the first steps ramp the order up, 1, 2, …, k, as Nek does: the
    first-order start limits the global error to O(Δt²) for k = 3), or ``u(x, y, z, t)``
    giving the velocity at ``t0 − Δt``, ``t0 − 2Δt``, … (an exact solution), so that every
    step runs at order k.
    """
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
    F = jnp.stack([ns.sem.local_map(lambda s_, ns_, v: _convection(ns_, s_, v), ns, U[i]) for i in range(1, k)]
                  + [jnp.zeros_like(U[0])]) if past is not None else jnp.zeros_like(U)
    step, t, past_ = replicated(s, (np.int32(0), np.asarray(t0, s.x.dtype), np.int32(len(levels) - 1)))
    return State(U=U, F=F, P=jnp.zeros_like(U[:, 0]), step=step, t=t, past=past_)


def _nodal(ns: NavierStokes, u, t, name):
    """Velocity values ``(3, E, n, n, n)`` checked, with the boundary data at ``t`` on Dirichlet nodes."""
    s = ns.sem
    u = jnp.asarray(u, s.x.dtype)
    if u.shape != (3,) + s.mask.shape:
        raise ValueError(f"{name} must give shape {(3,) + s.mask.shape}, got {u.shape}")
    if not isinstance(u, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(u))):
        raise ValueError(f"{name} has NaN/Inf values")
    if not ns.walls:
        return s.valid * u
    t = jnp.asarray(t, s.x.dtype)
    return s.valid * (s.mask * u + s.local_map(lambda s_, t_: _lift(ns, s_, t_), t))


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


def vorticity(ns: NavierStokes, state: State):
    """ω = ∇×u of ``state`` at the nodes (mass-averaged over shared nodes): ``(3, E, n, n, n)``."""
    return ns.sem.local_map(lambda s_, ns_, u: _curl(ns_, s_, u), ns, state.u)


def _kinetic_energy(ns: NavierStokes, st: State):
    return ns.sem.local_map(lambda s, ns_, u: 0.5 * s.integrate(jnp.sum(u * u, 0)) / ns_.volume, ns, st.u)


def diagnostics(ns: NavierStokes, state: State) -> Diagnostics:
    """:class:`Diagnostics` of ``state`` (global: summed over every rank and device)."""
    return ns.sem.local_map(lambda _, ns, st: _diagnostics_local(ns, st), ns, state)


class Series(NamedTuple):
    """A run's time series (NumPy, one entry per sample): ``time``, ``kinetic_energy``,
    ``dissipation`` (−dE_k/dt at the sample time from the energies of its last three steps,
    (3Eⁿ − 4Eⁿ⁻¹ + Eⁿ⁻²)/(2Δt), second order; from two where the sample has one step),
    ``enstrophy``, ``divergence``, ``cfl``; of every step of the sample, the most
    ``pressure_iterations`` and ``velocity_iterations``, the largest true relative
    residuals ``pressure_residual`` and ``velocity_residual``, and ``failed_solves`` (solves
    that missed their tolerance: :func:`run` stops at the first). The first row (the start)
    has NaN for the per-step columns."""

    time: np.ndarray
    kinetic_energy: np.ndarray
    dissipation: np.ndarray
    enstrophy: np.ndarray
    divergence: np.ndarray
    cfl: np.ndarray
    pressure_iterations: np.ndarray
    velocity_iterations: np.ndarray
    pressure_residual: np.ndarray
    velocity_residual: np.ndarray
    failed_solves: np.ndarray


_COLUMNS = len(Series._fields) + 1  # and the first failed step of the sample (0: none), not in the Series
_PER_STEP = [Series._fields.index(c) for c in ("dissipation", "pressure_iterations", "velocity_iterations",
                                               "pressure_residual", "velocity_residual", "failed_solves")]
_ROW_BLOCK = 16  # series rows are allocated in multiples of this


def _advance(ns: NavierStokes, chunk, y, m0, count):
    """``count`` steps from ``y = (state, rows)``; then row ⌈(m0 + count)/chunk⌉ of ``rows``
    gets the sample's diagnostics and the tally of its solves (:class:`Series`).
    ``chunk``, ``m0``, ``count``: ``()`` integers, traced like Δt, so that one compiled
    program serves every step and sample size on a discretization."""
    st, rows = y
    dtype = st.t.dtype
    nan = jnp.asarray(jnp.nan, dtype)

    def body(_, c):
        st, e1, _, tally = c
        e = _kinetic_energy(ns, st)  # E_k before this step: the sample's last three give −dE_k/dt
        st, info = step(ns, st)
        p, v = info.pressure, info.velocity
        failed = ~(p.converged & v.converged)
        tally = (jnp.maximum(tally[0], p.iterations.astype(dtype)), jnp.maximum(tally[1], v.iterations.astype(dtype)),
                 jnp.fmax(tally[2], p.true_relative_residual.astype(dtype)),
                 jnp.fmax(tally[3], v.true_relative_residual.astype(dtype)),
                 tally[4] + failed.astype(dtype),
                 jnp.where((tally[5] == 0) & failed, st.step.astype(dtype), tally[5]))
        return st, e, e1, tally

    zero = jnp.zeros((), dtype)
    st, e1, e2, tally = jax.lax.fori_loop(0, count, body, (st, nan, nan, (zero,) * 6))
    d = diagnostics(ns, st)
    e0 = d.kinetic_energy
    three = -(3 * e0 - 4 * e1 + e2) / (2 * ns.dt)
    diss = jnp.where(count >= 2, three, -(e0 - e1) / ns.dt)
    row = jnp.stack([st.t, e0, diss, d.enstrophy, d.divergence, d.cfl, *tally])
    rows = rows.at[(m0 + count + chunk - 1) // chunk].set(row)
    return st, rows


def _row0(ns: NavierStokes, st: State):
    d = diagnostics(ns, st)
    zero = jnp.zeros((), st.t.dtype)  # no step yet: the per-step columns are undefined (NaN in the Series)
    return jnp.stack([st.t, d.kinetic_energy, zero, d.enstrophy, d.divergence, d.cfl]
                     + [zero] * (_COLUMNS - 6))


def _whole_steps(span: float, dt: float, name: str) -> int:
    k = round(span / dt)
    if k < 0 or not math.isclose(k * dt, span, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"{name} = {span:.12g} is not a whole number of steps of dt = {dt:.12g}")
    return int(k)


def run(ns: NavierStokes, state: State, t_final: float, *, sample_interval: float = 0.1,
        options: ts.RunOptions = ts.RunOptions()):
    """Advance ``state`` to ``t_final`` in jitted chunks of one sample interval each.

    Returns ``(state, Series, RunInfo)``; the series starts with the given state and has
    a row at the end of every chunk (the last one at ``t_final``). ``sample_interval`` and
    ``t_final − state.t`` must be whole numbers of steps (``options.chunk_steps`` is
    replaced by the interval's). Checkpoints (``options.checkpoint_path``) hold the state
    with its BDF/EXT history and the series so far; a resumed run (``options.resume``,
    the same ``meta``) continues both bit for bit.

    Nothing that went wrong passes silently. Refused before any step (``ValueError``): a start
    whose CFL number is above ``ns.options.max_cfl`` (the message gives a Δt that is not);
    above 1 a :class:`StabilityWarning`.
    Stopped, naming the step and the time (the last checkpoint is the one before):
    :class:`jaxsem.solvers.stops.SolveFailedError` at the first step whose pressure or velocity
    solve missed its tolerance; :class:`jaxsem.solvers.stops.UnstableRunError` when a sample's
    CFL passes ``max_cfl`` or, in a flow with no boundary data (no energy enters), its E_k
    passes ten times the start's; :class:`jaxsem.solvers.timestepping.NonFiniteError` at the
    first step whose result is not finite (between samples).
    """
    if not isinstance(options, ts.RunOptions):
        raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
    t_start = float(state.t)
    for name, v in (("t_final", t_final), ("sample_interval", sample_interval)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if sample_interval <= 0:
        raise ValueError(f"sample_interval must be > 0, got {sample_interval!r}")
    dt = float(ns.dt)  # the step count, checkpoint metadata and messages are host values
    num_steps = _whole_steps(t_final - t_start, dt, "t_final - state.t")
    chunk = _whole_steps(sample_interval, dt, "sample_interval")
    if chunk < 1:
        raise ValueError(f"sample_interval = {sample_interval} is shorter than dt = {dt}")
    samples = -(-num_steps // chunk)
    # rows allocated in blocks, so that runs of similar lengths share one compiled chunk program
    # (the buffer's shape is part of it); the rows past samples + 1 stay zero and are cut below
    rows = replicated(ns.sem, np.zeros((-(-(samples + 1) // _ROW_BLOCK) * _ROW_BLOCK, _COLUMNS), state.t.dtype))
    rows = rows.at[0].set(_row0(ns, state))
    o = ns.options
    cfl0 = float(rows[0, Series._fields.index("cfl")])
    if cfl0 > o.max_cfl:
        raise ValueError(f"dt = {dt:.6g} gives CFL {cfl0:.4g} at the start, above NSOptions.max_cfl = "
                         f"{o.max_cfl:g}; use dt <= {dt * 0.5 / cfl0:.3g} (CFL 0.5)")
    if cfl0 > 1:
        warnings.warn(f"dt = {dt:.6g} gives CFL {cfl0:.4g} at the start: above 1 the explicit convection is "
                      f"stable only where viscosity damps it; dt <= {dt * 0.5 / cfl0:.3g} gives CFL 0.5",
                      StabilityWarning, stacklevel=2)
    label = f"BDF{o.time_order}/EXT{o.time_order} Navier-Stokes"
    meta = dict(options.meta, nu=float(ns.nu), order=ns.sem.order, nodes=int(ns.sem.num_global),
                time_order=o.time_order, dealias=o.dealias, sample_steps=chunk)
    start = 0
    if options.resume is not None:  # restored here: the series so far may be shorter than this run's
        state, rows, start = _resume(ns, options.resume, state, rows, dict(meta, dt=dt, t0=t_start, method=label))
        if start > num_steps:
            raise ValueError(f"resume: checkpoint {options.resume} is at step {start} > the {num_steps} steps "
                             f"to t_final = {t_final}")
    opts = dataclasses.replace(options, chunk_steps=chunk, meta=meta, resume=None)
    check = _checker(ns, chunk, dt, float(rows[0, 1]))
    (state, rows), info = ts.drive(_advance_jit, (state, rows), num_steps, dt=dt, t0=t_start, label=label,
                                   args=(ns, jnp.asarray(chunk)), options=opts, comm=ns.sem.comm, start=start,
                                   check=check)
    r = np.array(rows)[:samples + 1]
    r[0, _PER_STEP] = np.nan
    return state, Series(*(r[:, c] for c in range(len(Series._fields)))), info


def _checker(ns: NavierStokes, chunk: int, dt: float, e_start: float):
    """The host check of :func:`run` after each chunk: a failed solve, a CFL number past
    ``options.max_cfl`` or, with no boundary data (no energy enters), E_k grown tenfold stop the
    run, named with the step."""
    limit = ns.options.max_cfl
    col = {name: i for i, name in enumerate(Series._fields)}

    def check(y, m):
        row = np.asarray(y[1][-(-m // chunk)])
        step, t = int(np.asarray(y[0].step)), float(row[col["time"]])  # the flow's own step count
        failed = row[col["failed_solves"]]
        if failed > 0:
            first = int(row[-1])
            p_res, v_res = row[col["pressure_residual"]], row[col["velocity_residual"]]
            which = "pressure" if not p_res <= ns.options.pressure_tol else "velocity"
            res = p_res if which == "pressure" else v_res
            raise SolveFailedError(first, t - (step - first) * dt,
                                   which, res, int(failed),
                                   f"raise NSOptions.{which}_maxiter or loosen {which}_tol, or lower dt")
        cfl = row[col["cfl"]]
        if cfl > limit:
            raise UnstableRunError(step, t, "CFL", cfl, limit,
                                   f"dt = {dt:.4g} is past the stable step; dt <= {dt * 0.5 / cfl:.3g} gives CFL 0.5 here")
        e = row[col["kinetic_energy"]]
        if ns.boundary is None and e > 10 * e_start + 1e-300:
            raise UnstableRunError(step, t, "kinetic energy", e, 10 * e_start,
                                   "no energy enters this flow (no boundary data), so E_k cannot grow tenfold; "
                                   f"lower dt = {dt:.4g}")

    return check


def _resume(ns: NavierStokes, path, state: State, rows, meta: dict):
    """``(state, rows, step)`` from a checkpoint of :func:`run` with the same ``meta``; its series
    is copied into ``rows`` (this run's buffer; either may end in zero rows never written)."""
    comm = ns.sem.comm
    path = f"{path}{comm.file_suffix}"
    problem = ts.meta_mismatch(path, ts.checkpoint_meta(path), meta)
    if int(comm.allreduce(jnp.asarray(int(problem is not None)))) and problem is None:
        problem = f"resume: the checkpoint of another rank does not match this run (this rank's: {path})"
    if problem is not None:
        raise ValueError(problem)
    # the series' length is the saved run's (its t_final), so the last array is matched by its header
    shapes = ts.checkpoint_shapes(path)
    saved_rows = shapes[-1].shape if shapes else ()
    if len(saved_rows) != 2 or saved_rows[1] != rows.shape[1]:
        raise ValueError(f"resume: checkpoint {path}: its last array (the series) has shape {saved_rows}, "
                         f"expected (rows, {rows.shape[1]})")
    (state, saved), _, step, _ = ts.load_checkpoint(path, (state, jnp.zeros(saved_rows, rows.dtype)))
    need = -(-step // int(meta["sample_steps"])) + 1  # row 0 and one per sample reached
    if saved_rows[0] < need:
        raise ValueError(f"resume: checkpoint {path}: step {step} needs {need} series rows, the file holds "
                         f"{saved_rows[0]}")
    n = min(saved.shape[0], rows.shape[0])
    return state, rows.at[:n].set(saved[:n]), step


@jax.jit
def _advance_jit(y, args, m0, count):
    """The jitted chunk of :func:`run`: ``args = (ns, chunk)``, see :func:`_advance`."""
    ns, chunk = args
    return _advance(ns, chunk, y, m0, count)
