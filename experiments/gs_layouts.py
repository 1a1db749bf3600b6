"""Compare the gather–scatter layouts (segment / sorted / padded / csr) on one device.

Reproduces no paper figure: it chooses jaxsem's default QQᵀ layout (core issue,
item 6). For each size it checks the layouts agree to round-off, then
times one jitted QQᵀ on a random E-vector (median of repeats) and reports
effective bandwidth against a minimal-traffic model: read u and gid, write the
per-node sums, read them back by gid, write the result
(2·8 + 2·4 bytes per local node + 2·8 per global node, float64/int32; ×C for the
values with ``--components C``). ``csr`` is the CUDA gather kernel where it runs
(``kernel`` in the rows says whether it did), the segment form elsewhere.

    python experiments/gs_layouts.py --order 7 --elements 16 24 32 --out experiments/results/gs_layouts.json
Default (CPU, seconds): --order 3 --elements 4 6.
"""

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem
from jaxsem.discretization.gather_scatter import LAYOUTS, gs_apply, gs_uses_kernel, make_gs
from jaxsem.mesh import box_mesh
from jaxsem.mesh.numbering import number_nodes


def timed(fn, x, repeats):
    fn(x).block_until_ready()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(x).block_until_ready()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, nargs="+", default=[4, 6], help="elements per axis (cubes)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--components", type=int, default=1, help="fields per call (3: a vector field)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for m in a.elements:
        t0 = time.perf_counter()
        nb = number_nodes(box_mesh((m, m, m), a.order))
        t_num = time.perf_counter() - t0
        C = a.components
        u = jax.random.normal(jax.random.PRNGKey(0), ((C,) if C > 1 else ()) + nb.gid.shape)
        outs = {}
        layouts = [x for x in LAYOUTS if x != "auto"]  # auto is csr or segment
        for layout in layouts:
            plan = make_gs(nb.gid, nb.num_global, layout)
            f = jax.jit(lambda v, plan=plan: gs_apply(plan, v))
            outs[layout] = f(u)
            sec = timed(f, u, a.repeats)
            L, G = nb.gid.size, nb.num_global
            nbytes = L * (C * 2 * 8 + 2 * 4) + C * G * 2 * 8
            rows.append(dict(layout=layout, kernel=gs_uses_kernel(plan, u), components=C, order=a.order,
                             elements=[m] * 3, local_nodes=L, global_nodes=G,
                             seconds=sec, model_bytes=nbytes, effective_GBps=nbytes / sec / 1e9,
                             numbering_seconds=t_num))
            print(f"E={m}^3 p={a.order} {layout:8s} {sec*1e6:10.1f} us  {nbytes/sec/1e9:7.1f} GB/s", file=sys.stderr)
        ref = outs["segment"]
        for layout in layouts:
            err = float(jnp.max(jnp.abs(outs[layout] - ref)) / jnp.max(jnp.abs(ref)))
            assert err < 1e-13, (layout, err)
    dev = jax.devices()[0]
    result = dict(experiment="gs_layouts", device=getattr(dev, "device_kind", dev.platform), platform=dev.platform,
                  jax_version=jax.__version__, jaxsem_version=jaxsem.__version__, command=" ".join(sys.argv), rows=rows)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)
    best = {}
    for r in rows:
        key = tuple(r["elements"])
        if key not in best or r["seconds"] < best[key]["seconds"]:
            best[key] = r
    for key, r in best.items():
        print(f"fastest at E={key}: {r['layout']}")
    return result


if __name__ == "__main__":
    main()
