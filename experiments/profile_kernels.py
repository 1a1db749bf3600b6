"""Apply chosen CUDA kernels a few times each, for Nsight Compute (``ncu``) to read their counters.

Each ``--cases`` entry is ``problem:order[:variant]`` (problem as in ``cuda_kernels.py``:
bk1…bk6). The inputs are those of the timing sweep (E·p³ ≈ ``--target-dofs``, random data),
applied ``--applies`` times after one warm-up, un-fused (one jit per case), so every launch is
one kernel ncu can pick by name (``*_element_kernel``, ``bk5_kernel``, ``mass_kernel``):

    ncu --clock-control none -k regex:kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats ... \\
        python -m experiments.profile_kernels --cases bk1:7,bk3:7,bk5:7,bk5:11 --target-dofs 1.6e7

Without a CUDA GPU the einsum reference runs instead (the default case is small: seconds on a
CPU). ``--out`` records each case's element count and kernel.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jaxsem  # noqa: F401  (float64 on)
from jaxsem.backends import cuda as ck

from experiments.common import record, write_json
from experiments.cuda_kernels import PROBLEMS, apply, inputs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="bk5:3", help="problem:order[:variant], e.g. bk1:7,bk5:11:4")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--target-dofs", type=float, default=1e4, help="E·p³ of each case")
    ap.add_argument("--applies", type=int, default=2)
    ap.add_argument("--out", default="profile_kernels.json", help="JSON output")
    args = ap.parse_args(argv)
    gpu = ck.cuda_available()
    if gpu:
        ck.build()
    rows = []
    dtype = jnp.dtype(args.dtype)
    for case in args.cases.split(","):
        prob, order, *rest = case.split(":")
        order = int(order)
        impl = (f"cuda{rest[0]}" if rest else "cuda") if gpu else "einsum"
        op, comps = PROBLEMS[prob]
        E = max(1, int(args.target_dofs / order**3))
        u, J, Dt, data = inputs(jax.random.PRNGKey(0), E, order, op, comps, dtype)
        f = jax.jit(lambda *a: apply(op, impl, *a))
        w = f(u, J, Dt, data).block_until_ready()  # warm-up (compile)
        for _ in range(args.applies):
            w = f(u, J, Dt, data).block_until_ready()
        print(f"{case}: E={E} impl={impl} |w|max={float(jnp.max(jnp.abs(w))):.3e}", flush=True)
        rows.append(dict(case=case, elements=E, impl=impl, applies=args.applies))
    write_json(args.out, dict(record("profile_kernels"), dtype=args.dtype, rows=rows))


if __name__ == "__main__":
    main()
