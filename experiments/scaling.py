"""BP5 scaling over ranks/devices: time per PCG iteration, gather–scatter share.

The distributed issue's measurement (bake-off paper §5–6 style, one process per
GPU): for each global mesh size, BP5 (p = 7 by default) runs ``--iterations``
Jacobi-PCG iterations as one compiled loop; we also time the gather–scatter
alone (QQᵀ incl. the neighbour exchange) and the local operator alone, both as
jitted loops of 20, so the gather–scatter share of an iteration is reported.
Transports: ``mpi`` (run under ``mpirun -n P``; mpi4jax sendrecv/allreduce) and
``shard`` (``--devices P`` of one process, or every process's devices when started by
``mpirun``/``srun``: JAX's own runtime, NCCL on GPUs).

    mpirun -n 2 python -m experiments.scaling --transport mpi --sizes 16x16x16,32x32x16 --out r.json
    python -m experiments.scaling --transport shard --devices 1,2 --sizes 16x16x16 --out s.json
    python -m experiments.scaling --plot r1.json r2.json ...   # efficiency plots, PNG beside the first
Default (CPU, seconds): --order 3 --sizes 4x4x4.
Efficiencies (computed by --plot from runs with P = 1 and P = 2): strong
η = t₁/(P·t_P) at equal global size; weak η = t₁/t_P at equal size per rank;
n₀.₈ from the fit t(n) = t₀ + n/R∞ of the per-rank time per iteration.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from experiments.common import (Placements, Results, add_transport_args, median_seconds, parse_sizes)


def run(a, ap):
    """BP5 timings for each size and device count: the whole PCG, and per iteration the
    gather–scatter alone and the element operator alone (each in its own loop)."""
    from jaxsem.discretization import discretize
    from jaxsem.mesh import box_mesh
    from jaxsem.mesh.numbering import number_nodes
    from jaxsem.models import poisson

    at = Placements(a, ap)
    comm, counts, rank = at.comm, at.counts, at.rank
    rows = Results(a.out, "scaling", write=rank == 0)
    its, reps, f = a.iterations, 20, poisson.manufactured(5).f
    solve = jax.jit(lambda s, b: poisson.solve(s, None, rhs=b, tol=0.0, maxiter=its))
    gs_loop = jax.jit(lambda s, u: s.local_map(
        lambda s, u: jax.lax.fori_loop(0, reps, lambda i, v: s.dssum(v) * 0.125, u), u))
    ax_loop = jax.jit(lambda s, u: s.local_map(
        lambda s, u: jax.lax.fori_loop(0, reps, lambda i, v: poisson.local_operator(s)(v) * 1e-3, u), u))
    for elements in parse_sizes(a.sizes):
        mesh = box_mesh(elements, a.order, deform=0.1)
        numbering = number_nodes(mesh)  # shared by every device count
        for P, where in ((P, at.where(P)) for P in counts):
            t0 = time.perf_counter()
            sem = discretize(mesh, "gll", True, backend=a.backend, numbering=numbering, **where)
            b = poisson.load(sem, f)
            jax.block_until_ready((sem, b))
            setup = time.perf_counter() - t0
            t_solve = median_seconds(solve, (sem, b), a.repeats)
            t_gs = median_seconds(gs_loop, (sem, b), a.repeats) / reps
            t_ax = median_seconds(ax_loop, (sem, b), a.repeats) / reps
            info = solve(sem, b)[1]
            n_it = int(info.iterations)
            E = int(np.prod(elements))
            dofs = E * a.order**3
            ranks = P if comm is None else comm.size
            row = dict(transport=sem.comm.name, backend=sem.backend.name, ranks=ranks, processes=jax.process_count(),
                       elements=list(elements), num_elements=E, order=a.order, dofs=dofs, dofs_per_rank=dofs / ranks,
                       iterations=n_it, seconds=t_solve, seconds_per_iteration=t_solve / n_it, gs_seconds=t_gs,
                       ax_seconds=t_ax, gs_share=t_gs / (t_solve / n_it), dofs_per_second=dofs * n_it / t_solve,
                       setup_seconds=setup, residual=float(info.residual) / float(info.residual0))
            rows.append(row)
            if rank == 0:
                print(f"{row['transport']} P={ranks} E={elements} n={dofs:.3e} "
                      f"iter {row['seconds_per_iteration']*1e3:8.3f} ms gs {t_gs*1e3:7.3f} ms "
                      f"({100*row['gs_share']:4.1f}%) ax {t_ax*1e3:7.3f} ms {row['dofs_per_second']/1e9:6.2f} GDOF/s "
                      f"setup {setup:.0f}s", file=sys.stderr, flush=True)
            del sem, b
    return rank, rows


def _transport(row) -> str:
    """A row's transport (rows before the transport field called it "backend")."""
    return row.get("transport", row["backend"])


def fit_n08(rows):
    """Fit t = t0 + n/R over rows of one (backend, ranks); n per rank. Returns t0, R, n08 = 4 t0 R."""
    n = np.array([r["dofs_per_rank"] for r in rows])
    t = np.array([r["seconds_per_iteration"] for r in rows])
    if len(n) < 2:
        return None
    A = np.stack([np.ones_like(n), n], 1)
    (t0, inv_r), *_ = np.linalg.lstsq(A, t, rcond=None)
    if inv_r <= 0:
        return None
    R = 1 / inv_r
    if t0 <= 0:  # the sizes are all far above n0.8: the intercept is not resolved
        return dict(t0=float(t0), R=float(R), n08=None, note="t0 not resolved (fit intercept <= 0)")
    return dict(t0=float(t0), R=float(R), n08=float(4 * t0 * R))


def efficiencies(rows, size="dofs", per_rank="dofs_per_rank", time="seconds_per_iteration",
                 same=lambda r, b: True):
    """Strong and weak scaling efficiency of every P > 1 row against a P = 1 row.

    Strong η = t₁/(P·t_P), t₁ from a P = 1 row of equal global ``size``; weak η = t₁/t_P, t₁ from a
    P = 1 row whose ``size`` is within 3% of the row's ``per_rank``. The P = 1 rows considered for a
    row r are those b with ``same(r, b)``, r's own backend first (P = 1 never communicates), then in
    row order. Returns (strong, weak): lists of (row, P = 1 row, η), in row order.
    """
    strong, weak = [], []
    for r in rows:
        if r["ranks"] == 1:
            continue
        ones = sorted((b for b in rows if b["ranks"] == 1 and same(r, b)), key=lambda b: _transport(b) != _transport(r))
        eq = [b for b in ones if b[size] == r[size]]
        if eq:
            strong.append((r, eq[0], eq[0][time] / (r["ranks"] * r[time])))
        eq = [b for b in ones if abs(b[size] - r[per_rank]) <= 0.03 * b[size]]
        if eq:
            weak.append((r, eq[0], eq[0][time] / r[time]))
    return strong, weak


def plot(paths):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for p in paths:
        with open(p) as fh:
            rows += json.load(fh)["rows"]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    summary = {}
    for backend in sorted({_transport(r) for r in rows}):
        for P in sorted({r["ranks"] for r in rows if _transport(r) == backend}):
            rs = sorted((r for r in rows if _transport(r) == backend and r["ranks"] == P), key=lambda r: r["dofs"])
            ax[0].plot([r["dofs_per_rank"] for r in rs], [r["dofs_per_second"] / P / 1e9 for r in rs], "o-",
                       label=f"{backend}, P={P}")
            summary[f"{backend}_P{P}"] = fit_n08(rs)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("DOFs per rank (E·p³/P)")
    ax[0].set_ylabel("GDOF/s per rank (BP5, 100 PCG iterations)")
    ax[0].grid(True, which="both", alpha=0.3)
    ax[0].legend()
    strong, weak = efficiencies(rows)
    # strong-scaling efficiency at equal global size, by backend
    eff = sorted((dict(backend=_transport(r), ranks=r["ranks"], elements=r["elements"], dofs=r["dofs"],
                       strong_efficiency=e) for r, _, e in strong), key=lambda e: _transport(e))
    for backend in sorted({_transport(e) for e in eff}):
        for P in sorted({e["ranks"] for e in eff if _transport(e) == backend}):
            xs = sorted((e for e in eff if _transport(e) == backend and e["ranks"] == P), key=lambda e: e["dofs"])
            ax[1].plot([e["dofs"] for e in xs], [e["strong_efficiency"] for e in xs], "o-",
                       label=f"{backend}, P={P}: strong η")
    ax[1].set_xscale("log")
    ax[1].axhline(0.9, color="k", ls="--", lw=0.8)
    ax[1].set_xlabel("global DOFs")
    ax[1].set_ylabel("η = t₁ / (P·t_P)")
    ax[1].grid(True, which="both", alpha=0.3)
    ax[1].legend()
    # weak-scaling efficiency: equal DOFs per rank (within 3%) as a P = 1 run, same backend first
    weak = [dict(backend=_transport(r), ranks=r["ranks"], elements=r["elements"], dofs_per_rank=r["dofs_per_rank"],
                 base_elements=b["elements"], weak_efficiency=e) for r, b, e in weak]
    fig.tight_layout()
    out = os.path.splitext(paths[0])[0] + ".png"
    fig.savefig(out, dpi=110)
    print(out)
    return dict(fits=summary, strong=eff, weak=weak)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_transport_args(ap)
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--sizes", default="4x4x4", help="global element counts, e.g. 16x16x16,32x32x16")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--backend", default="auto", choices=["auto", "einsum", "cuda"],
                    help="element kernels (auto: CUDA on GPUs, einsum elsewhere)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="scaling.json", help="JSON output, rewritten after each size")
    ap.add_argument("--plot", nargs="+", default=None)
    a = ap.parse_args(argv)
    if a.plot:
        print(json.dumps(plot(a.plot), indent=1))
        return
    run(a, ap)   # rows are written to --out as they come


if __name__ == "__main__":
    main()
