"""The onset of Rayleigh–Bénard convection between rigid walls: the growth rate σ of a small roll
against the Rayleigh number, and its zero, against the critical Ra = 1707.76 (Chandrasekhar).

Each Rayleigh number is one run of :func:`jaxsem.app.rbc.run_rbc` (what ``jaxsem solve rbc``
runs): one critical wavelength 2π/3.117 wide, Pr = 1, from the conduction profile plus a roll of
amplitude 10⁻³; σ = ½ d ln E_k/dt over the last sample (thermal-diffusion units). The zero of σ is
interpolated linearly between the two Rayleigh numbers that bracket it, and the sweep's least-squares
line through all points gives a second estimate.

    python -m experiments.rbc_onset                                   # about 2 min on 2 CPU cores
    python -m experiments.rbc_onset --out experiments/results/rbc_onset_cpu.json
"""

from __future__ import annotations

import argparse

import numpy as np

from jaxsem.app.rbc import CRITICAL_RAYLEIGH, run_rbc

from .common import record, write_json


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rayleigh", default="1600,1650,1700,1720,1770,1800",
                   help="comma-separated Rayleigh numbers (default: %(default)s)")
    p.add_argument("--order", type=int, default=5)
    p.add_argument("--elements", type=int, nargs=3, default=(3, 1, 3))
    p.add_argument("--dt", type=float, default=0.002)
    p.add_argument("--t-final", type=float, default=0.6)
    p.add_argument("--sample", type=float, default=0.2)
    p.add_argument("--out", default=None, help="write the JSON there")
    a = p.parse_args(argv)
    ras = [float(v) for v in a.rayleigh.split(",")]
    rows = []
    for ra in ras:
        r = run_rbc(a.order, tuple(a.elements), rayleigh=ra, dt=a.dt, t_final=a.t_final, sample=a.sample)
        if r["status"] != "t_final":
            raise SystemExit(f"Ra {ra:g}: the run stopped: {r['message']}")
        rows.append(dict(rayleigh=ra, growth_rate=r["growth_rate"], growth_rate_series=r["growth_rate_series"],
                         nusselt=r["nusselt"], steps=r["steps"], seconds=r["seconds"]))
        print(f"Ra {ra:7.1f}: sigma {r['growth_rate']:+.5f}, Nusselt {r['nusselt']:.6f}, {r['seconds']:.1f} s",
              flush=True)
    ra, sigma = np.array(ras), np.array([row["growth_rate"] for row in rows])
    crossing = None
    for i in range(len(ra) - 1):
        if sigma[i] < 0 <= sigma[i + 1]:
            crossing = float(ra[i] - sigma[i] * (ra[i + 1] - ra[i]) / (sigma[i + 1] - sigma[i]))
    slope, intercept = np.polyfit(ra, sigma, 1)
    fit = float(-intercept / slope)
    out = dict(record("rbc_onset"), order=a.order, elements=list(a.elements), dt=a.dt, t_final=a.t_final,
               sample=a.sample, prandtl=1.0, wavenumber=3.117, amplitude=1e-3, rows=rows,
               critical_rayleigh=CRITICAL_RAYLEIGH, zero_bracketing=crossing, zero_least_squares=fit,
               relative_error_bracketing=None if crossing is None else crossing / CRITICAL_RAYLEIGH - 1,
               relative_error_least_squares=fit / CRITICAL_RAYLEIGH - 1)
    print(f"zero of sigma: {crossing} (bracketing points), {fit:.2f} (least squares) against {CRITICAL_RAYLEIGH}")
    if a.out:
        write_json(a.out, out)
    return out


if __name__ == "__main__":
    main()
