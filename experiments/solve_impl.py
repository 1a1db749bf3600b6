"""``jaxsem solve`` (PCG to a tolerance) with the fused kernels against einsum, BP1–BP6.

The library check that ``impl="auto"`` (the CLI default) solves every bake-off problem
on a GPU to the same error and iteration count as the einsum chain, and how much faster:
one process, :func:`jaxsem.app.cli.solve_poisson` per (bp, impl), rows written to ``--out``
as they come.

    python experiments/solve_impl.py --order 7 --elements 16 --out solve_impl.json
"""

import argparse
import json
import sys

import jax

import jaxsem
from jaxsem.app.cli import solve_poisson


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bps", default="1,2,3,4,5,6")
    ap.add_argument("--impls", default="auto,einsum")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    dev = jax.devices()[0]
    res = dict(experiment="solve_impl", device=getattr(dev, "device_kind", dev.platform),
               jax_version=jax.__version__, jaxsem_version=jaxsem.__version__,
               command="python " + " ".join(sys.argv), rows=[])
    for bp in (int(v) for v in a.bps.split(",")):
        for impl in a.impls.split(","):
            try:
                r = solve_poisson(bp, a.order, (a.elements,) * 3, tol=a.tol, maxiter=5000, impl=impl)
                r["requested_impl"] = impl
                print(f"BP{bp} {impl:6s} -> {r['impl']:6s} its {r['iterations']:5d} L2 {r['error_l2']:.3e} "
                      f"{r['seconds']:.4f} s {r['dofs_per_second'] / 1e9:6.2f} GDOF/s compile "
                      f"{r['compile_seconds']:.1f} s", flush=True)
            except Exception as e:
                r = dict(bp=bp, requested_impl=impl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                print(f"BP{bp} {impl} FAILED {r['error']}", flush=True)
            res["rows"].append(r)
            if a.out:
                with open(a.out, "w") as fh:
                    json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
