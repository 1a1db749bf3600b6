"""GPU element kernels inside ``shard_map``: BP5 PCG on 1 and P devices, every impl.

For each device count and ``--impls`` entry: the sharded BP5 system (box mesh,
``shard.bp_discretize_sharded``), ``--iterations`` fixed Jacobi-PCG iterations as one
jitted ``shard_fn``, then two scalars computed inside the shard: the solution's
weighted norm² ``x·x`` and the last residual norm. They must agree across impls and
device counts to rounding (printed as the largest relative difference against
einsum on one device); the median time of ``--repeats`` solves is recorded too.

    python experiments/shard_impl_check.py --devices 1,2 --impls einsum,cuda,fused --out $OUT/shard_impl.json
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
from jaxsem.discretization import shard
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.mesh.numbering import number_nodes
from jaxsem.solvers import pcg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--impls", default="einsum,cuda,fused")
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--elements", default="16x16x16")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="shard_impl.json")
    a = ap.parse_args(argv)
    elements = tuple(int(v) for v in a.elements.split("x"))
    mesh = box_mesh(elements, a.order, deform=0.1)
    numbering = number_nodes(mesh)
    f = poisson.manufactured(5).f
    out = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, jaxsem=jaxsem.__version__,
               command=" ".join(sys.argv), order=a.order, elements=list(elements), iterations=a.iterations, rows=[])
    ref = None
    for P in (int(v) for v in a.devices.split(",")):
        sem, dmesh = shard.bp_discretize_sharded(mesh, 5, devices=P, numbering=numbering)
        b, dinv = shard.shard_call(lambda s: (poisson.load(s, f), poisson.jacobi(s)), sem, mesh=dmesh)
        for impl in a.impls.split(","):
            row = dict(devices=P, impl=impl)
            try:
                def run(s, b, d, impl=impl):
                    x, info = pcg(poisson.operator(s, impl=impl), b, dot=s.dot, dots=s.dots,
                                  precond=lambda r: d * r, tol=0.0, maxiter=a.iterations)
                    return s.dot(x, x), info.residual
                fn = jax.jit(shard.shard_fn(run, dmesh))
                xx, rn = jax.block_until_ready(fn(sem, b, dinv))
                times = []
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn(sem, b, dinv))
                    times.append(time.perf_counter() - t0)
                xx, rn = float(np.asarray(xx).ravel()[0]), float(np.asarray(rn).ravel()[0])
                ref = ref or (xx, rn)
                dofs = int(np.prod(elements)) * a.order**3
                row.update(xx=xx, residual_norm=rn, rel_diff_xx=abs(xx - ref[0]) / abs(ref[0]),
                           rel_diff_residual=abs(rn - ref[1]) / abs(ref[1]), seconds=statistics.median(times),
                           dofs_per_second=dofs * a.iterations / statistics.median(times))
                print(f"P={P} {impl:7s} x.x={xx:.15e} |r|={rn:.6e} rel.diff {row['rel_diff_xx']:.1e} / "
                      f"{row['rel_diff_residual']:.1e}  {row['dofs_per_second'] / 1e9:6.2f} GDOF/s", flush=True)
            except Exception as exc:  # record and go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:600]
                print(f"P={P} {impl:7s} FAILED {row['error'][:300]}", flush=True)
            out["rows"].append(row)
            open(a.out, "w").write(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
