"""Gauss-point kernels BK1–BK4: launch-configuration sweep of the fused Pallas kernels.

``default_config_gauss`` (eb = 16/QP elements per program, 4 warps up to a 2048-point
quadrature tile, else 8) was chosen from register counts on a CPU; this sweep timed it
(gauss_kernels*_h100.json, which set the mass exceptions ``MASS_CONFIGS``). It times it against other ``eb/num_warps[/sS]`` choices (S: Triton num_stages) and the
einsum chain, per problem and order: first a correctness check of every configuration
against the einsum reference on a ragged element count, then the median over
``--repeats`` samples of ``--inner`` back-to-back applies (:func:`jaxsem.app.bench._time`) at
E·p³ ≈ ``--target-dofs``, with % of the copy-bandwidth ceiling measured in the same run
(bytes per DOF: :func:`jaxsem.app.bench.bytes_per_dof`). Rows are written to ``--out`` as
they come; a ``--budget-seconds`` guard stops starting new items.

    # GPU (one call):
    python experiments/gauss_kernels.py --out $OUT/gauss_kernels_h100.json
    # CPU (interpret mode, tiny, seconds; numbers meaningless):
    python experiments/gauss_kernels.py --target-dofs 2e3 --configs default,1/4 --problems bk1,bk3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem
from jaxsem import geometry
from jaxsem.app import bench
from jaxsem.operators.fused import (
    FusedConfig, _default_interpret, default_config_gauss, mass_fused, stiffness_fused,
)
from jaxsem.operators.mass import mass
from jaxsem.operators.stiffness import stiffness

PROBLEMS = {"bk1": ("mass", 1), "bk2": ("mass", 3), "bk3": ("stiffness", 1), "bk4": ("stiffness", 3)}
GPU_CONFIGS = ["einsum", "default", "1/4", "1/8", "1/8/s2", "1/16", "2/4", "2/8", "4/8"]


def parse_config(text, n, q, dtype, op):
    """``einsum``, ``default`` or ``eb/num_warps[/sS]``."""
    if text in ("einsum", "default"):
        return None if text == "einsum" else default_config_gauss(n, q, dtype, op)
    eb, nw, *rest = text.split("/")
    stages = int(rest[0][1:]) if rest else 1
    return FusedConfig("chunk", int(eb), int(nw), num_stages=stages)


def inputs(key, E, order, components, dtype):
    quad = geometry.quadrature(order, "gauss")
    n, q = order + 1, quad.J.shape[0]
    ku, kb, kg = jax.random.split(key, 3)
    shape = (components, E, n, n, n) if components > 1 else (E, n, n, n)
    u = jax.random.normal(ku, shape, dtype)
    B = 1.0 + jax.random.uniform(kb, (E, q, q, q), dtype)
    G = jax.random.normal(kg, (6, E, q, q, q), dtype)
    return u, jnp.asarray(quad.J, dtype), jnp.asarray(quad.Dt, dtype), B, G


def make_fn(op, cfg, interpret):
    if op == "mass":
        if cfg is None:
            return jax.jit(lambda u, J, Dt, B, G: mass(u, J, B))
        return jax.jit(lambda u, J, Dt, B, G: mass_fused(u, J, B, config=cfg, interpret=interpret))
    if cfg is None:
        return jax.jit(lambda u, J, Dt, B, G: stiffness(u, J, Dt, G))
    return jax.jit(lambda u, J, Dt, B, G: stiffness_fused(u, J, Dt, G, config=cfg, interpret=interpret))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", default="7", help="comma list, e.g. 3,7")
    ap.add_argument("--problems", default="bk1,bk3,bk2,bk4")
    ap.add_argument("--configs", default=None, help=f"comma list (GPU default {','.join(GPU_CONFIGS)})")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--target-dofs", type=float, default=1.6e7)
    ap.add_argument("--check-elements", type=int, default=37)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--budget-seconds", type=float, default=1e9)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(a.dtype)
    interpret = _default_interpret()
    configs = (a.configs or ("einsum,default,1/4" if interpret else ",".join(GPU_CONFIGS))).split(",")
    start = time.perf_counter()
    bw = bench.measure_bandwidth(nbytes=2**22 if interpret else 2**30)
    dev = jax.devices()[0]
    res = dict(experiment="gauss_kernels", device=getattr(dev, "device_kind", dev.platform),
               jax_version=jax.__version__, jaxsem_version=jaxsem.__version__, dtype=a.dtype,
               command="python " + " ".join(sys.argv), bandwidth_bytes_per_second=bw, rows=[], skipped=[])

    def save():
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(res, fh, indent=1)

    key = jax.random.PRNGKey(0)
    for order in (int(v) for v in a.orders.split(",")):
        n = order + 1
        E = max(1, int(round(a.target_dofs / order**3)))
        for prob in a.problems.split(","):
            op, comps = PROBLEMS[prob]
            bpd = bench.bytes_per_dof(prob, order, a.dtype)
            big = inputs(key, E, order, comps, dtype)
            small = inputs(jax.random.fold_in(key, 1), a.check_elements, order, comps, dtype)
            ref = make_fn(op, None, interpret)(*small)
            for text in configs:
                if time.perf_counter() - start > a.budget_seconds:
                    res["skipped"].append(dict(order=order, problem=prob, config=text))
                    continue
                row = dict(order=order, problem=prob, config=text, elements=E, dofs=comps * E * order**3,
                           bytes_per_dof=bpd)
                try:
                    cfg = parse_config(text, n, order + 2, dtype, op)
                    fn = make_fn(op, cfg, interpret)
                    w = fn(*small)
                    row["rel_error"] = float(jnp.linalg.norm((w - ref).ravel()) / jnp.linalg.norm(ref.ravel()))
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn(*big))
                    row["compile_seconds"] = time.perf_counter() - t0
                    _, times = bench._time(fn, big, a.repeats, a.inner)
                    t = statistics.median(times)
                    row.update(seconds=t, dofs_per_second=row["dofs"] / t,
                               percent_of_ceiling=100 * row["dofs"] * bpd / t / bw)
                    print(f"p={order} {prob} {text:8s} {row['dofs_per_second'] / 1e9:7.2f} GDOF/s "
                          f"{row['percent_of_ceiling']:5.1f}% err {row['rel_error']:.1e}", flush=True)
                except Exception as e:  # a configuration that does not compile is a result too
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    print(f"p={order} {prob} {text:8s} FAILED {row['error']}", flush=True)
                res["rows"].append(row)
                save()
            del big
    res["elapsed_seconds"] = time.perf_counter() - start
    save()
    return res


if __name__ == "__main__":
    main()
