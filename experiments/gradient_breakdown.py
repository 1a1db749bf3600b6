"""Where a Maxwell LSERK4 gradient's time goes: its reverse pass in parts, on one device.

For the SEDG Maxwell cavity (PEC, upwind, chain form, LSERK4, per-element ε as in
``experiments/gradient_cost.py``), times after compilation and a warm-up (median of
``--repeats``, ``block_until_ready``):

* the forward loop (:func:`jaxsem.timestepping.integrate`, plain);
* ``value_and_grad`` of the final electric energy w.r.t. ε (what gradient_cost.py's
  ``ratio_plain`` times) and w.r.t. the initial state q₀ only (no ε terms: the
  reverse pass is the operator's transpose and the update's adjoint);
* the same ε-gradient with the step loop written out (``lax.scan`` of ``rk_step``)
  and the right-hand side's internals (a) recomputed from the stage inputs
  (``jax.checkpoint``, as ``integrate``), (b) all kept (JAX's own reverse pass);
* one right-hand side, its transpose (vjp in q) and its vjp in ε, each alone.

It also counts the kernels (HLO fusions and custom calls) in each compiled program's
step loop. Output: ``--out PREFIX`` → ``PREFIX.json``, rewritten after each
measurement; ``--hlo DIR`` also writes each program's optimized HLO there, and
``--trace DIR`` runs each program once more under ``jax.profiler.trace`` (a Perfetto
trace per case: the time of each kernel in the reverse loop).

    python -m experiments.gradient_breakdown                      # CPU: small, to check it runs
    python -m experiments.gradient_breakdown --elements 8 16 --order 7 --steps 100 \\
        --out gradient_breakdown                          # a GPU
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem
from jaxsem.app import bench
from jaxsem import timestepping as ts
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx

from experiments.common import record

jax.config.update("jax_enable_x64", True)


def timed(compiled, args, repeats):
    tic = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - tic
    _, times = bench.time_median(compiled, args, repeats)
    return dict(seconds=statistics.median(times), seconds_min=min(times), first_call_seconds=first)


def kernels(compiled) -> dict:
    """Launches per program, counted from the optimized HLO: fusions and custom calls."""
    text = compiled.as_text()
    return dict(fusions=len(re.findall(r"\bfusion\(", text)) + len(re.findall(r" fusion\.\d+ = ", text)),
                custom_calls=len(re.findall(r"custom-call\(", text)),
                hlo_lines=text.count("\n"))


def trace_kernels(folder: str, top: int = 40) -> dict:
    """GPU time by kernel name in the Perfetto trace under ``folder``: total µs and launches, the
    ``top`` largest (the device's processes only; empty on a CPU)."""
    import collections
    import glob
    import gzip

    files = glob.glob(f"{folder}/plugins/profile/*/perfetto_trace.json.gz")
    if not files:
        return {}
    ev = json.load(gzip.open(files[0]))["traceEvents"]
    gpu = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
           and "GPU" in str(e.get("args", {}).get("name", ""))}
    total, count = collections.Counter(), collections.Counter()
    for e in ev:
        if e.get("ph") == "X" and e.get("pid") in gpu:
            total[e["name"]] += e.get("dur", 0.0)
            count[e["name"]] += 1
    return dict(total_us=sum(total.values()),
                kernels=[dict(name=k, us=t, launches=count[k]) for k, t in total.most_common(top)])


def case(E, order, steps, backend, repeats, skip=(), hlo=None, trace=None, stages="auto"):
    mesh = box_mesh((E,) * 3, order)
    dg = discretize_dg(mesh, backend=backend)
    q0 = mx.cavity_mode(dg.x, 0.0)
    eps = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, dg.num_elements))
    dt = 0.5 * mx.stable_dt(dg, mx.material(dg), form="chain")

    def f_of(eps):
        mat = mx.material(dg, eps)
        return lambda t, q: mx.rhs(dg, mat, q, form="chain")

    def final(eps, q0):
        return ts.integrate(f_of(eps), q0, dt, steps, stages=stages)

    def loss(eps, q0):
        return jnp.sum(dg.mass * final(eps, q0)[:3] ** 2)

    def scan_loss(wrap):
        def go(eps, q0):
            f = wrap(f_of(eps))
            q = jax.lax.scan(lambda q, m: (ts.rk_step(f, m * dt, q, dt, loop_stages=True), None), q0,
                             jnp.arange(steps))[0]
            return jnp.sum(dg.mass * q[:3] ** 2)
        return go

    mat = mx.material(dg, eps)
    rhs = lambda eps, q: mx.rhs(dg, mx.material(dg, eps), q, form="chain")
    ct = jnp.ones_like(q0)
    programs = {
        "forward": (lambda eps, q0: final(eps, q0)),
        "grad_eps": jax.value_and_grad(loss),
        "grad_q0": jax.value_and_grad(loss, argnums=1),
        "grad_eps_scan_remat": jax.value_and_grad(scan_loss(lambda f: jax.checkpoint(f, prevent_cse=False))),
        "grad_eps_scan_keep_all": jax.value_and_grad(scan_loss(lambda f: f)),
        "one_rhs": (lambda eps, q0: rhs(eps, q0)),
        "one_vjp_q": (lambda eps, q0: jax.vjp(lambda q: rhs(eps, q), q0)[1](ct)[0]),
        "one_vjp_eps_q": (lambda eps, q0: jax.vjp(rhs, eps, q0)[1](ct)),
    }
    out = dict(elements=E, order=order, steps=steps, stages=stages, num_elements=dg.num_elements, backend=dg.backend.name,
               values=6 * int(dg.jac.size), dt=dt)
    vals = {}
    programs = {k: v for k, v in programs.items() if k not in skip}
    for name, fn in programs.items():
        compiled = jax.jit(fn).lower(eps, q0).compile()
        out[name] = timed(compiled, (eps, q0), repeats) | kernels(compiled)
        vals[name] = compiled(eps, q0)
        if hlo:
            with open(f"{hlo}/E{E}_N{order}_{name}.hlo.txt", "w") as fh:
                fh.write(compiled.as_text())
        if trace:
            with jax.profiler.trace(f"{trace}/E{E}_N{order}_{name}", create_perfetto_trace=True):
                jax.block_until_ready(compiled(eps, q0))
            out[name]["trace"] = trace_kernels(f"{trace}/E{E}_N{order}_{name}")
        print(f"E={E}^3 {name}: {out[name]['seconds'] * 1e3:.3f} ms, {out[name]['fusions']} fusions, "
              f"{out[name]['custom_calls']} custom calls", flush=True)
    ref = vals["grad_eps"][1]
    for name in ("grad_eps_scan_remat", "grad_eps_scan_keep_all"):
        if name in vals:
            out[name]["grad_rel_diff"] = float(jnp.max(jnp.abs(vals[name][1] - ref)) / jnp.max(jnp.abs(ref)))
    fwd = out["forward"]["seconds"]
    out["ratios"] = {k: out[k]["seconds"] / fwd for k in programs if k.startswith("grad")}
    print(f"E={E}^3 ratios to forward: {out['ratios']}", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=int, nargs="+", default=[2])
    p.add_argument("--order", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--backend", default="auto")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip", nargs="*", default=[], help="programs not to run (e.g. grad_eps_scan_keep_all "
                   "where its memory plan does not fit)")
    p.add_argument("--stages", default="auto", choices=("auto", "loop", "unrolled"),
                   help="integrate's stages argument")
    p.add_argument("--out", default="gradient_breakdown", help="output prefix: PREFIX.json")
    p.add_argument("--hlo", default=None, help="folder for each program's optimized HLO text")
    p.add_argument("--trace", default=None, help="folder for a jax.profiler trace of each program")
    a = p.parse_args(argv)
    res = dict(record("gradient_breakdown"), cases=[])
    for E in a.elements:
        res["cases"].append(case(E, a.order, a.steps, a.backend, a.repeats, a.skip, a.hlo, a.trace, a.stages))
        if a.out:
            with open(a.out + ".json", "w") as fh:
                json.dump(res, fh, indent=1)
    return res


if __name__ == "__main__":
    main()
