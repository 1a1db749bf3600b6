"""Linear advection ∂u/∂t + c·∇u = 0 (constant c) in spectral-element DG.

Strong form on curvilinear hexahedra, GLL collocation (diagonal mass), the
structure of :mod:`jaxsem.models.maxwell` for one scalar field:

    du/dt = −c·∇u + L[ (c·n) u⁻ − f* ],   f* = (c·n)(u⁻ + u⁺)/2 + α |c·n| (u⁻ − u⁺)/2

``L`` the lift (face integral → nodal rate, :mod:`jaxsem.dg`); α = 1 the upwind
flux, α = 0 the central flux.

* **Metric terms.** The contravariant velocity ``A_a = c·(J∇r_a)`` uses
  Kopriva's conservative curl form J∇r_a (Kopriva 2006), for which the discrete
  metric identities Σ_a D_a(J∇r_a) = 0 hold to round-off on curved elements
  (the cross-product metrics of :mod:`jaxsem.geometry` do so only on affine
  ones). The volume term is the split form ½[Σ_a A_a ∂_a u + Σ_a ∂_a(A_a u)]/J
  (``form="split"``, default), or the conservative (``"conservative"``) or
  chain-rule (``"chain"``) half alone.
* **Conservation and stability.** On each face point the outward flux weight
  is the own ``A·(±e_a)`` (= sJ c·n) on the volume side and, in f*, the
  antisymmetrised ``vn = (an⁻ − an⁺)/2`` (one exchange at setup), so f* is
  single-valued: ∫u dx is conserved to round-off by every form (the chain
  and split forms through the metric identities), and by the SBP property of
  the GLL derivative the split form makes the upwind flux dissipate and the
  central flux conserve ½∫u² (semi-discretely), curved elements included.
* **Exchange.** One component per face point (own + neighbour; own alone on the
  boundary). Boundary faces (not periodic) see the inflow value u⁺ = 0.
* **Backend.** The operator is computed by ``dg.backend`` (the discretization's kernels):
  the einsum reference, or one fused CUDA kernel for every form and flux.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis
from ..solvers import driver
from ..solvers import timestepping as ts
from ..discretization.dg import DG, faces, neighbor_values
from ..mesh.box import Mesh
from . import _dg_common as common
from ._dg_common import RHO_MARGIN, check_choice, relative_error
from ._dg_common import ref_derivative as _d

# Source-free with a stable step, the energy (mass norm) does not grow: a thousandfold growth of the
# norm is instability, and driver.run stops there
GROWTH_LIMIT = 1e3

__all__ = [
    "FLUXES",
    "FORMS",
    "Scheme",
    "Transport",
    "transport",
    "curl_metrics",
    "rhs",
    "make_rhs",
    "mass",
    "energy",
    "spectral_radius",
    "stable_dt",
    "gaussian",
    "relative_error",
    "simulate",
    "solve_gaussian",
    "AdvectionResult",
]

FLUXES = ("upwind", "central")
FORMS = ("split", "conservative", "chain")
DEFAULT_VELOCITY = (1.0, 0.5, 0.25)
DEFAULT_WIDTH = 0.15
DEFAULT_CENTER = (0.5, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class Scheme(common.Scheme):
    """The numerics of an advection run (static, hashable): flux, volume form, time stepper, step.

    Attributes:
      flux: ``"upwind"`` (default) or ``"central"`` (:data:`FLUXES`).
      form: the volume term, ``"split"`` (default), ``"conservative"`` or ``"chain"``
        (:data:`FORMS`, see :func:`rhs`).
      method: the Runge–Kutta method (:data:`jaxsem.timestepping.METHODS`, default ``"lserk4"``).
      cfl: Δt as a fraction of the stable limit, 0 < cfl ≤ 1 (default 0.5; when ``dt`` is ``None``).
      dt: a fixed step > 0 that divides the run's ``t_final``, or ``None`` (default)
        for ``cfl`` × the limit, rounded down so that ``t_final`` is hit exactly.

    Raises ``ValueError`` naming the field, the value and what is allowed.
    """

    FLUXES: ClassVar[tuple] = FLUXES
    FORMS: ClassVar[tuple] = FORMS


# ----------------------------------------------------------------------------- metrics


def curl_metrics(D, x) -> np.ndarray:
    """Kopriva's curl-form metrics ``Ja[a, d] = J ∂r_a/∂x_d``, ``(3, 3, E, n, n, n)`` (NumPy, float64).

    J a^a_d = −ê_a · ∇_ξ × (X_l ∇_ξ X_m), (d, m, l) cyclic. Since the reference
    derivatives along different axes commute, Σ_a D_a Ja[a, d] = 0 to round-off.
    """
    D, x = np.asarray(D, np.float64), np.asarray(x, np.float64)
    dd = functools.partial(_d, D, xp=np)
    out = []
    for d in range(3):
        m, l = (d + 1) % 3, (d + 2) % 3
        V = [x[l] * dd(x[m], b) for b in range(3)]  # X_l ∇_ξ X_m
        curl = [dd(V[2], 1) - dd(V[1], 2), dd(V[0], 2) - dd(V[2], 0), dd(V[1], 0) - dd(V[0], 1)]
        out.append(-np.stack(curl))  # (3 a, ...)
    return np.stack(out, axis=1)  # (3 a, 3 d, ...)


# ----------------------------------------------------------------------------- transport


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transport:
    """The velocity and the flux weights it implies (pytree).

    ``A: (3, E, n, n, n)`` contravariant velocity c·J∇r_a; ``an: (E, 6, n, n)``
    own outward weight (sJ c·n from ``A``); ``vn`` its antisymmetrised value
    (single-valued across each face); ``lw = 1 / (J w_end)`` on the faces.
    """

    velocity: jax.Array
    A: jax.Array
    an: jax.Array
    vn: jax.Array
    lw: jax.Array


def _velocity(velocity) -> np.ndarray:
    c = np.asarray(velocity, dtype=float)
    if c.shape != (3,) or not np.all(np.isfinite(c)):
        raise ValueError(f"velocity must be 3 finite numbers, got {velocity!r}")
    return c


def _contravariant(order: int, x, c) -> np.ndarray:
    """``A_a = c·(J∇r_a)``, ``(3, E, n, n, n)``, from float64 GLL metrics of ``x: (3, E, n, n, n)``."""
    D = basis.derivative_matrix(basis.gll_points(order)[0])
    return np.einsum("d,ad...->a...", c, curl_metrics(D, x))


def transport(dg: DG, velocity=DEFAULT_VELOCITY) -> Transport:
    """Flux weights of the constant ``velocity`` on ``dg`` (one exchange for the ⁺ side)."""
    c = _velocity(velocity)
    # The metrics from the float64 GLL points and nodes (dg.x may be float32).
    A = _contravariant(dg.order, dg.host(dg.x), c)
    return _transport(dg, jnp.asarray(c, dg.jac.dtype), jnp.asarray(A, dg.jac.dtype))


@jax.jit
def _transport(dg, c, A):
    Af = faces(A)  # (3 a, E, 6, n, n)
    sign = jnp.asarray([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0], A.dtype)[:, None, None]
    an = jnp.stack([Af[f // 2, :, f] for f in range(6)], axis=1) * sign
    nbr = neighbor_values(dg, an[None])[0]  # 0 on the boundary
    vn = 0.5 * (an - nbr) + 0.5 * dg.boundary * an
    w_end = 2.0 / (dg.order * (dg.order + 1))
    return Transport(velocity=c, A=A, an=an, vn=vn, lw=1.0 / (faces(dg.jac) * w_end))


# ----------------------------------------------------------------------------- operator


def rhs(dg: DG, tr: Transport, u, flux: str = "upwind", form: str = "split"):
    """du/dt of the semi-discrete advection equation, ``u: (E, n, n, n)`` → same shape.

    Computed by ``dg.backend`` (the discretization's kernels). The einsum reference exchanges the
    face values, then computes everything (on a distributed ``dg`` an
    ``optimization_barrier`` keeps the volume term after the exchange: measured faster than
    overlapping them, ``docs/multi-gpu.md``). The CUDA backend runs every form and flux as
    one fused kernel (volume term, fluxes with the neighbours' values read in place, lift,
    1/J) whose derivatives are those of the einsum form; distributed, the kernel counts the
    remote neighbours as 0 and their flux (linear in the neighbour value) is added on the
    halo elements once the messages are in.
    """
    check_choice(flux, "flux", FLUXES)
    check_choice(form, "form", FORMS)
    return dg.backend.advection_rhs(dg, tr, u, flux, form)


@functools.lru_cache(maxsize=None)
def make_rhs(flux: str = "upwind", form: str = "split"):
    """``f(t, u, (dg, tr)) = rhs(dg, tr, u, flux, form)`` for :func:`jaxsem.solvers.driver.run`
    (cached: one object per options)."""
    check_choice(flux, "flux", FLUXES)
    check_choice(form, "form", FORMS)
    return common.rhs_fn(rhs, flux=flux, form=form)


@jax.jit
def mass(dg: DG, u):
    """∫ u dx with the GLL rule (all ranks)."""
    return dg.integrate(u)


@jax.jit
def energy(dg: DG, u):
    """½ ∫ u² dx with the GLL rule (all ranks)."""
    return 0.5 * dg.integrate(u * u)


def _inner(u, v, args):
    dg, _ = args
    return dg.comm.allreduce(jnp.sum(dg.mass * u * v))


def spectral_radius(dg: DG, tr: Transport, flux: str = "upwind", iterations: int = 60,
                    form: str = "split") -> float:
    """Power-iteration estimate of ρ of the semi-discrete operator in the L2 (mass) norm.

    Distributed, each rank starts from its elements' part of the serial start
    vector, so every rank gets the serial ρ (up to the order of the sums).
    """
    return common.spectral_radius(dg, make_rhs(flux, form), (dg, tr), _inner, iterations=iterations)


def stable_dt(dg: DG, tr: Transport, flux: str = "upwind", method: str = "lserk4", rho: float | None = None,
              form: str = "split") -> float:
    """The stable time-step limit ``stability_radius(method) / (1.05 ρ)``."""
    rho = spectral_radius(dg, tr, flux, form=form) if rho is None else rho
    return ts.cfl_dt(RHO_MARGIN * rho, method, 1.0)


# ----------------------------------------------------------------------------- exact solution


def gaussian(x, t, velocity=DEFAULT_VELOCITY, center=DEFAULT_CENTER, width=DEFAULT_WIDTH,
             lengths=(1.0, 1.0, 1.0), images: int = 3):
    """The periodic Gaussian exp(−|x − x₀ − ct|²/(2σ²)) summed over periodic images.

    Per axis (the Gaussian is separable), the distance is first reduced to the
    minimum image d ∈ [−L/2, L/2) on the torus, then the images d + mL,
    |m| ≤ ``images``, are summed: exact (to round-off for σ ≤ L/5) for any t,
    and smooth. ``x: (3, ...)``; returns ``(...)``.
    """
    c = tuple(float(v) for v in velocity)
    x0 = tuple(float(v) for v in center)
    L = tuple(float(v) for v in lengths)
    out = 1.0
    for d in range(3):
        s = x[d] - x0[d] - c[d] * t
        s = s - L[d] * jnp.floor(s / L[d] + 0.5)  # minimum image
        out = out * sum(jnp.exp(-((s + m * L[d]) ** 2) / (2 * width**2)) for m in range(-images, images + 1))
    return out


# ----------------------------------------------------------------------------- drivers


def simulate(dg: DG, tr: Transport, u0, t_final: float, *, scheme: Scheme = Scheme(), rho: float | None = None,
             options: driver.RunOptions = driver.RunOptions()):
    """Advance ``u0: (E, n, n, n)`` to ``t_final`` with the guarded driver; return ``(u, RunInfo, dt)``.

    Δt = ``scheme.cfl`` × the stable limit (rounded down so ``t_final`` is hit
    exactly) unless ``scheme.dt`` is given; a ``dt`` above the limit is refused.
    ``rho``: the spectral radius, if known. ``options``: chunks, progress and
    checkpoint files (:class:`jaxsem.solvers.driver.RunOptions`); checkpoints carry
    flux, form, velocity, order, dtype, element count and a mesh fingerprint,
    and a resume under any other value is refused.
    """
    common.check_scheme(scheme, Scheme)
    common.check_t_final(t_final)
    limit = stable_dt(dg, tr, scheme.flux, scheme.method, rho, scheme.form)
    dt, steps = driver.plan_steps(t_final, limit, scheme.method, scheme.cfl, scheme.dt)

    def meta():
        c = np.asarray(dg.host(tr.velocity), np.float64)
        return dict(flux=scheme.flux, form=scheme.form, velocity=" ".join(f"{v:.17g}" for v in c),
                    **common.dg_meta(dg))

    options = common.run_options(options, limit, "advection", meta)
    u, info = driver.run(make_rhs(scheme.flux, scheme.form), u0, dt, steps, args=(dg, tr),
                     method=scheme.method, options=options, comm=dg.comm,
                     growth_limit=GROWTH_LIMIT, norm=common.mass_norm(dg))
    return u, info, dt


class AdvectionResult(NamedTuple):
    """Outcome of :func:`solve_gaussian`: global error, steps, Δt, its limit, seconds, mass, energy, mesh size."""

    error_l2: float
    steps: int
    dt: float
    dt_limit: float
    seconds: float
    mass0: float
    mass: float
    energy0: float
    energy: float
    num_elements: int
    order: int


def solve_gaussian(mesh: Mesh, t_final: float = 0.5, *, velocity=DEFAULT_VELOCITY, scheme: Scheme = Scheme(),
                   dtype=jnp.float64, options: driver.RunOptions = driver.RunOptions(), **place):
    """The periodic Gaussian carried across a periodic box; returns ``(dg, u, AdvectionResult)``.

    ``mesh``: a :func:`jaxsem.box_mesh` filling ``[0, L]³``, periodic on every
    axis (any order, elements, deform); the Gaussian :func:`gaussian` starts at
    :data:`DEFAULT_CENTER` with width :data:`DEFAULT_WIDTH`. ``place``:
    ``comm=``, ``partition=`` or ``devices=`` of :func:`jaxsem.discretize_dg`.
    ``seconds`` counts the time stepping only (compiled beforehand); the error
    is relative L2 against :func:`gaussian` at ``t_final``.
    """
    lengths = common.box_lengths(mesh, "solve_gaussian")
    if not all(mesh.periodic):
        raise ValueError(f"solve_gaussian: mesh must be periodic on every axis, got periodic={mesh.periodic}")
    common.check_scheme(scheme, Scheme)
    dg = common.discretize(mesh, dtype, place, "solve_gaussian")
    tr = transport(dg, velocity)
    exact = functools.partial(gaussian, velocity=velocity, lengths=lengths)
    u0 = exact(dg.x, 0.0).astype(dg.jac.dtype)
    rho = spectral_radius(dg, tr, scheme.flux, form=scheme.form)
    limit = stable_dt(dg, tr, scheme.flux, scheme.method, rho, scheme.form)
    f = make_rhs(scheme.flux, scheme.form)
    driver.run(f, u0, limit / 2, 1, args=(dg, tr), method=scheme.method)  # compile
    u, info, dt = simulate(dg, tr, u0, t_final, scheme=scheme, rho=rho, options=options)
    err = relative_error(dg, u, exact(dg.x, t_final).astype(dg.jac.dtype))
    return dg, u, AdvectionResult(err, info.steps, dt, limit, info.seconds, float(mass(dg, u0)),
                                  float(mass(dg, u)), float(energy(dg, u0)), float(energy(dg, u)),
                                  mesh.num_elements, dg.order)
