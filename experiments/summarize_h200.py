"""Summaries and plots of the multi-GPU H200 batches (experiments/run_h200.sh), from the raw runs in
experiments/results/x4/ (nvidia-h200-x4: P = 1, 2, 4) and experiments/results/x8/ (nvidia-h200-x8:
P = 1, 8, and P = 4 again as a cross-machine check).

    python experiments/summarize_h200.py      # writes the files below, prints the tables

* ``scaling_h200.json`` / ``.png``: BP5 p = 7, shard (NCCL) and MPI (mpi4jax, host-staged),
  P = 1, 2, 4, 8: time per PCG iteration, strong η = t₁/(P·t_P) at equal global size, weak
  η = t₁/t_P at equal DOFs per GPU, gather–scatter share, the t = t₀ + n/R∞ fit and n₀.₈;
* ``maxwell_scaling_h200.json`` / ``.png``: SEDG Maxwell N = 7, the same quantities per step
  and the exchange share of a step;
* ``advection_overlap_h200.json`` / ``.png``: the paper's comparison (one GPU; two GPUs
  host-staged (MPI); device-resident (shard) bulk-synchronous; overlapped), GFLOPS per step;
* ``exchange_mallopt_h200.json``: mpi4jax exchange time per message size with and without the
  host-staging allocator tuning.
P = 1 rows come from the shard backend run on one device (no communication in either backend).
Efficiencies use the P = 1 time measured on the same machine (the two machines' P = 1 times agree
within 0.5%); the plots show each (backend, P) once, from the machine that ran it first.
"""

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MACHINES = {"x4": "nvidia-h200-x4", "x8": "nvidia-h200-x8"}   # raw-result folder -> device kind
OUT = os.path.join(HERE, "results")
sys.path.insert(0, HERE)


def load(pattern):
    rows, cmds, meta = [], [], {}
    for machine in MACHINES:
        for p in sorted(glob.glob(os.path.join(HERE, "results", machine, pattern))):
            with open(p) as fh:
                d = json.load(fh)
            tag = f"{machine}/{os.path.basename(p)}"
            for r in d.get("rows", []):
                r["source"], r["machine"] = tag, machine
                rows.append(r)
            cmds.append(dict(file=tag, device_kind=MACHINES[machine], command=d.get("command"), note=d.get("note")))
            meta = dict(device=d.get("device"), jax_version=d.get("jax_version"), jaxsem_version=d.get("jaxsem_version"))
    return rows, cmds, meta


def first_seen(rows, size_key):
    """One row per (backend, ranks, size, schedule): the x4 machine's where both ran it (for plots and fits)."""
    seen, out = set(), []
    for r in rows:
        k = (r["backend"], r["ranks"], r[size_key], r.get("schedule"))
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def efficiencies(rows, size_key, per_rank_key, time_key):
    """Strong and weak η tables (:func:`scaling.efficiencies`), each P > 1 row against P = 1 on its machine."""
    import scaling

    strong, weak = scaling.efficiencies(rows, size_key, per_rank_key, time_key,
                                        same=lambda r, b: b["machine"] == r["machine"])
    strong = [dict(backend=r["backend"], ranks=r["ranks"], machine=r["machine"], size=r[size_key],
                   elements=r["elements"], t1=b[time_key], tP=r[time_key], efficiency=e) for r, b, e in strong]
    weak = [dict(backend=r["backend"], ranks=r["ranks"], machine=r["machine"], per_rank=r[per_rank_key],
                 elements=r["elements"], base_elements=b["elements"], t1=b[time_key], tP=r[time_key], efficiency=e)
            for r, b, e in weak]
    return strong, weak


def bp5():
    import scaling

    rows, cmds, meta = load("bp5_*.json")
    rows = [r for r in rows if "mallopt" not in r["source"]]
    strong, weak = efficiencies(rows, "dofs", "dofs_per_rank", "seconds_per_iteration")
    rows = first_seen(rows, "dofs")
    fits = {}
    for b in sorted({r["backend"] for r in rows}):
        for P in sorted({r["ranks"] for r in rows}):
            rs = sorted((r for r in rows if r["ranks"] == P and (r["backend"] == b or P == 1)), key=lambda r: r["dofs"])
            uniq = {r["dofs"]: r for r in rs}
            fits[f"{b}_P{P}"] = scaling.fit_n08(list(uniq.values()))
    tmp = os.path.join(OUT, "scaling_h200_rows.json")
    with open(tmp, "w") as fh:
        json.dump(dict(rows=rows), fh)
    scaling.plot([tmp])
    os.replace(os.path.join(OUT, "scaling_h200_rows.png"), os.path.join(OUT, "scaling_h200.png"))
    os.remove(tmp)
    res = dict(experiment="BP5 p=7 scaling on 1-8 H200s (one host)", **meta, commands=cmds,
               batch="PART=bp5 bash experiments/run_h200.sh (nvidia-h200-x4); PART=bp5_8 (nvidia-h200-x8), "
                     "SRC=$PWD/.snap (a git archive of the committed tree)",
               strong=strong, weak=weak, fits=fits, rows=rows)
    with open(os.path.join(OUT, "scaling_h200.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print_eta("BP5", strong, weak)
    print("fits:", json.dumps(fits))
    gs = [(r["backend"], r["ranks"], r["elements"], round(r["gs_share"], 3)) for r in rows]
    print("gs shares:", gs)


def print_eta(title, strong, weak):
    print(f"{title} strong:")
    for e in strong:
        print(f"  {e['machine']} {e['backend']:5s} P={e['ranks']} n={e['size']:.3e} eta={e['efficiency']:.3f}")
    print(f"{title} weak:")
    for e in weak:
        print(f"  {e['machine']} {e['backend']:5s} P={e['ranks']} n/P={e['per_rank']:.3e} eta={e['efficiency']:.3f}")


def maxwell():
    import dg_scaling

    rows, cmds, meta = load("mx_*.json")
    strong, weak = efficiencies(rows, "points", "points_per_rank", "seconds_per_step")
    rows = first_seen(rows, "points")
    res = dict(experiment="Maxwell SEDG N=7 scaling on 1-8 H200s (one host)", **meta, commands=cmds,
               batch="PART=dg bash experiments/run_h200.sh (nvidia-h200-x4; MPI P=2 with JAXSEM_MALLOPT=1 in a "
                     "follow-up call); PART=dg_8 (nvidia-h200-x8)", strong=strong, weak=weak, rows=rows)
    with open(os.path.join(OUT, "maxwell_scaling_h200.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    tmp = os.path.join(OUT, "maxwell_scaling_h200.json.rows")
    with open(tmp, "w") as fh:
        json.dump(dict(rows=rows), fh)
    png = dg_scaling.plot([tmp])
    os.remove(tmp)
    os.replace(png, os.path.join(OUT, "maxwell_scaling_h200.png"))
    print_eta("Maxwell", strong, weak)
    print("exchange shares:", [(r["machine"], r["backend"], r["ranks"], r["elements"], round(r["exchange_share"], 3))
                               for r in rows])


def advection():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cmds, meta = load("adv_*.json")
    pick = lambda **k: [r for r in rows if all(r.get(a) == b for a, b in k.items())]
    cases = [
        ("1 GPU", pick(backend="shard", ranks=1, schedule="bulk", source="x4/adv_shard.json")),
        ("2 GPUs, host-staged (MPI), bulk", pick(backend="mpi", ranks=2, schedule="bulk", source="x4/adv_mpi_P2.json")),
        ("2 GPUs, host-staged (MPI), overlap", pick(backend="mpi", ranks=2, schedule="overlap", source="x4/adv_mpi_P2.json")),
        ("2 GPUs, device-resident (NCCL), bulk", pick(backend="shard", ranks=2, schedule="bulk", source="x4/adv_shard.json")),
        ("2 GPUs, device-resident (NCCL), overlap", pick(backend="shard", ranks=2, schedule="overlap",
                                                          source="x4/adv_shard.json")),
        ("2 GPUs, NCCL, overlap, latency-hiding scheduler", pick(backend="shard", ranks=2, schedule="overlap",
                                                                  source="x4/adv_shard_lhs.json")),
        ("8 GPUs, device-resident (NCCL), bulk", pick(backend="shard", ranks=8, schedule="bulk",
                                                       source="x8/adv_shard_P18.json")),
        ("8 GPUs, device-resident (NCCL), overlap", pick(backend="shard", ranks=8, schedule="overlap",
                                                          source="x8/adv_shard_P18.json")),
    ]
    table = [dict(case=c, seconds_per_step=r[0]["seconds_per_step"], gflops=r[0]["gflops"],
                  exchange_share=r[0]["exchange_share"], schedule_evidence=r[0]["schedule_evidence"],
                  source=r[0]["source"]) for c, r in cases if r]
    res = dict(experiment="advection overlap comparison (White & Dongarra setup), N=7, 40^3 elements = 320^3 points",
               **meta, commands=cmds, paper_gflops=dict(one_gpu=86, host_staged=24, streams=35, full_overlap=82),
               table=table, rows=rows)
    with open(os.path.join(OUT, "advection_overlap_h200.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([t["case"] for t in table][::-1], [t["gflops"] for t in table][::-1], color="tab:blue")
    for i, t in enumerate(table[::-1]):
        ax.text(t["gflops"], i, f" {t['gflops']:.0f} GF ({t['seconds_per_step'] * 1e3:.1f} ms/step)", va="center", fontsize=8)
    ax.set_xlabel("GFLOPS (work model, FP64), H200")
    ax.set_xlim(0, 1.6 * max(t["gflops"] for t in table))
    ax.set_title("Advection DG N=7, 320³ points, LSERK4: one step")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "advection_overlap_h200.png"), dpi=110)
    for t in table:
        print(f"  {t['case']:50s} {t['seconds_per_step'] * 1e3:7.2f} ms {t['gflops']:7.1f} GF "
              f"exch {100 * t['exchange_share']:4.1f}% {t['schedule_evidence']}")


def exchange():
    out = {}
    for p in sorted(glob.glob(os.path.join(HERE, "results", "x4", "exchange_mpi_*.json"))):
        with open(p) as fh:
            d = json.load(fh)
        out[os.path.basename(p)] = d
    with open(os.path.join(OUT, "exchange_mallopt_h200.json"), "w") as fh:
        json.dump(dict(experiment="mpi4jax sendrecv of GPU arrays, 2 ranks, 4x H200 host (Open MPI not CUDA-aware)",
                       note="variants split8M / mallopt_split8M (JAXSEM_MAX_MESSAGE_BYTES) aborted in XLA: "
                            "'Check failed: shape.IsArray() || shape.IsTuple()' (log_dg.txt); splitting removed",
                       runs=out), fh, indent=1)
    for k, d in out.items():
        print(k, [(r.get("bytes"), round(r.get("seconds", 0) * 1e6, 1)) for r in d.get("rows", d.get("results", []))])


if __name__ == "__main__":
    bp5()
    maxwell()
    advection()
    exchange()
