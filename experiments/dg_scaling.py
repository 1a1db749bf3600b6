"""DG time stepping over ranks/devices: Maxwell (SEDG) and advection, time per step, exchange share.

For each global mesh (periodic box, affine unit elements, order N) the model's
LSERK4 step runs ``--steps`` times inside one compiled loop (median of
``--repeats``); the face exchange alone (the face gather–scatter incl. the
neighbour messages, all components in one call) is timed as a loop of 20, so
its share of a step (5 stages × one exchange) is reported. Transports:

* ``mpi``: run under ``mpirun -n P`` (mpi4jax sendrecv/allreduce; host-staged
  when the MPI is not CUDA-aware);
* ``shard``: one process, ``--devices P`` (shard_map + ppermute, NCCL on GPUs).

For the shard transport the script also reads the compiled program's schedule: for each
``collective-permute-start``/``-done`` pair it counts the compute instructions
(fusions, custom calls, ...) the compiler placed between them — work that can
run while the message travels. That is the evidence the overlap happens, not
just the hope; the timings say whether it pays.

Work models (flops per step, n = E(N+1)³ points, 5 LSERK4 stages):

* Maxwell: NekCEM's [180(N+1) + 420]·n (Otten et al. 2016, eq. 16);
* advection (split form): 5·[(12(N+1) + 17)·n + 12·6E(N+1)²] — per stage two
  sets of three 1-D derivatives (2(N+1) flops per point each), 17 pointwise
  flops (products with A, sums, 1/J, the 2N-storage update) and 12 per face
  point (flux, lift).

    mpirun -n 2 python -m experiments.dg_scaling --model maxwell --transport mpi --sizes 4x4x4 --out m.json
    python -m experiments.dg_scaling --model advection --transport shard --devices 2
    python -m experiments.dg_scaling --model maxwell --devices 1,2,4 --order 7 --sizes 32x32x32 --backend einsum
    python -m experiments.dg_scaling --plot a.json b.json ...     # PNG beside the first file
Default (CPU, seconds): --order 3 --sizes 4x4x4 --steps 5.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import jax
import jax.numpy as jnp

from experiments.common import Results, median_seconds, parse_sizes


def flops_per_step(model, order, E):
    n1 = order + 1
    if model == "maxwell":
        return (180.0 * n1 + 420.0) * E * n1**3
    return 5.0 * ((12 * n1 + 17) * E * n1**3 + 12 * 6 * E * n1**2)


def schedule_evidence(hlo_text: str) -> dict:
    """Compute instructions the compiler scheduled between each collective-permute start and done.

    Reads the optimized HLO (``compiled.as_text()``): in each computation the
    instruction order is the schedule. Counts, for every start → done pair,
    the instructions in between that do work (fusion, custom-call, dot,
    convolution, all-reduce, ...), not bookkeeping (parameter, constant,
    get-tuple-element, tuple, bitcast, copy).
    """
    pairs = []
    skip = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy", "copy-start", "copy-done")
    for comp in re.split(r"\n(?=\S.*\{\s*$)", hlo_text):
        lines = comp.splitlines()
        open_ = {}
        for i, ln in enumerate(lines):
            m = re.match(r"\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*[^=]*?\s([\w\-]+)\(", ln)
            if not m:
                continue
            name, op = m.group(1), m.group(2)
            if op == "collective-permute-start":
                open_[name] = i
            elif op == "collective-permute-done":
                src = next((s for s in open_ if s in ln[ln.index(op):]), None)
                if src is None:
                    continue
                start = open_.pop(src)
                between = []
                for ln2 in lines[start + 1:i]:
                    m2 = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^=]*?\s([\w\-]+)\(", ln2)
                    if m2 and m2.group(1) not in skip:
                        between.append(m2.group(1))
                pairs.append(dict(start=src, compute_between=len(between),
                                  kinds=sorted(set(between))))
    return dict(pairs=len(pairs), compute_between=[p["compute_between"] for p in pairs],
                overlapping_pairs=sum(p["compute_between"] > 0 for p in pairs),
                kinds=sorted({k for p in pairs for k in p["kinds"]}))


def _setup(a, elements, comm=None, P=1):
    """(mesh, dg, args, y0) for one size; the elements split over P devices when a.transport == 'shard'."""
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.mesh import box_mesh
    from jaxsem.models import advection as ad
    from jaxsem.models import maxwell as mx

    mesh = box_mesh(elements, a.order, lengths=tuple(float(v) for v in elements), periodic=(True,) * 3)
    dtype = jnp.dtype(a.dtype)
    where = dict(devices=P if P > 1 else None) if a.transport == "shard" else dict(comm=comm)
    dg = discretize_dg(mesh, dtype=dtype, backend=a.backend, **where)
    if a.model == "maxwell":
        args = (dg, mx.material(dg))
        y0 = mx.plane_wave(dg.x, 0.0, lengths=mesh.lengths, wavenumber=(1, 1, 1)).astype(dtype) * dg.valid
    else:
        L = mesh.lengths
        vel = (1.0, 0.5, 0.25)
        args = (dg, ad.transport(dg, vel))
        y0 = ad.gaussian(dg.x, 0.0, vel, center=tuple(0.5 * v for v in L), width=0.15 * L[0],
                         lengths=L).astype(dtype) * dg.valid
    return mesh, dg, args, y0


def _rhs(a):
    from jaxsem.models import advection as ad
    from jaxsem.models import maxwell as mx

    if a.model == "maxwell":
        return mx.make_rhs("upwind", "pec", a.form)  # periodic mesh: no boundary faces
    return ad.make_rhs("upwind", "split")


def run(a):
    from jaxsem import timestepping as ts
    from jaxsem.parallel import get_comm
    from jaxsem.discretization.dg import face_exchange, faces

    comm = get_comm() if a.transport == "mpi" else None
    plist = [comm.size] if comm is not None else [int(v) for v in str(a.devices).split(",")]
    rank = comm.rank if comm is not None else 0
    rows = Results(a.out, "dg_scaling", write=rank == 0)
    for elements, P in ((e, P) for e in parse_sizes(a.sizes) for P in plist):
        t0 = time.perf_counter()
        mesh, dg, args, y0 = _setup(a, elements, comm, P)
        jax.block_until_ready((args, y0))
        setup = time.perf_counter() - t0
        E = mesh.num_elements
        n_pts = E * (a.order + 1) ** 3
        comps = 6 if a.model == "maxwell" else 1
        dt = 1e-4
        reps = 20

        def wrap(fn):  # the whole loop per device (a plain call on one)
            return jax.jit(lambda d, *rest: d.local_map(fn, *rest))

        xloop = wrap(lambda d, y: jax.lax.fori_loop(
            0, reps, lambda i, v: face_exchange(d, v) * 0.5, faces(y.reshape((comps,) + y.shape[-4:]))))
        t_x = median_seconds(xloop, (dg, y0), a.repeats) / reps
        f = _rhs(a)
        steps = a.steps

        def loop(d, extra, y):
            g = lambda t, v: f(t, v, (d, extra))
            return jax.lax.fori_loop(0, steps, lambda i, v: ts.rk_step(g, i * dt, v, dt, "lserk4",
                                                                      loop_stages=True), y)

        stepper = wrap(loop)
        t_run = median_seconds(stepper, (dg, args[1], y0), a.repeats)
        y = stepper(dg, args[1], y0)
        finite = bool(jnp.all(jnp.isfinite(y)))
        evidence = None
        if dg.comm.name == "shard" and P > 1:
            evidence = schedule_evidence(stepper.lower(dg, args[1], y0).compile().as_text())
        sps = t_run / steps
        flops = flops_per_step(a.model, a.order, E)
        row = dict(model=a.model, transport=dg.comm.name, backend=dg.backend.name,
                   ranks=P, elements=list(elements),
                   num_elements=E, order=a.order, points=n_pts, points_per_rank=n_pts / P,
                   dofs=E * a.order**3 * comps, steps=steps, seconds_per_step=sps,
                   exchange_seconds=t_x, exchange_share=5 * t_x / sps, gflops=flops / sps / 1e9,
                   flops_per_step=flops, setup_seconds=setup, finite=finite, schedule_evidence=evidence,
                   xla_flags=os.environ.get("XLA_FLAGS", ""))
        rows.append(row)
        if rank == 0:
            ev = "" if evidence is None else (f" permutes {evidence['pairs']}, with compute between "
                                              f"{evidence['overlapping_pairs']}")
            print(f"{a.model} {dg.comm.name} {dg.backend.name} P={P} E={elements} n={n_pts:.3e} step "
                  f"{sps * 1e3:8.3f} ms exch {t_x * 1e3:7.3f} ms ({100 * row['exchange_share']:4.1f}%) "
                  f"{row['gflops']:7.1f} GF setup {setup:.0f}s{ev}", file=sys.stderr, flush=True)
        del dg, args, y0
    return rank, rows


def plot(paths):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for p in paths:
        with open(p) as fh:
            rows += json.load(fh)["rows"]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model]
        tp = lambda r: r.get("transport", r.get("backend"))  # rows before the transport field: "backend"
        sched = lambda r: r.get("schedule", "")  # rows from before the exchange overlapped by itself
        for key in sorted({(tp(r), r["ranks"], sched(r)) for r in rs}):
            sel = sorted((r for r in rs if (tp(r), r["ranks"], sched(r)) == key), key=lambda r: r["points"])
            ax.plot([r["points_per_rank"] for r in sel], [r["gflops"] / r["ranks"] for r in sel], "o-",
                    label=f"{key[0]} P={key[1]} {key[2]}")
        ax.set_xscale("log")
        ax.set_xlabel("points per rank n/P")
        ax.set_ylabel("GFLOPS per rank (model)")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.splitext(paths[0])[0] + ".png"
    fig.savefig(out, dpi=110)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["maxwell", "advection"], default="maxwell")
    ap.add_argument("--transport", choices=["mpi", "shard"], default="shard",
                    help="mpi: one process per device under mpirun; shard: --devices of this process")
    ap.add_argument("--devices", default="1", help="shard transport: device counts, e.g. 1,2,4")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--sizes", default="4x4x4", help="global element counts, e.g. 10x10x8,20x10x8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--form", default="chain", choices=["chain", "split"], help="maxwell: curl form")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--backend", default="auto", choices=["auto", "einsum", "cuda"],
                    help="discretize_dg's backend: the fused kernels (cuda; auto: where they run) or einsum")
    ap.add_argument("--out", default="dg_scaling.json", help="JSON output, rewritten after each size")
    ap.add_argument("--plot", nargs="+", default=None)
    a = ap.parse_args(argv)
    if a.plot:
        print(plot(a.plot))
        return
    if a.steps < 1 or a.repeats < 1 or a.order < 1:
        ap.error("argument --steps/--repeats/--order: must be >= 1")
    if a.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    run(a)   # rows are written to --out as they come


if __name__ == "__main__":
    main()
