"""``jaxsem solve rbc``: Rayleigh–Bénard convection between rigid walls, the onset of convection.

Thermal-diffusion units (length: the layer depth d; time: d²/κ; temperature: the difference
ΔT across the layer): ν = Pr, κ = 1, the buoyancy Ra·Pr·θ ẑ (Boussinesq). The cell is one
wavelength 2π/k wide in x (periodic), ``Ey`` elements of the x element width deep in y
(periodic), and spans 0 ≤ z ≤ 1 between no-slip walls held at θ = 1 (bottom) and θ = 0 (top).
The run starts at rest from the conduction profile 1 − z plus a small roll
``amplitude·cos(kx) sin(πz)``; the kinetic energy of the growing or decaying roll gives the
growth rate σ = ½ d(ln E_k)/dt per sample (linear stability: σ changes sign at the critical
Rayleigh number, 1707.76 at k = 3.117 for rigid walls), and the bottom wall's heat flux the
Nusselt number (1 for conduction).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..mesh.box import box_mesh
from ..models import navier_stokes as NS
from ..models.navier_stokes import NO_SLIP, Buoyancy, Scalar, Value
from ..solvers.driver import RunOptions
from ..solvers.stops import NonFiniteError, RunStopped
from .verify import _where

__all__ = ["run_rbc", "CRITICAL_RAYLEIGH", "CRITICAL_WAVENUMBER"]

CRITICAL_RAYLEIGH = 1707.76  # rigid–rigid walls (Chandrasekhar 1961)
CRITICAL_WAVENUMBER = 3.117


@functools.lru_cache(maxsize=8)
def _start(wavenumber: float, amplitude: float):
    """The initial temperature, one function object per (k, amplitude): runs share programs."""
    def theta(x, y, z):
        return 1 - z + amplitude * jnp.cos(wavenumber * x) * jnp.sin(np.pi * z)

    return theta


def _at_rest(x, y, z):
    return jnp.zeros((3,) + jnp.shape(x), jnp.result_type(x))


def run_rbc(order: int, elements, *, rayleigh: float, prandtl: float = 1.0, wavenumber: float = CRITICAL_WAVENUMBER,
            t_final: float = 2.0, dt: float = 0.002, sample: float = 0.1, amplitude: float = 1e-3,
            backend: str = "auto", place: dict | None = None, progress=lambda m: None,
            progress_bar: bool = False) -> dict:
    """Run the convection cell and measure the growth rate and the Nusselt number; returns the
    record (a dict): ``growth_rate`` (σ of the last sample, thermal-diffusion units),
    ``nusselt`` (at the end), and the series ``time``, ``kinetic_energy``,
    ``growth_rate_series`` (per sample, None for the start) and ``nusselt_series``."""
    place = place or {}
    tic = time.perf_counter()
    ex, ey, ez = elements
    lx = 2 * np.pi / wavenumber
    mesh = box_mesh(tuple(elements), order, lengths=(lx, ey * lx / ex, 1.0), periodic=(True, True, False))
    ns = NS.setup(mesh, nu=prandtl, dt=dt, boundary={"zmin": NO_SLIP, "zmax": NO_SLIP},
                  scalars=Scalar("T", 1.0, boundary={"zmin": Value(1.0), "zmax": Value(0.0)}),
                  buoyancy=Buoyancy("T", (0.0, 0.0, rayleigh * prandtl)), backend=backend, **place)
    st = NS.initial_state(ns, _at_rest, scalars={"T": _start(float(wavenumber), float(amplitude))})
    setup_seconds = time.perf_counter() - tic
    samples = round(t_final / sample)
    progress(f"Rayleigh-Benard Ra {rayleigh:g}, Pr {prandtl:g}, k {wavenumber:g}: order {order}, "
             f"{'x'.join(map(str, elements))} elements, dt {dt:.4g} ({samples} samples), setup {setup_seconds:.1f} s")
    base = dict(problem="rbc", order=order, elements=list(elements), rayleigh=rayleigh, prandtl=prandtl,
                wavenumber=wavenumber, amplitude=amplitude, dt=dt, t_final=t_final, sample=sample,
                critical_rayleigh=CRITICAL_RAYLEIGH, dofs=int(ns.sem.num_global), time_order=ns.options.time_order,
                backend=ns.sem.backend.name, setup_seconds=setup_seconds, **_where(ns.sem))
    nusselt = jax.jit(lambda ns, st: NS.scalar_flux(ns, st, "T", "zmin") / (lx * ey * lx / ex))  # heat in / area
    opts = RunOptions(progress=progress_bar, desc="Rayleigh-Benard")
    times, energy, nu_series, steps, seconds = [], [], [], 0, 0.0
    try:
        for i in range(samples):
            st, s, info = NS.run(ns, st, (i + 1) * sample, sample_interval=sample, options=opts)
            if i == 0:
                times.append(float(s.time[0]))
                energy.append(float(s.kinetic_energy[0]))
                nu_series.append(None)
            times.append(float(s.time[-1]))
            energy.append(float(s.kinetic_energy[-1]))
            nu_series.append(float(nusselt(ns, st)))
            steps, seconds = steps + info.steps, seconds + info.seconds
    except (NonFiniteError, RunStopped) as e:
        return dict(base, converged=False, status=e.status, steps=e.step, t=e.t, message=str(e))
    e = np.asarray(energy)
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = 0.5 * np.diff(np.log(e)) / np.diff(times)
    finite = lambda v: float(v) if math.isfinite(float(v)) else None  # noqa: E731
    return dict(base, converged=True, status="t_final", steps=steps, t=float(st.t), seconds=seconds,
                seconds_per_step=seconds / max(steps, 1), growth_rate=finite(sigma[-1]), nusselt=nu_series[-1],
                time=times, kinetic_energy=energy, growth_rate_series=[None] + [finite(v) for v in sigma],
                nusselt_series=nu_series)
