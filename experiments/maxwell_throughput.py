"""NekCEM's single-device saturation study: SEDG Maxwell time per step and GFLOPS vs n.

Reproduces the shape of Otten et al. (2016), "An MPI/OpenACC implementation of a
high-order electromagnetics solver with GPUDirect communication", Fig. 7 (single
K20X: GFLOPS vs n = E(N+1)³ for N = 7 and 14, saturating at ≈ 28 / 48 GFLOPS with
half-peak sizes n₁/₂ ≈ 33,308 / 34,525) and the time-per-step curves of its
Figs. 5(a)/6(a), with jaxsem's SEDG Maxwell operator (:mod:`jaxsem.models.maxwell`)
advanced by LSERK4 inside one jitted loop.

For each order N and element count E (doubling, as in the paper) on a periodic box
of unit-size affine elements: compile, warm up, then time ``--steps`` steps
(median of ``--repeats``). Reported per size:

* time per step, and GFLOPS by the paper's work model (its eq. 16)
  W = [180(N+1) + 420]·n flops per step, n = E(N+1)³ (5 RK stages × 36(N+1)⁴
  curl flops + 84(N+1)³ vector flops per element; face terms not counted);
* the half-peak size n₁/₂: the smallest n at which the measured rate reaches half
  of the largest measured rate (log-linear interpolation);
* a bandwidth ceiling: bytes moved per step (see :func:`bytes_per_step`) against
  the device's measured streaming bandwidth → the steps/s and GFLOPS the kernel
  could reach if it were purely memory-bound, and the measured % of it.

``--form chain`` (default) is NekCEM's chain-rule curl, which the work model
counts; ``--form split`` is jaxsem's energy-stable curved-element form (twice
the reference derivatives).

    python -m experiments.maxwell_throughput                                # CPU, seconds
    python -m experiments.maxwell_throughput --orders 7 14 --max-points 4e7 --steps 200 \\
        --out maxwell_throughput.json --plot       # a GPU
    python -m experiments.maxwell_throughput --plot-only maxwell_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax.numpy as jnp

import jaxsem  # noqa: F401  (float64 on)
from jaxsem.app import bench
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx

from experiments.common import element_grid, half_peak, record, time_steps

PAPER = {  # Otten et al. 2016, single K20X GPU, Fig. 7
    7: dict(peak_gflops=28.0, n_half=33308),
    14: dict(peak_gflops=48.0, n_half=34525),
}


def bytes_per_step(order: int, E: int, form: str = "chain", stages: int = 5, word: int = 8) -> dict:
    """Bytes moved per LSERK4 step by an ideally fused implementation (lower bound).

    Per stage and per node: the state q is read (6 words), the 2N-storage
    register k read and written (6 + 6) and q written back (6) — 24 field words;
    the metric terms ∂r_a/∂x_d (9 words; the split form also reads jac: 10) and
    nodal ε, μ (2). Per stage and per face point (6·E·(N+1)² of them): the six
    face values written to and the exchanged sums read back (12), normals (3)
    and four flux/lift coefficients (4). Returns the parts and the total.
    """
    n = E * (order + 1) ** 3
    nf = 6 * E * (order + 1) ** 2
    geo = 10 if form == "split" else 9
    parts = dict(fields=24 * n, geometry=geo * n, material=2 * n, faces=(12 + 3 + 4) * nf)
    parts = {k: v * word * stages for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def time_size(order, E, steps, repeats, flux, form, dtype, dt, backend="auto"):
    ne = element_grid(E)
    mesh = box_mesh(ne, order, lengths=tuple(float(v) for v in ne), periodic=(True, True, True))
    dg = discretize_dg(mesh, dtype=dtype, backend=backend)
    mat = mx.material(dg)
    q0 = mx.plane_wave(dg.x, 0.0, lengths=mesh.lengths, wavenumber=(1, 1, 1)).astype(dtype)
    seconds, compile_s, y = time_steps(mx.make_rhs(flux, "pec", form), q0, (dg, mat), dt, steps, repeats)
    finite = bool(jnp.all(jnp.isfinite(y)))
    return dict(elements=list(ne), num_elements=E, n=E * (order + 1) ** 3, dofs=E * order**3,
                backend=dg.backend.name, fused_rhs=dg.backend.name == "cuda" and form == "chain",
                seconds_per_step=seconds, compile_seconds=compile_s, finite=finite)


def run(args):
    dtype = jnp.dtype(args.dtype)
    info = bench.device_info()
    if args.bandwidth == "measure":
        nbytes = 2**30 if info["platform"] != "cpu" else 2**26
        bw = bench.measure_bandwidth(nbytes=nbytes)
    else:
        bw = float(args.bandwidth) * 1e9
    print(f"device {info['device_kind']} ({info['platform']}), streaming bandwidth {bw / 1e9:.1f} GB/s",
          file=sys.stderr)
    out = dict(record("maxwell_throughput"), reproduces="Otten et al. 2016, Fig. 7 (and 5a/6a)",
               bandwidth_bytes_per_second=bw, flux=args.flux, form=args.form, dtype=args.dtype, backend=args.backend,
               steps=args.steps, repeats=args.repeats, method="lserk4",
               work_model="[180(N+1)+420]*n flops per step, n = E(N+1)^3", orders={})
    for N in args.orders:
        # One Δt for all sizes of this order (unit elements): half the stable limit of a 1-element box.
        small = discretize_dg(box_mesh((1, 1, 1), N, periodic=(True,) * 3), dtype=dtype)
        dt = 0.5 * mx.stable_dt(small, mx.material(small), args.flux, form=args.form)
        rows = []
        E = 1
        while E * (N + 1) ** 3 <= args.max_points:
            if E * (N + 1) ** 3 >= args.min_points:
                r = time_size(N, E, args.steps, args.repeats, args.flux, args.form, dtype, dt, args.backend)
                flops = mx.flops_per_step(N, E)
                b = bytes_per_step(N, E, args.form, word=dtype.itemsize)
                r.update(gflops=flops / r["seconds_per_step"] / 1e9, flops_per_step=flops,
                         bytes_per_step=b["total"], bytes_breakdown=b,
                         gbytes_per_second=b["total"] / r["seconds_per_step"] / 1e9,
                         ceiling_gflops=flops * bw / b["total"] / 1e9)
                r["percent_of_ceiling"] = 100 * r["gflops"] / r["ceiling_gflops"]
                rows.append(r)
                print(f"N={N:2d} E={E:6d} n={r['n']:10d}  {r['seconds_per_step'] * 1e3:9.3f} ms/step  "
                      f"{r['gflops']:8.2f} GFLOPS  ({r['percent_of_ceiling']:5.1f}% of the bandwidth ceiling)"
                      + ("" if r["finite"] else "  NON-FINITE"), file=sys.stderr, flush=True)
            E *= 2
        if not rows:
            continue
        ns, rates = [r["n"] for r in rows], [r["gflops"] for r in rows]
        out["orders"][str(N)] = dict(dt=dt, rows=rows, peak_gflops=max(rates), n_half=half_peak(ns, rates),
                                     ceiling_gflops=rows[-1]["ceiling_gflops"], paper=PAPER.get(N))
    return out


def table(result) -> str:
    lines = [f"SEDG Maxwell throughput on {result['device']} ({result['flux']} flux, {result['form']} curl, "
             f"LSERK4, {result['dtype']}; bandwidth {result['bandwidth_bytes_per_second'] / 1e9:.1f} GB/s)",
             f"{'N':>3} {'E':>7} {'n=E(N+1)^3':>12} {'ms/step':>10} {'GFLOPS':>9} {'GB/s':>8} "
             f"{'ceiling GFLOPS':>15} {'% ceil':>7}"]
    for N, o in result["orders"].items():
        for r in o["rows"]:
            lines.append(f"{N:>3} {r['num_elements']:>7} {r['n']:>12} {r['seconds_per_step'] * 1e3:>10.3f} "
                         f"{r['gflops']:>9.2f} {r['gbytes_per_second']:>8.1f} {r['ceiling_gflops']:>15.1f} "
                         f"{r['percent_of_ceiling']:>7.1f}")
        nh = o["n_half"]
        paper = o.get("paper") or {}
        lines.append(f"    N={N}: peak {o['peak_gflops']:.2f} GFLOPS, n_1/2 = "
                     f"{'n/a' if nh is None else f'{nh:,.0f}'}"
                     + (f"  (paper, K20X: {paper['peak_gflops']:.0f} GFLOPS, n_1/2 = {paper['n_half']:,})"
                        if paper else ""))
    return "\n".join(lines)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for N, o in result["orders"].items():
        ns = [r["n"] for r in o["rows"]]
        l, = a1.semilogx(ns, [r["gflops"] for r in o["rows"]], "o-", label=f"N = {N}")
        a1.axhline(o["ceiling_gflops"], color=l.get_color(), ls=":", lw=1)
        if o["n_half"]:
            a1.axvline(o["n_half"], color=l.get_color(), ls="--", lw=0.8)
        a2.loglog(ns, [r["seconds_per_step"] for r in o["rows"]], "o-", label=f"N = {N}")
    a1.set_xlabel("n = E(N+1)^3"); a1.set_ylabel("GFLOPS ([180(N+1)+420] n per step)")
    a1.set_title(f"{result['device']}: rate (dotted: bandwidth ceiling, dashed: n_1/2)")
    a2.set_xlabel("n = E(N+1)^3"); a2.set_ylabel("seconds per step"); a2.set_title("time per LSERK4 step")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--orders", type=int, nargs="+", default=[7, 14], help="polynomial orders N (default 7 14)")
    p.add_argument("--min-points", type=float, default=1, help="smallest n = E(N+1)^3 to time (default 1)")
    p.add_argument("--max-points", type=float, default=4100,
                   help="largest n = E(N+1)^3; E doubles from 1 up to it (default 4100: seconds on a CPU)")
    p.add_argument("--steps", type=int, default=10, help="time steps per timed run (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per size, median reported (default 3)")
    p.add_argument("--flux", choices=mx.FLUXES, default="upwind")
    p.add_argument("--form", choices=mx.FORMS, default="chain", help="volume curl form (default chain, NekCEM's)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--backend", choices=("auto", "einsum", "cuda"), default="auto",
                   help="DG kernels (auto: the fused CUDA right-hand side on a GPU for the chain form)")
    p.add_argument("--bandwidth", default="measure", metavar="GBPS",
                   help="memory bandwidth in GB/s for the ceiling, or 'measure' (default)")
    p.add_argument("--out", default="maxwell_throughput.json",
                   help="JSON output path (default ./maxwell_throughput.json)")
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="also write a PNG beside the JSON")
    p.add_argument("--plot-only", metavar="JSON", help="only plot an existing result file")
    args = p.parse_args(argv)
    if args.plot_only:
        with open(args.plot_only) as fh:
            result = json.load(fh)
        print(plot(result, os.path.splitext(args.plot_only)[0] + ".png"))
        return 0
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be >= 1")
    result = run(args)
    out = args.out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))
    print(f"wrote {out}")
    if args.plot:
        print(f"wrote {plot(result, os.path.splitext(out)[0] + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
