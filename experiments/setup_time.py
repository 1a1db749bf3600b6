"""Host setup time of a sharded BP5 discretization: box mesh, node numbering, discretize(mesh, devices=P).

The 79 M-DOF P = 8 run spent 39 s in mesh + numbering and 111 s in the shard setup
(results/x8/log_weak8.txt). This times the three steps on the current machine with P
forced CPU devices, so versions of the code can be compared (run it with PYTHONPATH at
another checkout for the old one).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/setup_time.py \
        --elements 32x16x16 --order 7 --devices 8 --out setup.json
"""

import argparse
import json
import subprocess
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jaxsem  # noqa: E402
from jaxsem.models import poisson  # noqa: E402
from jaxsem.mesh import box_mesh  # noqa: E402
from jaxsem.mesh.numbering import number_nodes  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", default="32x16x16")
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    el = tuple(int(v) for v in a.elements.split("x"))
    rows = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        mesh = box_mesh(el, a.order, deform=0.1)
        t1 = time.perf_counter()
        num = number_nodes(mesh)
        t2 = time.perf_counter()
        sem = poisson.bp_discretize(mesh, 5, devices=a.devices, numbering=num)
        jax.block_until_ready(sem)
        t3 = time.perf_counter()
        rows.append(dict(mesh_seconds=t1 - t0, numbering_seconds=t2 - t1, shard_setup_seconds=t3 - t2))
        del sem
        print(rows[-1], flush=True)
    best = {k: min(r[k] for r in rows) for k in rows[0]}
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=jaxsem.__path__[0]).stdout.strip()
    except OSError:
        rev = None
    res = dict(experiment="setup_time", device=jax.devices()[0].platform, num_devices=len(jax.devices()),
               jax_version=jax.__version__, jaxsem_version=jaxsem.__version__, jaxsem_commit=rev,
               elements=list(el), order=a.order, dofs=el[0] * el[1] * el[2] * a.order**3, ranks=a.devices,
               command="python " + " ".join(sys.argv), rows=rows, best=best)
    print(json.dumps(best))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
