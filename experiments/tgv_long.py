"""A long Taylor–Green run (Re = 1600) in segments, writing the series after each one.

``NS.run`` is called once per ``--segment`` time units, continuing from the returned state
(its BDF/EXT history included), and the CSV/JSON are rewritten after every segment, so a
run stopped by a time limit keeps what it computed. The same arithmetic as one
``jaxsem solve tgv`` run.

    python experiments/tgv_long.py --order 3 --elements 4 --t-final 0.4 --dt 0.02 --segment 0.2   # CPU
    python experiments/tgv_long.py --order 7 --elements 32 --t-final 10 --dt 2e-3 --out tgv32    # one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, default=4)
    ap.add_argument("--t-final", type=float, default=0.4)
    ap.add_argument("--dt", type=float, default=0.02)
    ap.add_argument("--segment", type=float, default=0.2)
    ap.add_argument("--sample", type=float, default=0.1)
    ap.add_argument("--out", default="tgv_long")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    K = a.elements
    mesh = js.box_mesh(K, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    tic = time.perf_counter()
    ns = NS.setup(mesh, nu=1 / 1600, dt=a.dt)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    rec = dict(experiment="tgv_long", device=jax.devices()[0].device_kind, jax_version=jax.__version__,
               command="python " + " ".join(sys.argv), order=a.order, elements=K, dt=a.dt, reynolds=1600,
               setup_seconds=time.perf_counter() - tic, segments=[], series={})
    names = NS.Series._fields
    rows = None
    n_seg = round(a.t_final / a.segment)
    for i in range(n_seg):
        t1 = round((i + 1) * a.segment, 12)
        st, s, info = NS.run(ns, st, t1, sample_interval=a.sample)
        part = np.stack(s, 1)
        rows = part if rows is None else np.concatenate([rows, part[1:]])
        rec["segments"].append(dict(t=t1, steps=info.steps, seconds=info.seconds))
        rec["series"] = {k: [None if not np.isfinite(v) else float(v) for v in rows[:, j]] for j, k in enumerate(names)}
        json.dump(rec, open(os.path.join(a.out, "tgv.json"), "w"), indent=1)
        print(f"t = {t1:g}: {info.steps} steps, {info.seconds:.1f} s, E_k {rows[-1, 1]:.6f}, "
              f"eps {rows[-1, 2]:.6f}, p its {rows[-1, 6]:.0f}", flush=True)


if __name__ == "__main__":
    main()
