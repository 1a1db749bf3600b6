"""A sharded gather–scatter's time per call by how each device sums its own copies: XLA's
scatter (``"segment"``, the einsum backend's plan) or the CUDA gather kernel (``"csr"`` rows,
the CUDA backend's plan), the exchange included; checked against each other first.

    python -m experiments.gs_sharded --elements 24 --order 7 --devices 4 --out gs_sharded.json

A box of ``--elements``³ elements (periodic), a 3-component field, a jitted loop of ``--reps``
gather–scatters (each scaled by 1/8 so values stay bounded), best of 3; ms per gather–scatter.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import jaxsem as js
from experiments.common import Results, best_seconds
from jaxsem.parallel.comm import gspmd_on_gpus

jax.config.update("jax_enable_x64", True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=8)
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--devices", type=int, default=len(jax.devices()))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--backends", default="einsum,cuda", help="comma-separated: einsum (segment), cuda (csr)")
    ap.add_argument("--out", default="gs_sharded.json")
    a = ap.parse_args(argv)
    K, p, reps = a.elements, a.order, a.reps
    mesh = js.box_mesh(K, p, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    rows = Results(a.out, "gs_sharded")
    ref = None
    for backend in a.backends.split(","):
        t = time.perf_counter()
        sem = js.discretize(mesh, devices=a.devices, backend=backend)
        setup = time.perf_counter() - t
        u = js.from_mesh_order(sem, np.sin(np.asarray(mesh.x)))
        loop = jax.jit(lambda s, v: s.local_map(
            lambda s_, v_: jax.lax.fori_loop(0, reps, lambda i, w: s_.dssum(w) * 0.125, v_), v))
        with gspmd_on_gpus(sem.comm):  # as NS.run's programs over several GPUs
            out = np.asarray(js.to_mesh_order(sem, loop(sem, u)))
            ms = 1e3 * best_seconds(loop, sem, u, repeats=3) / reps
        ref = out if ref is None else ref
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        rows.append(dict(backend=backend, layout=sem.gs.layout, elements=K, order=p, devices=a.devices,
                         points=K**3 * p**3, setup_seconds=setup, ms_per_gs=ms, rel_diff_to_segment=err))
        print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
