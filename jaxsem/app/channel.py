"""``jaxsem solve channel``: turbulent channel flow at a held bulk Reynolds number, averaged and
compared with the DNS of Moser, Kim & Mansour (1999) at Re_τ = 178.12.

Bulk units: walls at y = ±1 (half height h = 1), the bulk velocity U_b = 1 held every step
(:class:`~jaxsem.models.navier_stokes.FlowRate`), ν = 2/Re_b (Re_b = U_b 2h/ν = 5600 for the DNS's
case); periodic in x and z; the mesh graded toward the walls (tanh). The run starts from the
laminar profile with three-dimensional disturbances and, from ``average_from`` on, accumulates
the time averages of the velocity and its second moments each sample
(:mod:`jaxsem.models.navier_stokes.statistics`), averaged over x and z and folded about the
centre plane: U⁺(y⁺), the rms velocities and −⟨u'v'⟩⁺ in wall units, u_τ from the mean wall
shear (and, as a check, from the mean pressure gradient the flow rate needs, u_τ² = G h).
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..mesh.box import box_mesh
from ..mesh.grading import Grading
from ..models import navier_stokes as NS
from ..models.navier_stokes import statistics as ST
from ..solvers.driver import RunOptions, agreed_signal, stops_deferred
from ..solvers.stops import NonFiniteError, RunInterrupted, RunStopped, Terminated
from .files import save_figure, write_csv
from .tgv import setup_at_cfl
from .verify import _where

__all__ = ["run_channel", "relaxation_option", "DNS"]

# Moser, Kim & Mansour, Phys. Fluids 11 (1999) 943, Re_τ = 178.12 (chan180.means, chan180.reystress):
# U⁺ at three wall distances and at the centre, and the peaks of u_rms⁺ and −⟨u'v'⟩⁺.
DNS = dict(re_tau=178.12, re_bulk=5600.0, u_plus=((5.3381, 5.1133), (30.019, 13.870), (98.0, 17.09)),
           u_plus_centre=18.30, u_rms_peak=2.66, uv_peak=0.723)


def _start(lx, lz):
    """The laminar profile 1.5(1 − y²) with streamwise streaks and spanwise rolls of 30% of it."""
    kx, kz = 2 * np.pi / lx, 2 * np.pi / lz

    def u0(x, y, z):
        wall = 1 - y**2
        u = 1.5 * wall + 0.3 * wall * jnp.cos(kz * z) * jnp.sin(kx * x)
        v = 0.1 * wall**2 * jnp.sin(kz * z) * jnp.cos(kx * x)
        w = 0.3 * wall * jnp.sin(2 * kx * x) * jnp.cos(np.pi * y / 2)
        return jnp.stack([u, v, w])

    return u0


CUT, GROW = 1.25, 0.5  # a sample ending above CUT·cfl cuts the step, one below GROW·cfl lengthens it (≤ 2×)


def cut_dt(dt: float, cfl_now: float, cfl: float, sample: float) -> float:
    """The largest step that brings the CFL number ``cfl_now`` (reached at step ``dt``) to ``cfl``
    or below, at most 2·``dt``, a divisor of ``sample``:
    sample/max(⌈sample·cfl_now/(dt·cfl)⌉, ⌈sample/(2dt)⌉)."""
    n = max(math.ceil(sample * cfl_now / (dt * cfl) - 1e-9), math.ceil(sample / (2 * dt) - 1e-9))
    return sample / n


def relaxation_option(modes: int, strength: float):
    """The CLI's ``--relaxation-modes``/``--relaxation``: a :class:`~jaxsem.models.navier_stokes.Relaxation`,
    or None for strength 0."""
    return None if strength == 0 else NS.Relaxation(int(modes), float(strength))


def _with_dt(ns, dt: float):
    """``ns`` at another Δt (a leaf: the compiled step is reused)."""
    return dataclasses.replace(ns, dt=jnp.asarray(float(dt), ns.dt.dtype))


def _fold(y, f, odd=False):
    """A profile on y ∈ [−1, 1] folded about y = 0: (distance from the wall d, the mean of both
    halves at d); ``odd``: the profile changes sign across the centre (⟨u'v'⟩)."""
    d = np.round(1 - np.abs(y), 9)
    g = np.where(y > 0, -f, f) if odd else f
    keys = np.unique(d)
    return keys, np.array([g[d == k].mean() for k in keys])


def run_channel(order: int, elements, *, reynolds_bulk: float = DNS["re_bulk"], lengths=(2 * np.pi, np.pi),
                grading: float = 2.0, t_final: float = 200.0, average_from: float = 60.0, sample: float = 0.5,
                dt: float | None = None, cfl: float = 0.4, out: str | None = None, backend: str = "auto",
                place: dict | None = None, checkpoint: str | None = None, resume: str | None = None,
                relaxation: NS.Relaxation | None = NS.Relaxation(1, 5.0),
                progress=lambda m: None, progress_bar: bool = False) -> dict:
    """Run the channel and average it; returns the record (a dict) with ``re_tau``, ``u_bulk``,
    ``profiles`` (wall units) and the comparison with :data:`DNS`. ``lengths``: (Lx, Lz);
    ``grading``: the tanh strength β toward both walls; ``sample``: the interval of the series and
    of the averages (each sample's end state, weighted by the interval). ``checkpoint``: a file
    rewritten after every sample with the state, its history, the sums of the averages and the
    series (per rank under MPI); ``resume``: such a file of the same problem, from which the run
    continues to ``t_final`` as if never stopped. ``dt=None``: the step starts at CFL ``cfl`` and,
    since a flow in transition speeds up near the walls (the CFL number of a laminar start
    triples, with short bursts), is cut at the end of any sample whose CFL number passed
    :data:`CUT`·``cfl`` and lengthened (at most doubled) after one below :data:`GROW`·``cfl``,
    each time toward ``cfl`` and to a divisor of ``sample`` (:func:`cut_dt`); the BDF/EXT history
    then restarts at first order, as at t = 0. A given ``dt`` is kept. ``relaxation``: the :class:`~jaxsem.models.navier_stokes.Relaxation`
    (high-pass-filter relaxation, NekRS's channel example's one mode at χ = 5) or None."""
    place = place or {}
    tic = time.perf_counter()
    lx, lz = lengths
    nu = 2.0 / reynolds_bulk
    mesh = box_mesh(tuple(elements), order, lengths=(lx, 2.0, lz), origin=(0.0, -1.0, 0.0),
                    periodic=(True, False, True), grading=(None, Grading("tanh", grading), None))
    u0 = _start(lx, lz)
    setup = lambda step: NS.setup(mesh, nu=nu, dt=step, boundary={"ymin": NS.NO_SLIP, "ymax": NS.NO_SLIP},  # noqa: E731
                                  drive=NS.FlowRate(0, 1.0), backend=backend,
                                  options=NS.NSOptions(relaxation=relaxation), **place)
    adapt = dt is None
    ns, dt = setup_at_cfl(setup, u0, dt, cfl, sample)
    st = NS.initial_state(ns, u0)
    setup_seconds = time.perf_counter() - tic
    samples = round(t_final / sample)
    progress(f"channel Re_b {reynolds_bulk:g}: order {order}, {'x'.join(map(str, elements))} elements, "
             f"{ns.sem.num_global} points, dt {dt:.4g} ({samples} samples), setup {setup_seconds:.1f} s")
    base = dict(problem="channel", order=order, elements=list(elements), reynolds_bulk=reynolds_bulk, nu=nu,
                lengths=[lx, 2.0, lz], grading=grading, dt=dt, t_final=t_final, average_from=average_from,
                sample=sample, dofs=int(ns.sem.num_global), time_order=ns.options.time_order,
                backend=ns.sem.backend.name, setup_seconds=setup_seconds, reference=DNS, **_where(ns.sem))
    accumulate = jax.jit(ST.accumulate)
    shear = jax.jit(lambda ns, st: jnp.stack([ST.wall_shear(ns, st, g)[0] for g in ("ymin", "ymax")]))
    avg, tau, pushed, averaged = ST.start(ns, st), 0.0, 0.0, 0
    series = dict(time=[], bulk_velocity=[], driving=[], kinetic_energy=[], wall_shear=[], cfl=[], dt=[])
    opts = RunOptions(progress=progress_bar, desc="channel")
    steps, seconds, first = 0, 0.0, 0
    meta = dict(problem="channel", order=order, elements="x".join(map(str, elements)), reynolds_bulk=reynolds_bulk,
                dt=float(dt), sample=float(sample), average_from=float(average_from),
                relaxation="none" if relaxation is None else f"{relaxation.modes},{relaxation.strength:g}")
    suffix = ns.sem.comm.file_suffix
    if resume is not None:
        from ..io import checkpoint_meta, load_checkpoint, meta_mismatch, tree_from_fields

        problem = meta_mismatch(resume + suffix, checkpoint_meta(resume + suffix), meta)
        if problem is not None:
            raise ValueError(problem)
        ck = load_checkpoint(resume + suffix)
        st, avg = tree_from_fields("state", st, ck.fields), tree_from_fields("avg", avg, ck.fields)
        series = {k: ck.fields[f"series.{k}"].tolist() for k in series}
        ns = _with_dt(ns, float(ck.fields["dt_now"]))
        tau, pushed, averaged = (float(ck.fields["sums"][0]), float(ck.fields["sums"][1]),
                                 int(ck.fields["sums"][2]))
        first, steps = len(series["time"]), ck.step
        progress(f"resumed from {resume} at t = {ck.t:g} ({first} samples)")
    kept, saved = (resume, (steps, float(st.t))) if resume is not None else (None, None)  # the file, its (step, t)
    try:
        for i in range(first, samples):
            try:  # a stop between the sample's steps ends the run with the last sample's state and file
                try:
                    st, s, info = NS.run(ns, st, (i + 1) * sample, sample_interval=sample, options=opts)
                except RunInterrupted as e:  # count the run's steps; name the file of the last sample's end
                    raise RunInterrupted(steps + e.step, e.t, e.signal, kept, saved) from None
                steps, seconds = steps + info.steps, seconds + info.seconds
                with stops_deferred() as stop:  # a stop waits for the sample's statistics and checkpoint
                    tw = np.asarray(shear(ns, st))
                    for k, v in (("time", s.time[-1]), ("bulk_velocity", s.bulk_velocity[-1]),
                                 ("driving", s.driving[-1]), ("kinetic_energy", s.kinetic_energy[-1]),
                                 ("wall_shear", tw.mean()), ("cfl", s.cfl[-1]), ("dt", ns.dt)):
                        series[k].append(float(v))
                    if adapt and not GROW * cfl <= s.cfl[-1] <= CUT * cfl:
                        step = cut_dt(float(ns.dt), float(s.cfl[-1]), cfl, sample)
                        progress(f"t = {float(st.t):g}: CFL {float(s.cfl[-1]):.3g}, "
                                 f"dt {float(ns.dt):.4g} -> {step:.4g}")
                        ns, st = _with_dt(ns, step), dataclasses.replace(st, past=jnp.zeros_like(st.past))
                    if s.time[-1] > average_from + 1e-9 * sample:
                        avg = accumulate(avg, st, sample)
                        tau, pushed, averaged = tau + tw.mean(), pushed + float(s.driving[-1]), averaged + 1
                    if checkpoint is not None:
                        from ..io import save_checkpoint, tree_fields

                        fields = dict(tree_fields("state", st), **tree_fields("avg", avg),
                                      **{f"series.{k}": np.asarray(v) for k, v in series.items()},
                                      sums=np.array([tau, pushed, averaged], float), dt_now=np.array(float(ns.dt)))
                        save_checkpoint(checkpoint + suffix, fields, float(st.t), steps, **meta)
                        kept, saved = checkpoint, (steps, float(st.t))
                sig = agreed_signal(stop, ns.sem.comm)
            except (KeyboardInterrupt, Terminated) as e:  # outside the steps and the block (compilation)
                sig = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
            if sig:
                raise RunInterrupted(steps, float(st.t), sig, kept, saved)
    except (NonFiniteError, RunStopped) as e:
        return dict(base, converged=False, status=e.status, steps=e.step, t=e.t, message=str(e))
    record = dict(base, converged=True, status="t_final", steps=steps, t=float(st.t), seconds=seconds,
                  dt_final=float(ns.dt), dt_changes=int(np.sum(np.diff([base["dt"]] + series["dt"]) != 0)),
                  seconds_per_step=seconds / max(steps, 1), samples_averaged=averaged,
                  u_bulk=float(np.mean(series["bulk_velocity"])), series=series)
    if not averaged:
        return dict(record, re_tau=None, profiles=None, comparison=None)
    u_tau = math.sqrt(abs(tau / averaged))
    y, mean, stress = ST.plane_moments(ns, avg, axis=1)
    d, U = _fold(y, mean[0])
    uu, vv, ww = (np.maximum(_fold(y, stress[k])[1], 0.0) for k in (0, 1, 2))
    uv = _fold(y, stress[3], odd=True)[1]
    yp = d * u_tau / nu
    profiles = dict(y_plus=yp.tolist(), u_plus=(U / u_tau).tolist(), u_rms_plus=(np.sqrt(uu) / u_tau).tolist(),
                    v_rms_plus=(np.sqrt(vv) / u_tau).tolist(), w_rms_plus=(np.sqrt(ww) / u_tau).tolist(),
                    uv_plus=(uv / u_tau**2).tolist())
    up = np.asarray(profiles["u_plus"])
    comparison = dict(re_tau=u_tau / nu, re_tau_from_gradient=math.sqrt(abs(pushed / averaged)) / nu,
                      u_plus={f"{yr:g}": float(np.interp(yr, yp, up)) for yr, _ in DNS["u_plus"]},
                      u_plus_centre=float(up[-1]), u_rms_peak=float(np.max(profiles["u_rms_plus"])),
                      uv_peak=float(np.max(-np.asarray(profiles["uv_plus"]))))
    record.update(re_tau=u_tau / nu, profiles=profiles, comparison=comparison)
    if out is not None:
        import os

        os.makedirs(out, exist_ok=True)
        cols = ("y_plus", "u_plus", "u_rms_plus", "v_rms_plus", "w_rms_plus", "uv_plus")
        write_csv(os.path.join(out, "channel.csv"), cols, zip(*(profiles[c] for c in cols)))
        record["files"] = [os.path.join(out, "channel.csv"), plot(profiles, os.path.join(out, "channel.png"))]
    return record


def plot(profiles: dict, path: str) -> str:
    """U⁺(y⁺) (log axis) with the DNS's points and the stresses in wall units."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    yp, up = np.asarray(profiles["y_plus"]), np.asarray(profiles["u_plus"])
    a.semilogx(yp[yp > 0], up[yp > 0], "b.-", label="jaxsem")
    a.semilogx([p for p, _ in DNS["u_plus"]], [u for _, u in DNS["u_plus"]], "ko", label="DNS (MKM 1999)")
    a.set(xlabel="y+", ylabel="U+", title="mean velocity")
    for k, style in (("u_rms_plus", "b-"), ("v_rms_plus", "g-"), ("w_rms_plus", "r-")):
        b.plot(profiles["y_plus"], profiles[k], style, label=k)
    b.plot(profiles["y_plus"], -np.asarray(profiles["uv_plus"]), "k-", label="-uv_plus")
    b.axhline(DNS["u_rms_peak"], color="b", ls=":", lw=0.8)
    b.axhline(DNS["uv_peak"], color="k", ls=":", lw=0.8)
    b.set(xlabel="y+", title="stresses (DNS peaks dotted)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
