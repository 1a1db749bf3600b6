"""PCG iterations and time to a tolerance: p-multigrid (Chebyshev-smoothed V-cycle) against Jacobi.

BPk (default BP5) on the deformed unit box for each order p and mesh of K³ elements:
for each tolerance (relative true residual), the iterations, the solve time (best of
``--repeats`` compiled runs), the pMG setup time, and the largest difference between the
two solutions. The issue's reference points: Jacobi-PCG on 4³ elements (deform 0.1,
tol 1e-14) needs 114 iterations at p = 4, 192 at p = 6, 282 at p = 8; NekRS's pMG needs
28 iterations to 1e-8 on its Kershaw BPS5 case. ``--cost`` also times one V-cycle, its
coarse solve and one operator application on the finest level (a V-cycle's cost in
operator applications, BK5-equivalents for BP5).

    python -m experiments.pmg_iterations                                  # seconds on a CPU
    python -m experiments.pmg_iterations --orders 2 3 4 5 6 7 8 --elements 4 --tols 1e-8 1e-10
    python -m experiments.pmg_iterations --orders 7 --elements 4 8 16 32 --no-jacobi --cost   # a GPU

Writes ``--out`` (JSON) and a PNG of iterations against p beside it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import time

import jax
import jax.numpy as jnp

import jaxsem
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson
from jaxsem.solvers import chebyshev, multigrid

from experiments.common import record


def _solver(tol: float, method: str, maxiter: int):
    """``(sem, pmg | None, b) -> (u, PCGInfo)`` compiled: ``poisson.solve`` with the V-cycle or Jacobi."""
    return jax.jit(lambda sem, pmg, b: poisson.solve(sem, None, tol=tol, maxiter=maxiter, rhs=b, method=method,
                                                     precond=pmg))


def _best_time(fn, args, repeats: int):
    out = jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return out, best


def _cost(sem, pmg, repeats: int, n: int = 10) -> dict:
    """Seconds of one V-cycle, of its coarse solve and of one fine operator application."""
    b = sem.mask * sem.dssum(sem.mult * jnp.sin(7 * sem.x[0] + 3 * sem.x[1] * sem.x[2]))
    A = poisson.operator(sem)
    c = pmg.levels[-1]
    bc = c.sem.mask * c.sem.dssum(c.sem.mult * jnp.sin(7 * c.sem.x[0] + 3 * c.sem.x[1]))
    Ac = pmg.level_operator(len(pmg.levels) - 1)
    loops = {
        "vcycle": (lambda p, r: jax.lax.fori_loop(0, n, lambda i, v: multigrid.vcycle(p, v) * 1e-3 + r, r), b),
        "coarse": (lambda p, r: jax.lax.fori_loop(
            0, n, lambda i, v: chebyshev.first_kind(Ac, c.dinv, c.lmin, c.rho, p.coarse_steps, v) * 1e-3 + r, r),
            bc),
        "operator": (lambda p, r: jax.lax.fori_loop(0, n, lambda i, v: A(v) * 1e-3 + r, r), b),
    }
    out = {}
    for name, (fn, r) in loops.items():
        _, t = _best_time(jax.jit(fn), (pmg, r), repeats)
        out[f"{name}_seconds"] = t / n
    out["vcycle_in_operators"] = out["vcycle_seconds"] / out["operator_seconds"]
    out["coarse_fraction"] = out["coarse_seconds"] / out["vcycle_seconds"]
    return out


def run_case(bp, K, p, args) -> dict:
    mesh = box_mesh(K, p, deform=args.deform)
    sem = poisson.bp_discretize(mesh, bp, dtype=jnp.dtype(args.dtype), backend=args.backend)
    b = poisson.load(sem, poisson.manufactured(bp).f)
    options = multigrid.PMGOptions(degree=args.degree, coarse_reduction=args.coarse_reduction,
                                   dtype=args.cycle_dtype)
    t = time.perf_counter()
    pmg = jax.block_until_ready(poisson.pmg(sem, options=options))
    setup_cold = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(poisson.pmg(sem, options=options))
    setup_warm = time.perf_counter() - t
    row = dict(bp=bp, backend=sem.backend.name, elements=K, order=p, dofs=K**3 * p**3, orders=list(pmg.orders), coarse_steps=pmg.coarse_steps,
               rho=[float(lv.rho) for lv in pmg.levels], coarse_lmin=float(pmg.levels[-1].lmin),
               setup_seconds=setup_cold, setup_seconds_warm=setup_warm, tols={})
    for tol in args.tols:
        res = {}
        for name, pre in (("pmg", pmg), ("jacobi", None)):
            if pre is None and args.no_jacobi:
                continue
            (u, info), secs = _best_time(_solver(tol, args.method, args.maxiter), (sem, pre, b), args.repeats)
            res[name] = dict(iterations=int(info.iterations), converged=bool(info.converged),
                             true_relative_residual=float(info.true_relative_residual), seconds=secs)
            res[name + "_u"] = u
        if "jacobi" in res:
            uj = res["jacobi_u"]
            res["solution_difference"] = float(jnp.max(jnp.abs(res["pmg_u"] - uj)) / jnp.max(jnp.abs(uj)))
            res["speedup"] = res["jacobi"]["seconds"] / res["pmg"]["seconds"]
        row["tols"][f"{tol:g}"] = {k: v for k, v in res.items() if not k.endswith("_u")}
    if args.cost:
        row["cost"] = _cost(sem, pmg, args.repeats)
    return row


def _plot(rows, path: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    tols = list(rows[0]["tols"])
    markers = "os^vDP*X"
    for ti, tol in enumerate(tols):
        for ki, K in enumerate(sorted({r["elements"] for r in rows})):
            sel = sorted((r for r in rows if r["elements"] == K), key=lambda r: r["order"])
            ps = [r["order"] for r in sel]
            for name, style in (("pmg", "-"), ("jacobi", "--")):
                its = [r["tols"][tol].get(name, {}).get("iterations") for r in sel]
                if any(i is not None for i in its):
                    ax.plot(ps, its, style, marker=markers[ki % len(markers)], color=f"C{ti}",
                            label=f"{name}, {K}³ elements, tol {tol}")
    ax.set_xlabel("order p")
    ax.set_ylabel("PCG iterations")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("BP%d on the deformed unit box: p-multigrid (solid) and Jacobi (dashed)" % rows[0]["bp"],
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--bp", type=int, default=5, choices=(3, 5), help="bake-off problem (default 5)")
    ap.add_argument("--orders", type=int, nargs="+", default=[2, 4], help="orders p (default 2 4)")
    ap.add_argument("--elements", type=int, nargs="+", default=[3], help="elements per axis K (default 3)")
    ap.add_argument("--tols", type=float, nargs="+", default=[1e-8], help="relative tolerances (default 1e-8)")
    ap.add_argument("--deform", type=float, default=0.1)
    ap.add_argument("--degree", type=int, default=2, help="Chebyshev smoother degree (default 2)")
    ap.add_argument("--coarse-reduction", type=float, default=0.1)
    ap.add_argument("--method", default="classic", choices=("classic", "single-reduction"),
                    help="PCG variant (both apply the preconditioner once per iteration)")
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    ap.add_argument("--cycle-dtype", default=None, choices=("float32",),
                    help="run the V-cycle in float32 inside the --dtype solve (flexible CG)")
    ap.add_argument("--backend", default="auto", choices=("auto", "einsum", "cuda"))
    ap.add_argument("--maxiter", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per solve (best kept)")
    ap.add_argument("--no-jacobi", action="store_true", help="skip the Jacobi-PCG solves")
    ap.add_argument("--cost", action="store_true", help="time a V-cycle, its coarse solve and one operator")
    ap.add_argument("--out", default="pmg_iterations.json", help="JSON output (a PNG is written beside it)")
    args = ap.parse_args(argv)

    rows = []
    for K in args.elements:
        for p in args.orders:
            row = run_case(args.bp, K, p, args)
            rows.append(row)
            brief = {t: {k: (v["iterations"], round(v["seconds"], 4)) for k, v in r.items() if isinstance(v, dict)}
                     for t, r in row["tols"].items()}
            print(f"K={K} p={p} levels={row['orders']} coarse_steps={row['coarse_steps']} "
                  f"setup={row['setup_seconds']:.2f}s {brief}" + (f" cost={row['cost']}" if "cost" in row else ""),
                  flush=True)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=pathlib.Path(jaxsem.__path__[0]).parent).stdout.strip() or None
    except OSError:
        rev = None
    dev = jax.devices()[0]
    res = dict(record("pmg_iterations"), platform=dev.platform, jaxsem_commit=rev,
               deform=args.deform, degree=args.degree, method=args.method, dtype=args.dtype,
               cycle_dtype=args.cycle_dtype or args.dtype, rows=rows)
    out = pathlib.Path(args.out)
    out.write_text(json.dumps(res, indent=1))
    _plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
