"""Mosaic's 3-D ``navier_stokes_grid`` protocols, run on jaxsem's tesseract (tesseracts/navier-stokes-grid).

The benchmark's settings (pasteurlabs/mosaic a535cb3, ``benchmarks/problems/navier_stokes_3d_grid``),
the tesseract loaded in-process (``Tesseract.from_tesseract_api``) and differentiated, where Mosaic
differentiates it, through ``tesseract_jax.apply_tesseract``:

1. **agreement**: the Taylor–Green vortex, N = 16, dt = 0.01, 50 steps, ν ∈ {0.001, 0.01, 0.05}:
   the relative L2 error (Mosaic's ``l2_error_rel``) against Mosaic's linearized reference
   u₀e^{−2νt}, against the linear 3-D decay u₀e^{−3νt}, and, with ``--reference`` (Mosaic's
   ``references/forward_agreement.npz``, exponax at N = 64 truncated to 16), against the
   converged nonlinear flow; the kinetic energy against E₀e^{−6νt}.
2. **fd**: N = 16, ν = 0.001, dt = 0.05, 10 steps: ⟨∇L, v⟩ of L = Σ result² (``jax.grad``
   through ``apply_tesseract``) against central differences along 10 unit random directions,
   ε ∈ {5, 1, 0.1, 0.01, 0.001, 0.0001} × RMS(v0) (float32 results, as the harness sees them);
   the same at float64 on the tesseract's own maps. Pass: median relative error ≤ 1e-3 at the
   best ε and cosine ≥ 0.99.
3. **horizon**: N = 20, ν = 0.001, dt = 0.05, steps 40, 80, …, 10240: one ``jax.grad`` each
   (binomial checkpointing), stopping at the first out-of-memory, NaN, error, or call longer
   than ``--time-limit``; wall time, time per step and peak memory per step count.
4. **recovery**: a random divergence-free field (curl of a vector potential, energy at
   |k| = 2 ± 1, unit maximum speed), N = 16, ν = 0.01, dt = 0.02, 100 steps, from zeros: optax
   L-BFGS on mean (result − target)², up to 100 iterations (patience 20); the final/initial loss
   ratio (Mosaic flags > 0.5) and the relative error of the recovered field. The gradient is
   divergence-free already (the tesseract's first step is the Leray projection).
5. **cost**: ν = 0.01, dt = 0.01, 50 steps, N ∈ {16, 32, 48, 64}: the first call (compile
   included) and the median of the next calls of ``apply`` and of the VJP, with peak memory.

Peak memory is the device's ``peak_bytes_in_use`` where it reports one (a GPU; it only grows
within the process) and the process's maximum resident set on a CPU. Results go to ``--out``
after every protocol::

    git -C /path/to/mosaic show a535cb3:mosaic/benchmarks/problems/navier_stokes_3d_grid/references/forward_agreement.npz > fa.npz
    python -m experiments.mosaic_ns_grid --small --reference fa.npz \\
        --out experiments/results/mosaic_ns_grid_cpu.json          # a CPU: minutes
    python -m experiments.mosaic_ns_grid --reference fa.npz \\
        --out experiments/results/mosaic_ns_grid_gpu.json          # one GPU, the benchmark's sizes
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import resource
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common import record, write_json

API = pathlib.Path(__file__).resolve().parents[1] / "tesseracts" / "navier-stokes-grid" / "tesseract_api.py"
MOSAIC_COMMIT = "a535cb306546d2c7276790368270f43b742059ef"
L = 2 * np.pi
PROTOCOLS = ("agreement", "fd", "horizon", "recovery", "cost")


def tgv(N: int) -> np.ndarray:
    """``(N, N, N, 3)`` float32: u = sin x cos y cos z, v = −cos x sin y cos z, w = 0 on [0, 2π)³."""
    x = np.arange(N) * L / N
    X, Y, Z = np.meshgrid(x, x, x, indexing="ij")
    return np.stack([np.sin(X) * np.cos(Y) * np.cos(Z), -np.cos(X) * np.sin(Y) * np.cos(Z), 0 * X],
                    -1).astype(np.float32)


def random_solenoidal(N: int, seed: int) -> np.ndarray:
    """``(N, N, N, 3)`` float32: the curl of a random vector potential with the Gaussian shell
    |k| = 2 ± 1, scaled to unit maximum speed (the kind of Mosaic's ``rand_div_free``)."""
    rng = np.random.default_rng(seed)
    k = np.fft.fftfreq(N, 1.0 / N)
    K = np.meshgrid(k, k, k, indexing="ij")
    shell = np.exp(-0.5 * (np.sqrt(K[0] ** 2 + K[1] ** 2 + K[2] ** 2) - 2.0) ** 2)
    A = shell[..., None] * (rng.standard_normal((N, N, N, 3)) + 1j * rng.standard_normal((N, N, N, 3)))
    curl = np.stack([K[1] * A[..., 2] - K[2] * A[..., 1], K[2] * A[..., 0] - K[0] * A[..., 2],
                     K[0] * A[..., 1] - K[1] * A[..., 0]], -1)
    v = np.fft.ifftn(1j * curl, axes=(0, 1, 2)).real
    return (v / np.sqrt(np.sum(v * v, -1)).max()).astype(np.float32)


def inputs(v0, nu, dt, steps) -> dict:
    return dict(v0=np.asarray(v0, np.float32), viscosity=np.array([nu], np.float32),
                dt=np.array([dt], np.float32), steps=int(steps), domain_extent=L)


def rel_l2(a, b) -> float:
    """Mosaic's ``l2_error_rel``: ‖a − b‖/‖b‖ (RMS over all entries)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


def peak_bytes() -> int:
    """The device's peak bytes in use where reported, else the process's maximum resident set."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def grad_of_energy(tess, inp: dict):
    """``(Σ result², ∇_v0)`` by ``jax.value_and_grad`` through ``apply_tesseract`` (Mosaic's path)."""
    from tesseract_jax import apply_tesseract

    f = lambda v: jnp.sum(apply_tesseract(tess, dict(inp, v0=v))["result"] ** 2)
    value, g = jax.value_and_grad(f)(jnp.asarray(inp["v0"]))
    return float(value), np.asarray(g)


def agreement(tess, api, a) -> dict:
    N, dt, steps = a.agreement_n, 0.01, a.agreement_steps
    v0, t = tgv(N), steps * float(np.float32(dt))
    ref = dict(np.load(a.reference)) if a.reference else None
    rows = []
    for i, nu in enumerate((0.001, 0.01, 0.05)):
        tic = time.perf_counter()
        out = tess.apply(inputs(v0, nu, dt, steps))["result"]
        row = dict(nu=nu, N=N, dt=dt, steps=steps, t=t, seconds=time.perf_counter() - tic,
                   error_vs_mosaic_linear=rel_l2(out, v0 * np.exp(-2 * nu * t)),
                   error_vs_linear_3d=rel_l2(out, v0 * np.exp(-3 * nu * t)),
                   energy_ratio=float(np.sum(out.astype(np.float64) ** 2) / np.sum(v0.astype(np.float64) ** 2)),
                   energy_ratio_linear=float(np.exp(-6 * nu * t)), max_w=float(np.max(np.abs(out[..., 2]))))
        if ref is not None and ref[f"reference_{i}"].shape == out.shape:
            assert abs(float(ref["sweep_values"][i]) - nu) < 1e-12, ref["sweep_values"]
            row["error_vs_converged_reference"] = rel_l2(out, ref[f"reference_{i}"])
        rows.append(row)
        print(f"agreement ν={nu}: {row}")
    return dict(rows=rows, reference=str(a.reference) if a.reference else None)


def fd_check(tess, api, a) -> dict:
    N, nu, dt, steps = a.fd_n, 0.001, 0.05, a.fd_steps
    inp = inputs(tgv(N), nu, dt, steps)
    v0 = jnp.asarray(inp["v0"])
    scale = float(jnp.sqrt(jnp.mean(v0 ** 2)))
    keys = jax.random.split(jax.random.PRNGKey(0), a.fd_dirs)
    dirs = [np.asarray(d / jnp.linalg.norm(d)) for d in (jax.random.normal(k, v0.shape, jnp.float32) for k in keys)]
    tic = time.perf_counter()
    _, g = grad_of_energy(tess, inp)
    grad_seconds = time.perf_counter() - tic
    ad = np.array([float(np.vdot(g, d)) for d in dirs])
    energy = lambda v: float(np.sum(tess.apply(dict(inp, v0=np.asarray(v, np.float32)))["result"].astype(np.float64) ** 2))
    # the same at float64, on the tesseract's own maps (no float32 boundary)
    gm, args, static, snapshots = api.prepare(api.InputSchema(**inp))
    out64 = api.forward(gm, *args, **static)
    g64 = np.asarray(api.vjp(gm, *args, 2 * out64, **static, snapshots=snapshots)[0])
    ad64 = np.array([float(np.vdot(g64, d)) for d in dirs])
    energy64 = lambda v: float(jnp.sum(api.forward(gm, jnp.asarray(v, jnp.float64), *args[1:], **static) ** 2))
    sweep = {}
    for eps in a.fd_eps:
        h = eps * scale
        fd = np.array([(energy(v0 + h * d) - energy(v0 - h * d)) / (2 * h) for d in dirs])
        fd64 = np.array([(energy64(v0 + h * d) - energy64(v0 - h * d)) / (2 * h) for d in dirs])
        row = {}
        for tag, x, y in (("float32", fd, ad), ("float64", fd64, ad64)):
            err = np.abs(x - y) / np.maximum(np.maximum(np.abs(x), np.abs(y)), 1e-30)
            row[tag] = dict(median_rel_error=float(np.median(err)), max_rel_error=float(np.max(err)),
                            cosine=float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-30)))
        sweep[eps] = row
        print(f"fd ε={eps}: {row}")
    best = {tag: min(sweep, key=lambda e: sweep[e][tag]["median_rel_error"]) for tag in ("float32", "float64")}
    passed = {tag: bool(sweep[e][tag]["median_rel_error"] <= 1e-3 and sweep[e][tag]["cosine"] >= 0.99)
              for tag, e in best.items()}
    return dict(N=N, nu=nu, dt=dt, steps=steps, substeps=static["substeps"], ic_scale=scale,
                grad_seconds=grad_seconds, eps_sweep={str(k): v for k, v in sweep.items()},
                best_eps={k: float(v) for k, v in best.items()}, passed=passed)


def horizon(tess, api, a) -> dict:
    N, nu, dt = a.horizon_n, 0.001, 0.05
    v0 = tgv(N)
    rows = []
    for steps in a.horizon_steps:
        inp = inputs(v0, nu, dt, steps)
        gm, _, static, snapshots = api.prepare(api.InputSchema(**inp))
        row = dict(steps=steps, substeps=static["substeps"], snapshots=snapshots)
        tic = time.perf_counter()
        try:
            value, g = grad_of_energy(tess, inp)
        except Exception as e:  # noqa: BLE001 - classified and recorded, the sweep stops
            text = str(e)
            kind = "OOM" if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() else "error"
            rows.append(dict(row, status="failed", failure_type=kind, error=text[-2000:],
                             wall_time_s=time.perf_counter() - tic))
            print(f"horizon {steps}: {kind}")
            break
        seconds = time.perf_counter() - tic
        row.update(wall_time_s=seconds, seconds_per_step=seconds / steps, peak_bytes=peak_bytes(),
                   loss=value, grad_norm=float(np.linalg.norm(g)))
        if not np.all(np.isfinite(g)):
            rows.append(dict(row, status="failed", failure_type="nan"))
            print(f"horizon {steps}: nan")
            break
        rows.append(dict(row, status="ok"))
        print(f"horizon {steps}: {rows[-1]}", flush=True)
        a.save("horizon", dict(N=N, nu=nu, dt=dt, rows=rows, partial=True))
        if seconds > a.time_limit:
            rows.append(dict(steps=None, status="stopped", failure_type="timeout",
                             error=f"the call at {steps} steps took {seconds:.0f} s > --time-limit {a.time_limit:g} s"))
            break
    return dict(N=N, nu=nu, dt=dt, rows=rows)


def recovery(tess, api, a) -> dict:
    from tesseract_jax import apply_tesseract

    N, nu, dt, steps = a.recovery_n, 0.01, 0.02, a.recovery_steps
    trials = []
    for seed in a.recovery_seeds:
        truth = random_solenoidal(N, seed)
        base = inputs(truth, nu, dt, steps)
        base["substeps"] = api.prepare(api.InputSchema(**base))[2]["substeps"]  # one m for every iterate
        target = jnp.asarray(tess.apply(base)["result"])
        loss = lambda v: jnp.mean((apply_tesseract(tess, dict(base, v0=v))["result"] - target) ** 2)
        opt = optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(20))
        v = jnp.zeros_like(target)
        state = opt.init(v)
        history, best, since = [], np.inf, 0
        tic = time.perf_counter()
        for it in range(a.recovery_iters):
            value, grad = jax.value_and_grad(loss)(v)
            history.append(dict(iteration=it, loss=float(value), ic_error=rel_l2(v, truth),
                                seconds=time.perf_counter() - tic))
            best, since = (float(value), 0) if float(value) < best * (1 - 1e-6) else (best, since + 1)
            if since >= a.recovery_patience:
                break
            updates, state = opt.update(grad, state, v, value=value, grad=grad, value_fn=loss)
            v = v + updates
        final = float(loss(v))
        trial = dict(seed=seed, iterations=len(history), initial_loss=history[0]["loss"], final_loss=final,
                     final_initial_ratio=final / history[0]["loss"], initial_ic_error=history[0]["ic_error"],
                     final_ic_error=rel_l2(v, truth), seconds=time.perf_counter() - tic, history=history)
        trials.append(trial)
        print(f"recovery seed {seed}: ratio {trial['final_initial_ratio']:.3g}, "
              f"IC error {trial['final_ic_error']:.3g}, {trial['iterations']} iterations")
    return dict(N=N, nu=nu, dt=dt, steps=steps, substeps=int(base["substeps"]), trials=trials,
                mean_final_initial_ratio=float(np.mean([t["final_initial_ratio"] for t in trials])),
                mean_final_ic_error=float(np.mean([t["final_ic_error"] for t in trials])))


def cost(tess, api, a) -> dict:
    nu, dt, steps = 0.01, 0.01, a.cost_steps
    rows = []
    for N in a.cost_n:
        inp = inputs(tgv(N), nu, dt, steps)
        ct = {"result": np.ones_like(inp["v0"])}
        row = dict(N=N, steps=steps, nodes=int(api.grid_map((N,) * 3, L, 4).ns.sem.mask.size))
        for name, call in (("apply", lambda: tess.apply(inp)),
                           ("vjp", lambda: tess.vector_jacobian_product(inp, ["v0"], ["result"], ct))):
            times = []
            for _ in range(1 + a.cost_trials):
                tic = time.perf_counter()
                call()
                times.append(time.perf_counter() - tic)
            row[name] = dict(first_call_s=times[0], median_s=statistics.median(times[1:]),
                             per_step_s=statistics.median(times[1:]) / steps, peak_bytes=peak_bytes())
        rows.append(row)
        print(f"cost N={N}: {row}", flush=True)
        a.save("cost", dict(nu=nu, dt=dt, rows=rows, partial=True))
    return dict(nu=nu, dt=dt, rows=rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CPU sizes (minutes): N = 8 but agreement at 16")
    ap.add_argument("--only", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    ap.add_argument("--reference", help="Mosaic's forward_agreement.npz (converged reference, N = 16)")
    ap.add_argument("--out", default="mosaic_ns_grid.json")
    ap.add_argument("--time-limit", type=float, default=3600.0, help="horizon: stop after a call longer than this (s)")
    ap.add_argument("--agreement-n", type=int)
    ap.add_argument("--agreement-steps", type=int, default=50)
    ap.add_argument("--fd-n", type=int)
    ap.add_argument("--fd-steps", type=int, default=10)
    ap.add_argument("--fd-dirs", type=int, default=10)
    ap.add_argument("--fd-eps", type=float, nargs="+", default=[5.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4])
    ap.add_argument("--horizon-n", type=int)
    ap.add_argument("--horizon-steps", type=int, nargs="+")
    ap.add_argument("--recovery-n", type=int)
    ap.add_argument("--recovery-steps", type=int)
    ap.add_argument("--recovery-iters", type=int)
    ap.add_argument("--recovery-patience", type=int, default=20)
    ap.add_argument("--recovery-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--cost-n", type=int, nargs="+")
    ap.add_argument("--cost-steps", type=int, default=50)
    ap.add_argument("--cost-trials", type=int, default=3)
    a = ap.parse_args(argv)
    small = a.small
    a.agreement_n = a.agreement_n or 16
    a.fd_n = a.fd_n or (8 if small else 16)
    a.horizon_n = a.horizon_n or (8 if small else 20)
    a.horizon_steps = a.horizon_steps or ([40, 80, 160, 320] if small else [40 * 2 ** i for i in range(9)])
    a.recovery_n = a.recovery_n or (8 if small else 16)
    a.recovery_steps = a.recovery_steps or (20 if small else 100)
    a.recovery_iters = a.recovery_iters or (30 if small else 100)
    a.cost_n = a.cost_n or ([8, 12, 16] if small else [16, 32, 48, 64])
    if small:
        a.cost_steps, a.cost_trials = min(a.cost_steps, 10), min(a.cost_trials, 2)

    from tesseract_core import Tesseract

    spec = importlib.util.spec_from_file_location("jaxsem_ns_grid_tesseract", API)
    api = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = api  # its dataclasses look their module up
    spec.loader.exec_module(api)
    tess = Tesseract.from_tesseract_api(api)
    result = dict(record("mosaic_ns_grid"), mosaic_commit=MOSAIC_COMMIT, small=small, order=4,
                  cfl=api.CFL, pressure_tol=api.OPTIONS.pressure_tol, velocity_tol=api.OPTIONS.velocity_tol)
    a.save = lambda name, part: write_json(a.out, dict(result, **{name: part}))  # a protocol's rows so far
    for name in a.only:
        tic = time.perf_counter()
        result[name] = dict(globals()[{"fd": "fd_check"}.get(name, name)](tess, api, a),
                            protocol_seconds=time.perf_counter() - tic)
        write_json(a.out, result)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
