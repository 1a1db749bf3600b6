"""CUDA (XLA FFI) kernels for BK1–BK6: build, check against einsum, time across orders.

``jaxsem/backends/csrc/sem_kernels.cu`` (one element per thread layer, k-column in
registers, nothing padded to powers of two). This script, on one GPU:

1. builds the libraries the run needs (``jaxsem.backends.cuda.build``, one per operator,
   dtype and order, in parallel; the build time is recorded);
2. checks every kernel against the einsum reference on random data with a ragged
   element count (E = 37), orders 1…15, FP64 (and FP32 against the FP64 reference),
   scalar and 3-component forms;
3. times BK1–BK6 per order (median of ``--repeats`` samples of ``--inner`` back-to-back
   applies, :func:`jaxsem.app.bench.time_median`) at E·p³ ≈ ``--target-dofs`` for ``--impls``,
   against the copy ceiling measured in the same run (bytes per DOF:
   :func:`jaxsem.app.bench.bytes_per_dof`). Rows are written to ``--out`` as they come.

``--impls``: ``einsum`` (the reference) or ``cuda[V][p|n]``: the CUDA kernels with variant V
(default: the tuning table's) and the L2 prefetch on (p), off (n) or as the table says; V must
be one of ``jaxsem.backends.cuda.VARIANTS`` for the operator (others are skipped). The variant
is chosen by setting the tuning table's entry while the call is traced, the path every call
takes.

    python -m experiments.cuda_kernels --out cuda_kernels.json
    python -m experiments.cuda_kernels --impls cuda2,cuda4,cuda6,cuda8 --problems bk5,bk6 --orders 7
    python -m experiments.cuda_kernels --plot-only cuda_kernels.json   # the PNG again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp

import jaxsem
from jaxsem import geometry
from jaxsem.app import bench
from jaxsem.backends import cuda as ck
from jaxsem.operators.mass import mass
from jaxsem.operators.stiffness import stiffness, stiffness_gll

from experiments.common import record

PROBLEMS = {"bk1": ("mass", 1), "bk2": ("mass", 3), "bk3": ("stiffness", 1), "bk4": ("stiffness", 3),
            "bk5": ("gll", 1), "bk6": ("gll", 3)}
CUDA_OP = {"mass": "mass", "stiffness": "stiffness", "gll": "bk5"}  # PROBLEMS' op -> cuda.OPS


def inputs(key, E, order, op, components, dtype):
    quad = geometry.quadrature(order, "gll" if op == "gll" else "gauss")
    n, q = order + 1, quad.J.shape[0]
    ku, kg = jax.random.split(key)
    shape = (components, E, n, n, n) if components > 1 else (E, n, n, n)
    u = jax.random.normal(ku, shape, dtype)
    if op == "mass":
        data = 1.0 + jax.random.uniform(kg, (E, q, q, q), dtype)
    else:
        data = jax.random.normal(kg, (6, E, q, q, q), dtype)
    return u, jnp.asarray(quad.J, dtype), jnp.asarray(quad.Dt, dtype), data


def parse_impl(impl):
    """``cuda[V][p|n]`` -> (variant or None for the default, prefetch: True/False/None)."""
    body = impl[4:]
    prefetch = {"p": True, "n": False}.get(body[-1:]) if body else None
    if prefetch is not None:
        body = body[:-1]
    return (int(body) if body else None), prefetch


def apply(op, impl, u, J, Dt, data):
    """``impl``: einsum, or ``cuda[V][p|n]``: the CUDA kernels, variant V (default: the tuning
    table's), with the L2 prefetch on (p), off (n) or as the table says. V and the prefetch are
    the table's entry for u's key while this call is traced (jit it afresh per impl)."""
    if not impl.startswith("cuda"):
        if op == "mass":
            return mass(u, J, data)
        if op == "gll":
            return stiffness_gll(u, Dt, data)
        return stiffness(u, J, Dt, data)
    v, pf = parse_impl(impl)
    kop = CUDA_OP[op]
    key = (kop, u.shape[-1], math.prod(u.shape[:-4]) > 1, jnp.dtype(u.dtype).name)
    listed = ck.TUNING.get(key)
    dv, dpf = ck.defaults(kop, u)
    ck.TUNING[key] = (dv if v is None else v, dpf if pf is None else pf)
    try:
        if op == "mass":
            return ck.mass_cuda(u, J, data)
        if op == "gll":
            return ck.stiffness_gll_cuda(u, Dt, data)
        return ck.stiffness_cuda(u, J, Dt, data)
    finally:
        if listed is None:
            del ck.TUNING[key]
        else:
            ck.TUNING[key] = listed


def has_variant(op, impl):
    """False for ``cudaV…`` where the kernel family of ``op`` has no variant V."""
    if not impl.startswith("cuda"):
        return True
    v, _ = parse_impl(impl)
    return v is None or v in ck.VARIANTS[CUDA_OP[op]]


def check(orders, out, impls=("cuda",)):
    key = jax.random.PRNGKey(1)
    rows = []
    for order in orders:
        for prob, (op, comps) in PROBLEMS.items():
            for dtype in (jnp.float64, jnp.float32):
                if dtype == jnp.float32 and comps > 1:
                    continue
                u, J, Dt, data = inputs(key, 37, order, op, comps, jnp.float64)
                ref = apply(op, "einsum", u, J, Dt, data)
                args = [a.astype(dtype) for a in (u, J, Dt, data)]
                for impl in impls:
                    if not has_variant(op, impl):
                        continue  # e.g. no slice kernel for BK3/BK4, no lines kernel for BK5/BK6
                    w = jax.jit(lambda *a: apply(op, impl, *a))(*args)
                    err = float(jnp.max(jnp.abs(w.astype(jnp.float64) - ref)) / jnp.max(jnp.abs(ref)))
                    rows.append(dict(problem=prob, order=order, impl=impl, dtype=jnp.dtype(dtype).name,
                                     rel_error=err, finite=bool(jnp.all(jnp.isfinite(w)))))
        worst = max(r["rel_error"] for r in rows if r["order"] == order and r["dtype"] == "float64")
        worst32 = max(r["rel_error"] for r in rows if r["order"] == order and r["dtype"] == "float32")
        print(f"check p={order:2d}: max rel. error FP64 {worst:.1e}, FP32 {worst32:.1e}", flush=True)
        out["check"] = rows
    return rows


def plot(path):
    """``path``'s rows as GDOF/s and % of the copy ceiling against p, one line per BK and impl."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(path))
    rows = [r for r in res["rows"] if "dofs_per_second" in r]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = dict(zip(PROBLEMS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for prob in PROBLEMS:
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pr = sorted((r for r in rows if r["problem"] == prob and r["impl"] == impl), key=lambda r: r["order"])
            if not pr:
                continue
            o = [r["order"] for r in pr]
            axes[0].plot(o, [r["dofs_per_second"] / 1e9 for r in pr], "o-", color=colors[prob], ms=3,
                         label=f"{prob.upper()} {impl}")
            axes[0].plot(o, [r["ceiling_dofs_per_second"] / 1e9 for r in pr], ":", color=colors[prob])
            axes[1].plot(o, [r["percent_of_ceiling"] for r in pr], "o-", color=colors[prob], ms=3,
                         label=f"{prob.upper()} {impl}")
    axes[1].axhline(70, color="k", lw=0.8, ls="--")
    axes[0].set(yscale="log", xlabel="polynomial order p", ylabel="GDOF/s (dotted: copy ceiling)")
    axes[1].set(xlabel="polynomial order p", ylabel="% of copy ceiling (dashed: 70 %)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{res['device']}, {res['dtype']}, E·p³ ≈ {res['target_dofs']:.1e}, copy "
                 f"{res['bandwidth_bytes_per_second'] / 1e9:.0f} GB/s")
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", default="1-15")
    ap.add_argument("--check-orders", default="1-15", help='orders to check against einsum, or "none"')
    ap.add_argument("--problems", default="bk5,bk1,bk3,bk6,bk2,bk4")
    ap.add_argument("--impls", default="cuda", help="comma list of einsum, cuda[V][p|n] (default: cuda)")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--target-dofs", type=float, default=1.6e7)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--budget-seconds", type=float, default=300)
    ap.add_argument("--out", default="cuda_kernels.json")
    ap.add_argument("--plot-only", default=None, metavar="JSON", help="plot an existing results JSON and exit")
    a = ap.parse_args(argv)
    if a.plot_only:
        return plot(a.plot_only)
    rng = lambda s: [int(x) for x in range(int(s.split("-")[0]), int(s.split("-")[1]) + 1)] if "-" in s \
        else [int(x) for x in s.split(",")]
    t_start = time.perf_counter()
    out = dict(record("cuda_kernels"), dtype=a.dtype, target_dofs=a.target_dofs, repeats=a.repeats,
               inner=a.inner, rows=[])
    save = lambda: open(a.out, "w").write(json.dumps(out, indent=1))
    t0 = time.perf_counter()
    checks = rng(a.check_orders) if a.check_orders != "none" else []
    keys = {(CUDA_OP[op], dt, o + 1) for op, _ in PROBLEMS.values() for o in checks for dt in ("float64", "float32")}
    keys |= {(CUDA_OP[PROBLEMS[p][0]], a.dtype, o + 1) for p in a.problems.split(",") for o in rng(a.orders)}
    ck.build(sorted(keys))  # in parallel; $JAXSEM_CUDA_LIB: nothing to build
    out["build_seconds"] = time.perf_counter() - t0
    out["library"] = os.environ.get("JAXSEM_CUDA_LIB") or os.environ.get("JAXSEM_CUDA_CACHE") or "~/.cache/jaxsem"
    print(f"{len(keys)} libraries in {out['library']} ready in {out['build_seconds']:.1f} s", flush=True)
    if a.check_orders != "none":
        check(rng(a.check_orders), out, [i for i in dict.fromkeys(a.impls.split(",")) if i.startswith("cuda")])
    save()
    bw = bench.measure_bandwidth()
    out["bandwidth_bytes_per_second"] = bw
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    dtype = jnp.dtype(a.dtype)
    key = jax.random.PRNGKey(0)
    for prob in a.problems.split(","):
        op, comps = PROBLEMS[prob]
        for order in rng(a.orders):
            if time.perf_counter() - t_start > a.budget_seconds:
                out.setdefault("skipped", []).append(f"{prob} p={order}")
                continue
            m = max(1, round((a.target_dofs / order**3) ** (1 / 3)))
            E = m**3
            u, J, Dt, data = inputs(key, E, order, op, comps, dtype)
            dofs = E * order**3 * comps
            bpd = bench.bytes_per_dof(prob, order, a.dtype)
            for impl in a.impls.split(","):
                if not has_variant(op, impl):
                    continue  # this operator has no such variant
                try:
                    fn = jax.jit(lambda *x: apply(op, impl, *x))
                    t1 = time.perf_counter()
                    jax.block_until_ready(fn(u, J, Dt, data))
                    compile_s = time.perf_counter() - t1
                    _, times = bench.time_median(fn, (u, J, Dt, data), a.repeats, a.inner)
                    s = statistics.median(times)
                    rate = dofs / s
                    ceil = bw / bpd
                    row = dict(problem=prob, order=order, impl=impl, elements=[m] * 3, dofs=dofs, seconds=s,
                               seconds_min=min(times), compile_seconds=compile_s, dofs_per_second=rate,
                               bytes_per_dof=bpd, ceiling_dofs_per_second=ceil, percent_of_ceiling=100 * rate / ceil)
                    print(f"{prob} p={order:2d} {impl:6s} E={m}^3 {rate / 1e9:6.2f} GDOF/s "
                          f"{100 * rate / ceil:5.1f}% of {ceil / 1e9:.1f}", flush=True)
                except Exception as exc:  # record and go on: one failing kernel must not end the sweep
                    row = dict(problem=prob, order=order, impl=impl, error=f"{type(exc).__name__}: {exc}"[:500])
                    print(f"{prob} p={order:2d} {impl:6s} FAILED {row['error'][:200]}", flush=True)
                out["rows"].append(row)
                save()
            del u, data
    save()
    plot(a.out)


if __name__ == "__main__":
    main()
