"""DG advection on one device: time per LSERK4 step, GFLOPS and % of the bandwidth ceiling vs n.

The single-device saturation study of ``maxwell_throughput.py`` for the DG advection
operator (:mod:`jaxsem.models.advection`), the measurement of the fused CUDA
right-hand side (:func:`jaxsem.backends.cuda.advection_rhs_cuda`) against its
bandwidth ceiling; no paper figure. For each order N and element count E (doubling)
on a periodic box of unit-size affine elements, velocity (1, 0.5, 0.25): compile,
warm up, then time ``--steps`` LSERK4 steps inside one jitted loop (median of
``--repeats``), for each backend of ``--backend`` (``auto,einsum``: the fused kernel
where it runs and the einsum reference, same machine, same run). Reported per size:

* time per step, and GFLOPS by the work model of :func:`flops_per_step`;
* the half-peak size n₁/₂ (as in ``maxwell_throughput.py``);
* the bytes a step moves (:func:`bytes_per_step`, per node: ``bytes_per_point_step``)
  against the device's measured streaming bandwidth B (``jaxsem.app.bench.measure_bandwidth``,
  or ``--bandwidth``): the ceiling is ``bytes_per_step / B`` seconds per step, and
  ``percent_of_ceiling = 100 · (bytes_per_step / seconds_per_step) / B``.

    python -m experiments.advection_throughput                                  # CPU, seconds
    python -m experiments.advection_throughput --orders 7 14 --min-points 4000 --max-points 1.7e7 \\
        --steps 50 --backend auto,einsum --out advection_throughput.json --plot  # a GPU
    python -m experiments.advection_throughput --plot-only advection_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax.numpy as jnp
import numpy as np

import jaxsem  # noqa: F401  (float64 on)
from jaxsem.app import bench
from jaxsem.backends import BACKENDS
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as adv


STAGES = 5  # LSERK4
INDEX_BYTES = 4  # nbr is int32
BYTES_MODEL = ("the least a step must move: per stage 8 words per node (u and the register k read and written, "
               "A x3 and jac read) + per face point 3 words (an, vn, lw) + 4 bytes (nbr); 5 stages")
WORK_MODEL = ("5 stages x {[2d(N+1) + p + 5] E(N+1)^3 + f 6E(N+1)^2} flops: d = 6 (split) or 3 reference "
              "derivatives, p = 14 (split) or 7 pointwise, 5 for the update, f = 11 (upwind) or 7 (central) "
              "per face point")


def bytes_per_step(order: int, E: int, stages: int = STAGES, word: int = 8) -> dict:
    """The bytes one LSERK4 step must move: the ceiling's numerator (each array once per stage).

    Per stage and per node (n = E(N+1)³): u read and written, the 2N-storage register k
    read and written (4 field words, as in maxwell_throughput's model), the contravariant
    velocity A (3) and jac (1) read — 8 words. Per stage and per face point (6·E·(N+1)²):
    an, vn, lw (3 words) and nbr (4 bytes). The neighbour's u at a face point is a second
    read of u, assumed to hit L2, and not counted. This is the least a stage moves (the
    right-hand side and the update in one pass); the fused kernel today writes du/dt and
    XLA's update pass reads it back with k and u (3 words more per node and stage), which
    the measured % of this ceiling includes. ``word``: bytes per real. Returns the parts and
    the total.
    """
    n = E * (order + 1) ** 3
    nf = 6 * E * (order + 1) ** 2
    parts = dict(fields=4 * n * word, geometry=4 * n * word, faces=nf * (3 * word + INDEX_BYTES))
    parts = {k: v * stages for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


# Pointwise flops per node and stage of each volume form (with the final surf − vol/J):
# split: A_a u (3), A·∇u (5), Σ_a ∂_a(A_a u) (2), the two halves (2), /J and − (2);
# conservative: A_a u (3), the sum (2), /J and − (2); chain: A·∇u (5), /J and − (2).
_VOLUME_POINTWISE = {"split": 14, "conservative": 7, "chain": 7}
_DERIVATIVES = {"split": 6, "conservative": 3, "chain": 3}
_FACE = {"upwind": 11, "central": 7}  # f*, an·u − f*, ×lw, += per face point


def flops_per_step(order: int, E: int, form: str = "split", flux: str = "upwind", stages: int = STAGES) -> int:
    """Flops of one LSERK4 step (a fused multiply–add counts 2).

    Per stage and per node: the reference derivatives, 2(N+1) each (6 for the split
    form, 3 for the others), the pointwise volume work (14 split, 7 otherwise) and
    the update k ← a·k + Δt·f, u ← u + b·k (5); per face point 11 (upwind) or 7
    (central). W = stages·{[2d(N+1) + p + 5]·E(N+1)³ + f·6E(N+1)²}.
    """
    n = E * (order + 1) ** 3
    nf = 6 * E * (order + 1) ** 2
    per_node = 2 * _DERIVATIVES[form] * (order + 1) + _VOLUME_POINTWISE[form] + 5
    return stages * (per_node * n + _FACE[flux] * nf)


def time_size(order, E, steps, repeats, flux, form, dtype, dt, backend):
    # imported here, not above: tests load this file by path for its models, outside the package
    from experiments.common import element_grid, time_steps

    ne = element_grid(E)
    mesh = box_mesh(ne, order, lengths=tuple(float(v) for v in ne), periodic=(True, True, True))
    dg = discretize_dg(mesh, dtype=dtype, backend=backend)
    tr = adv.transport(dg)
    x = dg.x
    u0 = (jnp.sin(2 * np.pi * x[0] / ne[0]) * jnp.cos(2 * np.pi * x[1] / ne[1])
          + jnp.sin(2 * np.pi * x[2] / ne[2])).astype(dtype)
    seconds, compile_s, y = time_steps(adv.make_rhs(flux, form), u0, (dg, tr), dt, steps, repeats)
    fused = dg.backend.name == "cuda" and dg.nbr is not None
    row = dict(elements=list(ne), num_elements=E, n=E * (order + 1) ** 3, dofs=E * order**3,
               backend_requested=backend, backend=dg.backend.name, fused_rhs=fused,
               seconds_per_step=seconds, compile_seconds=compile_s,
               finite=bool(jnp.all(jnp.isfinite(y))))
    if fused:
        from jaxsem.backends import cuda

        row["variant"] = list(cuda.defaults("advection", u0))
    return row


def _backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--backend must be a comma-separated list of {BACKENDS}, got {text!r}")
    return list(dict.fromkeys(names))


def run(args):
    from experiments.common import half_peak, record  # the Maxwell study's n_1/2

    dtype = jnp.dtype(args.dtype)
    info = bench.device_info()
    if args.bandwidth == "measure":
        nbytes = 2**30 if info["platform"] != "cpu" else 2**26
        bw = bench.measure_bandwidth(nbytes=nbytes)
        source = f"measured: jaxsem.app.bench.measure_bandwidth(nbytes={nbytes})"
    else:
        bw = float(args.bandwidth) * 1e9
        source = "given: --bandwidth"
    print(f"device {info['device_kind']} ({info['platform']}), streaming bandwidth {bw / 1e9:.1f} GB/s",
          file=sys.stderr)
    out = dict(record("advection_throughput"), bandwidth_bytes_per_second=bw, bandwidth_source=source,
               flux=args.flux, form=args.form, dtype=args.dtype, velocity=list(adv.DEFAULT_VELOCITY),
               steps=args.steps, repeats=args.repeats, method="lserk4",
               work_model=WORK_MODEL, bytes_model=BYTES_MODEL, backends={})
    dts = {}
    for N in args.orders:
        # One Δt for all sizes of this order (unit elements): half the stable limit of a 1-element box.
        small = discretize_dg(box_mesh((1, 1, 1), N, periodic=(True,) * 3), dtype=dtype, backend="einsum")
        dts[N] = 0.5 * adv.stable_dt(small, adv.transport(small), args.flux, form=args.form)
    for backend in args.backend:
        orders = {}
        for N in args.orders:
            rows = []
            E = 1
            while E * (N + 1) ** 3 <= args.max_points:
                if E * (N + 1) ** 3 >= args.min_points:
                    r = time_size(N, E, args.steps, args.repeats, args.flux, args.form, dtype, dts[N], backend)
                    flops = flops_per_step(N, E, args.form, args.flux)
                    b = bytes_per_step(N, E, word=dtype.itemsize)
                    ceiling_s = b["total"] / bw
                    r.update(gflops=flops / r["seconds_per_step"] / 1e9, flops_per_step=flops,
                             bytes_per_step=b["total"], bytes_per_point_step=b["total"] / r["n"],
                             bytes_breakdown=b, gbytes_per_second=b["total"] / r["seconds_per_step"] / 1e9,
                             ceiling_seconds_per_step=ceiling_s, ceiling_gflops=flops / ceiling_s / 1e9,
                             percent_of_ceiling=100 * ceiling_s / r["seconds_per_step"])
                    rows.append(r)
                    print(f"{backend:>6} ({r['backend']}{', fused' if r['fused_rhs'] else ''}) N={N:2d} "
                          f"E={E:6d} n={r['n']:10d}  {r['seconds_per_step'] * 1e3:9.3f} ms/step  "
                          f"{r['gflops']:8.2f} GFLOPS  ({r['percent_of_ceiling']:5.1f}% of the bandwidth ceiling)"
                          + ("" if r["finite"] else "  NON-FINITE"), file=sys.stderr, flush=True)
                E *= 2
            if not rows:
                continue
            ns, rates = [r["n"] for r in rows], [r["gflops"] for r in rows]
            orders[str(N)] = dict(dt=dts[N], rows=rows, peak_gflops=max(rates), n_half=half_peak(ns, rates),
                                  peak_percent_of_ceiling=max(r["percent_of_ceiling"] for r in rows))
        out["backends"][backend] = dict(orders=orders)
    return out


def table(result) -> str:
    lines = [f"DG advection throughput on {result['device']} ({result['flux']} flux, {result['form']} form, "
             f"LSERK4, {result['dtype']}; bandwidth {result['bandwidth_bytes_per_second'] / 1e9:.1f} GB/s)",
             f"{'backend':>8} {'N':>3} {'E':>7} {'n=E(N+1)^3':>12} {'ms/step':>10} {'GFLOPS':>9} {'B/pt-step':>10} "
             f"{'GB/s':>8} {'% ceil':>7}"]
    for backend, res in result["backends"].items():
        for N, o in res["orders"].items():
            for r in o["rows"]:
                name = r["backend"] + ("*" if r["fused_rhs"] else "")
                lines.append(f"{name:>8} {N:>3} {r['num_elements']:>7} {r['n']:>12} "
                             f"{r['seconds_per_step'] * 1e3:>10.3f} {r['gflops']:>9.2f} "
                             f"{r['bytes_per_point_step']:>10.1f} {r['gbytes_per_second']:>8.1f} "
                             f"{r['percent_of_ceiling']:>7.1f}")
            nh = o["n_half"]
            lines.append(f"    {backend}, N={N}: peak {o['peak_gflops']:.2f} GFLOPS, "
                         f"{o['peak_percent_of_ceiling']:.1f}% of the ceiling, n_1/2 = "
                         f"{'n/a' if nh is None else f'{nh:,.0f}'}")
    lines.append("(* the fused CUDA right-hand side)")
    return "\n".join(lines)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for backend, res in result["backends"].items():
        for N, o in res["orders"].items():
            ns = [r["n"] for r in o["rows"]]
            label = f"{backend}, N = {N}"
            a1.semilogx(ns, [r["percent_of_ceiling"] for r in o["rows"]], "o-", label=label)
            a2.loglog(ns, [r["seconds_per_step"] for r in o["rows"]], "o-", label=label)
    a1.axhline(60, color="k", ls=":", lw=1)
    a1.set_xlabel("n = E(N+1)^3"); a1.set_ylabel("% of the bandwidth ceiling")
    a1.set_title(f"{result['device']}: bytes_per_step / time / bandwidth (dotted: 60%)")
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
    p.add_argument("--flux", choices=adv.FLUXES, default="upwind")
    p.add_argument("--form", choices=adv.FORMS, default="split", help="volume form (default split)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--backend", type=_backends, default=["auto"], metavar="LIST",
                   help="comma-separated backends, each timed in turn (default auto: the fused CUDA "
                        "right-hand side on a GPU; e.g. auto,einsum)")
    p.add_argument("--bandwidth", default="measure", metavar="GBPS",
                   help="memory bandwidth in GB/s for the ceiling, or 'measure' (default)")
    p.add_argument("--out", default="advection_throughput.json",
                   help="JSON output path (default ./advection_throughput.json)")
    p.add_argument("--plot", action="store_true", help="also write a PNG beside the JSON")
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
