"""``jaxsem solve tgv``: the Taylor–Green vortex at Re = 1600 against the 512³ spectral DNS.

On [−π, π]³ (periodic), u = sin x cos y cos z, v = −cos x sin y cos z, w = 0, ν = 1/Re.
Writes the time series (CSV and JSON), a PNG of E_k and ε against the DNS reference
(:func:`jaxsem.models.flows.tgv_reference`, when its file is found) and a VTU snapshot of
velocity, pressure and vorticity magnitude at the end; returns the record the CLI prints.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import jax.numpy as jnp
import numpy as np

from ..mesh.box import box_mesh
from ..models import flows
from ..models import navier_stokes as NS
from ..solvers.driver import RunOptions
from ..solvers.multigrid import PMGOptions
from ..solvers.stops import NonFiniteError, RunStopped
from .files import save_figure, write_csv
from .verify import _where, _write_vtu

__all__ = ["run_tgv", "default_dt", "setup_at_cfl", "plot"]


def default_dt(ns_probe: NS.NavierStokes, state: NS.State, cfl: float, sample: float) -> float:
    """The largest Δt with CFL ≤ ``cfl`` at the initial state that divides ``sample``."""
    c = float(NS.diagnostics(ns_probe, state).cfl) / float(ns_probe.dt)  # CFL per unit Δt
    steps = max(1, math.ceil(sample * c / cfl - 1e-9))
    return sample / steps


def setup_at_cfl(setup, u0, dt: float | None, cfl: float, sample: float) -> tuple[NS.NavierStokes, float]:
    """``(ns, dt)``: ``setup(dt)`` for a given ``dt``; for ``dt=None`` the problem is built once
    (at Δt = 1) and given the :func:`default_dt` of the start ``u0`` (the discretization and the
    preconditioner are kept)."""
    if dt is not None:
        return setup(dt), dt
    probe = setup(1.0)
    dt = default_dt(probe, NS.initial_state(probe, u0), cfl, sample)
    return dataclasses.replace(probe, dt=jnp.asarray(float(dt), probe.dt.dtype)), dt


def run_tgv(order: int, elements, t_final: float, *, dt: float | None = None, reynolds: float = 1600.0,
            sample: float = 0.1, cfl: float = 0.4, out: str | None = None, vtu: str | None = None,
            backend: str = "auto", place: dict | None = None, checkpoint: str | None = None,
            resume: str | None = None, checkpoint_every: float | None = None,
            vtu_every: float | None = None, progress=lambda m: None,
            progress_bar: bool = False, pmg_dtype: str | None = "float32", pressure_tol: float = 1e-8,
            velocity_tol: float = 1e-10, pressure_projection: int = 8) -> dict:
    """Run the Taylor–Green vortex and compare with the DNS; returns the record (a dict).

    ``out``: a directory for ``tgv.csv`` and ``tgv.png`` (None: none written; each file written
    atomically, a symlink in its place refused);
    ``dt``: None picks the largest step with initial CFL ≤ ``cfl`` that divides ``sample``;
    ``vtu``: the snapshot at ``t_final``, and with ``vtu_every`` (a multiple of ``sample``) one
    at every multiple of it too, ``<vtu stem>_t<time>.vtu`` (not with checkpoints: the run is
    then split into one :func:`navier_stokes.run` call per snapshot). The DNS reference file
    (:func:`flows.tgv_reference`) is read first: a bad one fails before the run, not after it.
    ``checkpoint_every``: with ``checkpoint``, its interval in time units, a whole multiple of
    ``sample`` (None: every sample); the file is also written at the end and when a signal stops
    the run.
    ``pmg_dtype``: the pressure V-cycle's precision (``"float32"``, the default, inside the float64
    solve, which then runs flexible CG; None or ``"float64"``: the solve's);
    ``pressure_tol``, ``velocity_tol``: the solves' relative residuals; ``pressure_projection``:
    the number of past pressure solutions each pressure solve starts from (:class:`NS.NSOptions`).
    """
    every = 1
    if checkpoint_every is not None:  # refused before any set-up
        every = round(checkpoint_every / sample)
        if checkpoint is None or every < 1 or abs(checkpoint_every / sample - every) > 1e-9:
            raise ValueError(f"checkpoint_every must be a whole multiple of sample ({sample}) with a checkpoint "
                             f"path, got {checkpoint_every!r} (checkpoint {checkpoint!r})")
    flows.tgv_reference()
    place = place or {}
    tic = time.perf_counter()
    mesh = box_mesh(tuple(elements), order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    nu = 1.0 / reynolds
    progress(f"Taylor-Green Re {reynolds:g}: order {order}, {'x'.join(map(str, elements))} elements")
    u0 = flows.taylor_green().velocity
    options = NS.NSOptions(pmg=PMGOptions(dtype=pmg_dtype), pressure_tol=pressure_tol, velocity_tol=velocity_tol,
                           pressure_projection=pressure_projection)
    ns, dt = setup_at_cfl(lambda step: NS.setup(mesh, nu=nu, dt=step, backend=backend, options=options, **place),
                          u0, dt, cfl, sample)
    st = NS.initial_state(ns, u0)
    setup_seconds = time.perf_counter() - tic
    progress(f"dt {dt:.4g} ({round(t_final / dt)} steps), setup {setup_seconds:.1f} s")
    opts = RunOptions(progress=progress_bar, desc="Taylor-Green", checkpoint_path=checkpoint, resume=resume,
                      checkpoint_every=every, meta=dict(reynolds=float(reynolds)))
    base = dict(problem="tgv", order=order, elements=list(elements), reynolds=reynolds, nu=nu, dt=dt,
                t_final=t_final, dofs=int(np.prod(elements)) * order**3, time_order=ns.options.time_order,
                dealias=ns.options.dealias, pressure_tol=ns.options.pressure_tol,
                velocity_tol=ns.options.velocity_tol, pressure_projection=ns.options.pressure_projection,
                backend=ns.sem.backend.name, pmg_dtype=pmg_dtype,
                setup_seconds=setup_seconds, **_where(ns.sem))
    ends = [t_final]
    if vtu_every is not None:
        if checkpoint is not None or resume is not None:
            raise ValueError("vtu_every: not with checkpoint or resume (give one or the other)")
        k = max(1, round(t_final / vtu_every))
        ends = sorted({round(i * vtu_every, 12) for i in range(1, k + 1) if i * vtu_every < t_final - 1e-9}
                      | {t_final})
    parts, steps, seconds, snapshots = [], 0, 0.0, []
    try:
        for t_end in ends:
            st, s, info = NS.run(ns, st, t_end, sample_interval=sample, options=opts)
            parts.append(s if not parts else NS.Series(*(a[1:] for a in s)))
            steps, seconds = steps + info.steps, seconds + info.seconds
            if vtu is not None and vtu_every is not None and t_end != t_final:
                snapshots.append(_snapshot(ns, st, f"{os.path.splitext(vtu)[0]}_t{t_end:g}.vtu"))
    except (NonFiniteError, RunStopped) as e:  # a RunStopped counts the flow's steps, NonFiniteError the call's
        at = e.step if isinstance(e, RunStopped) else steps + e.step
        return dict(base, converged=False, status=e.status, steps=at, t=e.t, message=str(e))
    s = NS.Series(*(np.concatenate(cols) for cols in zip(*parts)))
    record = dict(base, converged=True, status="completed", steps=steps, seconds=seconds,
                  seconds_per_step=seconds / max(steps, 1), **_series(s, nu))
    record.update(_compare(s))
    if out is not None:
        os.makedirs(out, exist_ok=True)
        if ns.sem.comm.lead:  # the series is global: one process writes it
            _write_csv(os.path.join(out, "tgv.csv"), s, nu)
            plot(s, nu, os.path.join(out, "tgv.png"))
        record["files"] = [os.path.join(out, f) for f in ("tgv.csv", "tgv.png")]
    if vtu is not None:
        record["vtu"] = snapshots + [_snapshot(ns, st, vtu)]
    return record


def _snapshot(ns: NS.NavierStokes, st: NS.State, path: str) -> str:
    """Velocity, pressure and vorticity magnitude of ``st`` to a VTU file for ParaView."""
    w = NS.vorticity(ns, st)
    return _write_vtu(path, ns.sem, velocity=st.u, pressure=st.p, vorticity_magnitude=jnp.sqrt(jnp.sum(w * w, 0)))


def _series(s: NS.Series, nu: float) -> dict:
    clean = lambda a: [None if not np.isfinite(v) else float(v) for v in a]
    return dict(time=clean(s.time), kinetic_energy=clean(s.kinetic_energy), dissipation=clean(s.dissipation),
                dissipation_viscous=clean(2 * nu * s.enstrophy), enstrophy=clean(s.enstrophy),
                divergence=clean(s.divergence), cfl=clean(s.cfl), pressure_iterations=clean(s.pressure_iterations),
                velocity_iterations=clean(s.velocity_iterations))


def _compare(s: NS.Series) -> dict:
    """Peak ε and its time (None when the largest ε is the last sample: the run ended before the
    peak), E_k at t = 5 and 10 (linear between the samples around it), here and in the DNS (where
    reached), and ``kinetic_energy_deviation_to_t12``: the largest |E_k − E_k,DNS| / E_k,DNS over
    the samples with t ≤ 12 (None without a reference)."""
    out = {}
    eps = np.where(np.isfinite(s.dissipation), s.dissipation, -np.inf)
    i = int(np.argmax(eps))
    # a maximum at the last sample is where the run stopped, not a peak: none reported then
    peak = bool(np.isfinite(eps[i])) and i < len(eps) - 1
    out["peak_dissipation"] = float(s.dissipation[i]) if peak else None
    out["peak_dissipation_time"] = float(s.time[i]) if peak else None
    for t in (5.0, 10.0):
        reached = s.time[-1] >= t - 1e-9
        out[f"kinetic_energy_t{t:g}"] = float(np.interp(t, s.time, s.kinetic_energy)) if reached else None
    ref = flows.tgv_reference()
    out["kinetic_energy_deviation_to_t12"] = None
    if ref is not None:
        k = (s.time <= 12.0 + 1e-9) & (s.time <= ref.time[-1])
        e_ref = ref.at(s.time[k]).kinetic_energy
        out["kinetic_energy_deviation_to_t12"] = float(np.max(np.abs(s.kinetic_energy[k] - e_ref) / e_ref))
        tp, vp = ref.peak_dissipation()
        out["reference"] = dict(peak_dissipation=float(vp), peak_dissipation_time=float(tp),
                                kinetic_energy_t5=float(ref.at(5.0).kinetic_energy),
                                kinetic_energy_t10=float(ref.at(10.0).kinetic_energy))
    return out


def _write_csv(path: str, s: NS.Series, nu: float) -> None:
    write_csv(path, ["time", "kinetic_energy", "dissipation", "dissipation_viscous", "enstrophy", "divergence",
                     "cfl", "pressure_iterations", "velocity_iterations"],
              zip(s.time, s.kinetic_energy, s.dissipation, 2 * nu * s.enstrophy, s.enstrophy, s.divergence,
                  s.cfl, s.pressure_iterations, s.velocity_iterations))


def plot(s: NS.Series, nu: float, path: str) -> str:
    """E_k and ε (−dE_k/dt and 2νZ) against time, with the DNS reference where found."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = flows.tgv_reference()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(s.time, s.kinetic_energy, label="jaxsem")
    b.plot(s.time, s.dissipation, label="jaxsem −dE_k/dt")
    b.plot(s.time, 2 * nu * s.enstrophy, "--", label="jaxsem 2νZ")
    if ref is not None:
        a.plot(ref.time, ref.kinetic_energy, "k:", label="DNS 512³")
        b.plot(ref.time, ref.dissipation, "k:", label="DNS 512³")
    a.set(xlabel="t", ylabel="E_k", title="kinetic energy")
    b.set(xlabel="t", ylabel="ε", title="dissipation rate")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
