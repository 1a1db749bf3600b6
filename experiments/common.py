"""What the experiment drivers share: the run record, incremental JSON rows, timing and placement.

Every driver is run from the repository root as ``python -m experiments.NAME`` (``--help`` lists
its options); every JSON it writes carries :func:`record` — the device, the versions and the command
that reproduces it.
"""

import json
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def command() -> str:
    """The command line that started this process, as it is re-run from the repository root:
    ``[mpirun -n P ]python -m experiments.NAME ARGS`` for a driver, else ``python ARGV``."""
    argv = list(sys.argv)
    head = argv[0] if argv else ""
    here = os.path.dirname(os.path.abspath(__file__))
    if head.endswith(".py") and os.path.dirname(os.path.abspath(head)) == here:
        argv[0] = "-m experiments." + os.path.basename(head)[:-3]
    return _launch() + "python " + " ".join(argv)


def record(experiment: str) -> dict:
    """``experiment``, ``device`` (kind of the first device), ``device_info`` (platform, count,
    devices), the jax, jaxlib, numpy and jaxsem versions and :func:`command`: the head of every
    result file."""
    import jaxlib

    import jaxsem
    from jaxsem.app import bench

    dev = jax.devices()[0]
    return dict(experiment=experiment, device=getattr(dev, "device_kind", dev.platform),
                device_info=bench.device_info(), jax_version=jax.__version__, jaxlib_version=jaxlib.__version__,
                numpy_version=np.__version__, jaxsem_version=jaxsem.__version__, command=command())


def write_json(path: str, result: dict) -> str:
    """Write ``result`` (indented JSON) to ``path``, making its folder; returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    return path


def parse_sizes(text):
    """``"16x16x16,32x32x16"`` → [(16, 16, 16), (32, 32, 16)]: global element counts."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


class Results(list):
    """Rows that are written to ``path`` (JSON) after every append, so a run stopped by a time
    limit keeps the sizes it finished. Rank 0 writes; ``path=None`` keeps them in memory."""

    def __init__(self, path, experiment, write=True):
        super().__init__()
        self.path, self.experiment, self.write = path, experiment, write

    def append(self, row):
        super().append(row)
        if self.path and self.write:
            write_json(self.path, dict(record(self.experiment), rows=list(self)))


def _launch() -> str:
    """``"mpirun -n P "`` when an MPI launcher started P processes, else ``""`` (for the JSON's command)."""
    from jaxsem.parallel.launch import launcher_size

    n = launcher_size()
    return f"mpirun -n {n} " if n and n > 1 else ""


def best_seconds(fn, *args, repeats=3):
    """The shortest wall seconds of ``fn(*args)`` over ``repeats`` calls after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def median_seconds(fn, args, repeats):
    """Median wall seconds of ``fn(*args)`` over ``repeats`` calls after one warm-up call."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def add_transport_args(ap):
    """``--transport`` and ``--devices``, the same for every scaling script."""
    ap.add_argument("--transport", choices=["mpi", "shard"], default="shard",
                    help="mpi: one process per device under mpirun (mpi4jax); shard: JAX's own runtime over "
                         "--devices of this process, or of all processes started by mpirun/srun")
    ap.add_argument("--devices", default="1", help="shard transport: device counts, e.g. 1,2,4")


class Placements:
    """Where each run goes, from ``--transport``/``--devices``: ``counts`` (device counts P),
    ``rank`` and ``processes`` of this process, and :meth:`where` (the ``discretize`` keywords for
    P). Under mpirun with the shard transport every process joins one device mesh
    (``init_distributed``); ``ap.error`` if a count is smaller than the processes."""

    def __init__(self, a, ap):
        from jaxsem.parallel import get_comm, init_distributed

        if a.transport == "shard":
            init_distributed()
            self.comm, self.counts = None, [int(v) for v in str(a.devices).split(",")]
            self.rank, self.processes = jax.process_index(), jax.process_count()
            if min(self.counts) < self.processes:
                ap.error(f"--devices: {self.processes} processes share one device mesh of at least "
                         f"{self.processes} devices")
        else:
            self.comm = get_comm()
            self.counts, self.rank, self.processes = [self.comm.size], self.comm.rank, self.comm.size

    def where(self, P: int) -> dict:
        return dict(comm=self.comm) if self.comm is not None else dict(devices=P if P > 1 else None)


def element_grid(E: int):
    """Factor E = 2^k into a near-cubic (Ex, Ey, Ez), x fastest-growing."""
    k = int(round(math.log2(E)))
    if 2**k != E:
        raise ValueError(f"element counts must be powers of 2, got {E}")
    dims = [1, 1, 1]
    for i in range(k):
        dims[i % 3] *= 2
    return tuple(dims)


def half_peak(ns, rates):
    """Smallest n where the rate reaches half the maximum (log-linear interpolation)."""
    ns, rates = np.asarray(ns, float), np.asarray(rates, float)
    half = rates.max() / 2
    for i, r in enumerate(rates):
        if r >= half:
            if i == 0:
                return float(ns[0])
            x0, x1 = math.log(ns[i - 1]), math.log(ns[i])
            f = (half - rates[i - 1]) / (r - rates[i - 1])
            return float(math.exp(x0 + f * (x1 - x0)))
    return None


def time_steps(f, y0, args, dt, steps, repeats):
    """LSERK4 steps of ``f(t, y, args)`` (:func:`jaxsem.solvers.timestepping.advance_fn`), compiled and
    warmed up by one step first: ``(median seconds per step over repeats, compile seconds, y)``."""
    from jaxsem.solvers.timestepping import advance_fn

    advance = advance_fn(f, "lserk4")
    t0, dtj = jnp.asarray(0.0, y0.dtype), jnp.asarray(dt, y0.dtype)
    run = lambda y, count: advance(y, args, t0, dtj, jnp.asarray(0), jnp.asarray(count))
    tic = time.perf_counter()
    jax.block_until_ready(run(y0, 1))  # compile + warm-up
    compile_s = time.perf_counter() - tic
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        y = jax.block_until_ready(run(y0, steps))
        times.append(time.perf_counter() - tic)
    return statistics.median(times) / steps, compile_s, y
