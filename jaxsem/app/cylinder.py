"""``jaxsem solve cylinder``: the DFG flow around a cylinder (Schäfer & Turek 1996) against the
published drag, lift, pressure difference and Strouhal number.

The mesh is :func:`jaxsem.mesh.dfg_mesh` (2-D: one element deep, periodic in z; 3-D: the square
duct); the case's parabolic inflow on ``inlet`` from t = 0, no-slip on ``walls`` and ``cylinder``,
zero traction on ``outlet``. The run starts from the inflow profile extended through the channel
(the developed flow without the cylinder) and advances one sample interval per
:func:`navier_stokes.run` call, reading Δp = p(front) − p(back) at the benchmark's two points after
each. Steady cases (2D-1, 3D-1Z) stop at a steady state; 2D-2 runs to ``t_final`` and reports
c_D,max and c_L,max over the last full period of the lift and the Strouhal number St = D/(Ū T).
Writes ``cylinder.csv`` and ``cylinder.png`` with ``out`` and a VTU snapshot with ``vtu``; returns
the record the CLI prints.
"""

from __future__ import annotations

import functools
import math
import os
import time

import jax.numpy as jnp
import numpy as np

from ..mesh import cylinder as dfg
from ..models import navier_stokes as NS
from ..models.navier_stokes.boundary import NO_SLIP, Outflow, Velocity
from ..solvers.driver import RunOptions
from ..solvers.stops import NonFiniteError, RunStopped
from .tgv import setup_at_cfl
from .files import save_figure, write_csv
from .verify import _where, _write_vtu

__all__ = ["run_cylinder", "CASES", "shedding", "plot"]

CASES = {c.name: c for c in (dfg.DFG_2D_1, dfg.DFG_2D_2, dfg.DFG_3D_1Z)}
STEADY = ("2D-1", "3D-1Z")
PERIODS = 5  # the Strouhal number is the mean period over at most this many last periods of the lift
# the record's name of each reference quantity of DFGCase.reference
_NAMES = dict(c_D="drag_coefficient", c_L="lift_coefficient", dp="delta_p", c_D_max="drag_coefficient_max",
              c_L_max="lift_coefficient_max", St="strouhal")


@functools.lru_cache(maxsize=4)
def _inflow(name: str):
    """The case's inflow velocity ``u_b(x, y, z, t) -> (3, ...)`` (one function object per case:
    runs in one process share compiled programs)."""
    case = CASES[name]

    def u_b(x, y, z, t):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        u = case.inflow(y) if case.geometry.dim == 2 else case.inflow(y, z)
        return jnp.stack([u, jnp.zeros_like(u), jnp.zeros_like(u)])

    return u_b


def shedding(time_, drag, lift, diameter: float, mean_velocity: float, periods: int = PERIODS):
    """The periodic state of a shedding run from its sampled coefficients: ``(St, c_D,max, c_L,max)``.

    The lift's upward crossings of its mean over the last half of the run, placed by linear
    interpolation, give the period T (the mean over at most ``periods`` last periods) and
    St = D/(Ū T); c_D,max and c_L,max are the largest samples within the last full period.
    ``(None, None, None)`` when fewer than two crossings (no full period) are found."""
    t, cd, cl = (np.asarray(a, float) for a in (time_, drag, lift))
    ok = np.isfinite(cl) & np.isfinite(cd)
    t, cd, cl = t[ok], cd[ok], cl[ok]
    if t.size < 4:
        return None, None, None
    late = t >= t[0] + 0.5 * (t[-1] - t[0])  # past the onset of shedding
    t, cd, cl = t[late], cd[late], cl[late]
    if t.size < 4:
        return None, None, None
    a = cl - 0.5 * (cl.max() + cl.min())
    i = np.nonzero((a[:-1] < 0) & (a[1:] >= 0))[0]
    up = t[i] - a[i] * (t[i + 1] - t[i]) / (a[i + 1] - a[i])
    if up.size < 2:
        return None, None, None
    up = up[-(periods + 1):]
    period = float(np.mean(np.diff(up)))
    last = (t >= up[-2]) & (t <= up[-1])
    return diameter / (mean_velocity * period), float(cd[last].max()), float(cl[last].max())


def run_cylinder(name: str, order: int, level: int = 0, *, t_final: float = 30.0, dt: float | None = None,
                 cfl: float = 0.4, sample: float = 0.1, steady_tol: float | None = 1e-5, out: str | None = None,
                 vtu: str | None = None, backend: str = "auto", place: dict | None = None,
                 mesh=None, progress=lambda m: None) -> dict:
    """Run DFG case ``name`` (``"2D-1"``, ``"2D-2"``, ``"3D-1Z"``) and compare with its reference.

    ``t_final`` a whole number of ``sample`` intervals; ``dt``: None picks the largest step with
    CFL ≤ ``cfl`` at the start (the inflow's peak velocity) that divides ``sample``;
    ``steady_tol``: the steady cases stop at the first sample whose ‖uⁿ⁺¹ − uⁿ‖/(Δt‖u‖) is below
    it (ignored for 2D-2). Coefficients c = ``coefficient_scale`` · F of the force F of the flow
    on the cylinder (x: drag, y: lift; per unit depth in 2-D); Δp in Pa (ρ = 1). ``mesh``: the
    case's mesh built before (``dfg_mesh(…, order, level)``, e.g. on a machine without gmsh), or
    None to build it here.
    """
    case = CASES[name]
    geo = case.geometry
    place = place or {}
    tic = time.perf_counter()
    progress(f"DFG {name} (Re {case.reynolds:g}): order {order}, level {level}: meshing")
    if mesh is None:
        mesh = dfg.dfg_mesh("2D" if geo.dim == 2 else "3D", order, level)
    elif mesh.order != order:
        raise ValueError(f"mesh has order {mesh.order}, the run asks for order {order}")
    z = mesh.x[2]
    depth = float(z.max() - z.min()) if geo.dim == 2 else 1.0  # the 2-D force is per this depth
    u_b = _inflow(name)
    boundary = dict(inlet=Velocity(u_b), walls=NO_SLIP, cylinder=NO_SLIP, outlet=Outflow())
    u0 = lambda x, y, z: u_b(x, y, z, 0.0)  # noqa: E731
    points = np.array(geo.dp_points, float)
    if geo.dim == 2:
        points[:, 2] = float(z.min()) + depth / 2
    setup = lambda step: NS.setup(mesh, nu=case.nu, dt=step, boundary=boundary, forces=("cylinder",),  # noqa: E731
                                  probes=points, backend=backend, **place)
    ns, dt = setup_at_cfl(setup, u0, dt, cfl, sample)
    st = NS.initial_state(ns, u0)
    setup_seconds = time.perf_counter() - tic
    steady = name in STEADY
    tol = steady_tol if steady else None
    samples = round(t_final / sample)
    progress(f"{ns.sem.num_global} points, dt {dt:.4g} ({samples} samples of {round(sample / dt)} steps), "
             f"setup {setup_seconds:.1f} s")
    base = dict(problem="cylinder", case=name, order=order, level=level, elements=int(mesh.num_elements),
                reynolds=case.reynolds, nu=case.nu, dt=dt, t_final=t_final, sample=sample, steady_tol=tol,
                dofs=int(ns.sem.num_global), time_order=ns.options.time_order, dealias=ns.options.dealias,
                pressure_tol=ns.options.pressure_tol, velocity_tol=ns.options.velocity_tol,
                backend=ns.sem.backend.name, setup_seconds=setup_seconds,
                reference={k: list(v) for k, v in case.reference.items()}, **_where(ns.sem))
    scale = case.coefficient_scale / depth
    try:
        st, s, info = NS.run(ns, st, samples * sample, sample_interval=sample, steady_tol=tol,
                             options=RunOptions(progress=False))
    except (NonFiniteError, RunStopped) as e:  # one run from step 0: both count the flow's steps
        return dict(base, converged=False, status=e.status, steps=e.step, t=e.t, message=str(e))
    f = scale * s.force[:, 0]
    rows = np.stack([s.time, f[:, 0], f[:, 1], s.probe[:, 0, 3] - s.probe[:, 1, 3], s.change, s.cfl], 1)
    rows[0, 1:5] = np.nan  # the start: no step, no force
    steps, seconds = info.steps, info.seconds
    status = "steady" if tol is not None and s.change[-1] < tol else "t_final"
    progress(f"t {rows[-1, 0]:.4g}: c_D {rows[-1, 1]:.5g}, c_L {rows[-1, 2]:.5g}, dp {rows[-1, 3]:.5g}, "
             f"change {rows[-1, 4]:.2e} ({status})")
    series = np.array(rows, float)  # time, c_D, c_L, dp, change, cfl
    last = lambda c: None if not math.isfinite(series[-1, c]) else float(series[-1, c])  # noqa: E731
    record = dict(base, converged=True, status=status, steps=steps, t=float(st.t), seconds=seconds,
                  seconds_per_step=seconds / max(steps, 1), drag_coefficient=last(1), lift_coefficient=last(2),
                  delta_p=last(3), change=last(4), cfl=float(np.nanmax(series[:, 5])))
    if not steady:
        st_, cd_max, cl_max = shedding(series[:, 0], series[:, 1], series[:, 2], geo.diameter, case.mean_velocity)
        record.update(strouhal=st_, drag_coefficient_max=cd_max, lift_coefficient_max=cl_max)
        if st_ is None:
            record.update(status="no_period", message=f"no full period of the lift in t <= {float(st.t):g} "
                          "(the shedding needs a longer run: raise --t-final)")
    # a band's bounds, or (3D-1Z) one published value: the deviation from the band's middle tells how far
    value = lambda k: record.get(_NAMES[k])  # noqa: E731
    record["within_reference"] = {_NAMES[k]: None if value(k) is None else bool(lo <= value(k) <= hi)
                                  for k, (lo, hi) in case.reference.items()}
    record["reference_deviation"] = {_NAMES[k]: None if value(k) is None else value(k) / (0.5 * (lo + hi)) - 1
                                     for k, (lo, hi) in case.reference.items()}
    record["time"] = [float(v) for v in series[:, 0]]
    for c, key in ((1, "drag"), (2, "lift"), (3, "dp")):
        record[f"{key}_series"] = [None if not math.isfinite(v) else float(v) for v in series[:, c]]
    if out is not None:
        os.makedirs(out, exist_ok=True)
        if ns.sem.comm.lead:  # the series is global: one process writes it
            _write_csv(os.path.join(out, "cylinder.csv"), series)
            plot(series, case, os.path.join(out, "cylinder.png"))
        record["files"] = [os.path.join(out, f) for f in ("cylinder.csv", "cylinder.png")]
    if vtu is not None:
        record["vtu"] = [_write_vtu(vtu, ns.sem, velocity=st.u, pressure=st.p)]
    return record


def _write_csv(path: str, series: np.ndarray) -> None:
    write_csv(path, ["time", "drag_coefficient", "lift_coefficient", "delta_p", "change", "cfl"], series)


def plot(series: np.ndarray, case: dfg.DFGCase, path: str) -> str:
    """c_D and c_L against time with the reference band of the case (the steady values, or the
    maxima of the periodic state)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, c, key, label in ((axes[0], 1, "c_D", "drag c_D"), (axes[1], 2, "c_L", "lift c_L")):
        ax.plot(series[:, 0], series[:, c], label="jaxsem")
        band = case.reference.get(key) or case.reference.get(f"{key}_max")
        if band is not None:
            ax.axhspan(band[0], band[1] if band[1] > band[0] else band[0] * (1 + 1e-3), color="k", alpha=0.2,
                       label=f"reference {key if key in case.reference else key + ',max'}")
            ax.axhline(band[0], color="k", lw=0.6, ls=":")
        ax.set(xlabel="t (s)", ylabel=key, title=f"DFG {case.name}: {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
