"""Summaries and plots of multi-GPU scaling batches, from folders of raw runs (one folder per machine).

Each folder holds the JSON files of ``experiments.scaling`` (``bp5_*.json``), ``experiments.dg_scaling``
(``mx_*.json``, ``adv_*.json``) and ``experiments.exchange_bench`` (``exchange_mpi_*.json``) run on one
host; the device comes from the files. The committed raw runs (``experiments/results/x4/``: P = 1, 2, 4;
``x8/``: P = 1, 8, and P = 4 again as a cross-machine check) give docs/multi-gpu.md's tables:

    python -m experiments.scaling_summary --out-dir experiments/results     # prints the tables

* ``scaling_TAG.json`` / ``.png``: BP5 p = 7, shard (NCCL) and MPI (mpi4jax, host-staged),
  time per PCG iteration, strong η = t₁/(P·t_P) at equal global size, weak
  η = t₁/t_P at equal DOFs per GPU, gather–scatter share, the t = t₀ + n/R∞ fit and n₀.₈;
* ``maxwell_scaling_TAG.json`` / ``.png``: SEDG Maxwell N = 7, the same quantities per step
  and the exchange share of a step;
* ``advection_overlap_TAG.json`` / ``.png``: the paper's comparison (one GPU; two GPUs
  host-staged (MPI); device-resident (shard) bulk-synchronous; overlapped), GFLOPS per step;
* ``exchange_mallopt_TAG.json``: mpi4jax exchange time per message size with and without the
  host-staging allocator tuning.
TAG is the device's model (``h200`` for "NVIDIA H200") unless ``--tag`` names it. P = 1 rows come
from the shard backend run on one device (no communication in either backend). Efficiencies use the
P = 1 time measured in the same folder; the plots show each (backend, P) once, from the first folder
that has it. The default reads the committed raw runs and writes to the current folder (seconds, CPU).
"""

import argparse
import glob
import json
import os

from experiments.common import command

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = [os.path.join(HERE, "results", "x4"), os.path.join(HERE, "results", "x8")]
FOLDERS: list = []   # the raw-run folders of this run (--raw)
OUT = "."            # where the summaries go (--out-dir)
TAG = ""             # file-name tag (--tag or the device's model)


def load(pattern):
    rows, cmds, meta = [], [], {}
    for folder in FOLDERS:
        machine = os.path.basename(os.path.normpath(folder))
        for p in sorted(glob.glob(os.path.join(folder, pattern))):
            with open(p) as fh:
                d = json.load(fh)
            tag = f"{machine}/{os.path.basename(p)}"
            for r in d.get("rows", []):
                r["source"], r["machine"] = tag, machine
                rows.append(r)
            cmds.append(dict(file=tag, device=d.get("device"), command=d.get("command"), note=d.get("note")))
            meta = dict(device=d.get("device"), jax_version=d.get("jax_version"), jaxsem_version=d.get("jaxsem_version"))
    return rows, cmds, meta


def first_seen(rows, size_key):
    """One row per (backend, ranks, size, schedule): the first folder's where both ran it (for plots and fits)."""
    seen, out = set(), []
    for r in rows:
        k = (r["backend"], r["ranks"], r[size_key], r.get("schedule"))
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def efficiencies(rows, size_key, per_rank_key, time_key):
    """Strong and weak η tables (:func:`scaling.efficiencies`), each P > 1 row against P = 1 on its machine."""
    from experiments import scaling

    strong, weak = scaling.efficiencies(rows, size_key, per_rank_key, time_key,
                                        same=lambda r, b: b["machine"] == r["machine"])
    strong = [dict(backend=r["backend"], ranks=r["ranks"], machine=r["machine"], size=r[size_key],
                   elements=r["elements"], t1=b[time_key], tP=r[time_key], efficiency=e) for r, b, e in strong]
    weak = [dict(backend=r["backend"], ranks=r["ranks"], machine=r["machine"], per_rank=r[per_rank_key],
                 elements=r["elements"], base_elements=b["elements"], t1=b[time_key], tP=r[time_key], efficiency=e)
            for r, b, e in weak]
    return strong, weak


def bp5():
    from experiments import scaling

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
    tmp = os.path.join(OUT, f"scaling_{TAG}_rows.json")
    with open(tmp, "w") as fh:
        json.dump(dict(rows=rows), fh)
    scaling.plot([tmp])
    os.replace(os.path.join(OUT, f"scaling_{TAG}_rows.png"), os.path.join(OUT, f"scaling_{TAG}.png"))
    os.remove(tmp)
    res = dict(experiment=f"BP5 p=7 scaling on 1-{max(r['ranks'] for r in rows)} GPUs (one host)", **meta,
               summary=command(), commands=cmds, strong=strong, weak=weak, fits=fits, rows=rows)
    with open(os.path.join(OUT, f"scaling_{TAG}.json"), "w") as fh:
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
    from experiments import dg_scaling

    rows, cmds, meta = load("mx_*.json")
    strong, weak = efficiencies(rows, "points", "points_per_rank", "seconds_per_step")
    rows = first_seen(rows, "points")
    res = dict(experiment=f"Maxwell SEDG N=7 scaling on 1-{max(r['ranks'] for r in rows)} GPUs (one host)", **meta,
               summary=command(), commands=cmds, strong=strong, weak=weak, rows=rows)
    with open(os.path.join(OUT, f"maxwell_scaling_{TAG}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    tmp = os.path.join(OUT, f"maxwell_scaling_{TAG}.json.rows")
    with open(tmp, "w") as fh:
        json.dump(dict(rows=rows), fh)
    png = dg_scaling.plot([tmp])
    os.remove(tmp)
    os.replace(png, os.path.join(OUT, f"maxwell_scaling_{TAG}.png"))
    print_eta("Maxwell", strong, weak)
    print("exchange shares:", [(r["machine"], r["backend"], r["ranks"], r["elements"], round(r["exchange_share"], 3))
                               for r in rows])


def advection():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cmds, meta = load("adv_*.json")
    def pick(variant="", **k):
        """Rows with the fields ``k`` from files of the plain runs (``variant=""``: neither ``_lhs``
        nor ``_mallopt`` in the name) or of the ``variant`` runs (e.g. ``"lhs"``), first file first."""
        tags = lambda r: {t for t in ("lhs", "mallopt") if f"_{t}" in r["source"]}
        hits = [r for r in rows if all(r.get(a) == b for a, b in k.items())
                and tags(r) == ({variant} if variant else set())]
        return [r for r in hits if r["source"] == hits[0]["source"]] if hits else []

    cases = [
        ("1 GPU", pick(backend="shard", ranks=1, schedule="bulk")),
        ("2 GPUs, host-staged (MPI), bulk", pick(backend="mpi", ranks=2, schedule="bulk")),
        ("2 GPUs, host-staged (MPI), overlap", pick(backend="mpi", ranks=2, schedule="overlap")),
        ("2 GPUs, device-resident (NCCL), bulk", pick(backend="shard", ranks=2, schedule="bulk")),
        ("2 GPUs, device-resident (NCCL), overlap", pick(backend="shard", ranks=2, schedule="overlap")),
        ("2 GPUs, NCCL, overlap, latency-hiding scheduler", pick("lhs", backend="shard", ranks=2, schedule="overlap")),
        ("8 GPUs, device-resident (NCCL), bulk", pick(backend="shard", ranks=8, schedule="bulk")),
        ("8 GPUs, device-resident (NCCL), overlap", pick(backend="shard", ranks=8, schedule="overlap")),
    ]
    table = [dict(case=c, seconds_per_step=r[0]["seconds_per_step"], gflops=r[0]["gflops"],
                  exchange_share=r[0]["exchange_share"], schedule_evidence=r[0]["schedule_evidence"],
                  source=r[0]["source"]) for c, r in cases if r]
    res = dict(experiment="advection overlap comparison (White & Dongarra setup), N=7, 40^3 elements = 320^3 points",
               **meta, summary=command(), commands=cmds, paper_gflops=dict(one_gpu=86, host_staged=24, streams=35, full_overlap=82),
               table=table, rows=rows)
    with open(os.path.join(OUT, f"advection_overlap_{TAG}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([t["case"] for t in table][::-1], [t["gflops"] for t in table][::-1], color="tab:blue")
    for i, t in enumerate(table[::-1]):
        ax.text(t["gflops"], i, f" {t['gflops']:.0f} GF ({t['seconds_per_step'] * 1e3:.1f} ms/step)", va="center", fontsize=8)
    ax.set_xlabel(f"GFLOPS (work model, FP64), {meta.get('device')}")
    ax.set_xlim(0, 1.6 * max(t["gflops"] for t in table))
    ax.set_title("Advection DG N=7, 320³ points, LSERK4: one step")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, f"advection_overlap_{TAG}.png"), dpi=110)
    for t in table:
        print(f"  {t['case']:50s} {t['seconds_per_step'] * 1e3:7.2f} ms {t['gflops']:7.1f} GF "
              f"exch {100 * t['exchange_share']:4.1f}% {t['schedule_evidence']}")


def exchange():
    out = {}
    for p in sorted(q for folder in FOLDERS for q in glob.glob(os.path.join(folder, "exchange_mpi_*.json"))):
        with open(p) as fh:
            d = json.load(fh)
        out[os.path.basename(p)] = d
    if not out:
        return
    with open(os.path.join(OUT, f"exchange_mallopt_{TAG}.json"), "w") as fh:
        json.dump(dict(experiment="mpi4jax sendrecv of GPU arrays, 2 ranks, one host (Open MPI not CUDA-aware)",
                       summary=command(),
                       note="variants split8M / mallopt_split8M (JAXSEM_MAX_MESSAGE_BYTES) aborted in XLA: "
                            "'Check failed: shape.IsArray() || shape.IsTuple()' (log_dg.txt); splitting removed",
                       runs=out), fh, indent=1)
    for k, d in out.items():
        print(k, [(r.get("bytes"), round(r.get("seconds", 0) * 1e6, 1)) for r in d.get("rows", d.get("results", []))])


def device_tag(folders) -> str:
    """``"h200"`` for raw runs on "NVIDIA H200": the last word of the first file's device, lower case."""
    for p in sorted(q for f in folders for q in glob.glob(os.path.join(f, "*.json"))):
        with open(p) as fh:
            device = json.load(fh).get("device")
        if device:
            return str(device).split()[-1].lower()
    return "gpu"


def main(argv=None):
    global FOLDERS, OUT, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--raw", nargs="+", default=RAW, help="folders of raw runs, one per machine (default: %(default)s)")
    ap.add_argument("--out-dir", default=".", help="where the summaries and plots go")
    ap.add_argument("--tag", default=None, help="file-name tag (default: the device's model, e.g. h200)")
    a = ap.parse_args(argv)
    for folder in a.raw:
        if not os.path.isdir(folder):
            ap.error(f"--raw: {folder!r} is not a folder")
    FOLDERS, OUT = list(a.raw), a.out_dir
    TAG = a.tag or device_tag(FOLDERS)
    os.makedirs(OUT, exist_ok=True)
    bp5()
    maxwell()
    advection()
    exchange()


if __name__ == "__main__":
    main()
