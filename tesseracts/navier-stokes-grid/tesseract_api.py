"""jaxsem's incompressible Navier–Stokes solver behind Mosaic's ``navier_stokes_grid`` schema.

A grid velocity ``v0: (N, N, N, 3)`` on [0, L)³ (points x_j = jL/N, triply periodic), or the
2-D one-cell-deep ``(N, N, 1, 2)``, is advanced ``steps`` steps of ``dt`` with ``viscosity`` and
returned on the same grid:

1. Leray projection on the grid (FFT): v̂ − k(k·v̂)/|k|², the mean kept; a no-op (to round-off)
   for a field that is spectrally divergence-free already, as Mosaic's initial conditions are.
2. Fourier interpolation onto the GLL nodes of a periodic box of N/2 elements per axis of even
   order p (default 4): the trigonometric interpolant of the grid values (Nyquist mode split
   symmetrically), evaluated at the nodes — exact for band-limited data.
3. ``steps · m`` steps of Δt = dt/m of :func:`jaxsem.models.navier_stokes.simulate` (PN–PN,
   BDF3/EXT3, 3/2-rule dealiasing), m = ``substeps`` or the least integer with
   (dt/m)·U·max_d (2/h_d)/Δr_min ≤ :data:`CFL` (U = max(1, max over the grid of Σ_a |v_a|),
   h the element size, Δr_min the smallest GLL gap on [−1, 1]: the CFL measure of
   :class:`jaxsem.models.navier_stokes.Diagnostics`, bounded from the initial field).
4. The grid points are GLL nodes of the mesh (element vertices and mid-nodes: N/2 elements,
   even p), so returning to the grid picks nodal values — exact Lagrange interpolation, and
   grid → nodes → grid is the identity.

float64 inside (importing jaxsem enables x64), float32 at the schema's boundary. Reverse mode
(``vector_jacobian_product``) runs the binomial checkpointing of
:class:`jaxsem.solvers.timestepping.Checkpointing` with at most ``snapshots`` stored states
(:func:`default_snapshots` when not given); forward mode runs the plain scan. Gradients reach
``v0``, ``viscosity`` and ``dt`` (through the step Δt = dt/m at fixed m: the final time is
steps · dt). The discretization is built once per (grid shape, L, order) and each program
(forward, VJP, JVP) is compiled once per (grid, steps, m) and kept.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from enum import Enum
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, Field, model_validator
from tesseract_core.runtime import Array, Differentiable, Float32

import jaxsem as js
from jaxsem.core import basis
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers.timestepping import Checkpointing

CFL = 0.4
"""The CFL number the automatic sub-step rule keeps below (jaxsem's ``solve tgv`` default)."""

OPTIONS = NS.NSOptions(pressure_tol=1e-10, velocity_tol=1e-12)
"""The solves: tight enough that forward and reverse mode agree to ~1e-10 (the dot-product test)."""

SNAPSHOT_BYTES = 2 << 30
"""The memory :func:`default_snapshots` gives the stored states of reverse mode (2 GiB)."""

GridVectorField = Array[(None, None, None, None), Float32]


# ---------------------------------------------------------------------------------------------
# The canonical schema (mosaic_shared.problems.navier_stokes_grid, not on PyPI: mirrored here)
# ---------------------------------------------------------------------------------------------


class BCType(str, Enum):
    """Boundary condition type for a single domain face."""

    PERIODIC = "periodic"
    NO_SLIP = "no_slip"
    NEUMANN = "neumann"
    DIRICHLET = "dirichlet"


class FaceBC(BaseModel):
    """Boundary condition for one face of the domain."""

    type: BCType = BCType.PERIODIC
    value: list[float] | None = Field(default=None, description="Velocity for DIRICHLET (None: no-slip).")


class GridBC(BaseModel):
    """Per-face boundary conditions of the grid (all periodic by default)."""

    x_lo: FaceBC = Field(default_factory=FaceBC)
    x_hi: FaceBC = Field(default_factory=FaceBC)
    y_lo: FaceBC = Field(default_factory=FaceBC)
    y_hi: FaceBC = Field(default_factory=FaceBC)
    z_lo: FaceBC = Field(default_factory=FaceBC)
    z_hi: FaceBC = Field(default_factory=FaceBC)

    @property
    def is_fully_periodic(self) -> bool:
        """True iff all six faces are periodic."""
        faces = (self.x_lo, self.x_hi, self.y_lo, self.y_hi, self.z_lo, self.z_hi)
        return all(f.type == BCType.PERIODIC for f in faces)


class GridObstacle(BaseModel):
    """A solid obstacle in the flow (fractions of ``domain_extent``); refused by this solver."""

    shape: Literal["cylinder", "box"] = "cylinder"
    center: list[float] = Field(default=[0.5, 0.5])
    radius: float | None = None
    half_widths: list[float] | None = None
    bc: Literal["no_slip"] = "no_slip"


def vortex_2d(N: int = 64, L: float = 2 * np.pi, seed: int = 42) -> np.ndarray:
    """``(N, N, 1, 2)`` float32: a random divergence-free 2-D field, the canonical default's kind.

    The velocity of a stream function whose spectrum is a Gaussian ring |k| = 4 ± 1.5 with
    random phases (seeded), scaled to unit maximum speed. Same recipe as the canonical
    default, not its bits.
    """
    rng = np.random.default_rng(seed)
    k = np.fft.fftfreq(N, 1.0 / N)
    kx, ky = np.meshgrid(k, k, indexing="ij")
    ring = np.exp(-0.5 * ((np.hypot(kx, ky) - 4.0) / 1.5) ** 2)
    psi = np.fft.ifft2(ring * np.exp(2j * np.pi * rng.random((N, N)))).real
    psi_hat = np.fft.fft2(psi)
    scale = 2 * np.pi / L
    u = np.fft.ifft2(1j * ky * scale * psi_hat).real
    v = np.fft.ifft2(-1j * kx * scale * psi_hat).real
    top = float(np.sqrt(u * u + v * v).max()) or 1.0
    return (np.stack([u, v], -1)[:, :, None, :] / top).astype(np.float32)


class InputSchema(BaseModel):
    """Mosaic's canonical ``navier_stokes_grid`` inputs, differentiable in v0, viscosity and dt,
    with jaxsem's discretization choices (``order``, ``substeps``, ``snapshots``) as extras."""

    v0: Differentiable[GridVectorField] = Field(
        default_factory=vortex_2d,
        description="Initial velocity, (N, N, N, 3) on [0, L)³ or (N, N, 1, 2) (2-D); N even, ≥ 4. "
                    "Default: a 64×64 divergence-free random vortex field.")
    viscosity: Differentiable[Array[(1,), Float32]] = Field(
        default_factory=lambda: np.array([0.05], np.float32), description="Kinematic viscosity ν ≥ 0.")
    dt: Differentiable[Array[(1,), Float32]] = Field(
        default_factory=lambda: np.array([0.01], np.float32), description="Timestep size.")
    steps: int = Field(default=300, description="Number of timesteps. Total simulated time = steps × dt.")
    domain_extent: float = Field(default=2 * np.pi, description="Side length of the periodic domain.")
    boundary_conditions: GridBC = Field(default_factory=GridBC, description="Per-face BCs: all periodic here.")
    obstacle: GridObstacle | None = Field(default=None, description="Not supported: must be None.")
    inflow_profile: Array[(None,), Float32] | None = Field(default=None, description="Not supported: must be None.")
    order: int = Field(default=4, description="Polynomial order p of the elements (even, 2 ≤ p ≤ 16).")
    substeps: int | None = Field(
        default=None, description="jaxsem steps per schema step (None: the least that keeps CFL ≤ 0.4).")
    snapshots: int | None = Field(
        default=None, description="States stored by reverse mode (None: as many as fit in 2 GiB, 4 to 64).")

    @model_validator(mode="after")
    def _check(self) -> "InputSchema":
        check_inputs(self)
        return self


class OutputSchema(BaseModel):
    """Mosaic's canonical ``navier_stokes_grid`` outputs."""

    result: Differentiable[GridVectorField] = Field(description="Final velocity field, same shape as v0.")
    drag: Array[(1,), Float32] | None = Field(default=None, description="None: no obstacle.")


def _number(name: str, value, allowed: str, ok) -> None:
    v = np.asarray(value, np.float64).reshape(-1)
    if v.size != 1 or not math.isfinite(float(v[0])) or not ok(float(v[0])):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_inputs(inputs: InputSchema) -> None:
    """Refuse what this solver cannot run, naming the input, before any set-up."""
    grid_shape(tuple(inputs.v0.shape))  # an array, or a ShapeDType under abstract_eval
    if isinstance(inputs.v0, np.ndarray) and not np.all(np.isfinite(inputs.v0)):
        raise ValueError("v0 has NaN/Inf values")
    for name, allowed, ok in (("viscosity", "a finite number >= 0", lambda v: v >= 0),
                              ("dt", "a finite number > 0", lambda v: v > 0)):
        value = getattr(inputs, name)
        if isinstance(value, np.ndarray):
            _number(name, value, allowed, ok)
    _count("steps", inputs.steps, 0)
    _number("domain_extent", inputs.domain_extent, "a finite number > 0", lambda v: v > 0)
    bc = inputs.boundary_conditions
    if not bc.is_fully_periodic:
        faces = {f: getattr(bc, f).type.value for f in ("x_lo", "x_hi", "y_lo", "y_hi", "z_lo", "z_hi")
                 if getattr(bc, f).type != BCType.PERIODIC}
        raise ValueError(f"boundary_conditions must be periodic on all six faces (a triply-periodic grid), "
                         f"got {faces}")
    if inputs.obstacle is not None:
        raise ValueError(f"obstacle must be None (no immersed obstacles on the periodic box), got a "
                         f"{inputs.obstacle.shape}")
    if inputs.inflow_profile is not None:
        raise ValueError("inflow_profile must be None (no inflow on a periodic box)")
    if isinstance(inputs.order, bool) or not isinstance(inputs.order, int) or inputs.order % 2 \
            or not 2 <= inputs.order <= 16:
        raise ValueError(f"order must be an even integer in [2, 16] (the grid points are element vertices "
                         f"and mid-nodes), got {inputs.order!r}")
    if inputs.substeps is not None:
        _count("substeps", inputs.substeps, 1)
    if inputs.snapshots is not None:
        _count("snapshots", inputs.snapshots, 1)


def grid_shape(shape: tuple) -> tuple:
    """``(Nx, Ny, Nz)`` of a ``v0`` shape: (N, N, N, 3), or (N, N, 1, 2) for 2-D; N even, ≥ 4.
    ``ValueError`` naming ``v0`` otherwise."""
    if len(shape) != 4 or shape[-1] not in (2, 3):
        raise ValueError(f"v0 must have shape (N, N, N, 3) or (N, N, 1, 2), got {shape}")
    n = shape[0]
    want = (n, n, n, 3) if shape[-1] == 3 else (n, n, 1, 2)
    if shape != want:
        raise ValueError(f"v0 must be a cubic grid (N, N, N, 3) or a square one (N, N, 1, 2), got {shape}")
    if n < 4 or n % 2:
        raise ValueError(f"v0: N must be even and >= 4 (N/2 >= 2 elements per axis, grid points at their "
                         f"vertices and mid-nodes), got N = {n}")
    return tuple(shape[:3])


# ---------------------------------------------------------------------------------------------
# Grid ↔ GLL nodes
# ---------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GridMap:
    """The periodic discretization of one (grid, L, order) and its maps to and from the grid (pytree).

    Attributes (Nd grid points, Ed = max(Nd/2, 2) elements and Md = Ed·n element-local nodes per
    axis d, n = order + 1):
      ns: the :class:`jaxsem.models.navier_stokes.NavierStokes` (ν and Δt are replaced per call).
      T: ``((Mx, Nx), (My, Ny), (Mz, Nz))`` Fourier interpolation from the grid to each axis'
        nodes (ones for the one-point axis of 2-D).
      wavenumbers: ``((Nx,), (Ny,), (Nz,))`` integer wavenumbers of the grid's FFT.
      shape: static ``(Nx, Ny, Nz)``; elements: static ``(Ex, Ey, Ez)``; order: static p.
      rate: static max_d (2/h_d)/Δr_min: CFL per unit step and unit speed.
    """

    ns: NS.NavierStokes
    T: tuple
    wavenumbers: tuple
    shape: tuple = dataclasses.field(metadata=dict(static=True))
    elements: tuple = dataclasses.field(metadata=dict(static=True))
    order: int = dataclasses.field(metadata=dict(static=True))
    rate: float = dataclasses.field(metadata=dict(static=True))


def fourier_matrix(N: int, xi: np.ndarray) -> np.ndarray:
    """``(M, N)``: the values at ``xi`` (grid units, x·N/L) of the trigonometric interpolant of N
    periodic samples at 0, 1, …, N − 1: (1/N) Σ_k w_k cos(2πk(ξ − j)/N), k = 0 … ⌊N/2⌋, w = 2 but
    w_0 = 1 and, N even, w_{N/2} = 1 (the Nyquist mode split evenly between ±N/2)."""
    k = np.arange(N // 2 + 1)
    w = np.where((k == 0) | (2 * k == N), 1.0, 2.0)
    phase = 2 * np.pi / N * (np.asarray(xi, np.float64)[:, None, None] - np.arange(N)[None, :, None]) * k
    return (np.cos(phase) @ w) / N


def _axis_nodes(elements: int, order: int) -> np.ndarray:
    """``(elements·n,)`` the element-local GLL nodes of one axis in element widths, [0, elements]."""
    r = basis.gll_points(order)[0]
    return (np.arange(elements)[:, None] + (1 + r[None, :]) / 2).reshape(-1)


@functools.lru_cache(maxsize=8)
def grid_map(shape: tuple, L: float, order: int) -> GridMap:
    """The :class:`GridMap` of grid ``shape = (Nx, Ny, Nz)`` on [0, L)³ at ``order`` (cached: one
    set-up per (shape, L, order)). A one-point axis (2-D) gets 2 elements of the others' size."""
    shape = grid_shape(tuple(shape) + ((3,) if shape[2] > 1 else (2,)))
    h = 2 * L / shape[0]
    elements = tuple(max(n // 2, 2) for n in shape)
    lengths = tuple(e * h for e in elements)
    mesh = js.box_mesh(elements, order, lengths=lengths, origin=(0.0,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1.0, dt=1.0, options=OPTIONS)
    T = []
    for n, e in zip(shape, elements):
        T.append(jnp.asarray(fourier_matrix(n, np.mod(2 * _axis_nodes(e, order), n))))
    r = basis.gll_points(order)[0]
    rate = (2 / h) / float(np.min(np.diff(r)))
    k = tuple(jnp.asarray(np.fft.fftfreq(n, 1.0 / n)) for n in shape)
    return GridMap(ns=ns, T=tuple(T), wavenumbers=k, shape=shape, elements=elements, order=order, rate=rate)


def project(g: GridMap, v):
    """``(Nx, Ny, Nz, 3)`` the Leray projection of ``v`` on the grid: v̂ − k(k·v̂)/|k|² (FFT,
    the mean kept, the real part of the inverse transform)."""
    k = jnp.meshgrid(*g.wavenumbers, indexing="ij")
    vh = jnp.fft.fftn(v, axes=(0, 1, 2))
    k2 = k[0] ** 2 + k[1] ** 2 + k[2] ** 2
    kv = (k[0] * vh[..., 0] + k[1] * vh[..., 1] + k[2] * vh[..., 2]) / jnp.where(k2 == 0, 1.0, k2)
    return jnp.fft.ifftn(vh - jnp.stack([ki * kv for ki in k], -1), axes=(0, 1, 2)).real


def to_nodes(g: GridMap, v):
    """``(3, E, n, n, n)`` the Fourier interpolant of the grid field ``v: (Nx, Ny, Nz, 3)`` at the
    GLL nodes (element order x fastest, node order [k, j, i])."""
    Tx, Ty, Tz = g.T
    u = jnp.einsum("xa,yb,zc,abcd->dzyx", Tx, Ty, Tz, v)  # (3, Mz, My, Mx)
    (ex, ey, ez), n = g.elements, g.order + 1
    u = u.reshape(3, ez, n, ey, n, ex, n).transpose(0, 1, 3, 5, 2, 4, 6)
    return u.reshape(3, ex * ey * ez, n, n, n)


def _picks(N: int, order: int):
    """Element and node index of each grid point of an axis: 2j → vertex of element j, 2j + 1 →
    its mid-node (a one-point axis: the first vertex)."""
    j = np.arange(N)
    return j // 2, np.where(j % 2, order // 2, 0)


def to_grid(g: GridMap, u):
    """``(Nx, Ny, Nz, 3)`` the nodal field ``u: (3, E, n, n, n)`` at the grid points (GLL nodes)."""
    (ex, ey, ez), n = g.elements, g.order + 1
    (Ix, ix), (Iy, iy), (Iz, iz) = (_picks(N, g.order) for N in g.shape)
    u = u.reshape(3, ez, ey, ex, n, n, n)
    out = u[:, Iz[:, None, None], Iy[None, :, None], Ix[None, None, :], iz[:, None, None], iy[None, :, None],
            ix[None, None, :]]  # (3, Nz, Ny, Nx)
    return out.transpose(3, 2, 1, 0)


# ---------------------------------------------------------------------------------------------
# The map v0 ↦ v(steps · dt) and its derivatives
# ---------------------------------------------------------------------------------------------


def substeps_for(g: GridMap, v0: np.ndarray, dt: float) -> int:
    """m, the least number of jaxsem steps per schema step with (dt/m)·U·rate ≤ :data:`CFL`,
    U = max(1, max over the grid of Σ_a |v0_a|)."""
    speed = max(1.0, float(np.max(np.sum(np.abs(v0), axis=-1))))
    return max(1, math.ceil(dt * speed * g.rate / CFL - 1e-9))


def default_snapshots(g: GridMap) -> int:
    """The states reverse mode stores: as many as :data:`SNAPSHOT_BYTES` holds, 4 to 64."""
    k, E, n = OPTIONS.time_order, g.ns.sem.mask.shape[0], g.order + 1
    state = (7 * k) * E * n ** 3 * 8  # U, F (3 components each) and P, k levels, float64
    return int(min(64, max(4, SNAPSHOT_BYTES // state)))


def rollout(g: GridMap, v0, viscosity, dt, steps: int, substeps: int, checkpointing=Checkpointing()):
    """``v(steps · dt)`` on the grid, same shape as ``v0`` (float64): project, interpolate to the
    nodes, ``steps · substeps`` jaxsem steps of dt/substeps, pick the grid points. Pure and
    differentiable in ``v0``, ``viscosity`` and ``dt`` (scalars ``()``)."""
    c = v0.shape[-1]
    v = v0 if c == 3 else jnp.concatenate([v0, jnp.zeros_like(v0[..., :1])], -1)
    ns = dataclasses.replace(g.ns, nu=jnp.asarray(viscosity, jnp.float64), dt=dt / substeps)
    st = NS.initial_state(ns, to_nodes(g, project(g, v)))
    st = NS.simulate(ns, st, steps * substeps, checkpointing=checkpointing)
    return to_grid(g, st.u)[..., :c]


def _schedule(steps: int, substeps: int, snapshots: int) -> Checkpointing:
    n = steps * substeps
    return Checkpointing() if n <= snapshots else Checkpointing(snapshots=snapshots)


@functools.partial(jax.jit, static_argnames=("steps", "substeps"))
def _forward(g: GridMap, v0, viscosity, dt, *, steps: int, substeps: int):
    return rollout(g, v0, viscosity, dt, steps, substeps)


@functools.partial(jax.jit, static_argnames=("steps", "substeps", "snapshots"))
def _vjp(g: GridMap, v0, viscosity, dt, cotangent, *, steps: int, substeps: int, snapshots: int):
    ck = _schedule(steps, substeps, snapshots)
    _, pull = jax.vjp(lambda a, b, c: rollout(g, a, b, c, steps, substeps, ck), v0, viscosity, dt)
    return pull(cotangent)


@functools.partial(jax.jit, static_argnames=("steps", "substeps"))
def _jvp(g: GridMap, primals: tuple, tangents: tuple, *, steps: int, substeps: int):
    return jax.jvp(lambda a, b, c: rollout(g, a, b, c, steps, substeps), primals, tangents)


_PROGRAMS: dict = {}


def _compiled(fn, g: GridMap, args: tuple, static: dict):
    """``fn`` compiled ahead of time for ``g``, the shapes of ``args`` and ``static``, kept (the 16
    latest): a call from inside an XLA callback — ``tesseract_jax.apply_tesseract`` under
    ``jax.grad`` or ``jit`` runs the endpoints there — misses ``jax.jit``'s own cache."""
    avals = tuple((a.shape, a.dtype, a.weak_type) for a in jax.tree.leaves(args))
    key = (fn, id(g), avals, tuple(sorted(static.items())))
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= 16:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = (g, fn.lower(g, *args, **static).compile())  # g held: its id stays its own
    return _PROGRAMS[key][1]


def forward(g: GridMap, v0, viscosity, dt, *, steps: int, substeps: int):
    """:func:`rollout`, compiled once per (g, shapes, steps, substeps)."""
    args = (v0, viscosity, dt)
    return _compiled(_forward, g, args, dict(steps=steps, substeps=substeps))(g, *args)


def vjp(g: GridMap, v0, viscosity, dt, cotangent, *, steps: int, substeps: int, snapshots: int):
    """``(∂v0, ∂viscosity, ∂dt)``: Jᵀ ``cotangent`` of :func:`rollout` (binomial checkpointing
    with ``snapshots`` states when the run is longer), compiled once per shapes and statics."""
    args = (v0, viscosity, dt, cotangent)
    return _compiled(_vjp, g, args, dict(steps=steps, substeps=substeps, snapshots=snapshots))(g, *args)


def jvp(g: GridMap, primals: tuple, tangents: tuple, *, steps: int, substeps: int):
    """``(v, J·tangents)`` of :func:`rollout` at ``primals = (v0, viscosity, dt)``, compiled once
    per shapes and statics (the plain scan: forward mode stores nothing)."""
    args = (tuple(primals), tuple(tangents))
    return _compiled(_jvp, g, args, dict(steps=steps, substeps=substeps))(g, *args)


def prepare(inputs: InputSchema) -> tuple:
    """``(g, (v0, viscosity, dt), dict(steps=, substeps=), snapshots)``: the cached map and the
    float64 arguments of one call."""
    v0 = np.asarray(inputs.v0, np.float64)
    g = grid_map(v0.shape[:3], float(inputs.domain_extent), inputs.order)
    dt = float(np.asarray(inputs.dt).reshape(-1)[0])
    m = inputs.substeps or substeps_for(g, v0, dt)
    args = point(v0, np.asarray(inputs.viscosity).reshape(-1)[0], dt)
    return g, args, dict(steps=int(inputs.steps), substeps=int(m)), inputs.snapshots or default_snapshots(g)


def point(v0, viscosity, dt) -> tuple:
    """``(v0, viscosity, dt)`` as float64 arrays, not weakly typed (one compiled program for
    every call, whatever the caller's Python floats)."""
    return tuple(jnp.asarray(np.asarray(a, np.float64)) for a in (v0, viscosity, dt))


# ---------------------------------------------------------------------------------------------
# Tesseract endpoints
# ---------------------------------------------------------------------------------------------


def apply(inputs: InputSchema) -> OutputSchema:
    """Advance ``v0`` by ``steps`` steps of ``dt``; ``result`` on the grid of ``v0``."""
    g, args, static, _ = prepare(inputs)
    return OutputSchema(result=np.asarray(forward(g, *args, **static), np.float32), drag=None)


_INPUTS = ("v0", "viscosity", "dt")


def vector_jacobian_product(inputs: InputSchema, vjp_inputs: set[str], vjp_outputs: set[str],
                            cotangent_vector: dict[str, Any]) -> dict[str, Any]:
    """Jᵀ of ``result`` w.r.t. ``v0``, ``viscosity``, ``dt`` (reverse mode, checkpointed)."""
    g, args, static, snapshots = prepare(inputs)
    ct = cotangent_vector.get("result") if "result" in vjp_outputs else None
    ct = jnp.zeros_like(args[0]) if ct is None else jnp.asarray(np.asarray(ct, np.float64))
    grads = vjp(g, *args, ct, **static, snapshots=snapshots)
    out = dict(zip(_INPUTS, grads))
    return {k: np.asarray(out[k], np.float32).reshape(np.shape(getattr(inputs, k))) for k in vjp_inputs}


def jacobian_vector_product(inputs: InputSchema, jvp_inputs: set[str], jvp_outputs: set[str],
                            tangent_vector: dict[str, Any]) -> dict[str, Any]:
    """J·tangent of ``result`` for tangents of ``v0``, ``viscosity``, ``dt`` (forward mode)."""
    g, args, static, _ = prepare(inputs)
    tangents = tuple(jnp.asarray(np.asarray(tangent_vector[k], np.float64).reshape(np.shape(a)))
                     if k in jvp_inputs and tangent_vector.get(k) is not None else jnp.zeros_like(a)
                     for k, a in zip(_INPUTS, args))
    _, t = jvp(g, args, tangents, **static)
    return {"result": np.asarray(t, np.float32)} if "result" in jvp_outputs else {}


def abstract_eval(abstract_inputs):
    """Shapes and dtypes of the outputs: ``result`` like ``v0``, float32; no ``drag``."""
    return {"result": {"shape": tuple(abstract_inputs.v0.shape), "dtype": "float32"}, "drag": None}
