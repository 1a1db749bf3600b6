"""Set-up time of ``jaxsem bench bk5``, stage by stage: box mesh, numbering, partition, discretize.

Each (elements, order) case runs in a fresh process (as ``jaxsem bench`` does: its memory is
first touched there) and reports, in wall and process-CPU seconds:

* ``box_mesh``, ``number_nodes``, ``partition_mesh`` (for ``--ranks``), and the parts of
  ``discretize``: the Dirichlet mask (``boundary_nodes``), ``make_gs``, ``make_assembled`` and
  the geometric factors (``geometric_factors``, on the default device);
* ``setup``: ``box_mesh`` + ``bp_discretize`` end to end, what ``jaxsem bench`` reports as
  ``setup_seconds``; then ``compile`` and ``solve`` (median BK5 apply) from
  :func:`jaxsem.app.bench.time_bk`, as its ``compile_seconds`` and ``seconds``.

Cases whose estimated host memory exceeds what the machine has free are skipped (recorded).
Run with ``PYTHONPATH`` at another checkout to time that version of ``jaxsem``.

    python -m experiments.setup_time                     # seconds: 8³ elements, p = 3
    python -m experiments.setup_time --elements 16x16x16,32x32x32,84x84x84 --orders 3,7 \\
        --out experiments/results/setup_time_cpu.json
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from experiments.common import parse_sizes, record, write_json


def _stage(rows, name, fn, *args):
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    rows[name] = dict(wall=time.perf_counter() - t, cpu=time.process_time() - c)
    return out


def one(elements, order, ranks, repeats, deform):
    """All stages of one case in this process: a dict of ``{stage: {wall, cpu}}`` and sizes."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import jaxsem
    from jaxsem.app import bench
    from jaxsem.backends import resolve
    from jaxsem.core import geometry as geo
    from jaxsem.discretization.assembled import make_assembled
    from jaxsem.discretization.gather_scatter import make_gs
    from jaxsem.mesh import box_mesh, number_nodes, partition_mesh
    from jaxsem.models import poisson
    from jaxsem.operators.bk import BK_SPECS

    st = {}
    # end to end first, as `jaxsem bench bk5` runs it (fresh memory), then the stages apart
    t, c = time.perf_counter(), time.process_time()
    mesh = box_mesh(elements, order, deform=deform)
    sem = jax.block_until_ready(poisson.bp_discretize(mesh, 5))
    st["setup"] = dict(wall=time.perf_counter() - t, cpu=time.process_time() - c)
    r = bench.time_bk(BK_SPECS[5], sem, repeats=repeats)
    st["compile"] = dict(wall=r["compile_seconds"])
    st["solve"] = dict(wall=r["seconds"])
    del sem, mesh

    mesh = _stage(st, "box_mesh", lambda: box_mesh(elements, order, deform=deform))
    num = _stage(st, "number_nodes", number_nodes, mesh)
    if ranks > 1:
        _stage(st, "partition_mesh", partition_mesh, mesh, ranks)
    mask = np.ones(num.gid.shape)
    mask[_stage(st, "boundary_nodes", num.boundary_nodes)] = 0.0
    layout = resolve("auto", order, order + 1, jax.numpy.float64).gs_layout  # "csr" with the CUDA kernels
    _stage(st, "make_gs", lambda: jax.block_until_ready(make_gs(num.gid, num.num_global, layout)))
    _stage(st, "make_assembled", lambda: jax.block_until_ready(make_assembled(num.gid, mask, num.num_global)))
    x = jax.numpy.asarray(mesh.x)
    quad = geo.quadrature(order, "gll")
    _stage(st, "geometric_factors", lambda: jax.block_until_ready(geo.geometric_factors(x, quad)))
    E = int(np.prod(elements))
    return dict(jaxsem=os.path.dirname(jaxsem.__file__), elements=list(elements), order=order, num_elements=E, nodes=int(num.num_global),
                dofs=E * order**3, stages=st, peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def _host_bytes(elements, order):
    """A generous estimate of the peak host memory of one case: ~45 doubles per GLL node."""
    E = elements[0] * elements[1] * elements[2]
    return 45 * 8 * E * (order + 1) ** 3


def _available_bytes():
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", default="8x8x8", help="element counts, comma separated, e.g. 16x16x16,84x84x84")
    ap.add_argument("--orders", default="3", help="polynomial orders, comma separated, e.g. 3,7")
    ap.add_argument("--ranks", type=int, default=8, help="ranks for the partition_mesh stage (1: skip it)")
    ap.add_argument("--deform", type=float, default=0.1, help="box deformation (jaxsem bench's default 0.1)")
    ap.add_argument("--repeats", type=int, default=3, help="timed BK5 applies (the solve stage)")
    ap.add_argument("--max-nodes", type=float, default=float("inf"),
                    help="skip cases of more local GLL nodes E·(p+1)³ than this (recorded as skipped)")
    ap.add_argument("--out", default=None, help="JSON output (default: print only)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one case, JSON on stdout
    a = ap.parse_args(argv)
    if a.one:
        el, order = a.one.split(":")
        print("RESULT " + json.dumps(one(tuple(int(v) for v in el.split("x")), int(order), a.ranks, a.repeats, a.deform)))
        return
    rows = []
    for el in parse_sizes(a.elements):
        for order in (int(v) for v in a.orders.split(",")):
            need, have = _host_bytes(el, order), _available_bytes()
            case = dict(elements=list(el), order=order)
            nodes = el[0] * el[1] * el[2] * (order + 1) ** 3
            if need > have or nodes > a.max_nodes:
                why = (f"{nodes} local nodes > --max-nodes {a.max_nodes:g}" if nodes > a.max_nodes else
                       f"needs about {need / 2**30:.0f} GiB of host memory, {have / 2**30:.0f} GiB available")
                rows.append(dict(case, skipped=why))
                print(rows[-1], flush=True)
                continue
            cmd = [sys.executable, "-m", "experiments.setup_time", "--one", f"{'x'.join(map(str, el))}:{order}",
                   "--ranks", str(a.ranks), "--repeats", str(a.repeats), "--deform", str(a.deform)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
            if p.returncode or not lines:
                rows.append(dict(case, failed=(p.stderr or p.stdout)[-2000:]))
            else:
                rows.append(json.loads(lines[-1][len("RESULT "):]))
            st = rows[-1].get("stages", {})
            print(json.dumps(dict(case, **{k: round(v["wall"], 3) for k, v in st.items()})), flush=True)
    res = dict(record("setup_time"), cpu_count=os.cpu_count(), ranks=a.ranks, deform=a.deform, rows=rows)
    if a.out:
        write_json(a.out, res)


if __name__ == "__main__":
    main()
