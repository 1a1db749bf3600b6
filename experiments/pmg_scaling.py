"""BP5 time to solution over devices: p-multigrid PCG to ``--tol`` across P devices or processes.

For each global mesh (the deformed unit box) and device count P: the seconds to build the
discretization and the right-hand side, to build the p-multigrid preconditioner
(``poisson.pmg``: levels, Chebyshev bounds, coarse level), and to solve to relative residual
``--tol`` (median of ``--repeats`` compiled solves after a compile run); the iterations (the
same for every P), and the relative L2 error against the manufactured solution. ``--jacobi``
adds the iterations Jacobi-PCG needs (not timed). Transports and JSON as in ``scaling.py``:
``shard`` (``--devices`` of this process, or of every process started by ``mpirun``) or ``mpi``
(``mpirun -n P``, one process per device, mpi4jax); rows are written to ``--out`` as they finish.
Efficiencies from them with ``scaling.efficiencies(rows, time="seconds")``.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m experiments.pmg_scaling \\
        --order 3 --sizes 4x4x4 --devices 1,2 --jacobi                 # a CPU, seconds
    mpirun -n 2 python -m experiments.pmg_scaling --order 3 --sizes 4x4x4 --transport mpi
    NCCL_NVLS_ENABLE=0 python -m experiments.pmg_scaling --sizes 64x32x32,64x64x56 --devices 1,2 \\
        --out pmg_shard.json                                           # 2 GPUs: 22.5 M and 79 M DOFs
    NCCL_NVLS_ENABLE=0 mpirun -n 2 python -m experiments.pmg_scaling --sizes 64x32x32,64x64x56 --devices 2 \\
        --out pmg_multi.json                                           # 2 GPUs, one process each, one device mesh
    mpirun -n 2 python -m experiments.pmg_scaling --sizes 64x32x32,64x64x56 --transport mpi --out pmg_mpi.json
"""

import argparse
import statistics
import sys
import time

import jax
import numpy as np

from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.mesh.numbering import number_nodes
from jaxsem.models import poisson

from experiments.common import Placements, Results, add_transport_args, parse_sizes


def _seconds(fn, *args):
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_transport_args(ap)
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--sizes", default="4x4x4", help="global element counts, e.g. 16x16x16,32x32x16")
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jacobi", action="store_true", help="also Jacobi-PCG's iterations to --tol")
    ap.add_argument("--backend", default="auto", choices=["auto", "einsum", "cuda"])
    ap.add_argument("--out", default="pmg_scaling.json")
    a = ap.parse_args(argv)
    at = Placements(a, ap)
    counts, rank, processes = at.counts, at.rank, at.processes
    rows = Results(a.out, "pmg_scaling", write=rank == 0)
    bp = poisson.manufactured(5)
    solve = jax.jit(lambda s, p, b: poisson.solve(s, None, tol=a.tol, maxiter=2000, rhs=b, precond=p))
    jacobi = jax.jit(lambda s, b: poisson.solve(s, None, tol=a.tol, maxiter=20000, rhs=b))
    for elements in parse_sizes(a.sizes):
        mesh = box_mesh(elements, a.order, deform=0.1)
        numbering = number_nodes(mesh)  # shared by every device count
        for P, where in ((P, at.where(P)) for P in counts):
            sem, setup = _seconds(lambda: discretize(mesh, "gll", True, backend=a.backend, numbering=numbering,
                                                     **where))
            b, _ = _seconds(poisson.load, sem, bp.f)
            pre, pmg_setup = _seconds(poisson.pmg, sem)
            (u, info), _ = _seconds(solve, sem, pre, b)  # compile
            seconds = statistics.median(_seconds(solve, sem, pre, b)[1] for _ in range(a.repeats))
            E, dofs = int(np.prod(elements)), int(np.prod(elements)) * a.order**3
            row = dict(transport=sem.comm.name, backend=sem.backend.name, ranks=P, processes=processes,
                       elements=list(elements), num_elements=E, order=a.order, dofs=dofs, dofs_per_rank=dofs / P,
                       tol=a.tol, pmg_orders=list(pre.orders), setup_seconds=setup, pmg_setup_seconds=pmg_setup,
                       seconds=seconds, iterations=int(info.iterations), converged=bool(info.converged),
                       l2_error=poisson.relative_errors(sem, u, bp.u)[0])
            if a.jacobi:
                row["jacobi_iterations"] = int(jacobi(sem, b)[1].iterations)
            rows.append(row)
            if rank == 0:
                print(f"{row['transport']} P={P} E={elements} n={dofs:.3e}: pMG {row['iterations']} it "
                      f"{seconds:.3f} s (setup {pmg_setup:.1f} s), L2 error {row['l2_error']:.2e}"
                      + (f", Jacobi {row['jacobi_iterations']} it" if a.jacobi else ""), file=sys.stderr, flush=True)
            del sem, b, pre, u


if __name__ == "__main__":
    main()
