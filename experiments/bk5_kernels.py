"""BK5 kernel variants: the einsum chain against fused Pallas (Triton) kernels.

For each order p: first a correctness check of every variant against the einsum
reference on fresh random data (a ragged element count, the output buffer
poisoned with NaN so unwritten points show), then timings at a saturating size
(E·p³ ≈ ``--target-dofs``): median over ``--repeats`` samples of ``--inner``
back-to-back applies, each sample ended by ``block_until_ready``. The copy
bandwidth is measured in the same run (:func:`jaxsem.app.bench.measure_bandwidth`)
and each rate is also given as % of the bandwidth ceiling, bytes per DOF from
:func:`jaxsem.app.bench.bytes_per_dof` (BK5, FP64 p = 7: 95.5 B/DOF).

Variants (see jaxsem/operators/fused.py): ``einsum`` (the reference chain,
XLA), ``bcast`` (one element per program, broadcast-and-sum), ``kron`` (dense
Kronecker dots for r and s), ``mixed`` (r by K = 16 chunk dots, s dense),
``chunk`` (r and s by K = 16 chunk dots, t block-diagonal); each ``/eb/nw``
= elements per program / num_warps, optionally ``/pP/sS``: a persistent grid of P
programs looping over the blocks, with Triton's software pipelining S stages deep.

    # on the GPU machine (writes $OUT/bk5_kernels_h100.json):
    PYTHONPATH=$PWD python3 experiments/bk5_kernels.py --gpu-default
    # here (CPU, Pallas interpret mode, tiny sizes, seconds; numbers meaningless):
    python experiments/bk5_kernels.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem
from jaxsem import basis
from jaxsem.app import bench
from jaxsem.operators.fused import (
    FusedConfig, _check_config, _fused_apply, default_config, stiffness_gll_fused,
)
from jaxsem.operators.stiffness import stiffness_gll

# Per order: "default" is the library's default_config (the measured best); the rest
# the sweep recorded in experiments/results/bk5_kernels_h100.json.
GPU_VARIANTS = {
    7: ["einsum", "default", "chunk/2/4", "chunk/2/4/m2/s1", "chunk/2/4/m2/s3", "chunk/2/4/m4/s2",
        "chunk/2/4/m1/s3", "chunk/2/8", "chunk/4/4", "chunk/4/8", "mixed/2/4", "kron/2/4", "kron/4/4",
        "bcast/1/4", "bcast/1/8"],
    3: ["einsum", "default", "chunk/8/2", "chunk/16/4", "chunk/8/2/m16/s2"],
    5: ["einsum", "default", "chunk/2/4/m2/s2"],
    9: ["einsum", "default"],
    11: ["einsum", "default"],
    15: ["einsum", "default", "chunk/1/16"],
}
FP32_VARIANTS = ["einsum", "default", "chunk/4/8", "chunk/2/4/m2/s2", "chunk/2/4/tf32x3"]
CPU_VARIANTS = ["einsum", "default", "chunk/2/4", "kron/2/4", "mixed/2/4", "bcast/1/4"]


def parse_variant(text, n=8, dtype=jnp.float64):
    """``einsum``, ``default`` (the library's :func:`default_config`) or
    ``variant/eb/num_warps[/pP][/mM][/sS][/tf32x3]``: P persistent programs (or M per
    SM), S num_stages, FP32 products on the tensor cores in three TF32 passes."""
    if text == "einsum":
        return None
    if text == "default":
        return default_config(n, dtype)
    v, eb, nw, *rest = text.split("/")
    kw = {}
    for r in rest:
        if r == "tf32x3":
            kw["dot_precision"] = r
        else:
            kw[{"p": "programs", "m": "programs_per_sm", "s": "num_stages"}[r[0]]] = int(r[1:])
    return FusedConfig(v, int(eb), int(nw), **kw)


def gll_D(order, dtype):
    x, _ = basis.gll_points(order)
    return jnp.asarray(basis.derivative_matrix(x), dtype)


def random_inputs(key, E, order, dtype):
    n = order + 1
    ku, kg = jax.random.split(key)
    u = jax.random.normal(ku, (E, n, n, n), dtype)
    G = jax.random.normal(kg, (6, E, n, n, n), dtype)
    return u, gll_D(order, dtype), G


def make_fn(cfg, interpret):
    if cfg is None:
        return jax.jit(stiffness_gll)
    return jax.jit(lambda u, D, G: stiffness_gll_fused(u, D, G, config=cfg, interpret=interpret))


def rel_err(w, ref):
    w64, r64 = np.asarray(w, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(w64 - r64) / np.linalg.norm(r64))


def check(cfg, order, dtype, E, key, interpret):
    """Rel. error vs the FP64 einsum reference on fresh data, output poisoned with NaN."""
    u, D, G = random_inputs(key, E, order, dtype)
    ref = jax.jit(stiffness_gll)(u.astype(jnp.float64), D.astype(jnp.float64), G.astype(jnp.float64))
    if cfg is None:
        w = jax.jit(stiffness_gll)(u, D, G)
        unwritten = 0
    else:
        w = jax.jit(lambda u, D, G: _fused_apply(u, D, G, cfg, interpret, poison=jnp.nan))(u, D, G)
        unwritten = int(jnp.isnan(w).sum())
    return rel_err(w, ref), unwritten


def time_fn(fn, args, repeats, inner):
    """Compile ``fn`` (compile seconds include the first call), warm it up once more, then
    :func:`jaxsem.app.bench._time` it. Returns (last output, compile seconds, seconds per apply list)."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))  # second warm-up
    out, times = bench._time(compiled, args, repeats, inner)
    return out, compile_s, times


def run(args):
    on_gpu = jax.default_backend() == "gpu"
    interpret = not on_gpu
    info = bench.device_info()
    bw = bench.measure_bandwidth(nbytes=2**30 if on_gpu else 2**24)
    print(f"device {info['device_kind']} ({info['platform']}), jax {jax.__version__}, "
          f"copy bandwidth {bw / 1e9:.0f} GB/s, interpret={interpret}", flush=True)
    result = dict(
        experiment="bk5_kernels", device=info["device_kind"], device_info=info,
        jax_version=jax.__version__, jaxsem_version=jaxsem.__version__,
        command="python " + " ".join(sys.argv), date=time.strftime("%Y-%m-%d %H:%M:%S"),
        interpret=interpret, bandwidth_bytes_per_second=bw,
        bandwidth_note="jaxsem.app.bench.measure_bandwidth(): float32 read+write stream, 1 GiB, median of 5",
        target_dofs=args.target_dofs, check_elements=args.check_elements,
        repeats=args.repeats, inner=args.inner, rows=[],
    )

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    key = jax.random.PRNGKey(args.seed)
    jobs = [(o, d, args.variants or (GPU_VARIANTS.get(o, ["einsum", "chunk/2/4"]) if on_gpu else CPU_VARIANTS))
            for o in args.orders for d in args.dtypes]
    if args.gpu_default:
        jobs.append((7, "float32", args.variants or FP32_VARIANTS))
    if args.plan:  # explicit "order:dtype:v1,v2,...;..." replaces the above
        jobs = []
        for item in args.plan.split(";"):
            o, d, vs = item.split(":")
            jobs.append((int(o), d, vs.split(",")))
    for order, dtype_name, names in jobs:
        if True:
            dtype = jnp.dtype(dtype_name)
            E = max(1, int(round(args.target_dofs / order**3)))
            n = order + 1
            key, kt = jax.random.split(key)
            targs = random_inputs(kt, E, order, dtype)
            ref = None
            bpd = bench.bytes_per_dof("bk5", order, dtype_name)
            dofs = E * order**3
            print(f"\np={order} n={n} {dtype_name}: E={E} ({dofs / 1e6:.2f} M DOF, "
                  f"{E * n**3 * 8 * dtype.itemsize / 1e9:.2f} GB moved per apply), {bpd:.1f} B/DOF", flush=True)
            for name in names:
                row = dict(order=order, n=n, dtype=dtype_name, variant=name, num_elements=E, dofs=dofs,
                           bytes_per_dof=bpd)
                try:
                    cfg = parse_variant(name, n, dtype)
                    if cfg is not None:
                        _check_config(cfg, n)
                        row.update(kernel=cfg.variant, elements_per_block=cfg.elements_per_block,
                                   num_warps=cfg.num_warps, num_stages=cfg.num_stages, programs=cfg.programs,
                                   programs_per_sm=cfg.programs_per_sm, dot_precision=cfg.dot_precision)
                    key, kc = jax.random.split(key)
                    err, unwritten = check(cfg, order, dtype, args.check_elements, kc, interpret)
                    tol = 1e-13 if dtype == jnp.float64 else 1e-5
                    row.update(check_rel_err=err, check_unwritten=unwritten,
                               check_ok=bool(err < tol and unwritten == 0))
                    out, compile_s, times = time_fn(make_fn(cfg, interpret), targs, args.repeats, args.inner)
                    if ref is None:
                        ref = jax.jit(stiffness_gll)(*targs)
                    row["timed_rel_err"] = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
                    sec = statistics.median(times)
                    row.update(compile_seconds=compile_s, seconds=sec, seconds_min=min(times),
                               times=times, gdofs=dofs / sec / 1e9,
                               percent_of_ceiling=100.0 * dofs / sec * bpd / bw)
                    print(f"  {name:12s} err {err:.1e} (timed {row['timed_rel_err']:.1e}) "
                          f"unwritten {unwritten}  {sec * 1e3:8.3f} ms  {row['gdofs']:6.2f} GDOF/s  "
                          f"{row['percent_of_ceiling']:5.1f}%  (compile {compile_s:.1f} s)", flush=True)
                except Exception as ex:  # keep going: one variant failing to compile is a result
                    row["error"] = f"{type(ex).__name__}: {ex}"[:2000]
                    print(f"  {name:12s} FAILED {row['error'][:300]}", flush=True)
                    if args.verbose:
                        traceback.print_exc()
                result["rows"].append(row)
                save()
            del targs, ref

    print("\norder dtype    variant       GDOF/s  %ceil  rel.err", flush=True)
    for r in result["rows"]:
        if "gdofs" in r:
            print(f"{r['order']:5d} {r['dtype']:8s} {r['variant']:12s} {r['gdofs']:7.2f} {r['percent_of_ceiling']:6.1f}"
                  f"  {r['check_rel_err']:.1e}{'' if r['check_ok'] else ' FAIL'}")
        else:
            print(f"{r['order']:5d} {r['dtype']:8s} {r['variant']:12s}  error: {r.get('error', '')[:80]}")
    save()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma-separated orders p (default 7; with --gpu-default 7,3,15,5,9,11)")
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=["float64"], help="float64,float32")
    ap.add_argument("--variants", type=lambda s: s.split(","), default=None,
                    help="e.g. einsum,chunk/2/4,kron/4/4 (default: a per-order list)")
    ap.add_argument("--plan", default=None,
                    help='jobs as "order:dtype:v1,v2;order:dtype:..." (overrides --orders/--dtypes/--variants)')
    ap.add_argument("--target-dofs", type=float, default=None, help="E·p³ per timing (GPU default 1.2e7)")
    ap.add_argument("--check-elements", type=int, default=None, help="E of the correctness check (ragged)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--inner", type=int, default=None, help="applies per timed sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default $OUT/bk5_kernels_h100.json if $OUT is set)")
    ap.add_argument("--gpu-default", action="store_true", help="orders 7,3,15,5,9,11 (FP64), then FP32 at p=7")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    if args.orders is None:
        args.orders = [7, 3, 15, 5, 9, 11] if args.gpu_default else [7]
    if args.target_dofs is None:
        args.target_dofs = 1.2e7 if on_gpu else 3 * 343
    if args.check_elements is None:
        args.check_elements = 1001 if on_gpu else 5
    if args.repeats is None:
        args.repeats = 15 if on_gpu else 2
    if args.inner is None:
        args.inner = 5 if on_gpu else 1
    if args.out is None and os.environ.get("OUT"):
        args.out = os.path.join(os.environ["OUT"], "bk5_kernels_h100.json")
    return run(args)


if __name__ == "__main__":
    main()
