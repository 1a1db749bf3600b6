"""How many collectives one Navier–Stokes pressure solve's program holds when sharded: per
computation of the compiled HLO (the CG loop's body, the coarsest level's loops), the counts of
collective-permutes (neighbour messages, one per exchange round) and all-reduces.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m experiments.ns_collectives \\
        --elements 4 --devices 4 --out ns_collectives_cpu.json

Taylor–Green, p = 7, NekRS's tolerances (pressure 1e-6, float32 V-cycle), compiled under GSPMD as
on GPUs (the count is the program's, not the platform's: CPU devices give it without a GPU).
"""

from __future__ import annotations

import argparse
import collections
import re

import jax
import numpy as np

import jaxsem as js
from experiments.common import record, write_json
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.parallel import comm as C
from jaxsem.solvers import multigrid

jax.config.update("jax_enable_x64", True)
KINDS = ("collective-permute", "all-reduce", "all-gather", "all-to-all")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--out", default="ns_collectives.json")
    a = ap.parse_args(argv)
    mesh = js.box_mesh(a.elements, 7, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    opts = NS.NSOptions(pressure_tol=1e-6, velocity_tol=1e-8, pmg=multigrid.PMGOptions(dtype="float32"))
    ns = NS.setup(mesh, nu=1 / 1600, dt=3e-3, options=opts, devices=a.devices)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    jax.config.update("jax_use_shardy_partitioner", False)  # as gspmd_on_gpus does on GPUs
    ps = jax.jit(lambda ns, b, p0: ns.sem.local_map(
        lambda s_, ns_, b_, p_: NS.scheme._pressure_solve(ns_, b_, p_, 0.0), ns, b, p0))
    txt = ps.lower(ns, st.p, st.p).compile().as_text()
    rows = []
    for comp in re.split(r"\n(?=\S.*\{\n)", txt):
        pattern = r"\b(" + "|".join(KINDS) + r")(?:-start)?\("
        count = collections.Counter(re.findall(pattern, comp))
        if count:
            rows.append(dict(computation=comp.split("\n", 1)[0].split(" ")[0], **count))
    out = dict(record("ns_collectives"), elements=a.elements, devices=a.devices, order=7,
               pmg_orders=list(ns.pressure.pmg.orders), computations=rows)
    write_json(a.out, out)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
