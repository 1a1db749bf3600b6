"""Bake-off roofline: BK1–BK6 and BP1–BP6 DOFs/s against the bandwidth ceiling, per backend.

Reproduces the shape of the CEED bake-off's throughput figures (Fischer et al.
2020: DOFs/s vs order p, and DOFs/s vs points per device, Figs. 17/18) on one
device, for the element-kernel backends asked for: the einsum reference and
``"auto"`` (the fused CUDA kernels on a GPU, einsum elsewhere). The copy
bandwidth is measured in the same run (:func:`jaxsem.app.bench.measure_bandwidth`)
and each kernel's ceiling is bandwidth / :func:`jaxsem.app.bench.bytes_per_dof`.

Work, in priority order (``--budget-seconds`` skips what no longer fits, and
says so in the JSON; the JSON is rewritten after every measurement):
  1. every problem and backend at ``--sweep-order`` and the largest of ``--sizes``;
  2. BP5 per-iteration time at ``--fit-sizes`` → fit t = t0 + n/R∞, n0.8 = 4·t0·R∞
     (the definition of experiments/scaling.py ``fit_n08``; SEEDS.md §1);
  3. order sweep at the largest size, orders coarse-to-fine (7, 3, 11, 15, 5, …);
  4. the other ``--sizes`` at the sweep order (DOFs/s vs points per device).

    # GPU (≈ 7 min with the guard):
    python -m experiments.roofline --orders 1-15 --sizes 1e5,1e6,4e6,1.6e7 \\
        --budget-seconds 400 --out roofline.json
    python -m experiments.roofline --plot-only roofline.json
Default (CPU, < 1 min): p = 2, 2·10³ points, 10 PCG iterations, all 12 problems.
Writes ``OUT`` (JSON) and ``OUT_order.png``, ``OUT_size.png`` beside it.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

import jaxsem
from jaxsem.app import bench
from jaxsem.backends import cuda
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.operators.bk import BK_SPECS

ALL_PROBLEMS = tuple(f"bk{k}" for k in range(1, 7)) + tuple(f"bp{k}" for k in range(1, 7))


def parse_list(text, cast=int):
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if cast is int and "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(cast(float(part)) if cast is int else cast(part))
    return out


def spread(orders):
    """``orders`` reordered coarse-to-fine: 7, 3, 11, 15, 5, 9, 13, 1, then the rest ascending."""
    first = [o for o in (7, 3, 11, 15, 5, 9, 13, 1) if o in orders]
    return first + [o for o in orders if o not in first]


def elements_for(order, points, max_per_axis=64):
    """Elements per axis m with m³·p³ ≈ points, 1 ≤ m ≤ ``max_per_axis`` (host-side mesh set-up
    of millions of low-order elements would eat the budget)."""
    return min(max_per_axis, max(1, int(round((points / order**3) ** (1 / 3)))))


def fit_n08(rows):
    """t = t0 + n/R∞ by least squares over ``rows`` (points, seconds_per_iteration).

    Returns t0, R∞ (points/s) and n0.8 = 4·t0·R∞ (the size at which the rate is 80 % of
    R∞; experiments/scaling.py ``fit_n08``), or None with fewer than 2 sizes or R∞ ≤ 0.
    """
    n = np.array([r["points"] for r in rows], float)
    t = np.array([r["seconds_per_iteration"] for r in rows], float)
    if len(set(n)) < 2:
        return None
    (t0, inv_r), *_ = np.linalg.lstsq(np.stack([np.ones_like(n), n], 1), t, rcond=None)
    if inv_r <= 0:
        return None
    R = 1.0 / inv_r
    return dict(t0=float(t0), R_inf=float(R), n08=float(4 * t0 * R), t08=float(5 * t0),
                points=[int(x) for x in n], seconds_per_iteration=[float(x) for x in t])


class Sweep:
    """Runs measurements under a time budget; caches discretizations; records everything."""

    def __init__(self, args, result):
        self.args = args
        self.result = result
        self.t_start = time.perf_counter()
        self.est = {"bk": 2.0, "bp": 4.0}  # seconds per item, updated as we go
        self.sems = {}

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def sem(self, spec, order, m, backend):
        key = (order, m, spec.quadrature, spec.dirichlet, backend)
        if key not in self.sems:
            if len(self.sems) > 2:  # keep memory bounded on large meshes
                self.sems.pop(next(iter(self.sems)))
            mesh = box_mesh((m, m, m), order, deform=0.1)
            self.sems[key] = poisson.bp_discretize(mesh, spec.number, dtype=self.args.dtype, backend=backend)
            jax.block_until_ready(self.sems[key])
        return self.sems[key]

    def run(self, stage, problem, backend, order, points):
        a = self.args
        kind, spec = problem[:2], BK_SPECS[int(problem[2:])]
        m = elements_for(order, points, a.max_per_axis)
        tag = dict(stage=stage, problem=problem, backend_requested=backend, order=order, elements=[m] * 3,
                   target_points=points)
        left = a.budget_seconds - self.elapsed()
        if left < self.est[kind]:
            self.result["skipped"].append(dict(tag, reason=f"budget: {left:.1f} s left, item ≈ {self.est[kind]:.1f} s"))
            return None
        t0 = time.perf_counter()
        try:
            sem = self.sem(spec, order, m, backend)
            if kind == "bk":
                r = bench.time_bk(spec, sem, repeats=a.repeats)
            else:
                r = bench.time_bp(spec, sem, iterations=a.iterations, repeats=max(1, a.repeats // 2))
                r["seconds_per_iteration"] = r["seconds"] / r["iterations"]
            r.update(tag, backend=r["backend"])
            bench.rates(r, self.result["bandwidth_bytes_per_second"])
            msg = (f"{r['dofs_per_second'] / 1e9:8.3f} GDOF/s {r['percent_of_ceiling']:5.1f}% of ceiling "
                   f"(compile {r['compile_seconds']:.1f} s)")
        except Exception as exc:  # out of memory, a kernel that fails to compile: record, go on
            r = dict(tag, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            msg = r["error"]
        dt = time.perf_counter() - t0
        r["item_seconds"] = dt
        self.est[kind] = 0.5 * self.est[kind] + 0.5 * dt
        self.result["rows"].append(r)
        print(f"[{self.elapsed():6.1f} s] {stage:5s} {problem} {backend:6s} p={order:2d} E={m}^3 {msg}",
              file=sys.stderr, flush=True)
        self.save()
        return r

    def save(self):
        self.result["elapsed_seconds"] = self.elapsed()
        if self.args.out:
            with open(self.args.out, "w") as fh:
                json.dump(self.result, fh, indent=1)


def run(args):
    jax.config.update("jax_enable_x64", True)
    info = bench.device_info()
    on_cpu = info["platform"] == "cpu"
    nbytes = args.bandwidth_bytes or (2**24 if on_cpu else 2**30)
    bw = bench.measure_bandwidth(nbytes=nbytes, repeats=3 if on_cpu else 5)
    print(f"device {info['device_kind']} ({info['platform']}), jax {jax.__version__}, "
          f"copy bandwidth {bw / 1e9:.1f} GB/s", file=sys.stderr, flush=True)
    problems = [p.lower() for p in parse_list(args.problems, str)]
    bad = [p for p in problems if p not in ALL_PROBLEMS]
    if bad:
        raise SystemExit(f"--problems: unknown {bad}; allowed {','.join(ALL_PROBLEMS)}")
    backends = parse_list(args.backends, str)
    orders = parse_list(args.orders)
    sizes = sorted(parse_list(args.sizes, float))
    fit_sizes = sorted(parse_list(args.fit_sizes, float))
    result = dict(
        experiment="roofline", device=info["device_kind"], device_info=info, jax_version=jax.__version__,
        jaxsem_version=jaxsem.__version__, command="python " + " ".join(sys.argv), dtype=args.dtype,
        bandwidth_bytes_per_second=bw, bandwidth_nbytes=nbytes, problems=problems, backends=backends, orders=orders,
        sizes=sizes, sweep_order=args.sweep_order, fit_order=args.fit_order, fit_sizes=fit_sizes,
        iterations=args.iterations, repeats=args.repeats, budget_seconds=args.budget_seconds,
        # one device: the BPs keep assembled vectors (discretize's default storage)
        bytes_per_dof={p: {str(o): bench.bytes_per_dof(p, o, args.dtype, "assembled" if p.startswith("bp") else "local")
                           for o in sorted(set(orders) | {args.sweep_order})}
                       for p in problems},
        rows=[], skipped=[], fits={},
    )
    if {"auto", "cuda"} & set(backends) and cuda.cuda_available():
        # the CUDA libraries this sweep uses, built in parallel now rather than one by one on first use
        t0 = time.perf_counter()
        keys = {("bk5" if BK_SPECS[int(p[2:])].quadrature == "gll" else BK_SPECS[int(p[2:])].operator, args.dtype,
                 o + 1) for p in problems for o in set(orders) | {args.sweep_order, args.fit_order}}
        keys |= {("gs", args.dtype, None)} if any(p.startswith("bp") for p in problems) else set()
        cuda.build([k for k in cuda.libraries() if k in keys])  # orders the kernels do not run: einsum
        result["cuda_build_seconds"] = time.perf_counter() - t0
    sw = Sweep(args, result)
    # 1. every problem at the sweep order and the largest size (both plots' anchor)
    for prob in problems:
        for backend in backends:
            sw.run("size", prob, backend, args.sweep_order, sizes[-1])
    # 2. BP5 small sizes: t = t0 + n/R∞ (cheap)
    if "bp5" in problems:
        for backend in backends:
            for points in fit_sizes:
                sw.run("fit", "bp5", backend, args.fit_order, points)
    # 3. order sweep at the largest size, orders spread out first (7, 3, 11, 15, 5, ...) so a
    #    budget cut leaves a coarse curve for every problem rather than a fine one for a few
    for order in spread(orders):
        if order == args.sweep_order:
            continue  # measured in stage 1
        for prob in problems:
            for backend in backends:
                sw.run("order", prob, backend, order, sizes[-1])
    # 4. the other sizes at the sweep order (DOFs/s vs points per device)
    for points in sizes[-2::-1]:
        for prob in problems:
            for backend in backends:
                sw.run("size", prob, backend, args.sweep_order, points)
    if "bp5" in problems:
        for backend in backends:
            rows = [r for r in result["rows"] if r["problem"] == "bp5" and r["backend_requested"] == backend
                    and r["order"] == args.fit_order and "seconds_per_iteration" in r
                    and r["stage"] in ("fit", "size")]
            result["fits"][f"bp5_{backend}_p{args.fit_order}"] = fit_n08(rows)
    sw.save()
    print(f"done in {sw.elapsed():.1f} s: {len(result['rows'])} measurements, "
          f"{len(result['skipped'])} skipped by the budget", file=sys.stderr)
    for k, f in result["fits"].items():
        if f:
            print(f"{k}: t0 = {f['t0'] * 1e6:.1f} us, R_inf = {f['R_inf'] / 1e9:.3f} GDOF/s, "
                  f"n0.8 = {f['n08']:.3g} points", file=sys.stderr)
    if args.out and not args.no_plot:
        plot(args.out)
    return result


def _finish(fig, axes, path):
    """Grid and legend on every panel, then save ``path`` and close."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as fh:
        res = json.load(fh)
    rows = [r for r in res["rows"] if "dofs_per_second" in r]
    bw = res["bandwidth_bytes_per_second"]
    base = os.path.splitext(path)[0]
    styles = {"einsum": "--", "auto": "-", "cuda": "-"}
    colors = {f"{kd}{k}": f"C{k - 1}" for kd in ("bk", "bp") for k in range(1, 7)}
    outs = []

    # DOFs/s vs p at the largest size of each order, with each problem's ceiling
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, kind in zip(axes, ("bk", "bp")):
        for prob in [p for p in res["problems"] if p.startswith(kind)]:
            for backend in res["backends"]:
                pr = {}
                for r in rows:
                    if r["problem"] == prob and r["backend_requested"] == backend and r["stage"] in ("order", "size"):
                        if r["order"] not in pr or r["points"] > pr[r["order"]]["points"]:
                            pr[r["order"]] = r
                if pr:
                    o = sorted(pr)
                    ax.plot(o, [pr[x]["dofs_per_second"] / 1e9 for x in o], "o" + styles.get(backend, "-"),
                            color=colors[prob], ms=3, label=f"{prob.upper()} {backend}")
            os_ = sorted({r["order"] for r in rows if r["problem"] == prob})
            if os_:
                ax.plot(os_, [bw / res["bytes_per_dof"][prob][str(o)] / 1e9 for o in os_], ":",
                        color=colors[prob], lw=1)
        ax.set_xlabel("polynomial order p")
        ax.set_ylabel("GDOF/s (DOFs = components·E·p³)")
        ax.set_yscale("log")
        ax.set_title(f"{kind.upper()}: solid auto/cuda, dashed einsum, dotted ceiling\n"
                     f"{res['device']}, {res['dtype']}, copy {bw / 1e9:.0f} GB/s")
    outs.append(_finish(fig, axes, base + "_order.png"))

    # DOFs/s vs points per device at the sweep order (bake-off Figs. 17/18)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, kind in zip(axes, ("bk", "bp")):
        for prob in [p for p in res["problems"] if p.startswith(kind)]:
            for backend in res["backends"]:
                pr = sorted((r for r in rows if r["problem"] == prob and r["backend_requested"] == backend
                             and r["order"] == res["sweep_order"] and r["stage"] in ("size", "fit")),
                            key=lambda r: r["points"])
                if pr:
                    ax.plot([r["points"] for r in pr], [r["dofs_per_second"] / 1e9 for r in pr],
                            "o" + styles.get(backend, "-"), color=colors[prob], ms=3, label=f"{prob.upper()} {backend}")
            if any(r["problem"] == prob for r in rows):
                ax.axhline(bw / res["bytes_per_dof"][prob][str(res["sweep_order"])] / 1e9, ls=":",
                           color=colors[prob], lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("points per device (E·p³)")
        ax.set_ylabel("GDOF/s")
        ax.set_title(f"{kind.upper()} at p = {res['sweep_order']} vs size, {res['device']}")
    outs.append(_finish(fig, axes, base + "_size.png"))
    for o in outs:
        print(o)
    return outs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--orders", default="2", help="order sweep, e.g. 1-15 or 3,5,7 (default 2)")
    ap.add_argument("--problems", default=",".join(ALL_PROBLEMS), help="comma list of bk1..bk6,bp1..bp6")
    ap.add_argument("--backends", default="einsum,auto",
                    help="comma list of einsum, auto, cuda (default einsum,auto; auto is einsum on a CPU)")
    ap.add_argument("--sizes", default="2e3", help="target points per device E·p³ for the size sweep")
    ap.add_argument("--sweep-order", type=int, default=None, help="order of the size sweep (default: 7 on GPU, "
                    "else the first of --orders)")
    ap.add_argument("--fit-order", type=int, default=None, help="order of the BP5 t0/R∞ fit (default: sweep order)")
    ap.add_argument("--fit-sizes", default=None, help="extra small BP5 sizes for the fit (default 5e2 on CPU; "
                    "1e4,3e4,1e5,3e5 on GPU)")
    ap.add_argument("--iterations", type=int, default=None, help="PCG iterations per BP solve (default 100; 10 on CPU)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs (median; default 5, 2 on CPU)")
    ap.add_argument("--max-per-axis", type=int, default=64, help="cap on elements per axis (default 64)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--budget-seconds", type=float, default=420.0,
                    help="stop starting new measurements after this many seconds (default 420)")
    ap.add_argument("--bandwidth-bytes", type=int, default=None, help="array size of the copy-bandwidth test")
    ap.add_argument("--out", default="roofline.json")
    ap.add_argument("--no-plot", action="store_true", help="write the JSON only")
    ap.add_argument("--plot-only", default=None, metavar="JSON", help="plot an existing results JSON and exit")
    a = ap.parse_args(argv)
    if a.plot_only:
        return plot(a.plot_only)
    gpu = jax.default_backend() != "cpu"
    if a.sweep_order is None:
        a.sweep_order = 7 if gpu else parse_list(a.orders)[0]
    if a.fit_order is None:
        a.fit_order = a.sweep_order
    if a.fit_sizes is None:
        a.fit_sizes = "1e4,3e4,1e5,3e5" if gpu else "5e2"
    if a.iterations is None:
        a.iterations = 100 if gpu else 10
    if a.repeats is None:
        a.repeats = 5 if gpu else 2
    for name in ("backends",):
        bad = [x for x in parse_list(getattr(a, name), str) if x not in ("einsum", "auto", "cuda")]
        if bad:
            ap.error(f"--{name}: unknown {bad}")
    return run(a)


if __name__ == "__main__":
    main()
