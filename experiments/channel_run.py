"""The turbulent channel at Re_τ = 180 (``jaxsem solve channel``) run within a wall-clock budget.

Two segments of :func:`jaxsem.app.channel.run_channel` joined by its checkpoint, as the CLI's
``--checkpoint``/``--resume`` join them:

1. from the disturbed laminar start to ``--average-from`` (transition, nothing averaged); its wall
   time per unit of flow time sizes
2. the averaging segment, resumed from the checkpoint, to the largest multiple of ``--sample`` that
   fits the rest of ``--budget`` (at most ``--t-max``).

The record of each segment (the second holds the averages: Re_τ, U⁺, the stresses and their
comparison with the DNS of Moser, Kim & Mansour) goes to ``--out`` with the plan::

    python -m experiments.channel_run --order 7 --elements 8 8 8 --average-from 60 --budget 520 \\
        --out channel_gpu.json --files chan/          # one GPU, one ten-minute call
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

from jaxsem.app.channel import run_channel

from experiments.common import record, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--elements", type=int, nargs=3, default=[8, 8, 8])
    ap.add_argument("--average-from", type=float, default=60.0, help="flow time at which averaging starts")
    ap.add_argument("--sample", type=float, default=0.5)
    ap.add_argument("--budget", type=float, default=520.0, help="wall seconds for both segments together")
    ap.add_argument("--t-max", type=float, default=400.0, help="the averaging segment ends at most here")
    ap.add_argument("--margin", type=float, default=45.0, help="seconds kept for the second set-up and compile")
    ap.add_argument("--checkpoint", default=None, help="checkpoint path (default: a temporary file)")
    ap.add_argument("--files", default=None, help="folder for channel.csv and channel.png")
    ap.add_argument("--out", default="channel_run.json")
    a = ap.parse_args(argv)
    if a.average_from <= 0 or a.budget <= 0 or a.sample <= 0:
        ap.error("--average-from, --budget and --sample must be > 0")
    tic = time.perf_counter()
    ck = a.checkpoint or os.path.join(tempfile.mkdtemp(), "channel.npz")
    res = dict(record("channel_run"), budget_seconds=a.budget)
    common = dict(average_from=a.average_from, sample=a.sample, checkpoint=ck, progress=print)
    first = run_channel(a.order, a.elements, t_final=a.average_from, **common)
    first.pop("series", None)
    res["transition"] = dict(first, wall_seconds=time.perf_counter() - tic)
    write_json(a.out, res)
    if first.get("status") != "t_final":
        print("the transition segment stopped:", first.get("status"))
        return res
    per_time = first["seconds"] / a.average_from  # wall seconds per unit of flow time, compile included
    left = a.budget - (time.perf_counter() - tic) - a.margin
    t_final = min(a.t_max, a.average_from + a.sample * math.floor(max(left, 0.0) / per_time / a.sample))
    res["plan"] = dict(seconds_per_flow_time=per_time, seconds_left=left, t_final=t_final)
    write_json(a.out, res)
    print("plan", res["plan"], flush=True)
    if t_final <= a.average_from:
        return res
    tic2 = time.perf_counter()
    res["averaging"] = dict(run_channel(a.order, a.elements, t_final=t_final, resume=ck, out=a.files, **common),
                            wall_seconds=time.perf_counter() - tic2)
    res["wall_seconds"] = time.perf_counter() - tic
    write_json(a.out, res)
    print({k: res["averaging"].get(k) for k in ("status", "t", "steps", "seconds_per_step", "re_tau", "comparison")})
    return res


if __name__ == "__main__":
    main()
