"""Inverse problems through a Navier–Stokes flow: an initial velocity from a later observation
(4D-Var) and a viscosity from a kinetic-energy curve, by optax L-BFGS through bounded-memory
reverse mode.

The flow: the periodic box [−π, π]³, K³ elements of order N, ``--steps`` BDF3/EXT3 steps of
:mod:`jaxsem.models.navier_stokes` (Δt, ν; solves to ``--tol``) to T = steps·Δt. One run gives
the velocity u(T) and the kinetic energy E = ⟨½|u|²⟩ after every step; it is
``checkpointed_scan`` over ``NS.step`` (what ``NS.simulate`` runs, with an observation per step)
under ``Checkpointing(snapshots=k)``: reverse mode keeps at most k states (each with its BDF/EXT
history) and recomputes the steps between them (the binomial schedule; the JSON records how many).

(a) Initial-condition recovery. u⁰(a) = u_TG + Σ_m a_m φ_m over M = 52 divergence-free Fourier
modes φ = e cos(k·x), e sin(k·x): the 13 wave vectors k ∈ {−1, 0, 1}³ up to sign, two unit
polarisations e ⊥ k each. The Taylor–Green field lies in their span (k = (1, ±1, ±1)), so a = 0
is the Taylor–Green start and its amplitude is recovered with the rest. Truth: a* ~ N(0, σ_a²)
(``--amplitude``). Data: u(T; a*) at every node plus Gaussian noise of ``--noise``·max|u(T)| per
distinct node. Objective J_u(a) = ‖u(T; a) − d‖²/‖d‖² (L²(Ω)). Modes, not nodal values, and no
Tikhonov term: the gradient part of a nodal u⁰ is removed by the first pressure projection (not
identifiable at all) and its grid-scale part is damped by exp(−ν|k|²T) (nearly so), while each
of the 52 modes is damped by at most exp(−3νT) (0.94 at the defaults), so the least-squares
problem in a is well posed as it stands. Reported: the loss history, the relative L² errors of
the recovered u⁰ against the truth, ‖u⁰(a) − u⁰(a*)‖/‖u⁰(a*) − u_TG‖ (1 at the start) and
‖u⁰(a) − u⁰(a*)‖/‖u⁰(a*)‖, the amplitude error and the misfit of the truth (the noise floor).

(b) Parameter study. ν from E(t_j) at ``--samples`` equally spaced times of a run from the
Taylor–Green field with ν = ``--nu``: J_E(ν) = Σ_j (E(t_j; ν) − E_j)²/Σ_j (E_j − E(0))², over
log ν from ``--nu-start``.

Both minimise one objective of one run, J = w_u J_u + w_E J_E over (log ν, a), with the weights
and the free parameters switched ((a): w = (1, 0), a free, ν the true one; (b): w = (0, 1), log ν
free, a = 0), so one compiled L-BFGS step serves both. optax L-BFGS with a backtracking (Armijo)
line search, which runs the forward problem only (the zoom search's Wolfe condition would put
another reverse pass into the compiled step). Once, at the start, the gradient of J (both terms)
with the schedule is checked against the plain scan's (``Checkpointing()``) to 1e-10 relative,
and XLA's temporary memory of both gradient programs is recorded.

    python -m experiments.ns_inverse                       # default: about 3 min on 2 CPU cores
    python -m experiments.ns_inverse --out experiments/results/ns_inverse_cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsem as js
from jaxsem.mesh.numbering import number_nodes
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers.timestepping import Checkpointing, checkpointed_scan

from experiments.common import record, write_json

jax.config.update("jax_enable_x64", True)


def wave_modes():
    """The (k, e) pairs of the modes: ``k ∈ {−1, 0, 1}³``, k ≠ 0, up to sign (first nonzero
    component positive), ``e`` two unit vectors ⊥ k; 26 pairs, each giving a cos and a sin mode."""
    pairs = []
    for k in itertools.product((-1, 0, 1), repeat=3):
        if k == (0, 0, 0) or next(c for c in k if c) < 0:
            continue
        kv = np.asarray(k, float)
        e1 = np.cross(kv, np.eye(3)[np.argmin(np.abs(kv))])
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(kv, e1)
        pairs += [(kv, e1), (kv, e2 / np.linalg.norm(e2))]
    return pairs


def modes(x, y, z):
    """``(M, 3, ...)`` the divergence-free modes e cos(k·x), e sin(k·x) (M = 52) at the points."""
    out = []
    for k, e in wave_modes():
        phase = k[0] * x + k[1] * y + k[2] * z
        for f in (jnp.cos, jnp.sin):
            out.append(jnp.asarray(e).reshape((3,) + (1,) * phase.ndim) * f(phase))
    return jnp.stack(out)


class Flow(NamedTuple):
    """The flow problem (pytree: passed to the compiled programs, not closed over)."""

    ns: NS.NavierStokes
    phi: jax.Array  # (M, 3, E, n, n, n) the modes at the nodes
    u_tg: jax.Array  # (3, E, n, n, n) the Taylor–Green field


def initial_velocity(flow: Flow, a):
    """u⁰(a) = u_TG + Σ a_m φ_m: ``(3, E, n, n, n)``."""
    return flow.u_tg + jnp.tensordot(a, flow.phi, 1)


def trajectory(flow: Flow, log_nu, a, steps: int, checkpointing: Checkpointing):
    """The run from u⁰(a) with ν = exp(log_nu): ``(u(T): (3, E, n, n, n), E: (steps,))``, E the
    kinetic energy after each step."""
    ns = dataclasses.replace(flow.ns, nu=jnp.exp(log_nu))

    def one(st, _):
        st, _ = NS.step(ns, st)
        return st, NS.diagnostics(ns, st).kinetic_energy

    st, energy = checkpointed_scan(one, NS.initial_state(ns, initial_velocity(flow, a)), steps, checkpointing)
    return st.u, energy


def misfits(flow: Flow, uT, energy, data, every: int):
    """``(J_u, J_E)`` of a run's u(T) and energies against ``data`` (sampled every ``every`` steps)."""
    sem = flow.ns.sem
    ju = sem.integrate((uT - data["u"]) ** 2) / sem.integrate(data["u"] ** 2)
    e = energy[every - 1::every]
    je = jnp.sum((e - data["energy"]) ** 2) / jnp.sum((data["energy"] - data["energy0"]) ** 2)
    return ju, je


def objective(p, flow, data, weights, steps, every, checkpointing):
    """J = w_u J_u + w_E J_E of the run with ``p = {"log_nu": (), "a": (M,)}``; aux ``(J_u, J_E)``."""
    uT, energy = trajectory(flow, p["log_nu"], p["a"], steps, checkpointing)
    ju, je = misfits(flow, uT, energy, data, every)
    return weights[0] * ju + weights[1] * je, (ju, je)


def lbfgs(max_backtracking_steps: int = 20):
    """optax L-BFGS with a backtracking (Armijo) line search (forward runs only)."""
    return optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(max_backtracking_steps))


def make_step(opt, steps, every, checkpointing):
    """One L-BFGS iteration on J with the gradient masked to the free parameters ``free``
    (a pytree of 0/1 like p): ``step(p, state, flow, data, weights, free) -> (p, state, J, (J_u, J_E))``
    with J at the incoming p."""
    obj = functools.partial(objective, steps=steps, every=every, checkpointing=checkpointing)

    def step(p, state, flow, data, weights, free):
        (value, parts), grad = jax.value_and_grad(obj, has_aux=True)(p, flow, data, weights)
        grad = jax.tree_util.tree_map(jnp.multiply, grad, free)
        updates, state = opt.update(grad, state, p, value=value, grad=grad,
                                    value_fn=lambda q: obj(q, flow, data, weights)[0])
        return optax.apply_updates(p, updates), state, value, parts

    return step


def strong(tree):
    """``tree`` with every leaf a strongly typed array (optax's initial state holds weakly typed
    scalars, which the first update would turn into a second compiled signature)."""
    return jax.tree_util.tree_map(lambda v: jnp.array(v, dtype=jnp.asarray(v).dtype), tree)


def minimise(step, p0, flow, data, weights, free, iterations, opt, report=None):
    """``iterations`` L-BFGS steps from ``p0``: ``(p, rows)``, one row per iterate (its J, J_u, J_E,
    ν, wall seconds since the start); ``report(p)`` adds entries to each row."""
    p, state = p0, strong(opt.init(p0))
    rows, tic = [], time.perf_counter()
    for it in range(iterations):
        new_p, state, value, (ju, je) = step(p, state, flow, data, weights, free)
        extra = report(p) if report else {}
        rows.append(dict(iteration=it, loss=float(value), misfit_u=float(ju), misfit_energy=float(je),
                         nu=float(jnp.exp(p["log_nu"])), seconds=time.perf_counter() - tic, **extra))
        print(f"  iter {it:2d}  J {rows[-1]['loss']:.4e}  nu {rows[-1]['nu']:.8f}"
              + "".join(f"  {k} {v:.3e}" for k, v in extra.items()), file=sys.stderr, flush=True)
        p = new_p
    return p, rows


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=3, help="elements per axis (default 3)")
    p.add_argument("--order", type=int, default=4, help="polynomial order N (default 4)")
    p.add_argument("--nu", type=float, default=0.02, help="true viscosity (default 0.02)")
    p.add_argument("--dt", type=float, default=0.04, help="time step (default 0.04)")
    p.add_argument("--steps", type=int, default=24, help="time steps of a run (default 24)")
    p.add_argument("--snapshots", type=int, default=4, help="states kept by the reverse pass (default 4)")
    p.add_argument("--samples", type=int, default=6, help="(b): energy samples, dividing --steps (default 6)")
    p.add_argument("--amplitude", type=float, default=0.05, help="(a): σ of the true mode amplitudes (default 0.05)")
    p.add_argument("--noise", type=float, default=0.01, help="(a): observation noise / max|u(T)| (default 0.01)")
    p.add_argument("--nu-start", type=float, default=0.05, help="(b): the first guess of ν (default 0.05)")
    p.add_argument("--iterations", type=int, default=8, help="(a): L-BFGS iterations (default 8)")
    p.add_argument("--nu-iterations", type=int, default=8, help="(b): L-BFGS iterations (default 8)")
    p.add_argument("--tol", type=float, default=1e-10, help="pressure and velocity solve tolerance (default 1e-10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the true amplitudes and the noise (default 0)")
    p.add_argument("--out", default="ns_inverse", help="output prefix: writes PREFIX.json and PREFIX.png")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = p.parse_args(argv)
    if args.steps < 2 or args.steps % args.samples:
        p.error(f"--samples must divide --steps (>= 2), got {args.samples} and {args.steps}")
    return args


def run(args):
    tic = time.perf_counter()
    ck = Checkpointing(snapshots=args.snapshots)
    every = args.steps // args.samples
    mesh = js.box_mesh(args.elements, args.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3,
                       periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=args.nu, dt=args.dt, options=NS.NSOptions(pressure_tol=args.tol, velocity_tol=args.tol))
    x = ns.sem.x
    flow = Flow(ns, modes(*x) * ns.sem.valid, flows.taylor_green().velocity(*x) * ns.sem.valid)
    M = flow.phi.shape[0]
    setup_seconds = time.perf_counter() - tic
    print(f"{ns.sem.num_elements} elements of order {args.order} ({ns.sem.num_global} nodes), {args.steps} steps to "
          f"T = {args.steps * args.dt:g}; Checkpointing(snapshots={args.snapshots}): reverse mode keeps at most "
          f"{args.snapshots} states and recomputes {ck.recomputed_steps(args.steps)} steps", file=sys.stderr)

    # the observations: u(T) of the perturbed start (noisy), E(t_j) of the Taylor-Green start
    tic = time.perf_counter()
    forward = jax.jit(trajectory, static_argnums=(3, 4))
    rng = np.random.default_rng(args.seed)
    a_true = jnp.asarray(args.amplitude * rng.standard_normal(M))
    log_nu = jnp.asarray(np.log(args.nu))
    u_obs, _ = forward(flow, log_nu, a_true, args.steps, ck)
    xi = rng.standard_normal((3, int(ns.sem.num_global)))[:, np.asarray(number_nodes(mesh).gid)]
    d = ns.sem.valid * (u_obs + args.noise * float(jnp.max(jnp.abs(u_obs))) * xi)
    _, e_obs = forward(flow, log_nu, jnp.zeros(M), args.steps, ck)
    e0 = NS.diagnostics(ns, NS.initial_state(ns, flow.u_tg)).kinetic_energy
    data = dict(u=d, energy=e_obs[every - 1::every], energy0=e0)
    data_seconds = time.perf_counter() - tic

    # the gradient with the schedule against the plain scan's, once
    tic = time.perf_counter()
    p_check = dict(log_nu=jnp.asarray(np.log(args.nu_start)), a=jnp.zeros(M))
    both = jnp.asarray([1.0, 1.0])
    grads, memory = {}, {}
    for name, c in (("plain", Checkpointing()), ("snapshots", ck)):
        obj = functools.partial(objective, steps=args.steps, every=every, checkpointing=c)
        f = jax.value_and_grad(obj, has_aux=True)
        compiled = jax.jit(f).lower(p_check, flow, data, both).compile()
        memory[name] = int(compiled.memory_analysis().temp_size_in_bytes)
        grads[name] = compiled(p_check, flow, data, both)[1]
    rel = {k: float(jnp.max(jnp.abs(grads["snapshots"][k] - grads["plain"][k])) / jnp.max(jnp.abs(grads["plain"][k])))
           for k in ("log_nu", "a")}
    state_bytes = sum(v.size * v.dtype.itemsize for v in jax.tree_util.tree_leaves(NS.initial_state(ns, flow.u_tg)))
    check_seconds = time.perf_counter() - tic
    print(f"gradient with Checkpointing(snapshots={args.snapshots}) vs plain: relative difference "
          f"{rel['log_nu']:.1e} (log nu), {rel['a']:.1e} (a); XLA temporaries {memory['snapshots'] / 2**20:.1f} MiB "
          f"vs {memory['plain'] / 2**20:.1f} MiB", file=sys.stderr)

    opt = lbfgs()
    tic = time.perf_counter()
    p0 = dict(log_nu=log_nu, a=jnp.zeros(M))
    step = jax.jit(make_step(opt, args.steps, every, ck)).lower(
        p0, strong(opt.init(p0)), flow, data, both, jax.tree_util.tree_map(jnp.ones_like, p0)).compile()
    compile_seconds = time.perf_counter() - tic

    sem = ns.sem
    u_true = initial_velocity(flow, a_true)
    l2 = lambda v: float(jnp.sqrt(sem.integrate(v**2)))  # noqa: E731
    size_pert, size_field = l2(u_true - flow.u_tg), l2(u_true)

    def errors(p):
        e = l2(initial_velocity(flow, p["a"]) - u_true)
        return dict(field_error=e / size_pert, field_error_vs_field=e / size_field,
                    amplitude_error=float(jnp.linalg.norm(p["a"] - a_true) / jnp.linalg.norm(a_true)))

    def final_row(p):
        uT, energy = forward(flow, p["log_nu"], p["a"], args.steps, ck)
        return [float(v) for v in misfits(flow, uT, energy, data, every)]

    print("(a) the initial velocity from u(T)", file=sys.stderr)
    tic = time.perf_counter()
    p_a, rows_a = minimise(step, p0, flow, data, jnp.asarray([1.0, 0.0]),
                           dict(log_nu=jnp.asarray(0.0), a=jnp.ones(M)), args.iterations, opt, errors)
    seconds_a = time.perf_counter() - tic
    floor = final_row(dict(log_nu=log_nu, a=a_true))[0]
    final_a = dict(misfit_u=final_row(p_a)[0], **errors(p_a))

    print("(b) the viscosity from E(t_j)", file=sys.stderr)
    tic = time.perf_counter()
    p_b, rows_b = minimise(step, dict(log_nu=jnp.asarray(np.log(args.nu_start)), a=jnp.zeros(M)), flow, data,
                           jnp.asarray([0.0, 1.0]), dict(log_nu=jnp.asarray(1.0), a=jnp.zeros(M)),
                           args.nu_iterations, opt)
    seconds_b = time.perf_counter() - tic
    nu_found = float(jnp.exp(p_b["log_nu"]))

    result = dict(
        **record("ns_inverse"),
        description="(a) the initial velocity (Taylor-Green + 52 divergence-free Fourier modes) from a noisy "
                    "observation of u(T); (b) the viscosity from E(t_j); optax L-BFGS through NS steps with "
                    "Checkpointing(snapshots=k)",
        optax_version=optax.__version__, args=vars(args),
        elements=int(sem.num_elements), order=int(sem.order), nodes=int(sem.num_global),
        unknowns_per_step=4 * int(sem.num_global), modes=int(M), steps=args.steps, dt=args.dt, T=args.steps * args.dt,
        snapshots=args.snapshots, recomputed_steps=ck.recomputed_steps(args.steps), samples=args.samples,
        state_bytes=int(state_bytes),
        gradient_check=dict(relative_difference_log_nu=rel["log_nu"], relative_difference_a=rel["a"],
                            passed=max(rel.values()) <= 1e-10, xla_temp_bytes_plain=memory["plain"],
                            xla_temp_bytes_snapshots=memory["snapshots"]),
        initial_condition=dict(
            iterations=args.iterations, initial_loss=rows_a[0]["loss"], final_loss=final_a["misfit_u"],
            misfit_of_truth=floor, final=final_a, initial=errors(p0), history=rows_a,
            a_true=np.asarray(a_true).tolist(), a_recovered=np.asarray(p_a["a"]).tolist(), seconds=seconds_a),
        viscosity=dict(
            iterations=args.nu_iterations, nu_true=args.nu, nu_start=args.nu_start, nu_recovered=nu_found,
            relative_error=abs(nu_found - args.nu) / args.nu, initial_loss=rows_b[0]["loss"],
            final_loss=final_row(p_b)[1], history=rows_b, seconds=seconds_b,
            energy_observed=np.asarray(data["energy"]).tolist(), energy_initial=float(data["energy0"])),
        seconds=dict(setup=setup_seconds, data=data_seconds, gradient_check=check_seconds,
                     compile_lbfgs_step=compile_seconds, initial_condition=seconds_a, viscosity=seconds_b),
    )
    return result, dict(flow=flow, forward=forward, a_true=a_true, p_a=p_a, p_b=p_b, ck=ck)


def plot(result, S, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ra, rb = result["initial_condition"], result["viscosity"]
    fig, ax = plt.subplots(2, 3, figsize=(16, 9))
    ha = ra["history"]
    ax[0, 0].semilogy([r["loss"] for r in ha] + [ra["final_loss"]], "o-", ms=3, label=r"$J_u$")
    ax[0, 0].semilogy([r["field_error"] for r in ha] + [ra["final"]["field_error"]], "s-", ms=3,
                      label=r"$\|u^0 - u^0_*\| / \|u^0_* - u_{TG}\|$")
    ax[0, 0].axhline(ra["misfit_of_truth"], color="k", ls="--", lw=0.8, label="misfit of the truth (noise)")
    ax[0, 0].set(title="(a) L-BFGS: misfit and initial-field error", xlabel="iteration")
    ax[0, 0].legend(fontsize=8)
    # the perturbation u⁰ − u_TG, x-component, on the plane z = 0
    s = np.linspace(-np.pi, np.pi, 97)
    X, Y = np.meshgrid(s, s, indexing="xy")
    phi = np.asarray(modes(jnp.asarray(X), jnp.asarray(Y), jnp.zeros_like(jnp.asarray(X))))
    true = np.tensordot(np.asarray(ra["a_true"]), phi, 1)[0]
    found = np.tensordot(np.asarray(ra["a_recovered"]), phi, 1)[0]
    lim = np.abs(true).max()
    for a, v, t in ((ax[0, 1], true, "true"), (ax[0, 2], found, "recovered")):
        im = a.pcolormesh(X, Y, v, vmin=-lim, vmax=lim, cmap="RdBu_r", shading="auto")
        a.set(title=rf"(a) {t} $u^0_x - u_{{TG,x}}$ at $z = 0$", xlabel="x", ylabel="y", aspect="equal")
        fig.colorbar(im, ax=a)
    ax[1, 0].plot(ra["a_true"], ra["a_recovered"], "o", ms=4)
    lo, hi = min(ra["a_true"]), max(ra["a_true"])
    ax[1, 0].plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax[1, 0].set(title=f"(a) the {result['modes']} mode amplitudes", xlabel="true", ylabel="recovered")
    t = result["dt"] * np.arange(result["steps"] + 1)
    every = result["steps"] // result["samples"]
    forward, flow, ck = S["forward"], S["flow"], S["ck"]
    zeros = jnp.zeros(result["modes"])
    for nu, style, label in ((rb["nu_start"], "C1--", "start"), (rb["nu_recovered"], "C0-", "recovered")):
        e = np.asarray(forward(flow, jnp.asarray(np.log(nu)), zeros, result["steps"], ck)[1])
        ax[1, 1].plot(t, np.r_[rb["energy_initial"], e], style, label=rf"{label}, $\nu$ = {nu:.6g}")
    ax[1, 1].plot(t[every::every], rb["energy_observed"], "ko", label=rf"observed ($\nu$ = {rb['nu_true']:g})")
    ax[1, 1].set(title="(b) kinetic energy", xlabel="t", ylabel=r"$E_k$")
    ax[1, 1].legend(fontsize=8)
    hb = rb["history"]
    ax[1, 2].semilogy([max(r["loss"], 1e-32) for r in hb] + [max(rb["final_loss"], 1e-32)], "o-", ms=3, label=r"$J_E$")
    ax[1, 2].semilogy([abs(r["nu"] / rb["nu_true"] - 1) for r in hb] + [rb["relative_error"]], "s-", ms=3,
                      label=r"$|\nu/\nu_{\rm true} - 1|$")
    ax[1, 2].set(title="(b) L-BFGS on log ν", xlabel="iteration")
    ax[1, 2].legend(fontsize=8)
    fig.suptitle(f"Navier–Stokes inverse problems: {result['elements']} elements of order {result['order']}, "
                 f"{result['steps']} steps, Checkpointing(snapshots={result['snapshots']}); "
                 f"initial-field error {ra['final']['field_error']:.2e}, ν error {rb['relative_error']:.1e}",
                 fontsize=10)
    plt.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse(argv)
    tic = time.perf_counter()
    result, S = run(args)
    result["seconds"]["total"] = time.perf_counter() - tic
    write_json(args.out + ".json", result)
    if not args.no_plot:
        plot(result, S, args.out + ".png")
    ra, rb = result["initial_condition"], result["viscosity"]
    print(f"(a) J {ra['initial_loss']:.3e} -> {ra['final_loss']:.3e} (truth {ra['misfit_of_truth']:.3e}); "
          f"initial-field error {ra['initial']['field_error']:.3f} -> {ra['final']['field_error']:.3e}")
    print(f"(b) nu {rb['nu_start']} -> {rb['nu_recovered']:.10f} (true {rb['nu_true']}), "
          f"relative error {rb['relative_error']:.1e}")
    print(f"gradient check {result['gradient_check']}; {result['seconds']['total']:.0f} s")
    return 0 if result["gradient_check"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
