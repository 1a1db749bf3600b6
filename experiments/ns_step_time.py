"""Navier–Stokes time per step (Taylor–Green, Re = 1600, BDF3/EXT3, pMG pressure) over devices: warm timing.

For each mesh and device count P: setup, one sample interval to compile and pass the start-up, then
``--steps`` timed steps (one jitted chunk); reports ms per step, the pressure and velocity iterations
of the last step, and the time of each part alone: one convective term, one curl-curl, one pressure
solve and one velocity solve (the step's own right-hand sides), and one gather–scatter (``dssum``) of
the velocity, its neighbour exchange included (a jitted loop of 20). Transports as in ``scaling.py``:
``shard`` (``--devices`` of this process, or of every process started by ``mpirun``) or ``mpi``
(``mpirun -n P``, one process per device, mpi4jax). Rows go to ``--out`` (JSON) as they finish;
strong-scaling η = t₁/(P·t_P) from them with
``scaling.efficiencies(rows, size="points", per_rank="points_per_rank", time="ms_per_step")``.

``--trace DIR`` (one device) then runs the timed steps and the pressure solve alone once more under
``jax.profiler.trace`` (Perfetto) and adds to the row, for each, the GPU time per kernel name (the
``--trace-top`` largest: µs, launches, share of the traced GPU time, the HLO instruction's output type
where the trace names it) and per group: the operator kernels (stiffness/BK5/mass, by element size
n = p + 1 of the level), gather–scatter, convection, XLA's elementwise fusions, XLA's reductions
(the CG and Chebyshev dot products, norms), matrix products, copies, other.

    python -m experiments.ns_step_time --order 7 --elements 36 --dt 3e-3 --steps 20 --pressure-tol 1e-6 \\
        --velocity-tol 1e-8 --cycle-dtype float32 --trace /tmp/trace --out tgv36_profile.json  # one GPU

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m experiments.ns_step_time \\
        --order 3 --elements 4 --steps 5 --devices 1,2                 # a CPU, a minute
    mpirun -n 2 python -m experiments.ns_step_time --order 3 --elements 4 --steps 5 \\
        --transport mpi                                                # a CPU, one process per device
    NCCL_NVLS_ENABLE=0 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --devices 1,2 --out ns_shard.json                              # 2 GPUs, one process
    NCCL_NVLS_ENABLE=0 mpirun -n 2 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --devices 2 --out ns_multi.json                                # 2 GPUs, one process each, one device mesh
    mpirun -n 2 python -m experiments.ns_step_time --order 7 --elements 16 32 --steps 100 \\
        --transport mpi --out ns_mpi.json                              # 2 GPUs, mpi4jax
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.elliptic import solve_local
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers import multigrid
from jaxsem.parallel.comm import gspmd_on_gpus

from experiments.common import Placements, Results, add_transport_args, best_seconds


GROUPS = ("operator", "gather_scatter", "convection", "xla_elementwise", "xla_reduction", "matmul", "copies", "other")


def kernel_group(name: str) -> str:
    """The group of a GPU kernel (or copy) name of the trace: ``operator`` (the CUDA stiffness, BK5
    and mass kernels of ``jaxsem/backends/csrc``), ``gather_scatter`` (``gs_csr_kernel``, XLA's
    scatters and gathers), ``convection``, ``xla_reduction``, ``matmul``, ``copies``,
    ``xla_elementwise`` (XLA's loop fusions) or ``other``."""
    n = name.lower()
    if re.search(r"bk5\w*_kernel|stiffness\w*_kernel|mass_lines_kernel|mass\w*_kernel", n):
        return "operator"
    if "gs_csr" in n or "scatter" in n or "gather" in n:
        return "gather_scatter"
    if re.search(r"\bconvt?_kernel|advection_kernel", n):
        return "convection"
    if any(k in n for k in ("memcpy", "memset", "copy", "transpose", "dynamic_update_slice", "concatenate")):
        return "copies"
    if "reduce" in n or "reduction" in n or "cub::" in n:
        return "xla_reduction"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "cublas", "triton", "dot_", "_dot")):
        return "matmul"
    if "fusion" in n or n.startswith(("loop_", "input_", "wrapped_")):
        return "xla_elementwise"
    return "other"


def _hlo_types(hlo: str) -> dict:
    """``{instruction name: "type opcode(operands..."}`` of an optimized HLO module's text (names
    also with ``.``/``-`` as ``_``, the kernels' spelling); an operand-less scalar's type is followed
    by its operands' types (``<-``), and ``where`` (below) by its source."""
    out, operands, frames = {}, {}, _hlo_frames(hlo)
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$", hlo, re.M):
        name, rest = m.group(1), m.group(4)
        ty = f"{m.group(2)[:200]} {m.group(3)}"
        sf = re.search(r"stack_frame_id=(\d+)", rest)
        where = frames.get(int(sf.group(1))) if sf else None
        ops = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        for key in (name, re.sub(r"[.\-]", "_", name)):
            out.setdefault(key, ty + (f" @ {where}" if where else ""))
            operands.setdefault(key, ops)
    for key, ty in list(out.items()):  # a reduction's level: its operands'
        if not re.search(r"\[\d", ty.split(" @ ")[0]):
            ins = [out.get(o, "").split(" @ ")[0].split(" ")[0] for o in operands[key][:3]]
            if any(ins):
                src = f" <- {','.join(ins)}"
                out[key] = ty.replace(" @ ", src + " @ ", 1) if " @ " in ty else ty + src
    return out


def _hlo_frames(hlo: str) -> dict:
    """``{stack_frame_id: "file:line function < caller ..."}`` (jaxsem's and experiments' frames,
    innermost first, at most four) from the HLO text's stack-frame tables; {} if there are none."""
    try:
        def table(title, pattern):
            m = re.search(rf"^{title}\n((?:\d+ .*\n)+)", hlo, re.M)
            return {int(r[0]): r[1:] for r in re.findall(pattern, m.group(1))} if m else {}
        files = table("FileNames", r'^(\d+) "(.*)"$'.replace("^", "(?m)^", 1))
        funcs = table("FunctionNames", r'^(\d+) "(.*)"$'.replace("^", "(?m)^", 1))
        locs = table("FileLocations", r"(?m)^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)")
        stack = table("StackFrames", r"(?m)^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)")
        out = {}
        for fid in stack:
            chain, seen, f = [], set(), fid
            while f in stack and f not in seen:
                seen.add(f)
                loc, parent = int(stack[f][0]), int(stack[f][1])
                if loc in locs:
                    fi, fu, line = (int(v) for v in locs[loc])
                    path = files.get(fi, ("?",))[0]
                    if "jaxsem/" in path or "experiments/" in path:
                        short = path.split("jaxsem/", 1)[-1] if "jaxsem/" in path else path.split("experiments/", 1)[-1]
                        chain.append(f"{short}:{line} {funcs.get(fu, ('?',))[0]}")
                f = parent
            out[fid] = " < ".join(chain[:4])
        return out
    except Exception as e:  # the tables are a printing detail: never fail the run over them
        return {0: f"frames unreadable: {e!r}"}


def _level(ty: str | None, E: int) -> str | None:
    """The level an HLO instruction works on, from the first array shape of ``ty`` (the output's,
    then the operands', a reduction's): ``n8`` for ``[..., E, 8, 8, 8]`` (an E-vector of order 7),
    ``343/el`` for a flat ``[..., E·343]`` (assembled storage: 343 = p³ unique points an element
    at p = 7; any flat multiple of E); None if neither."""
    if not ty:
        return None
    for dims in re.findall(r"\[([\d,]+)\]", ty):
        d = [int(v) for v in dims.split(",") if v]
        if len(d) >= 3 and d[-1] == d[-2] == d[-3] and d[-1] > 1 and (not E or E in d[:-3]):
            return f"n{d[-1]}"
        if d and E and d[-1] >= E and d[-1] % E == 0:
            return f"{d[-1] // E}/el"
    return None


def kernel_profile(folder: str, top: int = 40, hlo: str | None = None, E: int = 0, per: int = 1,
                   sequence: int = 0) -> dict:
    """GPU time by kernel name in the Perfetto trace under ``folder`` (the device's processes):
    the total, each group's (:func:`kernel_group`; also by level, :func:`_level`, and dtype), the
    GPU time by the innermost jaxsem source line of each kernel's HLO instruction, and the
    ``top`` largest kernels with their launches, share and, where the trace names the HLO
    instruction, its output type from ``hlo``. ``per``: divides the totals into ``*_per`` (per
    step or per iteration); ``sequence``: also the first that many GPU events in time order (name,
    µs, start µs, group, level and dtype). On a CPU (no GPU process) only the event count."""
    files = glob.glob(f"{folder}/plugins/profile/*/perfetto_trace.json.gz")
    if not files:
        return dict(error=f"no perfetto_trace.json.gz under {folder}")
    ev = json.load(gzip.open(sorted(files)[-1]))["traceEvents"]
    gpu = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
           and "GPU" in str(e.get("args", {}).get("name", ""))}
    if not gpu:
        return dict(gpu_events=0, events=sum(e.get("ph") == "X" for e in ev),
                    note="no GPU process in the trace (a CPU run): nothing to sum")
    types = _hlo_types(hlo) if hlo else {}
    total, count, ops, durs, seq = collections.Counter(), collections.Counter(), {}, collections.defaultdict(list), []
    span = [float("inf"), 0.0]
    for e in ev:
        if e.get("ph") == "X" and e.get("pid") in gpu:
            name = e["name"]
            total[name] += e.get("dur", 0.0)
            count[name] += 1
            durs[name].append(e.get("dur", 0.0))
            if sequence:
                seq.append((e.get("ts", 0.0), name, e.get("dur", 0.0)))
            span[0], span[1] = min(span[0], e.get("ts", 0.0)), max(span[1], e.get("ts", 0.0) + e.get("dur", 0.0))
            op = (e.get("args") or {}).get("hlo_op")
            if op and name not in ops:
                ops[name] = op
    T = sum(total.values())
    groups = collections.Counter()
    launches = collections.Counter()
    by_level, by_source = collections.Counter(), collections.Counter()
    for name, t in total.items():
        g = kernel_group(name)
        groups[g] += t
        launches[g] += count[name]
        ty = types.get(ops.get(name, name)) or types.get(name)
        lv = _level(ty, E) or (f"n{_template_n(name)}" if _template_n(name) else "?")
        by_level[f"{g} {lv} {_dtype(name, ty)}"] += t
        by_source[(ty or "").split(" @ ", 1)[1].split(" < ")[0] if " @ " in (ty or "") else "?"] += t
    sample = next((e.get("args") for e in ev if e.get("ph") == "X" and e.get("pid") in gpu and e.get("args")), {})
    return dict(
        gpu_us=T, gpu_span_us=span[1] - span[0], launches=sum(count.values()), per=per, gpu_ms_per=T / per / 1e3,
        kernels_total=len(total),
        groups={g: dict(us=groups[g], share=groups[g] / T if T else 0.0, ms_per=groups[g] / per / 1e3,
                        launches=launches[g]) for g in GROUPS},
        by_group_and_level={k: dict(us=v, share=v / T if T else 0.0) for k, v in by_level.most_common()},
        by_source_line={k: dict(us=v, share=v / T if T else 0.0) for k, v in by_source.most_common(top)},
        kernels=[dict(name=k[:300], group=kernel_group(k), us=t, launches=count[k], share=t / T if T else 0.0,
                      us_per_launch=t / count[k], us_min=min(durs[k]), us_median=float(np.median(durs[k])),
                      us_max=max(durs[k]), hlo_op=ops.get(k),
                      type=types.get(ops.get(k, k)) or types.get(k)) for k, t in total.most_common(top)],
        trace_event_args_example=sorted(sample)[:20],
        **(dict(sequence=[[n[:90], d, ts - min(seq)[0], kernel_group(n),
                           _level(types.get(n), E) or (f"n{_template_n(n)}" if _template_n(n) else "?"),
                           _dtype(n, types.get(n))] for ts, n, d in sorted(seq)[:sequence]]) if seq else {}))


def _dtype(name: str, ty: str | None) -> str:
    """f32 or f64 from an HLO output type or a CUDA kernel's template arguments; ``?`` if neither."""
    if ty:
        m = re.search(r"\b(f32|f64|bf16|f16|s32|pred)\[", ty)
        if m:
            return m.group(1)
    m = re.search(r"_kernel<[^>]*\b(float|double)\b", name)
    return {"float": "f32", "double": "f64"}[m.group(1)] if m else "?"


def _template_n(name: str) -> int | None:
    """n of a CUDA kernel's template arguments (``bk5_lines_kernel<8, float, ...>``), if any."""
    m = re.search(r"_kernel<(\d+)", name)
    return int(m.group(1)) if m else None


def traced(fn, args, folder: str, top: int, E: int, per: int, sequence: int = 0) -> dict:
    """Run ``fn(*args)`` (an AOT-compiled program) once under ``jax.profiler.trace`` into ``folder``
    and return :func:`kernel_profile` of it, its wall seconds too."""
    jax.block_until_ready(fn(*args))
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        wall = time.perf_counter() - t
    hlo = fn.as_text() if hasattr(fn, "as_text") else None
    return dict(wall_ms_traced=1e3 * wall, **kernel_profile(folder, top, hlo, E, per, sequence))


def case(mesh, K, dt, steps, backend, where, options=NS.NSOptions(), trace=None, top=40, sequence=0):
    t = time.perf_counter()
    ns = NS.setup(mesh, nu=1 / 1600, dt=dt, backend=backend, options=options, **where)
    st = NS.initial_state(ns, flows.taylor_green().velocity)
    setup = time.perf_counter() - t
    # every program of the measurement compiles under GSPMD over several GPUs, as NS.run's own chunks do:
    # XLA's GPU compiler crashes on them under Shardy (parallel.comm.gspmd_on_gpus)
    with gspmd_on_gpus(ns.sem.comm):
        start = dt * max(1, round(0.1 / dt))  # about t = 0.1, in whole steps
        st, s, _ = NS.run(ns, st, start, sample_interval=start)
        many = jax.jit(lambda ns, st: jax.lax.fori_loop(0, steps, lambda i, x: NS.step(ns, x)[0], st))
        if trace:  # compiled ahead, so that the trace's kernels are named in the HLO text of the same program
            many = many.lower(ns, st).compile()
        t_step = best_seconds(many, ns, st, repeats=2) / steps
        _, info = jax.jit(NS.step)(ns, st)
        conv = jax.jit(lambda ns, u: ns.sem.local_map(lambda s_, ns_, u_: NS.scheme._convection(ns_, s_, u_), ns, u))
        t_conv = best_seconds(conv, ns, st.u)
        curlcurl = jax.jit(lambda ns, u: ns.sem.local_map(
            lambda s_, ns_, u_: NS.scheme._curl(ns_, s_, NS.scheme._curl(ns_, s_, u_)), ns, u))
        t_cc = best_seconds(curlcurl, ns, st.u)
        reps = 20
        gs_loop = jax.jit(lambda ns, u: ns.sem.local_map(
            lambda s_, u_: jax.lax.fori_loop(0, reps, lambda i, v: s_.dssum(v) * 0.125, u_), u))
        t_gs = best_seconds(gs_loop, ns, st.u) / reps
        # the step's own pressure and velocity right-hand sides (periodic: no lift), then each solve alone
        beta_, a_ = NS.bdf_ext(ns.options.time_order)
        beta, a, h2 = jnp.asarray(beta_), jnp.asarray(a_), beta_[0] / dt

        def rhs(s_, ns_, st_):
            F = jnp.concatenate([NS.scheme._convection(ns_, s_, st_.U[0])[None], st_.F])
            Ub, Fx, ux = jnp.tensordot(beta[1:], st_.U, 1) / ns_.dt, jnp.tensordot(a, F, 1), jnp.tensordot(a, st_.U, 1)
            R = Ub + Fx - ns_.nu * NS.scheme._curl(ns_, s_, NS.scheme._curl(ns_, s_, ux))
            return s_.dssum(NS.scheme._weak_grad_t(s_, R)), s_.mask * s_.dssum(s_.bmass * (Ub + Fx)), s_.mask * ux

        bp, bv, x0 = jax.jit(lambda ns, st: ns.sem.local_map(rhs, ns, st))(ns, st)
        psolve = jax.jit(lambda ns, b, p0: ns.sem.local_map(lambda s_, ns_, b_, p_: NS.scheme._pressure_solve(ns_, b_, p_, 0.0),
                                                            ns, b, p0))
        vsolve = jax.jit(lambda ns, b, x: ns.sem.local_map(
            lambda s_, ns_, b_, x_: solve_local(NS.scheme._velocity(ns_, h2), b_, x0=x_, tol=ns_.options.velocity_tol, maxiter=ns_.options.velocity_maxiter), ns, b, x))
        if trace:
            psolve = psolve.lower(ns, bp, st.p).compile()
        t_p = best_seconds(psolve, ns, bp, st.p)
        t_v = best_seconds(vsolve, ns, bv, x0)
        pits, vits = int(psolve(ns, bp, st.p)[1].iterations), int(vsolve(ns, bv, x0)[1].iterations)
        p = mesh.order
        prof = {}
        if trace:
            E = K**3
            prof = dict(trace=dict(
                steps=traced(many, (ns, st), f"{trace}/E{K}_p{p}_steps", top, E, steps),
                pressure_solve=traced(psolve, (ns, bp, st.p), f"{trace}/E{K}_p{p}_pressure_solve", top, E, pits,
                                      sequence),
                pmg_orders=list(ns.pressure.pmg.orders) if ns.pressure.pmg is not None else None,
                note="steps: per = the steps of one traced call; pressure_solve: per = its iterations. Shares are of "
                     "the GPU kernel time summed over the trace (gpu_us); wall_ms_traced includes the profiler's cost."))
        return prof | dict(transport=ns.sem.comm.name, backend=ns.sem.backend.name, elements=K, order=p,
                    pressure_tol=options.pressure_tol, velocity_tol=options.velocity_tol,
                    cycle_dtype=str(options.pmg.dtype or "float64"),
                    points=K**3 * p**3, dt=dt, steps=steps, setup_seconds=setup, ms_per_step=1e3 * t_step,
                    convection_ms=1e3 * t_conv, curl_curl_ms=1e3 * t_cc, pressure_solve_ms=1e3 * t_p,
                    pressure_solve_iterations=pits, velocity_solve_ms=1e3 * t_v, velocity_solve_iterations=vits,
                    dssum_ms=1e3 * t_gs, pressure_iterations=int(info.pressure.iterations),
                    velocity_iterations=int(info.velocity.iterations), compact_affine=ns.sem.affine is not None,
                    kinetic_energy=float(NS.diagnostics(ns, st).kinetic_energy))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, nargs="+", default=[4])
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--pressure-tol", type=float, default=NS.NSOptions.pressure_tol)
    ap.add_argument("--velocity-tol", type=float, default=NS.NSOptions.velocity_tol)
    add_transport_args(ap)
    ap.add_argument("--cycle-dtype", choices=["float64", "float32"], default="float64",
                    help="the pressure V-cycle's precision (float32: NekRS's mixed-precision multigrid)")
    ap.add_argument("--full-factors", action="store_true",
                    help="the CUDA backend reads the full geometric factors on affine meshes too (the "
                         "previous kernels, for a before/after measurement)")
    ap.add_argument("--trace", metavar="DIR", default=None,
                    help="also trace the steps and the pressure solve (jax.profiler, Perfetto) into DIR and "
                         "add the GPU time per kernel and per group to the row")
    ap.add_argument("--trace-top", type=int, default=40, help="kernels listed per trace (the largest)")
    ap.add_argument("--trace-sequence", type=int, default=0, metavar="N",
                    help="also list the pressure solve's first N GPU events in time order (0: none)")
    ap.add_argument("--out", default="ns_step_time.json")
    a = ap.parse_args(argv)
    if a.full_factors:
        from jaxsem.backends import CudaBackend
        CudaBackend.compact_affine = False
    at = Placements(a, ap)
    counts, rank, processes = at.counts, at.rank, at.processes
    rows = Results(a.out, "ns_step_time", write=rank == 0)
    for K in a.elements:
        mesh = js.box_mesh(K, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
        for P, where in ((P, at.where(P)) for P in counts):
            r = case(mesh, K, a.dt, a.steps, a.backend, where,
                     NS.NSOptions(pressure_tol=a.pressure_tol, velocity_tol=a.velocity_tol,
                                  pmg=multigrid.PMGOptions(dtype=None if a.cycle_dtype == "float64" else "float32")),
                     trace=a.trace, top=a.trace_top, sequence=a.trace_sequence)
            r.update(ranks=P, processes=processes, points_per_rank=r["points"] / P)
            rows.append(r)
            if rank == 0:
                print(r, flush=True)


if __name__ == "__main__":
    main()
