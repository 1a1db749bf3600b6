"""Time one neighbour exchange between two ranks: mpi4jax sendrecv vs shard_map ppermute.

Diagnoses the distributed gather–scatter's transport (distributed issue, item 6).
Each sample is a jitted ``fori_loop`` of ``--reps`` exchanges of a float64
buffer of the given size (so launch overheads amortize); median over repeats.

    mpirun -n 2 python -m experiments.exchange_bench --backend mpi --out mpi.json
    python -m experiments.exchange_bench --backend shard --out shard.json   # one process, 2 devices
Extra ``--tag`` text is stored with the results (e.g. the MPI transport settings).
"""

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from experiments.common import record, write_json

jax.config.update("jax_enable_x64", True)


def sizes_from(text):
    return [int(float(s)) for s in text.split(",")]


def bench_mpi(sizes, reps, repeats):
    from jaxsem.parallel.comm import get_comm, sendrecv

    comm = get_comm()
    assert comm.size == 2, f"run under mpirun -n 2 (size {comm.size})"
    other = 1 - comm.rank
    rows = []
    for nbytes in sizes:
        n = max(nbytes // 8, 1)
        x = jnp.full((n,), float(comm.rank + 1))

        @jax.jit
        def loop(x):
            def body(i, y):
                return sendrecv(y, y, source=other, dest=other, comm=comm) * 1.0
            return jax.lax.fori_loop(0, reps, body, x)

        y = loop(x).block_until_ready()
        expect = float(other + 1) if reps % 2 else float(comm.rank + 1)
        ok = bool(jnp.all(y == expect))
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            loop(x).block_until_ready()
            ts.append((time.perf_counter() - t) / reps)
        rows.append(dict(bytes=n * 8, seconds=statistics.median(ts), correct=ok))
    return comm.rank, rows


def bench_shard(sizes, reps, repeats):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devs = jax.devices()[:2]
    mesh = Mesh(devs, ("r",))
    rows = []
    for nbytes in sizes:
        n = max(nbytes // 8, 1)
        x = jax.device_put(jnp.concatenate([jnp.full((n,), 1.0), jnp.full((n,), 2.0)]),
                           NamedSharding(mesh, P("r")))

        def body_fn(y):
            def body(i, z):
                return jax.lax.ppermute(z, "r", [(0, 1), (1, 0)]) * 1.0
            return jax.lax.fori_loop(0, reps, body, y)

        loop = jax.jit(jax.shard_map(body_fn, mesh=mesh, in_specs=P("r"), out_specs=P("r")))
        y = loop(x).block_until_ready()
        ok = bool(jnp.all(y[:n] == (2.0 if reps % 2 else 1.0)))
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            loop(x).block_until_ready()
            ts.append((time.perf_counter() - t) / reps)
        rows.append(dict(bytes=n * 8, seconds=statistics.median(ts), correct=ok))
    return 0, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["mpi", "shard"], default="mpi")
    ap.add_argument("--sizes", default="8e3,64e3,256e3,1e6,4e6,16e6")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="exchange_bench.json", help="JSON output")
    a = ap.parse_args(argv)
    fn = bench_mpi if a.backend == "mpi" else bench_shard
    rank, rows = fn(sizes_from(a.sizes), a.reps, a.repeats)
    if rank == 0:
        res = dict(record("exchange_bench"), backend=a.backend, tag=a.tag,
                   env={k: v for k, v in os.environ.items() if k.startswith(("OMPI_MCA", "UCX_", "NCCL_", "MPI4JAX"))},
                   rows=rows)
        for r in rows:
            print(f"{a.backend:5s} {a.tag:20s} {r['bytes']:>10d} B  {r['seconds']*1e6:10.1f} us  "
                  f"{r['bytes']/r['seconds']/1e9:7.2f} GB/s  ok={r['correct']}", file=sys.stderr)
        write_json(a.out, res)


if __name__ == "__main__":
    main()
