"""Run a few PCG iterations of one BP under Nsight Compute's profiling range, to see every kernel
of an iteration (the element operator, the gather–scatter's scatter and gather, XLA's fused
vector updates and dot products) with its duration and DRAM throughput.

The solve is compiled and run once outside the range; the second run sits between
``cuProfilerStart``/``cuProfilerStop`` (driver API, through ctypes), so with
``ncu --profile-from-start off`` only its kernels are profiled:

    python -m experiments.profile_bp                      # a CPU, seconds: BP6, p = 3, 4³ elements
    ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum,\\
dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python -m experiments.profile_bp --problem bp6 --order 7 --elements 36 --iterations 2

Without ncu it runs the same; either way it writes the time of the profiled run to ``--out``
(ncu's kernel table is its own output; docs/performance.md cites it).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import jax

import jaxsem  # noqa: F401  (float64 on)
from jaxsem.app import bench
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson

from experiments.common import record, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="bp6", help="bp1 … bp6")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, default=4, help="elements per axis")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--backend", default="auto", choices=["auto", "einsum", "cuda"], help="element kernels")
    ap.add_argument("--out", default="profile_bp.json", help="JSON output")
    a = ap.parse_args(argv)
    kind, spec = bench.check_problem(a.problem)
    if kind != "bp":
        raise ValueError(f"--problem must be bp1 … bp6, got {a.problem!r}")
    sem = poisson.bp_discretize(box_mesh((a.elements,) * 3, a.order, deform=0.1), spec.number, backend=a.backend)
    run, args = bench.bp_run(spec, sem, a.iterations)  # what jaxsem bench times
    fn = jax.jit(run).lower(*args).compile()
    jax.block_until_ready(fn(*args))
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no CUDA driver here (a CPU machine): nothing to profile, just run
        cuda = None
    if cuda is not None:
        cuda.cuProfilerStart()
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    dt = time.perf_counter() - t0
    if cuda is not None:
        cuda.cuProfilerStop()
    print(f"{a.problem} p={a.order} E={a.elements}^3 backend={sem.backend.name}: {a.iterations} iterations in "
          f"{dt * 1e3:.2f} ms (profiled run; with setup of the loop)")
    write_json(a.out, dict(record("profile_bp"), problem=a.problem, order=a.order, elements=a.elements,
                           backend=sem.backend.name, iterations=a.iterations, profiled_seconds=dt,
                           profiled=cuda is not None))


if __name__ == "__main__":
    main()
