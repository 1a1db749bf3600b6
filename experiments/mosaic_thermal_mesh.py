"""Mosaic's thermal-mesh protocols, run on jaxsem's tesseract (tesseracts/thermal-mesh).

Three measurements, each through the tesseract as Mosaic's harness calls it
(``Tesseract.from_tesseract_api``, float32 inputs and outputs):

1. Forward agreement: the thermal compliance of the heated block (Lz = Lx/nx, Q_total = 1)
   against Mosaic's stored references (``benchmarks/problems/thermal_mesh/references/*.npz``,
   the trimmed mean of the entrants; the values are written below), for the experiments
   forward/agreement (ρ₀ sweep at 16 × 8 × 1), forward/baseline (Mosaic's seed-0 random ρ,
   N × N/2 × 1), forward/source_baseline (Gaussian source, ρ₀ = 0.5) and
   forward/source_linearity (its amplitude at 16 × 8 × 1).
2. Gradients against central differences, Mosaic's gradient/fd_check: random ρ (seed 0) on
   8 × 4 × 1, loss sum(C²) by ``jax.grad`` through ``tesseract_jax.apply_tesseract`` against
   differences along unit random directions at steps ε · rms(ρ), ε ∈ {1, 1e-1, 1e-2, 1e-3, 1e-4};
   likewise gradient/source_fd_check (identification error w.r.t. the Gaussian source, a target
   temperature from two Gaussians).
   Pass: median relative error ≤ 1e-3 and cosine ≥ 0.99 at the best step.
3. Time per call (apply and VJP, median of --repeats after a warm-up) against nx (nx × nx/2 × 1,
   ρ = 0.5: Mosaic's cost/spatial_cost and cost/vjp_cost), with the PCG iterations and the
   set-up of a new mesh (``setup_s``: jaxsem mesh, numbering, geometry, and the compilation of
   that set-up for shapes not seen before; once per mesh, the plan is cached).

    python -m experiments.mosaic_thermal_mesh                      # CPU: N ≤ 24, cost to nx = 256, ~3 min
    python -m experiments.mosaic_thermal_mesh --cost 16,32,64,128,256,512 --order 1 \
        --out experiments/results/mosaic_thermal_mesh_h100.json    # one GPU
"""

import argparse
import importlib.util
import os
import pathlib
import time

import jax
import numpy as np

from experiments.common import record, write_json

API = pathlib.Path(__file__).resolve().parents[1] / "tesseracts" / "thermal-mesh" / "tesseract_api.py"

# Mosaic a535cb3, benchmarks/problems/thermal_mesh/references/<experiment>.npz: sweep value → reference_i
REFERENCES = {
    "forward/agreement": {0.05: 14223.803, 0.1: 8004.0015, 0.2: 1779.3594, 0.4: 246.39644, 0.6: 73.806175,
                          0.8: 31.220243, 0.95: 18.65851},
    "forward/baseline": {2: 16.552181, 3: 19.562195, 4: 23.414675, 6: 85.65075, 8: 99.867744, 12: 85.6194,
                         16: 122.75734, 24: 329.5523},
    "forward/source_baseline": {4: 33.446007, 6: 49.652714, 8: 65.53651, 12: 97.30925, 16: 129.08481,
                                24: 192.63837},
    "forward/source_linearity": {0.1: 127.30769, 0.25: 127.60387, 0.5: 128.09752, 1.0: 129.08481,
                                 2.0: 131.0594, 4.0: 135.00858},
}


def load_api():
    spec = importlib.util.spec_from_file_location("thermal_mesh_api", API)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_rho(nx, ny):
    """Mosaic's "random" initial condition, seed 0 (ics.py: 0.5 + 0.3 ξ, clipped to [0.05, 0.95])."""
    rng = np.random.default_rng(0)
    return np.clip(0.5 + 0.3 * rng.standard_normal(nx * ny).astype(np.float32), 0.05, 0.95).astype(np.float32)


def gaussian(nx, ny, centre=(0.5, 0.5), sigma=0.2, amplitude=1.0, Lx=2.0, Ly=1.0):
    """Mosaic's Gaussian source at the cell centres (ics.py ``_gaussian_source``)."""
    X, Y = np.meshgrid((np.arange(nx) + 0.5) * Lx / nx, (np.arange(ny) + 0.5) * Ly / ny, indexing="xy")
    w = sigma * min(Lx, Ly)
    g = amplitude * np.exp(-((X - centre[0] * Lx) ** 2 + (Y - centre[1] * Ly) ** 2) / (2 * w**2))
    return g.ravel().astype(np.float32)


def block(ta, nx, order, **kw):
    """The harness's quasi-2-D heated block at nx × nx/2 × 1, Lz = Lx / nx."""
    return ta.heated_block_inputs(nx, max(1, nx // 2), 1, lengths=(2.0, 1.0, 2.0 / nx), order=order, **kw)


def forward(tess, ta, order, max_n):
    rows = []
    cases = [("forward/agreement", v, dict(nx=16, rho=v)) for v in REFERENCES["forward/agreement"]]
    cases += [("forward/baseline", n, dict(nx=n, rho=random_rho(n, n // 2))) for n in REFERENCES["forward/baseline"]]
    cases += [("forward/source_baseline", n, dict(nx=n, rho=0.5, source=gaussian(n, n // 2)))
              for n in REFERENCES["forward/source_baseline"]]
    cases += [("forward/source_linearity", a, dict(nx=16, rho=0.5, source=gaussian(16, 8, amplitude=a)))
              for a in REFERENCES["forward/source_linearity"]]
    for name, value, kw in sorted(cases, key=lambda c: c[2]["nx"]):  # one mesh after another (plan cache)
        if kw["nx"] > max_n:
            continue
        nx = kw.pop("nx")
        C = float(tess.apply(block(ta, nx, order, **kw))["thermal_compliance"])
        ref = REFERENCES[name][value]
        rows.append(dict(experiment=name, sweep_value=value, nx=nx, compliance=C, reference=ref,
                         relative_error=abs(C - ref) / abs(ref)))
        print(f"{name:26s} {value:>6g}  C = {C:12.6g}  reference {ref:12.6g}  "
              f"rel. error {rows[-1]['relative_error']:.2e}")
    return rows


def fd_check(tess, inputs, key, output, eps_values, directions, seed=0):
    """Mosaic's fd_check: loss sum(out²), its gradient by ``jax.grad`` through tesseract-jax's
    ``apply_tesseract`` (the VJP endpoint, as the harness computes it) against central
    differences at steps ε · rms(input) along unit random directions."""
    import jax.numpy as jnp
    from tesseract_jax import apply_tesseract

    x = np.asarray(inputs[key], np.float64)
    g = jax.grad(lambda ic: jnp.sum(apply_tesseract(tess, {**inputs, key: ic})[output] ** 2))(jnp.asarray(inputs[key]))
    g = np.asarray(g, np.float64)
    rng = np.random.default_rng(seed)
    dirs = [v / np.linalg.norm(v) for v in rng.standard_normal((directions, x.size))]
    ad = np.array([g @ v for v in dirs])
    scale = float(np.sqrt(np.mean(x**2)))
    loss = lambda y: float(tess.apply({**inputs, key: y.astype(np.float32)})[output]) ** 2
    sweep = []
    for eps in eps_values:
        h = eps * scale
        fd = np.array([(loss(x + h * v) - loss(x - h * v)) / (2 * h) for v in dirs])
        err = np.abs(fd - ad) / np.maximum(np.maximum(np.abs(fd), np.abs(ad)), 1e-30)
        cos = float(fd @ ad / (np.linalg.norm(fd) * np.linalg.norm(ad) + 1e-30))
        sweep.append(dict(eps=eps, median_relative_error=float(np.median(err)), cosine=cos, fd=fd.tolist()))
    best = min(sweep, key=lambda r: r["median_relative_error"])
    return dict(input=key, output=output, ad=ad.tolist(), ic_scale=scale, sweep=sweep, best_eps=best["eps"],
                best_median_relative_error=best["median_relative_error"], best_cosine=best["cosine"],
                passed=bool(best["median_relative_error"] <= 1e-3 and best["cosine"] >= 0.99))


def gradients(tess, ta, order, eps_values, directions):
    rows = []
    inputs = block(ta, 8, order, rho=random_rho(8, 4))
    rows.append(dict(experiment="gradient/fd_check", **fd_check(tess, inputs, "rho", "thermal_compliance",
                                                               eps_values, directions)))
    # gradient/source_fd_check: the target is the temperature of two Gaussian sources (0.3 and 0.7 Lx)
    two = gaussian(8, 4, (0.3, 0.5), 0.15) + gaussian(8, 4, (0.7, 0.5), 0.15)
    target = block(ta, 8, order, rho=0.5, source=two)
    plan, rho, source, tgt, k_max, p_exp, pre = ta.prepare(ta.InputSchema.model_validate(target))
    T, _ = ta.temperature(plan, rho, source, k_max, p_exp, pre)
    inputs = block(ta, 8, order, rho=0.5, source=gaussian(8, 4))
    inputs["target_temperature"] = np.asarray(T.reshape(-1)[plan.vertex_at], np.float32)
    rows.append(dict(experiment="gradient/source_fd_check", **fd_check(tess, inputs, "source", "identification_error",
                                                                      eps_values, directions)))
    for r in rows:
        print(f"{r['experiment']:26s} best eps {r['best_eps']:g}: "
              f"median rel. error {r['best_median_relative_error']:.2e}, cosine {r['best_cosine']:.8f}, "
              f"passed {r['passed']}")
    return rows


def seconds(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def cost(tess, ta, order, sizes, repeats):
    rows = []
    for nx in sizes:
        inputs = block(ta, nx, order, rho=0.5)
        schema = ta.InputSchema.model_validate(inputs)
        ta._PLANS.clear()
        t0 = time.perf_counter()
        ta.prepare(schema)  # the host set-up of a mesh not seen before (cached for the calls below)
        setup = time.perf_counter() - t0
        plan, rho, source, target, k_max, p_exp, pre = ta.prepare(schema)
        _, _, info = ta._outputs(plan, rho, source, target, k_max=k_max, p_exp=p_exp, precond=pre)
        t_apply = seconds(lambda: tess.apply(inputs), repeats)
        t_vjp = seconds(lambda: tess.vector_jacobian_product(inputs, ["rho"], ["thermal_compliance"],
                                                             {"thermal_compliance": 1.0}), repeats)
        ny = max(1, nx // 2)
        E, nodes = nx * ny, (nx * order + 1) * (ny * order + 1) * (order + 1)
        rows.append(dict(nx=nx, cells=E, order=order, nodes=nodes,
                         setup_s=setup, apply_s=t_apply, vjp_s=t_vjp, pcg_iterations=int(info.iterations)))
        print(f"nx {nx:5d}: {E:8d} cells, setup {setup:7.3f} s, apply {t_apply:8.4f} s, vjp {t_vjp:8.4f} s, "
              f"{int(info.iterations)} PCG iterations")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--order", type=int, default=1, help="jaxsem polynomial order (1: Mosaic's Q1 problem)")
    ap.add_argument("--max-n", type=int, default=24, help="largest nx of the forward references")
    ap.add_argument("--eps", default="1,1e-1,1e-2,1e-3,1e-4", help="FD steps relative to rms(input)")
    ap.add_argument("--directions", type=int, default=6, help="random directions of the FD check")
    ap.add_argument("--cost", default="16,32,64,128,256", help="nx of the timings (nx × nx/2 × 1 cells)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="experiments/results/mosaic_thermal_mesh_cpu.json")
    a = ap.parse_args()
    import tesseract_core
    import tesseract_jax
    from tesseract_core import Tesseract

    ta = load_api()
    tess = Tesseract.from_tesseract_api(API)
    result = dict(record("mosaic_thermal_mesh"), tesseract_core_version=tesseract_core.__version__,
                  tesseract_jax_version=tesseract_jax.__version__,
                  mosaic_commit="a535cb306546d2c7276790368270f43b742059ef", order=a.order,
                  cpu_count=os.cpu_count(), backend=jax.default_backend())
    result["forward"] = forward(tess, ta, a.order, a.max_n)
    result["gradients"] = gradients(tess, ta, a.order, [float(e) for e in a.eps.split(",")], a.directions)
    result["cost"] = cost(tess, ta, a.order, [int(s) for s in a.cost.split(",")], a.repeats)
    print("wrote", write_json(a.out, result))


if __name__ == "__main__":
    main()
