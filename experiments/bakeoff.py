"""CEED bake-off on one device: BK1–BK6 and BP1–BP6 throughput vs order p.

Reproduces the shape of the bake-off paper's per-order throughput results
(Fischer et al. 2020, §6, Figs. 5–11, there per node of BG/Q or per V100) with
jaxsem's einsum reference operators: for each order p, a box mesh of about
``--target-points`` E·p³ points (deformed, all six geometric factors stored),
one discretization per quadrature/boundary-condition kind shared by the BK
and BP of the same number, then BK (one element-operator apply) and BP
(100 Jacobi-PCG iterations with gather–scatter and weighted dot products) timed
with the jitted functions of :mod:`jaxsem.app.bench`. The device's copy bandwidth
is measured in the same run and every rate is also given as % of its
bandwidth ceiling (bytes per DOF from :func:`jaxsem.app.bench.bytes_per_dof`).

    python -m experiments.bakeoff --orders 1-15 --target-points 4e6 --out bakeoff.json
    python -m experiments.bakeoff --problems bp5 --backend auto --storage auto,local ...  # both storages
    python -m experiments.bakeoff --plot bakeoff.json    # PNG beside the JSON
Default (CPU, seconds): orders 2 3, 1e4 points, problems bk5 bp5.
"""

import argparse
import json
import os
import sys
import time


import jaxsem  # noqa: F401  (float64 on)
from jaxsem.app import bench
from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.mesh.numbering import number_nodes
from jaxsem.operators.bk import BK_SPECS

from experiments.common import record


def parse_orders(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def elements_for(order, target_points, max_per_axis):
    m = max(1, int(round((target_points / order**3) ** (1 / 3))))
    return min(m, max_per_axis)


def run(args):
    info = bench.device_info()
    bw = bench.measure_bandwidth()
    print(f"device {info}, copy bandwidth {bw/1e9:.0f} GB/s", file=sys.stderr)
    result = dict(record("bakeoff"), bandwidth_bytes_per_second=bw,
                  target_points=args.target_points, rows=[])
    problems = args.problems.split(",")
    for order in parse_orders(args.orders):
        m = elements_for(order, args.target_points, args.max_per_axis)
        t0 = time.perf_counter()
        mesh = box_mesh((m, m, m), order, deform=0.1)
        numbering = number_nodes(mesh)
        setup_mesh = time.perf_counter() - t0
        sems = {}
        storages = args.storage.split(",")
        for prob, storage in [(p, st) for p in problems for st in (storages if p.startswith("bp") else storages[:1])]:
            spec = BK_SPECS[int(prob[2:])]
            key = (spec.quadrature, spec.dirichlet, storage)
            if key not in sems:
                sems = {key: discretize(mesh, spec.quadrature, spec.dirichlet, backend=args.backend, numbering=numbering,
                                        storage=storage)}
            sem = sems[key]
            variants = [None]
            if args.assembled_variants and sem.assembled is not None and prob in ("bp3", "bp4", "bp5", "bp6") \
                    and sem.backend.name == "cuda":
                variants = [(int(v.rstrip("p")), v.endswith("p")) for v in args.assembled_variants.split(",")]
            for variant in variants:
                r = one(args, prob, spec, sem, variant)
                if r is None:
                    continue
                r.update(elements=[m] * 3, mesh_seconds=setup_mesh)
                bench.rates(r, bw)
                result["rows"].append(r)
                print(f"{prob} {r.get('storage', '')} {r.get('cuda_variant', '')} p={order:2d} E={m}^3 "
                      f"n={r['dofs']:.2e} {r['dofs_per_second']/1e9:7.3f} GDOF/s "
                      f"{r['percent_of_ceiling']:5.1f}% of ceiling  (compile {r['compile_seconds']:.1f}s)",
                      file=sys.stderr)
                if args.out:
                    with open(args.out, "w") as fh:
                        json.dump(result, fh, indent=1)
        del sems
    return result


def one(args, prob, spec, sem, variant):
    """Time BK/BP ``prob`` on ``sem``; ``variant``: (V, prefetch) of the fused assembled kernel
    (bk5a for BP5/BP6, stiffnessa for BP3/BP4), set in the tuning table while the solve is traced
    (None: the table's own)."""
    from jaxsem.backends import cuda as ck

    op = "bk5a" if spec.quadrature == "gll" else "stiffnessa"
    key = (op, sem.order + 1, spec.components > 1, sem.x.dtype.name)
    listed = ck.TUNING.get(key)
    if variant is not None:
        ck.TUNING[key] = variant
    try:
        if prob.startswith("bk"):
            return bench.time_bk(spec, sem, repeats=args.repeats)
        return bench.time_bp(spec, sem, iterations=args.iterations, repeats=max(2, args.repeats // 2))
    except Exception as exc:  # out of memory at large p/size: record, go on
        print(f"{prob} p={sem.order}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return None
    finally:
        if listed is None:
            ck.TUNING.pop(key, None)
        else:
            ck.TUNING[key] = listed


def plot(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as fh:
        res = json.load(fh)
    rows = [r for r in res["rows"] if "dofs_per_second" in r]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    for ax, kind in zip(axes, ("bk", "bp")):
        for k in range(1, 7):
            pr = sorted((r for r in rows if r["problem"] == f"{kind}{k}"), key=lambda r: r["order"])
            if pr:
                ax.plot([r["order"] for r in pr], [r["dofs_per_second"] / 1e9 for r in pr], "o-", label=f"{kind.upper()}{k}")
        ceil = sorted((r for r in rows if r["problem"] == f"{kind}5"), key=lambda r: r["order"])
        if ceil:
            ax.plot([r["order"] for r in ceil], [r["ceiling_dofs_per_second"] / 1e9 for r in ceil], "k--",
                    label=f"{kind.upper()}5 bandwidth ceiling")
        ax.set_xlabel("polynomial order p")
        ax.set_ylabel("GDOF/s (DOFs = components·E·p³)")
        ax.set_yscale("log")
        ax.set_title(f"{kind.upper()}1–6, einsum reference, {res['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", default="2,3", help="e.g. 1-15 or 3,5,7")
    ap.add_argument("--problems", default="bk5,bp5", help="comma list of bk1..bk6,bp1..bp6")
    ap.add_argument("--target-points", type=float, default=1e4)
    ap.add_argument("--max-per-axis", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--backend", default="einsum", choices=["einsum", "auto", "cuda"],
                    help="element kernels (auto: CUDA on GPUs, einsum elsewhere)")
    ap.add_argument("--storage", default="auto",
                    help="Krylov storage of the BPs, comma list: auto (assembled on one device), local")
    ap.add_argument("--assembled-variants", default="",
                    help="assembled BP3-BP6 with the CUDA backend: time each variant V of the fused kernel "
                         "(Vp: L2 prefetch on), e.g. 2,4,6 for bk5a (BP5/6), 8,9,11 for stiffnessa (BP3/4)")
    ap.add_argument("--out", default="bakeoff.json", help="JSON output")
    ap.add_argument("--plot", default=None, help="plot an existing results JSON and exit")
    a = ap.parse_args(argv)
    if a.plot:
        return plot(a.plot)
    return run(a)


if __name__ == "__main__":
    main()
