"""What a gradient through a long Navier–Stokes run costs at size: memory and time against the forward run.

The loss is the kinetic energy at the end of a Taylor–Green run (Re = 1600, BDF3/EXT3, the
default pressure and velocity solves), L(ν, u⁰) = E_k(t_final); the gradient is taken w.r.t.
the viscosity and the whole initial velocity field ``u⁰: (3, E, n, n, n)`` with
``jax.value_and_grad`` through :func:`jaxsem.models.navier_stokes.simulate` under the
binomial schedule ``Checkpointing(snapshots=s)``. In order:

1. **check** (small mesh, ``--check-steps`` steps): the gradient under the schedule equals the
   plain scan's (relative difference, recorded);
2. **forward** at size: compiled apart, then run once; time, XLA's memory plan, and the
   device's peak bytes in use after it;
3. **gradient** at size: the same for value-and-grad; the ratios to the forward run;
4. **finite differences** (``--fd`` directions: ν first, then standard-normal directions of
   u⁰): central differences of L with relative steps ``--h``, against ⟨∇L, v⟩.

The peak is the allocator's ``peak_bytes_in_use`` (it only grows: the forward run's is read
before the gradient runs); it includes the discretization and the input state, which both
runs hold. Rows go to ``--out`` (JSON) after every part.

    python -m experiments.ns_gradient_size --elements 3 --order 3 --steps 40 --schedule binomial:4 \\
        --check-elements 2 --check-steps 6 --fd 2 --out /tmp/ns_grad.json   # a CPU, a minute
    python -m experiments.ns_gradient_size --elements 18 --order 7 --steps 3000 --schedule binomial:10 \\
        --fd 0 --out ns_gradient_size.json                                    # one GPU
    python -m experiments.ns_gradient_size --elements 29 --order 7 --steps 3000 --schedule binomial:10 \
        --devices 4 --skip check --fd 0 --out ns_gradient_size_4gpu.json      # four GPUs, ≥ 4× the points
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers.timestepping import Checkpointing

from experiments.common import record, write_json


def _problem(elements: int, order: int, dt: float, devices: int = 1):
    mesh = js.box_mesh(elements, order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=dt, devices=devices if devices > 1 else None)
    return ns, NS.initial_state(ns, flows.taylor_green().velocity)


def _loss(steps, checkpointing):
    """``L(ν, u⁰, ns, st0)``: the discretization and the start state are arguments, not constants
    baked into the compiled program."""

    def loss(nu, u0, ns, st0):
        st = dataclasses.replace(st0, U=st0.U.at[0].set(u0))
        st = NS.simulate(dataclasses.replace(ns, nu=nu), st, steps, checkpointing=checkpointing)
        return NS.diagnostics(ns, st).kinetic_energy

    return loss


def _directions(u, count: int) -> list:
    """``count`` standard-normal directions shaped like ``u`` (seeded: the same in every run)."""
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(u.shape), u.dtype) for _ in range(count)]


def _peak() -> int | None:
    """The largest ``peak_bytes_in_use`` over this process's devices (None where not reported)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    return max(peaks) if all(p is not None for p in peaks) else None


def _plan(compiled) -> dict:
    m = compiled.memory_analysis()
    if m is None:
        return {}
    return dict(temp_bytes=int(m.temp_size_in_bytes), argument_bytes=int(m.argument_size_in_bytes),
                output_bytes=int(m.output_size_in_bytes))


def _compile_and_run(fn, *args, repeats: int = 1):
    """Compile ``fn`` apart, then run it ``repeats`` times: ``(out, compiled, row)``, the row's
    ``seconds`` the fastest run and ``all_seconds`` every run's, in order."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    t_compile = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    return out, compiled, dict(compile_seconds=t_compile, seconds=min(times), all_seconds=times, repeats=repeats,
                               **_plan(compiled))


def check(elements: int, order: int, dt: float, steps: int, schedule: Checkpointing) -> dict:
    """The schedule's kind (binomial with 2 states, or chunks of 2 steps, kept where ``schedule``
    keeps them) against the plain scan's gradient on a small mesh."""
    ns, st0 = _problem(elements, order, dt)
    small = (Checkpointing(snapshots=2) if schedule.snapshots is not None
             else Checkpointing(2, offload=schedule.offload))
    g = {}
    for key, ck in (("plain", Checkpointing()), ("schedule", small)):
        g[key] = jax.jit(jax.grad(_loss(steps, ck), argnums=(0, 1)))(ns.nu, st0.u, ns, st0)
    d_nu = abs(float(g["schedule"][0] - g["plain"][0])) / abs(float(g["plain"][0]))
    d_u = float(jnp.max(jnp.abs(g["schedule"][1] - g["plain"][1])) / jnp.max(jnp.abs(g["plain"][1])))
    return dict(elements=elements, order=order, steps=steps, schedule=repr(small), grad_nu_rel_diff=d_nu,
                grad_u_rel_diff=d_u)


def _schedule(text: str) -> Checkpointing:
    """plain, sqrt, every:C or binomial:S; sqrt:host and every:C:host keep the chunks' start
    states in the host's memory (``Checkpointing(offload=True)``), sqrt:custom_vjp and
    every:C:custom_vjp recompute the chunks through the custom VJP on the device."""
    offload, vjp = text.endswith(":host"), text.endswith(":custom_vjp")
    kind, _, arg = text.removesuffix(":host").removesuffix(":custom_vjp").partition(":")
    remat = "custom_vjp" if vjp else "auto"
    if kind == "plain" and not (offload or vjp):
        return Checkpointing()
    if kind == "sqrt":
        return Checkpointing("sqrt", remat, offload=offload)
    if kind == "every":
        return Checkpointing(int(arg), remat, offload=offload)
    if kind == "binomial" and not offload:
        return Checkpointing(snapshots=int(arg))
    raise ValueError(f"a schedule is plain, sqrt[:host|:custom_vjp], every:C[:host|:custom_vjp] or binomial:S, "
                     f"got {text!r}")


def _host_states(ck: Checkpointing, steps: int) -> int:
    """States the schedule keeps in the host's memory."""
    c = ck.chunk(steps)
    return steps // c if ck.offload and c else 0


def plans(elements: int, order: int, dt: float, steps_list, schedules, save_rows=lambda rows: None) -> list:
    """XLA's memory plan (compiled, never run) of the forward run and of value-and-grad under each
    schedule, for each step count: rows with ``temp_bytes`` and the schedule's recomputed steps."""
    ns, st0 = _problem(elements, order, dt)
    state_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(st0))
    rows = []
    for steps in steps_list:
        for name in ["forward"] + list(schedules):
            ck = Checkpointing() if name == "forward" else _schedule(name)
            fn = _loss(steps, ck)
            if name != "forward":
                fn = jax.value_and_grad(fn, argnums=(0, 1))
            t = time.perf_counter()
            compiled = jax.jit(fn).lower(ns.nu, st0.u, ns, st0).compile()
            rows.append(dict(steps=steps, schedule=name, state_bytes=state_bytes,
                             recomputed_steps=None if name == "forward" else ck.recomputed_steps(steps),
                             compile_seconds=time.perf_counter() - t, **_plan(compiled)))
            print(rows[-1], flush=True)
            save_rows(rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=3, help="elements per direction")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--schedule", default="binomial:4", help="the gradient's schedule: plain, sqrt, every:C or "
                    "binomial:S (S states stored); sqrt and every:C take :host (states in host memory) "
                    "or :custom_vjp")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each program; the fastest is reported")
    ap.add_argument("--devices", type=int, default=1, help="devices the run is sharded over (peak: the largest)")
    ap.add_argument("--check-elements", type=int, default=2)
    ap.add_argument("--check-steps", type=int, default=6)
    ap.add_argument("--fd", type=int, default=2, help="finite-difference directions (ν first); 0: none")
    ap.add_argument("--h", type=float, default=1e-4, help="relative step of the central differences")
    ap.add_argument("--skip", nargs="*", default=[], choices=["check", "gradient"])
    ap.add_argument("--plan-steps", type=int, nargs="*", default=[],
                    help="compile only: XLA's memory plan of value-and-grad for these step counts under "
                         "--schedules (then stop)")
    ap.add_argument("--schedules", nargs="*", default=["plain", "sqrt", "binomial:4", "binomial:16"],
                    help="plain, sqrt, every:C or binomial:S")
    ap.add_argument("--ad-from", help="with --skip gradient: the JSON whose 'ad' values the differences check")
    ap.add_argument("--out", default="ns_gradient_size.json")
    a = ap.parse_args(argv)
    for name in ("elements", "order", "steps", "devices", "repeats"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1")

    res = dict(record("ns_gradient_size"))
    save = lambda: write_json(a.out, res)  # noqa: E731
    if a.plan_steps:
        res["plans"] = plans(a.elements, a.order, a.dt, a.plan_steps, a.schedules, save_rows=lambda r: (
            res.__setitem__("plans", r), save()))
        return res
    try:
        ck = _schedule(a.schedule)
    except ValueError as e:
        ap.error(f"--schedule: {e}")
    if "check" not in a.skip:
        res["check"] = check(a.check_elements, min(a.order, 3), a.dt, a.check_steps, ck)
        print("check", res["check"], flush=True)
        save()

    ns, st0 = _problem(a.elements, a.order, a.dt, a.devices)
    state_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(st0))
    res["case"] = dict(flow="taylor_green", reynolds=1600, devices=a.devices, elements=a.elements, order=a.order,
                       points=a.elements**3 * a.order**3, nodes=int(ns.sem.x[0].size), dt=a.dt, steps=a.steps,
                       t_final=a.steps * a.dt, schedule=a.schedule, state_bytes=state_bytes,
                       recomputed_steps=ck.recomputed_steps(a.steps), peak_bytes_after_setup=_peak(),
                       host_states=_host_states(ck, a.steps),
                       host_state_bytes=_host_states(ck, a.steps) * state_bytes)
    save()
    fwd = _loss(a.steps, ck)
    value, run_fwd, res["forward"] = _compile_and_run(fwd, ns.nu, st0.u, ns, st0, repeats=a.repeats)
    res["forward"].update(value=float(value), peak_bytes=_peak())
    print("forward", res["forward"], flush=True)
    save()

    if "gradient" not in a.skip:
        vg = jax.value_and_grad(fwd, argnums=(0, 1))
        (v, (g_nu, g_u)), _, res["gradient"] = _compile_and_run(vg, ns.nu, st0.u, ns, st0, repeats=a.repeats)
        res["gradient"].update(value=float(v), grad_nu=float(g_nu), grad_u_norm=float(jnp.linalg.norm(g_u)),
                               peak_bytes=_peak())
        f, g = res["forward"], res["gradient"]
        res["ratios"] = dict(time=g["seconds"] / f["seconds"],
                             peak_bytes=(g["peak_bytes"] / f["peak_bytes"]) if f["peak_bytes"] else None)
        print("gradient", res["gradient"], res["ratios"], flush=True)
        save()

        # ⟨∇L, v⟩ for the finite-difference directions, kept so that a later run (--ad-from) checks them
        res["ad"] = [float(g_nu)] + [float(jnp.vdot(g_u, v)) for v in _directions(st0.u, max(a.fd, 3) - 1)]
        save()
    elif a.fd:
        if not a.ad_from:
            ap.error("--fd with --skip gradient needs --ad-from (a JSON of a run with the gradient)")
        import json

        with open(a.ad_from) as fh:
            res["ad"] = json.load(fh)["ad"]
        res["ad_from"] = a.ad_from

    rows = []
    for k, v in enumerate([None] + _directions(st0.u, a.fd - 1) if a.fd else []):
        if v is None:  # ν, relative step h
            h = a.h * float(ns.nu)
            plus, minus, what = (ns.nu + h, st0.u), (ns.nu - h, st0.u), "nu"
        else:  # a standard-normal u⁰ direction, step h·max|u⁰|
            h = a.h * float(jnp.max(jnp.abs(st0.u)))
            plus, minus, what = (ns.nu, st0.u + h * v), (ns.nu, st0.u - h * v), f"u0 random {k}"
        t = time.perf_counter()
        fd = (float(run_fwd(*plus, ns, st0)) - float(run_fwd(*minus, ns, st0))) / (2 * h)
        ad = res["ad"][k]
        rows.append(dict(direction=what, ad=ad, fd=fd, rel_error=abs(ad - fd) / abs(fd), h=h,
                         seconds=time.perf_counter() - t))
        print("fd", rows[-1], flush=True)
        res["finite_differences"] = rows
        save()
    return res


if __name__ == "__main__":
    main()
