"""What a gradient costs: time(gradient) / time(forward) for PCG and RK, and memory vs time steps.

Three measurements, each compiled first and timed after a warm-up (median of
``--repeats`` runs, ``block_until_ready``):

1. **PCG** (BP5-like: −∇·(h₁∇u) = f, GLL collocation, Dirichlet, Jacobi-PCG
   to ``--tol``; :func:`jaxsem.models.poisson.solve`): the forward solve vs
   ``value_and_grad`` of L = ‖u − t‖² w.r.t. the per-point coefficient h₁
   ``(E, n, n, n)`` and the source f ``(E, n, n, n)`` — one adjoint PCG solve
   plus the parameter terms (``lax.custom_linear_solve``). The ideal ratio is ~2.
2. **RK** (SEDG Maxwell, PEC cavity, LSERK4, ``--steps`` steps;
   :func:`jaxsem.solvers.timestepping.integrate`): the forward loop vs
   ``value_and_grad`` of the final electric energy w.r.t. a per-element ε
   ``(E,)``, with a plain ``lax.scan`` (every step's residuals stored) and with
   ``Checkpointing("sqrt")`` (chunks recomputed: one more forward pass).
   The reverse pass is integrate's (recorded as ``reverse_pass``: whether
   ``f`` runs under ``jax.checkpoint``, i.e. is recomputed from the kept stage
   inputs). ``--backend`` picks the DG backend (``auto``: the fused CUDA
   right-hand side on a GPU; its derivatives are the einsum form's). Each
   program's memory plan is printed first; one that would not fit in 90 % of
   the device memory is reported as skipped (loudly) instead of run.
3. **Memory vs steps**: XLA's compiled memory plan of the RK gradient
   (``jax.jit(...).lower(...).compile().memory_analysis()``: temporaries
   ``temp_size_in_bytes``, plus arguments and outputs) for ``--memory-steps``
   with ``Checkpointing()`` (∝ steps) and ``Checkpointing("sqrt")`` (∝ √steps), and of
   the forward loop; compiled only, never run. ``plain_states_per_step``: the
   plain gradient's growth between the last two step counts, in states.

Output: one JSON (``--out PREFIX`` → ``PREFIX.json``, rewritten after every
measurement so that a crash keeps what was done) and, with ``--plot``,
``PREFIX.png`` (memory vs steps, log–log; the time ratios as bars). Nothing
is caught: a failure stops the run with its traceback, after the partial JSON.

    python -m experiments.gradient_cost                                   # CPU default: ~30 s (compiles)
    python -m experiments.gradient_cost --poisson-elements 16 --poisson-order 7 \\
        --maxwell-elements 8 --maxwell-order 7 --steps 100 \\
        --memory-steps 16 64 256 1024 4096 --out gradient_cost --plot   # a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem  # noqa: F401  (float64 on)
from jaxsem.app import bench
from jaxsem import timestepping as ts
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx
from jaxsem.models import poisson

from experiments.common import record

jax.config.update("jax_enable_x64", True)


def note(msg: str) -> None:
    print(f"[gradient_cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(fn, args, repeats: int) -> dict:
    """Compile (first call) and warm up, then the median wall time of ``repeats`` calls."""
    tic = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - tic
    jax.block_until_ready(fn(*args))
    _, times = bench.time_median(fn, args, repeats)
    return dict(seconds=statistics.median(times), seconds_min=min(times), first_call_seconds=first,
                repeats=repeats)


def memory(compiled) -> dict:
    """The fields of XLA's CompiledMemoryStats that this backend reports (bytes)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("memory_analysis() returned None on this backend: no compiled memory plan")
    out = {k: int(getattr(stats, k)) for k in ("temp_size_in_bytes", "argument_size_in_bytes",
                                                "output_size_in_bytes", "alias_size_in_bytes",
                                                "generated_code_size_in_bytes") if hasattr(stats, k)}
    if hasattr(stats, "peak_memory_in_bytes"):
        out["peak_memory_in_bytes"] = int(stats.peak_memory_in_bytes)
    if "temp_size_in_bytes" not in out:
        raise RuntimeError(f"memory_analysis() has no temp_size_in_bytes: {stats}")
    out["total_bytes"] = out["temp_size_in_bytes"] + out.get("argument_size_in_bytes", 0) + out.get(
        "output_size_in_bytes", 0) - out.get("alias_size_in_bytes", 0)
    return out


# ----------------------------------------------------------------------------- PCG


def pcg_cost(args) -> dict:
    mesh = box_mesh((args.poisson_elements,) * 3, args.poisson_order, deform=0.1)
    sem = poisson.bp_discretize(mesh, 5)
    xq = sem.geom.xq
    h1 = 1.0 + 0.3 * jnp.sin(np.pi * xq[0]) * jnp.cos(xq[1] + xq[2])
    f = 1.0 + jnp.cos(2 * xq[0] + xq[1]) * xq[2]

    def solve(h1, f):
        return poisson.solve(sem, f, h1, 0.0, tol=args.tol, maxiter=args.maxiter)

    u0, info = jax.jit(solve)(h1, f)
    target = 0.5 * u0

    def loss(h1, f):
        u, info = solve(h1, f)
        return sem.dot(u - target, u - target), info

    fwd = jax.jit(lambda h1, f: solve(h1, f)[0])
    vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    note(f"PCG: {sem.num_elements} elements of order {args.poisson_order}, {int(sem.num_global)} unknowns, "
         f"{int(info.iterations)} iterations to tol {args.tol:g}")
    if not bool(info.converged):
        raise RuntimeError(f"PCG did not converge in {args.maxiter} iterations (tol {args.tol:g})")
    t_fwd = timed(fwd, (h1, f), args.repeats)
    t_grad = timed(vg, (h1, f), args.repeats)
    ratio = t_grad["seconds"] / t_fwd["seconds"]
    note(f"PCG: forward {t_fwd['seconds'] * 1e3:.2f} ms, value_and_grad {t_grad['seconds'] * 1e3:.2f} ms, "
         f"ratio {ratio:.2f}")
    return dict(elements=args.poisson_elements, order=args.poisson_order, num_elements=sem.num_elements,
                unknowns=int(sem.num_global), iterations=int(info.iterations), tol=args.tol,
                forward=t_fwd, gradient=t_grad, ratio=ratio,
                gradient_wrt=["h1 (E, n, n, n)", "f (E, n, n, n)"])


# ----------------------------------------------------------------------------- RK


def maxwell_setup(args):
    mesh = box_mesh((args.maxwell_elements,) * 3, args.maxwell_order)
    dg = discretize_dg(mesh, backend=args.backend)
    q0 = mx.cavity_mode(dg.x, 0.0)
    eps = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, dg.num_elements))
    dt = 0.5 * mx.stable_dt(dg, mx.material(dg), form=args.form)

    def final(eps, q0, steps, every):
        mat = mx.material(dg, eps)
        return ts.integrate(lambda t, q: mx.rhs(dg, mat, q, form=args.form), q0, dt, steps,
                            checkpointing=ts.Checkpointing(every))

    def loss(eps, q0, steps, every):
        q = final(eps, q0, steps, every)
        return jnp.sum(dg.mass * q[:3] ** 2)

    return dg, q0, eps, dt, final, loss


def device_bytes_limit():
    """Memory the device may allocate (bytes), or None where the backend does not say (CPU)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("bytes_limit")


def rk_cost(args) -> dict:
    dg, q0, eps, dt, final, loss = maxwell_setup(args)
    # integrate's reverse pass: f under jax.checkpoint (remat) in the step loop, or not
    recompute = "remat" in str(jax.make_jaxpr(lambda eps, q0: final(eps, q0, 2, None))(eps, q0))
    reverse_pass = ("stage inputs kept, f recomputed (jax.checkpoint)" if recompute
                    else "JAX autodiff of the step (every residual of f kept)")
    note(f"RK: Maxwell, {dg.num_elements} elements of order {args.maxwell_order}, {6 * dg.jac.size} values, "
         f"{args.steps} LSERK4 steps of {dt:.4g}, form {args.form}, backend {dg.backend.name}; "
         f"reverse pass: {reverse_pass}")
    limit = device_bytes_limit()
    out = dict(elements=args.maxwell_elements, order=args.maxwell_order, num_elements=dg.num_elements,
               values=6 * int(dg.jac.size), steps=args.steps, dt=dt, form=args.form, backend=dg.backend.name,
               reverse_pass=reverse_pass, gradient_wrt="eps per element (E,)", device_bytes_limit=limit)
    programs = [("forward", lambda eps, q0: final(eps, q0, args.steps, None))]
    programs += [(f"gradient_{name}", jax.value_and_grad(lambda eps, q0, every=every: loss(eps, q0, args.steps, every)))
                 for name, every in (("plain", None), ("sqrt", "sqrt"))]
    for name, fn in programs:
        compiled = jax.jit(fn).lower(eps, q0).compile()
        plan = memory(compiled)
        out[f"{name}_memory"] = plan
        note(f"RK: {name}: memory plan {plan['total_bytes'] / 2**30:.3f} GiB"
             + (f" of {limit / 2**30:.1f} GiB" if limit else ""))
        if limit and plan["total_bytes"] > 0.9 * limit:
            note(f"RK: {name}: NOT RUN — its memory plan exceeds 90 % of the device memory (lower --steps)")
            out[name] = dict(skipped=f"memory plan {plan['total_bytes']} B > 0.9 x {limit} B")
            continue
        out[name] = timed(compiled, (eps, q0), args.repeats)
        note(f"RK: {name}: {out[name]['seconds'] * 1e3:.2f} ms")
    for name in ("plain", "sqrt"):
        g = out[f"gradient_{name}"]
        out[f"ratio_{name}"] = g["seconds"] / out["forward"]["seconds"] if "seconds" in g else None
        chunk = ts.Checkpointing(None if name == "plain" else "sqrt").chunk(args.steps)
        note(f"RK: time(value_and_grad, {name}, chunk {chunk}) / time(forward) = {out[f'ratio_{name}']}")
    return out


def memory_vs_steps(args) -> dict:
    dg, q0, eps, dt, final, loss = maxwell_setup(args)
    state_bytes = 6 * int(dg.jac.size) * dg.jac.dtype.itemsize
    rows = []
    for steps in args.memory_steps:
        row = dict(steps=steps, chunk_sqrt=ts.Checkpointing("sqrt").chunk(steps))
        tic = time.perf_counter()
        fwd = jax.jit(lambda eps, q0, steps=steps: final(eps, q0, steps, None)).lower(eps, q0).compile()
        row["forward"] = memory(fwd)
        for name, every in (("plain", None), ("sqrt", "sqrt")):
            g = jax.jit(jax.grad(lambda eps, q0, steps=steps, every=every: loss(eps, q0, steps, every)))
            row[name] = memory(g.lower(eps, q0).compile())
        note(f"memory at {steps:6d} steps: temp bytes forward {row['forward']['temp_size_in_bytes']:.3e}, "
             f"grad plain {row['plain']['temp_size_in_bytes']:.3e}, grad sqrt {row['sqrt']['temp_size_in_bytes']:.3e} "
             f"(= {row['plain']['temp_size_in_bytes'] / state_bytes:.1f} / "
             f"{row['sqrt']['temp_size_in_bytes'] / state_bytes:.1f} states; "
             f"compiled in {time.perf_counter() - tic:.1f} s)")
        rows.append(row)
    fit, per_step = {}, None
    s = np.log(np.array(args.memory_steps, float))
    if len(rows) >= 2:
        for name in ("plain", "sqrt"):
            m = np.log(np.array([r[name]["temp_size_in_bytes"] for r in rows], float))
            fit[name] = float(np.polyfit(s[-2:], m[-2:], 1)[0])  # slope of the last two points
        (a, b) = rows[-2:]
        per_step = (b["plain"]["temp_size_in_bytes"] - a["plain"]["temp_size_in_bytes"]) / (
            (b["steps"] - a["steps"]) * state_bytes)
        note(f"memory growth exponent (last two sizes): plain {fit['plain']:.2f}, sqrt {fit['sqrt']:.2f}; "
             f"plain: {per_step:.2f} states per step")
    return dict(elements=args.maxwell_elements, order=args.maxwell_order, backend=args.backend,
                state_bytes=state_bytes, rows=rows, growth_exponent_last_two=fit, plain_states_per_step=per_step)


# ----------------------------------------------------------------------------- driver


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    mem = result.get("memory")
    if mem:
        steps = np.array([r["steps"] for r in mem["rows"]])
        for name, style in (("plain", "o-"), ("sqrt", "s-"), ("forward", "^:")):
            ax[0].loglog(steps, [r[name]["temp_size_in_bytes"] / mem["state_bytes"] for r in mem["rows"]], style,
                         label={"plain": "gradient, plain scan", "sqrt": 'gradient, Checkpointing("sqrt")',
                                "forward": "forward"}[name])
        first = lambda name: mem["rows"][0][name]["temp_size_in_bytes"] / mem["state_bytes"]
        ax[0].loglog(steps, first("plain") * steps / steps[0], "k--", lw=0.7, label="∝ steps")
        ax[0].loglog(steps, first("sqrt") * np.sqrt(steps / steps[0]), "k:", lw=0.7, label="∝ √steps")
        ax[0].set_xticks(steps, [str(s) for s in steps])
        ax[0].minorticks_off()
        ax[0].set(title=f"compiled scratch memory, Maxwell order {mem['order']}, {mem['elements']}³ elements",
                  xlabel="time steps", ylabel="temp bytes / bytes of one state")
        ax[0].legend(fontsize=8)
    labels, values = [], []
    if "pcg" in result:
        labels.append("PCG (BP5)")
        values.append(result["pcg"]["ratio"])
    if "rk" in result:
        for name in ("plain", "sqrt"):
            if result["rk"][f"ratio_{name}"] is not None:
                labels.append(f"RK {name}")
                values.append(result["rk"][f"ratio_{name}"])
    ax[1].bar(labels, values, color=["C0", "C1", "C2"][: len(values)])
    for i, v in enumerate(values):
        ax[1].text(i, v, f"{v:.2f}", ha="center", va="bottom")
    backend = f", RK backend {result['rk']['backend']}" if "rk" in result else ""
    ax[1].set(title=f"time(value_and_grad) / time(forward) on {result['device']}{backend}", ylabel="ratio")
    plt.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--poisson-elements", type=int, default=3, help="PCG: elements per axis (default 3)")
    p.add_argument("--poisson-order", type=int, default=4, help="PCG: order (default 4)")
    p.add_argument("--tol", type=float, default=1e-10, help="PCG relative tolerance (default 1e-10)")
    p.add_argument("--maxiter", type=int, default=2000, help="PCG iteration cap (default 2000)")
    p.add_argument("--maxwell-elements", type=int, default=2, help="RK: elements per axis (default 2)")
    p.add_argument("--maxwell-order", type=int, default=3, help="RK: order (default 3)")
    p.add_argument("--form", choices=("split", "chain"), default="chain",
                   help="Maxwell volume curl (affine mesh: the same operator; default chain)")
    p.add_argument("--backend", choices=("auto", "einsum", "cuda"), default="auto",
                   help="DG backend of the Maxwell runs (default auto: the fused CUDA kernel on a GPU)")
    p.add_argument("--steps", type=int, default=20, help="RK: time steps of the timed runs (default 20)")
    p.add_argument("--memory-steps", type=int, nargs="+", default=[16, 128],
                   help="RK: step counts of the memory plan (default 16 128)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (default 5)")
    p.add_argument("--skip", nargs="*", default=[], choices=("pcg", "rk", "memory"), help="parts to skip")
    p.add_argument("--out", default="gradient_cost", help="output prefix: PREFIX.json (and PREFIX.png with --plot)")
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="write PREFIX.png (needs --out)")
    args = p.parse_args(argv)
    for name in ("poisson_elements", "poisson_order", "maxiter", "maxwell_elements", "maxwell_order", "steps",
                 "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(s < 1 for s in args.memory_steps):
        p.error(f"--memory-steps must all be >= 1, got {args.memory_steps}")
    if args.plot and not args.out:
        p.error("--plot needs --out PREFIX")
    return args


def main(argv=None):
    args = parse(argv)
    dev = jax.devices()[0]
    result = dict(record("gradient_cost"), backend=dev.platform, args=vars(args))
    note(f"device {result['device']} ({result['backend']}), jax {jax.__version__}")

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out + ".json", "w") as fh:
                json.dump(result, fh, indent=1)

    tic = time.perf_counter()
    for part, fn in (("pcg", pcg_cost), ("rk", rk_cost), ("memory", memory_vs_steps)):
        if part in args.skip:
            note(f"{part}: skipped")
            continue
        note(f"{part}: start")
        result[part] = fn(args)
        result["seconds"] = time.perf_counter() - tic
        save()
    if args.out:
        note(f"wrote {args.out}.json")
    if args.plot:
        plot(result, args.out + ".png")
        note(f"wrote {args.out}.png")
    summary = dict(pcg_ratio=result.get("pcg", {}).get("ratio"), rk_ratio_plain=result.get("rk", {}).get("ratio_plain"),
                   rk_ratio_sqrt=result.get("rk", {}).get("ratio_sqrt"),
                   rk_reverse_pass=result.get("rk", {}).get("reverse_pass"),
                   plain_states_per_step=result.get("memory", {}).get("plain_states_per_step"),
                   memory_growth_exponent=result.get("memory", {}).get("growth_exponent_last_two"),
                   seconds=time.perf_counter() - tic)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
