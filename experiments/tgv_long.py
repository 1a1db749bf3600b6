"""A long Taylor–Green run (Re = 1600) in segments, writing the series after each one.

``NS.run`` is called once per ``--segment`` time units, continuing from the returned state
(its BDF/EXT history included), and the CSV/JSON are rewritten after every segment, so a
run stopped by a time limit keeps what it computed; ``--wall-limit`` stops it between segments
with the state saved, and ``--resume`` goes on from there (the same bits as one run). The same
arithmetic as one ``jaxsem solve tgv`` run.

    python -m experiments.tgv_long --order 3 --elements 4 --t-final 0.4 --dt 0.02 --segment 0.2   # CPU
    python -m experiments.tgv_long --order 7 --elements 32 --t-final 10 --dt 2e-3 --out tgv32    # one GPU
    python -m experiments.tgv_long --order 7 --elements 32 --t-final 20 --dt 2e-3 --devices 2 --out tgv32x2 \
        --wall-limit 560                                   # then the same with --resume, to go on
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS

from experiments.common import record
from jaxsem.io import load_checkpoint, save_checkpoint, tree_fields, tree_from_fields


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, default=4)
    ap.add_argument("--t-final", type=float, default=0.4)
    ap.add_argument("--dt", type=float, default=0.02)
    ap.add_argument("--segment", type=float, default=0.2)
    ap.add_argument("--sample", type=float, default=0.1)
    ap.add_argument("--devices", type=int, default=1, help="split the elements over this many devices (shard)")
    ap.add_argument("--out", default="tgv_long")
    ap.add_argument("--wall-limit", type=float, default=None,
                    help="seconds: stop after the segment past which the next one would not fit, writing the "
                         "state to OUT/state.npz; run again with --resume to go on from it")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/state.npz and OUT/tgv.json")
    a = ap.parse_args(argv)
    start = time.perf_counter()
    os.makedirs(a.out, exist_ok=True)
    K = a.elements
    mesh = js.box_mesh(K, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    tic = time.perf_counter()
    ns = NS.setup(mesh, nu=1 / 1600, dt=a.dt, devices=a.devices if a.devices > 1 else None)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    rec = dict(record("tgv_long"), order=a.order, elements=K, dt=a.dt, reynolds=1600,
               devices=a.devices,
               setup_seconds=time.perf_counter() - tic, segments=[], series={})
    names = NS.Series._fields
    rows = None
    first = 0
    state_path, json_path = os.path.join(a.out, "state.npz"), os.path.join(a.out, "tgv.json")
    if a.resume:  # the state where the last run stopped, placed like the fresh one, and its series
        ck = load_checkpoint(state_path, tree_fields("state", st))
        saved, t_saved = tree_from_fields("state", st, ck.fields), ck.t
        st = jax.tree.map(lambda v, like: jax.device_put(v, like.sharding), saved, st)
        old = json.load(open(json_path))
        rec.update(segments=old["segments"], resumed=old.get("resumed", []) + [t_saved])
        rows = np.array([[np.nan if v is None else v for v in old["series"][k]] for k in names]).T
        first = round(t_saved / a.segment)
    n_seg = round(a.t_final / a.segment)
    for i in range(first, n_seg):
        t1 = round((i + 1) * a.segment, 12)
        st, s, info = NS.run(ns, st, t1, sample_interval=a.sample)
        part = np.stack(s, 1)
        rows = part if rows is None else np.concatenate([rows, part[1:]])
        rec["segments"].append(dict(t=t1, steps=info.steps, seconds=info.seconds))
        rec["series"] = {k: [None if not np.isfinite(v) else float(v) for v in rows[:, j]] for j, k in enumerate(names)}
        json.dump(rec, open(json_path, "w"), indent=1)
        print(f"t = {t1:g}: {info.steps} steps, {info.seconds:.1f} s, E_k {rows[-1, 1]:.6f}, "
              f"eps {rows[-1, 2]:.6f}, p its {rows[-1, 6]:.0f}", flush=True)
        if a.wall_limit and i + 1 < n_seg and time.perf_counter() - start + 1.3 * info.seconds > a.wall_limit:
            save_checkpoint(state_path, tree_fields("state", st), t1, int(st.step))
            print(f"stopped at t = {t1:g} for the wall limit; the state is in {state_path}", flush=True)
            return


if __name__ == "__main__":
    main()
