"""Exact incompressible flows and reference data that Navier–Stokes solvers are verified against.

- :func:`ethier_steinman`: the unsteady 3-D exact solution of Ethier & Steinman (1994).
- :func:`kovasznay`: Kovasznay's steady 2-D flow behind a grid (exact, any Re).
- :func:`taylor_green`: the Taylor–Green vortex initial condition (HiOCFD workshop case C3.5).
- :func:`tgv_reference`: the 512³ spectral DNS of that vortex at Re = 1600 (E_k, ε, Z over t).

Fields are jnp callables of coordinate arrays of any (broadcastable) shape, traceable and
differentiable; vector fields return their components first, ``(3, ...)``. Nondimensional,
density ρ = 1.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ExactFlow", "InitialFlow", "ethier_steinman", "kovasznay", "velocity_gradient", "taylor_green",
    "TGVReference", "TGVSample", "tgv_reference", "TGV_REFERENCE_ENV",
]

TGV_REFERENCE_ENV = "JAXSEM_TGV_REFERENCE"
# Where the project keeps shared data: <repository root>/../shared (repository root = parent of jaxsem/).
_SHARED_PATH = pathlib.Path(__file__).resolve().parents[2].parent / "shared/data/tgv/spectral_Re1600_512.gdiag"
_PACKAGED_PATH = pathlib.Path(__file__).resolve().parents[1] / "data" / "tgv_re1600_dns.txt"


@dataclasses.dataclass(frozen=True)
class ExactFlow:
    """An exact unsteady Navier–Stokes solution for kinematic viscosity ``nu``.

    ``velocity(x, y, z, t) -> (3, ...)``, ``pressure(x, y, z, t) -> (...)`` (kinematic, ρ = 1),
    ``vorticity(x, y, z, t) -> (3, ...)`` = ∇×u; ``...`` is the broadcast shape of the arguments.
    """

    velocity: Callable
    pressure: Callable
    vorticity: Callable
    nu: float


@dataclasses.dataclass(frozen=True)
class InitialFlow:
    """A divergence-free initial condition: ``velocity(x, y, z) -> (3, ...)``, ``pressure(x, y, z) -> (...)``,
    ``vorticity(x, y, z) -> (3, ...)`` = ∇×u."""

    velocity: Callable
    pressure: Callable
    vorticity: Callable


def _real(name: str, value, nonnegative: bool = False):
    """``value`` checked finite (and ≥ 0) where concrete; traced values pass through."""
    if isinstance(value, jax.core.Tracer):
        return value
    v = np.asarray(value)
    if v.ndim != 0 or not np.isrealobj(v) or v.dtype == bool or not np.isfinite(v) or (nonnegative and v < 0):
        allowed = "a finite real number ≥ 0" if nonnegative else "a finite real number"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(v)


def ethier_steinman(a=np.pi / 4, d=np.pi / 2, nu=1.0) -> ExactFlow:
    """The Ethier–Steinman exact unsteady 3-D Navier–Stokes solution (any box, any Re).

    With E = e^{−ν d² t} (the viscosity enters only through it):
      u = −a [e^{ax} sin(ay + dz) + e^{az} cos(ax + dy)] E
      v = −a [e^{ay} sin(az + dx) + e^{ax} cos(ay + dz)] E
      w = −a [e^{az} sin(ax + dy) + e^{ay} cos(az + dx)] E
      p = −(a²/2) [e^{2ax} + e^{2ay} + e^{2az}
                   + 2 sin(ax + dy) cos(az + dx) e^{a(y+z)}
                   + 2 sin(ay + dz) cos(ax + dy) e^{a(z+x)}
                   + 2 sin(az + dx) cos(ay + dz) e^{a(x+y)}] E²
    The field is Beltrami, ∇×u = d u, so (u·∇)u = ∇(½|u|²) and p = −½|u|².
    Defaults a = π/4, d = π/2 are the paper's test values on [−1, 1]³. Dirichlet data for a
    solver is ``velocity`` on the boundary.

    C. R. Ethier & D. A. Steinman, "Exact fully 3D Navier–Stokes solutions for benchmarking",
    Int. J. Numer. Meth. Fluids 19 (1994) 369–375.
    """
    a, d, nu = _real("a", a), _real("d", d), _real("nu", nu, nonnegative=True)

    def velocity(x, y, z, t):
        x, y, z, t = jnp.broadcast_arrays(x, y, z, t)
        ex, ey, ez = jnp.exp(a * x), jnp.exp(a * y), jnp.exp(a * z)
        u = ex * jnp.sin(a * y + d * z) + ez * jnp.cos(a * x + d * y)
        v = ey * jnp.sin(a * z + d * x) + ex * jnp.cos(a * y + d * z)
        w = ez * jnp.sin(a * x + d * y) + ey * jnp.cos(a * z + d * x)
        return -a * jnp.exp(-nu * d**2 * t) * jnp.stack([u, v, w])

    def pressure(x, y, z, t):
        x, y, z, t = jnp.broadcast_arrays(x, y, z, t)
        s = (jnp.exp(2 * a * x) + jnp.exp(2 * a * y) + jnp.exp(2 * a * z)
             + 2 * jnp.sin(a * x + d * y) * jnp.cos(a * z + d * x) * jnp.exp(a * (y + z))
             + 2 * jnp.sin(a * y + d * z) * jnp.cos(a * x + d * y) * jnp.exp(a * (z + x))
             + 2 * jnp.sin(a * z + d * x) * jnp.cos(a * y + d * z) * jnp.exp(a * (x + y)))
        return -0.5 * a**2 * jnp.exp(-2 * nu * d**2 * t) * s

    def vorticity(x, y, z, t):
        return d * velocity(x, y, z, t)

    return ExactFlow(velocity, pressure, vorticity, nu)


def kovasznay(reynolds=40.0) -> ExactFlow:
    """Kovasznay's exact steady flow (the laminar wake behind a grid), ν = 1/Re, in the x–y plane:
      u = 1 − e^{λx} cos 2πy,  v = (λ/2π) e^{λx} sin 2πy,  w = 0,  p = ½(1 − e^{2λx}),
    λ = Re/2 − √(Re²/4 + 4π²). The usual test domain is [−0.5, 1] × [−0.5, 1.5] at Re = 40,
    here one element deep and periodic in z. Fields take ``(x, y, z, t)`` (``t`` unused).

    L. I. G. Kovasznay, "Laminar flow behind a two-dimensional grid", Proc. Camb. Phil. Soc.
    44 (1948) 58–62.
    """
    re = _real("reynolds", reynolds)
    if not re > 0:
        raise ValueError(f"reynolds must be > 0, got {reynolds!r}")
    lam = re / 2 - np.sqrt(re**2 / 4 + 4 * np.pi**2)

    def velocity(x, y, z, t=0.0):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        e = jnp.exp(lam * x)
        return jnp.stack([1 - e * jnp.cos(2 * np.pi * y), lam / (2 * np.pi) * e * jnp.sin(2 * np.pi * y),
                          jnp.zeros_like(x)])

    def pressure(x, y, z, t=0.0):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        return 0.5 * (1 - jnp.exp(2 * lam * x))

    def vorticity(x, y, z, t=0.0):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        wz = (lam**2 / (2 * np.pi) - 2 * np.pi) * jnp.exp(lam * x) * jnp.sin(2 * np.pi * y)
        return jnp.stack([jnp.zeros_like(x), jnp.zeros_like(x), wz])

    return ExactFlow(velocity, pressure, vorticity, 1.0 / re)


def velocity_gradient(velocity: Callable) -> Callable:
    """``g(x, y, z, t) -> (3, 3, ...)``, ``g[i, j] = ∂u_j/∂x_i`` of a pointwise velocity field
    ``velocity(x, y, z, t) -> (3, ...)`` (forward-mode derivatives, exact to round-off)."""

    def g(x, y, z, t=0.0):
        x, y, z, t = jnp.broadcast_arrays(*(jnp.asarray(a, jnp.result_type(float)) for a in (x, y, z, t)))
        f = lambda *c: velocity(*c, t)  # noqa: E731
        ones, zero = jnp.ones_like(x), jnp.zeros_like(x)
        tangents = ((ones, zero, zero), (zero, ones, zero), (zero, zero, ones))
        return jnp.stack([jax.jvp(f, (x, y, z), tan)[1] for tan in tangents])

    return g


def taylor_green(V0=1.0) -> InitialFlow:
    """The Taylor–Green vortex initial condition on the periodic box [−π, π]³ (L = 1, ρ = 1).

      u = V0 sin x cos y cos z,  v = −V0 cos x sin y cos z,  w = 0,
      p = V0² (cos 2x + cos 2y)(cos 2z + 2) / 16   (the pressure of this u; p0 = 0),
      ω = V0 (−cos x sin y sin z, −sin x cos y sin z, 2 sin x sin y cos z).
    Volume averages: ½|u|² = V0²/8, ½|ω|² = 3V0²/8. With V0 = 1 and ν = 1/1600 this is case
    C3.5 of the 1st International Workshop on High-Order CFD Methods (Wang et al., 2013),
    whose DNS is :func:`tgv_reference`.
    """
    V0 = _real("V0", V0)

    def velocity(x, y, z):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        cz = jnp.cos(z)
        return V0 * jnp.stack([jnp.sin(x) * jnp.cos(y) * cz, -jnp.cos(x) * jnp.sin(y) * cz, jnp.zeros_like(x)])

    def pressure(x, y, z):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        return V0**2 / 16 * (jnp.cos(2 * x) + jnp.cos(2 * y)) * (jnp.cos(2 * z) + 2)

    def vorticity(x, y, z):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        sx, cx, sy, cy, sz, cz = jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y), jnp.sin(z), jnp.cos(z)
        return V0 * jnp.stack([-cx * sy * sz, -sx * cy * sz, 2 * sx * sy * cz])

    return InitialFlow(velocity, pressure, vorticity)


class TGVSample(NamedTuple):
    """Reference values at given times, each of the shape of those times."""

    kinetic_energy: np.ndarray
    dissipation: np.ndarray
    enstrophy: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class TGVReference:
    """Volume-averaged DNS diagnostics of the Taylor–Green vortex, one row per time: ``(T,)`` each.

    ``time`` (convective units L/V0), ``kinetic_energy`` E_k = ⟨½|u|²⟩, ``dissipation``
    ε = −dE_k/dt, ``enstrophy`` Z = ⟨½|ω|²⟩ (so ε ≈ 2νZ). Arrays are read-only.
    """

    time: np.ndarray
    kinetic_energy: np.ndarray
    dissipation: np.ndarray
    enstrophy: np.ndarray
    path: pathlib.Path

    def peak_dissipation(self) -> tuple[float, float]:
        """(t, ε) of the largest dissipation rate among the rows."""
        i = int(np.argmax(self.dissipation))
        return float(self.time[i]), float(self.dissipation[i])

    def at(self, t) -> TGVSample:
        """E_k, ε and Z linearly interpolated at time(s) ``t`` within [time[0], time[-1]]."""
        t = np.asarray(t, dtype=float)
        lo, hi = self.time[0], self.time[-1]
        outside = t[~((t >= lo) & (t <= hi))]
        if outside.size:
            raise ValueError(f"t must lie in the reference's range [{lo}, {hi}], got {outside.flat[0]}")
        return TGVSample(*(np.interp(t, self.time, f) for f in (self.kinetic_energy, self.dissipation, self.enstrophy)))


def tgv_reference(path: str | os.PathLike | None = None) -> TGVReference | None:
    """The TGV Re = 1600 spectral DNS (512³) reference: a 4-column ``.gdiag`` file (t, E_k, ε, Z).

    ``path=None`` uses the file named by the environment variable ``JAXSEM_TGV_REFERENCE``
    if set, else ``<repository root>/../shared/data/tgv/spectral_Re1600_512.gdiag`` (every
    0.01 in t) where it exists, else the table shipped in the package (the same rows every 0.1,
    plus the dissipation peak at t = 8.97 and the last row; ``jaxsem/data/tgv_re1600_dns.txt``).
    It returns None only if even the packaged table is missing (a broken install). Raises ``FileNotFoundError`` for a given path (or the
    variable's) that does not exist and ``ValueError`` naming the path for a malformed file.
    Data: HiOCFD workshop case C3.5 (Wang et al., Int. J. Numer. Meth. Fluids 72 (2013) 811).
    """
    if path is None:
        env = os.environ.get(TGV_REFERENCE_ENV)
        if env:
            path, who = env, f"{TGV_REFERENCE_ENV}"
        elif _SHARED_PATH.is_file():
            path, who = _SHARED_PATH, "default path"
        elif _PACKAGED_PATH.is_file():
            path, who = _PACKAGED_PATH, "packaged table"
        else:
            return None
    else:
        who = "path"
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{who}: no TGV reference file at {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{who}: cannot read TGV reference {str(path)!r}: {e}") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{who}: TGV reference {str(path)!r} line {lineno}"
        if len(fields) != 4:
            raise ValueError(f"{where}: expected 4 columns (t, E_k, -dE/dt, enstrophy), got {len(fields)}")
        try:
            rows.append([float(f) for f in fields])
        except ValueError:
            raise ValueError(f"{where}: non-numeric value in {line.strip()!r}") from None
    data = np.array(rows, dtype=float).reshape(-1, 4)
    if len(data) < 2:
        raise ValueError(f"{who}: TGV reference {str(path)!r} needs at least 2 data rows, got {len(data)}")
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{who}: TGV reference {str(path)!r} has non-finite values")
    if not np.all(np.diff(data[:, 0]) > 0):
        raise ValueError(f"{who}: TGV reference {str(path)!r} times must increase strictly")
    cols = [np.ascontiguousarray(c) for c in data.T]
    for c in cols:
        c.setflags(write=False)
    return TGVReference(*cols, path=path)
