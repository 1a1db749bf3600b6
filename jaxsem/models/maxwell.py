"""Source-free Maxwell equations in spectral-element DG (NekCEM).

    ε ∂E/∂t = ∇×H,    μ ∂H/∂t = −∇×E

on curvilinear hexahedra, strong form, GLL collocation (diagonal mass), after
Hesthaven & Warburton, *Nodal DG* §6.5 and NekCEM (Min & Fischer; Otten et al.
2016). With Δu = u⁺ − u⁻ (⁺ the neighbour, n the outward normal of the own side)
and impedance Z = √(μ/ε), admittance Y = 1/Z on each side:

    ε dE/dt = ∇×H + L[ n×(Z⁺ ΔH − α n×ΔE) / (Z⁻ + Z⁺) ]
    μ dH/dt = −∇×E − L[ n×(Y⁺ ΔE + α n×ΔH) / (Y⁻ + Y⁺) ]

``L`` the lift (:mod:`jaxsem.dg`); α = 1 is the upwind flux (the exact Riemann
solution), α = 0 the central flux (the impedance-weighted averages
H* = (Z⁻H⁻ + Z⁺H⁺)/(Z⁻ + Z⁺), E* = (Y⁻E⁻ + Y⁺E⁺)/(Y⁻ + Y⁺); the plain average in
a uniform medium). With the split-form curl below, the semi-discrete energy
½∫(ε|E|² + μ|H|²) is exactly conserved by the central flux and dissipated by the
upwind flux — on curved elements, with any ε, μ, PEC or periodic.

* Fields are packed as ``q: (6, E, n, n, n)``, components ``Ex Ey Ez Hx Hy Hz``.
* Faces: all six components go through ONE exchange (own + neighbour per face
  point). NekCEM writes −n×E and −n×H; writing E and H themselves moves the
  same six words per point and lets the neighbour's impedance enter.
* Boundary faces (not shared, not periodic) are perfect electric conductors by
  mirror states E⁺ = −E⁻, H⁺ = H⁻ (so n×E⁺ = −n×E⁻), or perfect magnetic
  conductors with ``bc="pmc"`` (E⁺ = E⁻, H⁺ = −H⁻). Periodic axes come from the mesh.
* ε, μ: scalars, per element ``(E,)`` or per point ``(E, n, n, n)``; they are
  ordinary arrays, so ``jax.grad`` of any loss of the solution w.r.t. them works.
* The volume curl (``form=``): ``"split"`` (default), the average of the
  chain-rule form Σ_a ∇r_a × ∂_a F and the conservative form
  (1/J) Σ_a ∂_a(J∇r_a × F), energy-stable on curved elements (36 reference
  derivatives); ``"chain"``, NekCEM's chain rule (18 derivatives, as its work
  model counts), the same operator on affine elements but not energy-stable on
  curved ones (random data grows with it on a deformed mesh).
* The operator is computed by ``dg.backend`` (the discretization's kernels): the einsum
  reference, or one fused CUDA kernel wherever its chain-rule curl is the operator
  asked for (the chain form, and the default split form on affine meshes).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..solvers import driver
from ..solvers import timestepping as ts
from ..discretization.dg import DG, faces, neighbor_values
from ..mesh.box import Mesh
from . import _dg_common as common
from ._dg_common import RHO_MARGIN, check_choice, relative_error

# Source-free with a stable step, the energy (mass norm) does not grow: a thousandfold growth of the
# norm is instability, and driver.run stops there
GROWTH_LIMIT = 1e3

__all__ = [
    "FIELDS",
    "FLUXES",
    "BCS",
    "FORMS",
    "Scheme",
    "Material",
    "material",
    "curl",
    "rhs",
    "make_rhs",
    "energy",
    "spectral_radius",
    "stable_dt",
    "cavity_mode",
    "plane_wave",
    "relative_error",
    "simulate",
    "solve_mode",
    "ModeResult",
    "flops_per_step",
]

FIELDS = ("Ex", "Ey", "Ez", "Hx", "Hy", "Hz")
FLUXES = ("upwind", "central")
BCS = ("pec", "pmc")
FORMS = ("split", "chain")


@dataclasses.dataclass(frozen=True)
class Scheme(common.Scheme):
    """The numerics of a Maxwell run (static, hashable): flux, curl form, time stepper, step size.

    Attributes:
      flux: ``"upwind"`` (default) or ``"central"`` (:data:`FLUXES`).
      form: the volume curl, ``"split"`` (default, energy-stable on curved
        elements) or ``"chain"`` (:data:`FORMS`, see :func:`rhs`).
      method: the Runge–Kutta method (:data:`jaxsem.timestepping.METHODS`, default ``"lserk4"``).
      cfl: Δt as a fraction of the stable limit, 0 < cfl ≤ 1 (default 0.5; when ``dt`` is ``None``).
      dt: a fixed step > 0 that divides the run's ``t_final``, or ``None`` (default)
        for ``cfl`` × the limit, rounded down so that ``t_final`` is hit exactly.

    Raises ``ValueError`` naming the field, the value and what is allowed.
    """

    FLUXES: ClassVar[tuple] = FLUXES
    FORMS: ClassVar[tuple] = FORMS


# ----------------------------------------------------------------------------- material


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Material:
    """ε, μ on the nodes and the flux coefficients they imply (pytree).

    ``eps, mu: (E, n, n, n)``; face coefficients ``(E, 6, n, n)`` with the lift
    folded in: ``cE = L·Z⁺/(Z⁻+Z⁺)``, ``aE = L/(Z⁻+Z⁺)``, ``cH = L·Y⁺/(Y⁻+Y⁺)``,
    ``aH = L/(Y⁻+Y⁺)``.
    """

    eps: jax.Array
    mu: jax.Array
    cE: jax.Array
    aE: jax.Array
    cH: jax.Array
    aH: jax.Array


def _as_nodal(value, dg: DG, name: str):
    shape = (dg.num_elements,) + (dg.n,) * 3
    a = jnp.asarray(value, dg.jac.dtype)
    if a.ndim == 0:
        a = jnp.broadcast_to(a, shape)
    elif a.shape == (dg.num_elements,):
        a = jnp.broadcast_to(a[:, None, None, None], shape)
    elif a.shape != shape:
        raise ValueError(f"{name} must be a scalar, shape ({dg.num_elements},) per element or "
                         f"{shape} per node, got shape {a.shape}")
    # Pad elements of a sharded dg (from_mesh_order fills them with 0) get 1: a vacuum that
    # keeps their fields at 0 and every derivative there finite.
    a = jnp.where(dg.elements[:, None, None, None] >= 0, a, jnp.ones((), a.dtype))
    if not isinstance(a, jax.core.Tracer) and not bool(jnp.all(a > 0)):
        raise ValueError(f"{name} must be positive everywhere, got min {float(jnp.min(a))}")
    return a


def material(dg: DG, eps=1.0, mu=1.0) -> Material:
    """Nodal ε, μ and the face flux coefficients (one exchange of Z and Y for the ⁺ side).

    On boundary faces the outside medium is the inside one (mirror states).
    """
    eps, mu = _as_nodal(eps, dg, "eps"), _as_nodal(mu, dg, "mu")
    return _material(dg, eps, mu)


@jax.jit
def _material(dg, eps, mu):
    Z = jnp.sqrt(mu / eps)
    own = faces(jnp.stack([Z, 1.0 / Z]))  # (2, E, 6, n, n)
    nbr = neighbor_values(dg, own) + dg.boundary * own
    (Zm, Ym), (Zp, Yp) = own, nbr
    aE = dg.lift / (Zm + Zp)
    aH = dg.lift / (Ym + Yp)
    return Material(eps=eps, mu=mu, cE=Zp * aE, aE=aE, cH=Yp * aH, aH=aH)


# ----------------------------------------------------------------------------- operator


def curl(dg: DG, F, form: str = "split"):
    """Pointwise curl of a 3-vector field ``F: (3, E, n, n, n)`` (no fluxes), the volume form
    ``"split"`` or ``"chain"`` (see :func:`rhs`)."""
    check_choice(form, "form", FORMS)
    return dg.backend.maxwell_curls(dg, jnp.concatenate([F, F]), form)[0]


def rhs(dg: DG, mat: Material, q, flux: str = "upwind", bc: str = "pec", form: str = "split"):
    """dq/dt of the semi-discrete Maxwell system, ``q: (6, E, n, n, n)`` → same shape.

    ``form``: the volume curl, ``"split"`` (energy-stable on curved elements, default) or
    ``"chain"`` (NekCEM's chain rule; the same operator on affine meshes, half the
    derivatives). Computed by ``dg.backend`` (the discretization's kernels): the einsum reference
    exchanges the face values, then computes; the CUDA backend runs one fused kernel (curls,
    fluxes with the neighbours' values read in place, lift) wherever its chain-rule curl is
    the operator asked for — the chain form, and the split form on affine meshes — with
    derivatives equal to the einsum form's. Distributed, the kernel mirrors q where the
    neighbour is remote and the remote neighbours' flux is added on the halo elements.
    """
    check_choice(flux, "flux", FLUXES)
    check_choice(bc, "bc", BCS)
    check_choice(form, "form", FORMS)
    return dg.backend.maxwell_rhs(dg, mat, q, flux, bc, form)


@functools.lru_cache(maxsize=None)
def make_rhs(flux: str = "upwind", bc: str = "pec", form: str = "split"):
    """``f(t, q, (dg, mat)) = rhs(dg, mat, q, flux, bc, form)`` for :func:`jaxsem.solvers.driver.run`
    (cached: one object per options)."""
    check_choice(flux, "flux", FLUXES)
    check_choice(bc, "bc", BCS)
    check_choice(form, "form", FORMS)
    return common.rhs_fn(rhs, flux=flux, bc=bc, form=form)


@jax.jit
def energy(dg: DG, mat: Material, q):
    """Electromagnetic energy ½ ∫ (ε|E|² + μ|H|²) dx with the GLL rule (summed over all ranks)."""
    local = jnp.sum(dg.mass * (mat.eps * jnp.sum(q[:3] ** 2, 0) + mat.mu * jnp.sum(q[3:] ** 2, 0)))
    return 0.5 * dg.comm.allreduce(local)


def _energy_inner(u, v, args):
    dg, mat = args
    local = jnp.sum(dg.mass * (mat.eps * jnp.sum(u[:3] * v[:3], 0) + mat.mu * jnp.sum(u[3:] * v[3:], 0)))
    return dg.comm.allreduce(local)


def spectral_radius(dg: DG, mat: Material, flux: str = "upwind", bc: str = "pec", iterations: int = 60,
                    form: str = "split") -> float:
    """Power-iteration estimate of ρ of the semi-discrete operator, in the energy norm.

    Distributed, each rank starts from its elements' part of the serial start
    vector and the inner products all-reduce, so every rank gets the serial ρ
    (up to the order of the sums).
    """
    return common.spectral_radius(dg, make_rhs(flux, bc, form), (dg, mat), _energy_inner, lead=(6,),
                                  iterations=iterations)


def stable_dt(dg: DG, mat: Material, flux: str = "upwind", bc: str = "pec", method: str = "lserk4",
              rho: float | None = None, form: str = "split") -> float:
    """The stable time-step limit ``stability_radius(method) / (1.05 ρ)``.

    The split-form operator is dissipative (upwind) or skew (central) in the
    energy norm, so its spectrum lies in the closed left half-plane and the
    half-disk radius of :func:`jaxsem.timestepping.stability_radius` applies.
    """
    rho = spectral_radius(dg, mat, flux, bc, form=form) if rho is None else rho
    return ts.cfl_dt(RHO_MARGIN * rho, method, 1.0)


# ----------------------------------------------------------------------------- exact solutions


def _hashable(*vals):
    return tuple(tuple(float(a) for a in v) if np.ndim(v) else float(v) for v in vals)


def cavity_mode(x, t, lengths=(1.0, 1.0, 1.0), mode=(1, 1, 1), amplitude=(1.0, 1.0, -2.0),
                eps=1.0, mu=1.0):
    """A standing mode of the PEC box ``[0, L]³``: ``(6, ...)`` fields at ``x: (3, ...)``.

    k = π(m/Lx, n/Ly, p/Lz), E = A ⊙ (cos sin sin, sin cos sin, sin sin cos)(k·x) cos ωt
    with A ⊥ k (the given amplitude minus its k component), H = −(∇×E₀) sin ωt / (μω),
    ω = |k|/√(εμ). Default: the (1,1,1) mode with A = (1, 1, −2), all six
    components non-zero.
    """
    return _cavity_mode(x, t, *_hashable(lengths, mode, amplitude, eps, mu))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _cavity_mode(x, t, lengths, mode, amplitude, eps, mu):
    k = np.pi * np.asarray(mode, float) / np.asarray(lengths, float)
    A = np.asarray(amplitude, float)
    A = A - (A @ k) / (k @ k) * k
    w = math.sqrt(k @ k / (eps * mu))
    s = [jnp.sin(k[d] * x[d]) for d in range(3)]
    c = [jnp.cos(k[d] * x[d]) for d in range(3)]
    E0 = jnp.stack([A[0] * c[0] * s[1] * s[2], A[1] * s[0] * c[1] * s[2], A[2] * s[0] * s[1] * c[2]])
    kA = np.cross(k, A)  # ∇×E₀ = (k×A) ⊙ (sin cos cos, cos sin cos, cos cos sin)
    cE0 = jnp.stack([kA[0] * s[0] * c[1] * c[2], kA[1] * c[0] * s[1] * c[2], kA[2] * c[0] * c[1] * s[2]])
    return jnp.concatenate([E0 * jnp.cos(w * t), -cE0 * jnp.sin(w * t) / (mu * w)])


def plane_wave(x, t, lengths=(1.0, 1.0, 1.0), wavenumber=(1, 1, 0), amplitude=(1.0, -1.0, 1.0),
               eps=1.0, mu=1.0):
    """A plane wave in the periodic box: ``E = A sin(k·x − ωt)``, ``H = k̂×E / Z``.

    k = 2π(m/Lx, n/Ly, p/Lz), A made ⊥ k, ω = |k|/√(εμ), Z = √(μ/ε).
    """
    return _plane_wave(x, t, *_hashable(lengths, wavenumber, amplitude, eps, mu))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _plane_wave(x, t, lengths, wavenumber, amplitude, eps, mu):
    k = 2 * np.pi * np.asarray(wavenumber, float) / np.asarray(lengths, float)
    A = np.asarray(amplitude, float)
    A = A - (A @ k) / (k @ k) * k
    w = math.sqrt(k @ k / (eps * mu))
    Z = math.sqrt(mu / eps)
    ph = jnp.sin(k[0] * x[0] + k[1] * x[1] + k[2] * x[2] - w * t)
    B = np.cross(k / np.linalg.norm(k), A) / Z
    return jnp.stack([A[0] * ph, A[1] * ph, A[2] * ph, B[0] * ph, B[1] * ph, B[2] * ph])


# ----------------------------------------------------------------------------- drivers


def flops_per_step(order: int, num_elements: int) -> float:
    """NekCEM's work model (Otten et al. 2016, eq. 16): [180(N+1) + 420]·n, n = E(N+1)³."""
    return (180.0 * (order + 1) + 420.0) * num_elements * (order + 1) ** 3


def simulate(dg: DG, mat: Material, q0, t_final: float, *, scheme: Scheme = Scheme(), bc: str = "pec",
             rho: float | None = None, options: driver.RunOptions = driver.RunOptions()):
    """Advance ``q0: (6, E, n, n, n)`` to ``t_final`` with the guarded driver; return ``(q, RunInfo, dt)``.

    Δt = ``scheme.cfl`` × the stable limit (rounded down so that ``t_final`` is
    hit exactly) unless ``scheme.dt`` is given; a ``dt`` above the limit is
    refused with the limit in the message. ``rho``: the spectral radius, if
    known (else a power iteration finds it). ``options``: chunks, progress and
    checkpoint files (:class:`jaxsem.solvers.driver.RunOptions`); checkpoints carry
    flux, form, bc, order, dtype, element count and fingerprints of the mesh and
    of ε, μ, and a resume under any other value is refused.
    """
    common.check_scheme(scheme, Scheme)
    check_choice(bc, "bc", BCS)
    common.check_t_final(t_final)
    limit = stable_dt(dg, mat, scheme.flux, bc, scheme.method, rho, scheme.form)
    dt, steps = driver.plan_steps(t_final, limit, scheme.method, scheme.cfl, scheme.dt)

    def meta():
        return dict(flux=scheme.flux, form=scheme.form, bc=bc, **common.dg_meta(dg),
                    material=common.fingerprint(dg.host(mat.eps), dg.host(mat.mu)))

    options = common.run_options(options, limit, "maxwell", meta)
    q, info = driver.run(make_rhs(scheme.flux, bc, scheme.form), q0, dt, steps, args=(dg, mat),
                     method=scheme.method, options=options, comm=dg.comm,
                     growth_limit=GROWTH_LIMIT, norm=common.mass_norm(dg))
    return q, info, dt


class ModeResult(NamedTuple):
    """Outcome of :func:`solve_mode`: global error, steps, Δt and its limit, stepping seconds, energies, mesh size."""

    error_l2: float
    steps: int
    dt: float
    dt_limit: float
    seconds: float
    energy0: float
    energy: float
    num_elements: int
    order: int


def solve_mode(mesh: Mesh, t_final: float = 0.5, *, mode=None, scheme: Scheme = Scheme(), dtype=jnp.float64,
               options: driver.RunOptions = driver.RunOptions(), **place):
    """Exact-mode verification run in a box: PEC cavity mode or periodic plane wave; ``(dg, q, ModeResult)``.

    ``mesh``: a :func:`jaxsem.box_mesh` filling ``[0, L]³`` (any order, elements,
    deform). Closed on every axis: the PEC cavity mode :func:`cavity_mode`
    (``mode`` default (1, 1, 1)); periodic on every axis: the plane wave
    :func:`plane_wave` (``mode`` = wavenumber, default (1, 1, 0)).
    ``place``: ``comm=``, ``partition=`` or ``devices=`` of
    :func:`jaxsem.discretize_dg` (a distributed run: ``q`` is this rank's part,
    the error and energies are global). ``seconds`` counts the time stepping
    only (compiled beforehand).
    """
    lengths = common.box_lengths(mesh, "solve_mode")
    if len(set(mesh.periodic)) != 1:
        raise ValueError(f"solve_mode: mesh must be closed (PEC cavity) or periodic (plane wave) on every axis, "
                         f"got periodic={mesh.periodic}")
    common.check_scheme(scheme, Scheme)
    dg = common.discretize(mesh, dtype, place, "solve_mode")
    mat = material(dg)
    if mesh.periodic[0]:
        exact = functools.partial(plane_wave, lengths=lengths, wavenumber=mode or (1, 1, 0))
    else:
        exact = functools.partial(cavity_mode, lengths=lengths, mode=mode or (1, 1, 1))
    q0 = exact(dg.x, 0.0).astype(dg.jac.dtype)
    rho = spectral_radius(dg, mat, scheme.flux, form=scheme.form)
    limit = stable_dt(dg, mat, scheme.flux, method=scheme.method, rho=rho)
    # Compile the stepping loop (one step, same function and shapes) so ``seconds`` is pure stepping.
    driver.run(make_rhs(scheme.flux, "pec", scheme.form), q0, limit / 2, 1, args=(dg, mat), method=scheme.method)
    q, info, dt = simulate(dg, mat, q0, t_final, scheme=scheme, rho=rho, options=options)
    err = relative_error(dg, q, exact(dg.x, t_final))
    return dg, q, ModeResult(err, info.steps, dt, limit, info.seconds, float(energy(dg, mat, q0)),
                             float(energy(dg, mat, q)), mesh.num_elements, dg.order)
