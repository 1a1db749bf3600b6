"""CEED bake-off benchmarks: BK1–BK6 kernel and BP1–BP6 Jacobi-PCG throughput.

Pure functions returning dicts (no printing); ``jaxsem bench`` formats them.
The definitions follow Fischer et al. (2020), "Scalability of high-performance
PDE solvers" (``seeds/ceed_bakeoff_scalability.txt``):

* BK: one application of the unassembled element operator to a random E-vector.
* BP: ``iterations`` (default 100) Jacobi-PCG iterations on the assembled
  operator with the manufactured right-hand side, no stopping test (tol = 0).

DOF counting. ``points = E·p³`` (p = order): the paper's n, "the total number of
parallel unique degrees of freedom, including all boundary unknowns" (its §2).
``dofs = components · E·p³``: for the vector problems BK/BP 2, 4, 6 all three
components count. The paper's evidence (§6): "for the scalar problems (BP1,
BP3, and BP5), the number of DOFs is equal to the number of grid points" (so
for vector problems it is not); its x-axis is *points* per node precisely so
that independent components collapse onto one curve, while the y-axis MDOFs
of BP2/4/6 count all components: BP6 reaches 76 MDOFs against BP5's 80, and
the BP2/BP1, BP4/BP3, BP6/BP5 ratios are "slightly in excess of unity"
(Fig. 11), which holds only if the vector problem's three-fold work is counted
as three-fold DOFs. Rates: ``dofs_per_second = dofs · iterations / seconds``
(BP; ``iterations`` is the count PCG reports) and ``dofs / seconds`` (BK).

Bandwidth model (:func:`bytes_per_dof`): the bytes one apply (BK) or one PCG
iteration (BP) must move per DOF with local (E-vector) storage, fully fused
streaming, integer index traffic and the small 1-D matrices neglected.
``percent_of_ceiling = 100 · dofs_per_second · bytes_per_dof / bandwidth``.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis
from ..discretization import assembled
from ..parallel.comm import Blocks, allreduce_sum
from ..mesh.box import _check_int_triple, box_mesh
from ..models import poisson
from ..backends import BACKENDS
from ..operators.bk import BK_SPECS, bk_apply
from ..solvers.pcg import pcg

__all__ = [
    "PROBLEMS", "bench", "bench_bk", "bench_bp", "bytes_per_dof", "measure_bandwidth",
    "device_info", "count_dofs", "time_bk", "time_bp", "bp_run", "rates", "time_median", "check_problem", "time_to_solution", "kernel_record",
]

PROBLEMS = tuple(f"bk{k}" for k in BK_SPECS) + tuple(f"bp{k}" for k in BK_SPECS)


# ----------------------------------------------------------------------------- checks

def check_problem(problem: str):
    """``"bk5"`` → ("bk", spec)."""
    if not isinstance(problem, str) or problem.lower() not in PROBLEMS:
        raise ValueError(f"problem must be one of {', '.join(PROBLEMS)}, got {problem!r}")
    p = problem.lower()
    return p[:2], BK_SPECS[int(p[2:])]


def _check_k(k, name="k"):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) not in BK_SPECS:
        raise ValueError(f"{name} must be one of 1..6, got {k!r}")
    return int(k)


def _check_elements(elements):
    return _check_int_triple(elements, "elements")


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_dtype(dtype):
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be float64 or float32, got {dtype!r}") from None
    if dt not in (jnp.float64, jnp.float32):
        raise ValueError(f"dtype must be float64 or float32, got {dtype!r}")
    return dt


def _check_bandwidth(bandwidth):
    if bandwidth is None:
        return None
    b = float(bandwidth)
    if not (np.isfinite(b) and b > 0):
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return b


# ----------------------------------------------------------------------------- models

def count_dofs(components: int, order: int, elements) -> tuple[int, int]:
    """``(points, dofs)`` = ``(E·p³, components·E·p³)`` (bake-off convention)."""
    E = int(np.prod(_check_elements(elements)))
    points = E * int(order) ** 3
    return points, int(components) * points


STORAGES = ("local", "assembled")


def bytes_per_dof(problem: str, order: int, dtype="float64", storage: str = "local") -> float:
    """Minimum bytes moved per DOF by one BK apply or one BP (PCG) iteration.

    Words per local node (n = p + 1 GLL nodes per axis, q quadrature points,
    ρ = (q/n)³, c components):

    * BK: read u and write w (2c), read the geometric data: ρ (mass, B) or 6ρ
      (stiffness, G: rr, rs, rt, ss, st, tt).
    * BP adds 12c + 5 for the fused vector work of an iteration:
      gs + mask + (p, w): read w, p, mask, mult, write w (3c + 2);
      x, r updates with (r, z), (r, r): read x, p, r, w, dinv, mult, write x, r (6c + 2);
      p = dinv·r + βp: read r, dinv, p, write p (3c + 1).

    bytes/DOF = words · itemsize · n³ / (c · p³). FP64, p = 7: BK5 95.5 B/DOF
    (SEEDS.md §1); BP5 298.5 B/DOF (SEEDS.md's rougher estimate is 269).

    ``storage="assembled"`` (BP only; vectors hold one value per global node, ≈ p³ per
    element): per local node the geometric data and the node map (int32, half a word);
    per global node the operator's gather of p, its zeroed output and the sum into it (3c),
    then p·Ap (2c), x += αp (3c), r -= αAp with z = dinv·r and the two dots (3c + 1),
    p = dinv·r + βp (3c + 1): bytes/DOF = itemsize · ((geometric + ½) n³ + (14c + 2) p³) / (c p³).
    FP64, p = 7: BP5 205.6 B/DOF.
    """
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    kind, spec = check_problem(problem)
    order = basis.check_order(order)
    item = _check_dtype(dtype).itemsize
    n = order + 1
    q = n if spec.quadrature == "gll" else order + 2
    rho = (q / n) ** 3
    c = spec.components
    geometric = (1 if spec.operator == "mass" else 6) * rho
    if kind == "bp" and storage == "assembled":
        return float(item * ((geometric + 0.5) * n**3 + (14 * c + 2) * order**3) / (c * order**3))
    words = 2 * c + geometric
    if kind == "bp":
        words += 12 * c + 5
    return float(words * item * n**3 / (c * order**3))


def rates(result: dict, bandwidth):
    """Add bytes_per_dof, bytes_per_second and (with ``bandwidth``) the ceiling."""
    bpd = bytes_per_dof(result["problem"], result["order"], result["dtype"], result.get("storage", "local"))
    result["bytes_per_dof"] = bpd
    result["bytes_per_second"] = result["dofs_per_second"] * bpd
    if bandwidth is not None:
        result["bandwidth"] = bandwidth
        result["ceiling_dofs_per_second"] = bandwidth / bpd
        result["percent_of_ceiling"] = 100.0 * result["dofs_per_second"] / (bandwidth / bpd)
    return result


def time_median(fn, args, repeats, inner: int = 1):
    """Time the compiled ``fn(*args)``: ``repeats`` samples of ``inner`` calls each.

    The ``inner`` calls of a sample are dispatched back to back and waited for
    once, so the host's dispatch of call k+1 overlaps the device running call k
    (a kernel's own time, as the bake-off measures it); each sample is
    (elapsed / inner). Returns (last output, seconds per call list).
    """
    times = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return out, times


def _check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def _note(progress, msg):
    if progress is not None:
        progress(msg)


# ----------------------------------------------------------------------------- BK

def bench_bk(
    k: int,
    order: int,
    elements,
    repeats: int = 10,
    dtype="float64",
    deform: float = 0.1,
    bandwidth: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    backend: str = "auto",
) -> dict:
    """Time the jitted BKk element operator on a random E-vector.

    Args:
      k: 1..6. order: p (1..20). elements: ``(Ex, Ey, Ez)`` or one int.
      repeats: timed applications after one untimed warm-up; ``seconds`` is
        their median (per apply), ``seconds_min`` the fastest.
      dtype: ``"float64"`` or ``"float32"``. deform: box deformation (curvilinear
        geometry; all six factors are stored either way).
      bandwidth: memory bandwidth in bytes/s for ``percent_of_ceiling``.
      progress: optional callback receiving one-line status messages.
      backend: element kernels, as :func:`jaxsem.discretize`; the result's ``backend``
        says which ran.

    Returns a dict: problem, backend [, cuda_variant, cuda_prefetch with "cuda"], order,
    elements, num_elements, components, points,
    dofs, dtype, deform, iterations (1), repeats, inner (applies per timed sample), seconds,
    seconds_min, times, setup_seconds, compile_seconds, dofs_per_second
    (dofs / seconds), bytes_per_dof, bytes_per_second [, bandwidth,
    ceiling_dofs_per_second, percent_of_ceiling].
    """
    repeats = _check_positive_int(repeats, "repeats")
    backend = _check_backend(backend)
    timer = lambda spec, sem, mesh: time_bk(spec, sem, repeats=repeats, seed=seed, progress=progress)
    return _bench("bk", k, order, elements, dtype, deform, bandwidth, progress, timer, backend)


def _bench(kind, k, order, elements, dtype, deform, bandwidth, progress, timer, backend) -> dict:
    """Validate, discretize BPk's box mesh once (timed as setup), run ``timer``, add rates."""
    k = _check_k(k)
    order = basis.check_order(order)
    ne = _check_elements(elements)
    dt = _check_dtype(dtype)
    bandwidth = _check_bandwidth(bandwidth)
    spec = BK_SPECS[k]

    _note(progress, f"setting up {kind}{k}: order {order}, elements {ne}")
    t0 = time.perf_counter()
    mesh = box_mesh(ne, order, deform=deform)
    sem = poisson.bp_discretize(mesh, k, dtype=dt, backend=backend)
    jax.block_until_ready(sem)
    setup = time.perf_counter() - t0
    result = timer(spec, sem, mesh)
    result.update(elements=list(ne), deform=float(deform), setup_seconds=setup)
    points, dofs = count_dofs(spec.components, order, ne)
    assert (points, dofs) == (result["points"], result["dofs"])
    return rates(result, bandwidth)


def kernel_record(spec, used: str, u, assembled: bool = False) -> dict:
    """For the CUDA kernels, the record of which ran: ``cuda_variant`` and ``cuda_prefetch``
    (:func:`jaxsem.backends.cuda.defaults` for this operator and the E-vector shape of ``u``;
    ``assembled``: BP3–BP6's fused kernels on assembled vectors, ``"bk5a"`` and ``"stiffnessa"``)."""
    if used != "cuda":
        return {}
    from ..backends import cuda as ck

    op = "bk5" if spec.quadrature == "gll" else spec.operator
    if assembled:
        op = {"bk5": "bk5a", "stiffness": "stiffnessa"}.get(op, op)
    variant, prefetch = ck.defaults(op, u)
    return dict(cuda_variant=variant, cuda_prefetch=prefetch, cuda_op=op)


BK_INNER = 5  # applies per timed BK sample, dispatched back to back (see _time)


def time_bk(spec, sem, repeats: int = 10, seed: int = 0, progress=None, inner: int = BK_INNER) -> dict:
    """Time BK ``spec`` with ``sem.backend``'s kernels on ``sem`` (see :func:`bench_bk`).

    Each of the ``repeats`` samples queues ``inner`` applies and waits once
    (per-apply time = elapsed / inner): a single apply of a few hundred µs
    would otherwise carry the host's dispatch and synchronisation latency.
    """
    shape = ((3,) if spec.components == 3 else ()) + sem.mask.shape
    dt = sem.x.dtype
    u = jax.random.normal(jax.random.PRNGKey(seed), shape, dt)
    args = (u, sem.J, sem.Dt, sem.geom.G, sem.geom.B)

    _note(progress, "compiling...")
    t0 = time.perf_counter()
    fn = jax.jit(lambda u, J, Dt, G, B: bk_apply(spec, u, J, Dt, G, B, sem.backend)).lower(*args).compile()
    jax.block_until_ready(fn(*args))  # warm-up
    compile_s = time.perf_counter() - t0

    _note(progress, f"timing {repeats}x{inner} applies...")
    _, times = time_median(fn, args, repeats, inner)
    seconds = statistics.median(times)
    E = int(allreduce_sum(jnp.asarray(sem.num_elements), sem.comm))  # all ranks' elements
    points = E * sem.order**3
    dofs = spec.components * points
    used = sem.backend.name
    return dict(
        problem=f"bk{spec.number}", backend=used, **kernel_record(spec, used, u), order=sem.order, num_elements=E,
        components=spec.components, points=points, dofs=dofs, dtype=jnp.dtype(dt).name,
        iterations=1, repeats=repeats, inner=inner, seconds=seconds, seconds_min=min(times), times=times,
        compile_seconds=compile_s, dofs_per_second=dofs / seconds,
    )


# ----------------------------------------------------------------------------- BP

def bench_bp(
    k: int,
    order: int,
    elements,
    iterations: int = 100,
    repeats: int = 5,
    dtype="float64",
    deform: float = 0.1,
    bandwidth: float | None = None,
    progress: Callable[[str], None] | None = None,
    backend: str = "auto",
    tol: float | None = None,
) -> dict:
    """Time ``iterations`` Jacobi-PCG iterations of BPk, compiled as one function, and the
    time to solution to ``tol`` with p-multigrid.

    Discretization, right-hand side b = load(f_manufactured) and the Jacobi
    diagonal are built once, outside the timing; the PCG run (tol = 0,
    maxiter = ``iterations``) is one jitted ``lax.while_loop``, compiled and
    run once untimed, then timed ``repeats`` times (``seconds``: median per
    full solve).

    Returns the keys of :func:`bench_bk` (with ``iterations`` the count PCG
    performed and ``dofs_per_second = dofs · iterations / seconds``) plus
    ``converged`` (None: no stopping test in fixed-iteration mode) and
    ``residual_reduction`` (‖r‖/‖b‖ after the run). ``backend``: as in :func:`bench_bk`.
    ``tol > 0``: also :func:`time_to_solution` (keys ``tts_*``; default 1e-8, 1e-5 in
    float32); 0 skips it.
    """
    tol = (1e-5 if jnp.dtype(dtype) == jnp.float32 else 1e-8) if tol is None else tol
    iterations = _check_positive_int(iterations, "iterations")
    repeats = _check_positive_int(repeats, "repeats")
    backend = _check_backend(backend)
    if not (tol == 0 or 0 < tol < 1):
        raise ValueError(f"tol must be 0 (no time to solution) or in (0, 1), got {tol!r}")

    def timer(spec, sem, mesh):
        r = time_bp(spec, sem, iterations=iterations, repeats=repeats, progress=progress)
        return r if tol == 0 else dict(r, **time_to_solution(spec, sem, mesh, tol, repeats, progress))
    return _bench("bp", k, order, elements, dtype, deform, bandwidth, progress, timer, backend)


def bp_run(spec, sem, iterations: int):
    """BP ``spec``'s fixed-iteration PCG solve on ``sem`` as ``(run, args)``: ``run(*args)``
    (jittable) does ``iterations`` Jacobi-PCG iterations (tol = 0) on b = load(f_manufactured)
    and returns ``(x, PCGInfo)``; ``args = (sem, b, dinv)``, built here. The vectors are in
    ``sem``'s storage: assembled (one value per global node) where ``sem.assembled`` is set,
    else E-vectors."""
    k = spec.number
    h1, h2 = poisson.coefficients(k)
    b = poisson.load(sem, poisson.manufactured(k).f)
    dinv = poisson.jacobi(sem, h1, h2)
    if sem.assembled is not None:
        # assembled vectors are per-rank blocks (Blocks): split over the devices when sharded
        b, dinv = sem.local_map(lambda s, b, d: Blocks(tuple(assembled.from_local(s.assembled, v, s.mult)
                                                             for v in (b, d))), b, dinv).value

        def run(sem, b, dinv):
            def local(s, bd):
                b, dinv = bd.value
                x, info = pcg(poisson.global_operator(s, h1, h2), b, dot=functools.partial(assembled.dot, s.assembled),
                              dots=functools.partial(assembled.dots, s.assembled), precond=lambda r: dinv * r,
                              tol=0.0, maxiter=iterations)
                return Blocks(x), info
            x, info = sem.local_map(local, Blocks((b, dinv)))
            return x.value, info
    else:
        def run(sem, b, dinv):
            A = poisson.operator(sem, h1, h2)
            return pcg(A, b, dot=sem.dot, dots=sem.dots, precond=lambda r: dinv * r, tol=0.0, maxiter=iterations)

    return run, (sem, b, dinv)


def time_bp(spec, sem, iterations: int = 100, repeats: int = 5, progress=None) -> dict:
    """Time ``iterations`` PCG iterations of BP ``spec`` on ``sem`` (see :func:`bench_bp`).

    ``sem`` must carry BP ``spec``'s quadrature and boundary conditions; the kernels are
    ``sem.backend``'s.
    """
    k = spec.number
    run, args = bp_run(spec, sem, iterations)
    b = args[1]
    jax.block_until_ready(args)

    _note(progress, "compiling...")
    t0 = time.perf_counter()
    fn = jax.jit(run).lower(*args).compile()
    jax.block_until_ready(fn(*args))  # warm-up
    compile_s = time.perf_counter() - t0

    _note(progress, f"timing {repeats} solves of {iterations} iterations...")
    (_, info), times = time_median(fn, args, repeats)
    seconds = statistics.median(times)
    its = int(info.iterations)
    E = int(allreduce_sum(jnp.asarray(sem.num_elements), sem.comm))  # all ranks' elements
    points = E * sem.order**3
    dofs = spec.components * points
    r0 = float(info.residual0)
    used = sem.backend.name
    return dict(
        problem=f"bp{k}", backend=used, storage="local" if sem.assembled is None else "assembled",
        **kernel_record(spec, used, jax.ShapeDtypeStruct(b.shape[:-1] + sem.mask.shape, b.dtype)
                        if sem.assembled is not None else b, sem.assembled is not None),
        order=sem.order, num_elements=E,
        components=spec.components, points=points, dofs=dofs, dtype=jnp.dtype(sem.x.dtype).name,
        iterations=its, converged=None,
        residual_reduction=float(info.residual) / r0 if r0 > 0 else float("nan"),
        repeats=repeats, seconds=seconds, seconds_min=min(times), times=times,
        compile_seconds=compile_s, dofs_per_second=dofs * its / seconds,
    )


def time_to_solution(spec, sem, mesh, tol: float = 1e-8, repeats: int = 5, progress=None) -> dict:
    """Seconds to solve BP ``spec`` on ``sem`` to relative residual ``tol`` with p-multigrid PCG.

    The preconditioner's setup (``tts_setup_seconds``: levels, Lanczos bounds) is timed apart
    from the compiled solve (``tts_seconds``: median of ``repeats``); ``tts_iterations``,
    ``tts_converged``, and ``tts_jacobi_iterations`` = the iterations Jacobi-PCG needs (not
    timed: it can take thousands).
    """
    k = spec.number
    h1, h2 = poisson.coefficients(k)
    b = poisson.load(sem, poisson.manufactured(k).f)
    _note(progress, "p-multigrid setup...")
    t0 = time.perf_counter()
    pre = jax.block_until_ready(poisson.pmg(sem, h1, h2))
    setup = time.perf_counter() - t0
    solve = jax.jit(lambda s, p, b: poisson.solve(s, None, h1, h2, tol=tol, maxiter=2000, rhs=b, precond=p))
    jax.block_until_ready(solve(sem, pre, b))  # compile
    _note(progress, f"timing {repeats} solves to {tol:g}...")
    (_, info), times = time_median(solve, (sem, pre, b), repeats)
    _, jac = jax.jit(lambda s, b: poisson.solve(s, None, h1, h2, tol=tol, maxiter=20000, rhs=b))(sem, b)
    return dict(tts_tol=tol, tts_precond="pmg", tts_pmg_orders=list(pre.orders), tts_setup_seconds=setup,
                tts_seconds=statistics.median(times), tts_iterations=int(info.iterations),
                tts_converged=bool(info.converged), tts_jacobi_iterations=int(jac.iterations))


def bench(problem: str, order: int, elements, iterations: int = 100, **kw) -> dict:
    """Dispatch ``"bk1"``…``"bp6"`` to :func:`bench_bk` / :func:`bench_bp`."""
    kind, spec = check_problem(problem)
    if kind == "bk":
        return bench_bk(spec.number, order, elements, **kw)
    return bench_bp(spec.number, order, elements, iterations=iterations, **kw)


# ----------------------------------------------------------------------------- machine

def measure_bandwidth(nbytes: int = 2**30, repeats: int = 5, passes: int = 10, device=None) -> float:
    """Streaming memory bandwidth in bytes/s: (bytes read + written) / time.

    One jitted ``fori_loop`` makes ``passes`` read-modify-write sweeps
    ``y ← a·y + b`` over a float32 array of ``nbytes`` bytes (random data) on
    ``device`` (default: the first), so dispatch overhead is amortized; the
    median of ``repeats`` timed runs after a warm-up. Keep ``nbytes`` well
    above the last-level cache (default 1 GiB).
    """
    nbytes = _check_positive_int(nbytes, "nbytes")
    repeats = _check_positive_int(repeats, "repeats")
    passes = _check_positive_int(passes, "passes")
    n = max(nbytes // 4, 1)
    x = jax.device_put(jax.random.uniform(jax.random.PRNGKey(0), (n,), jnp.float32), device or jax.devices()[0])
    sweep = lambda x: jax.lax.fori_loop(0, passes, lambda i, y: y * 0.999 + 1e-3, x)
    fn = jax.jit(sweep).lower(x).compile()
    jax.block_until_ready(fn(x))
    _, times = time_median(fn, (x,), repeats)
    return 2.0 * n * 4 * passes / statistics.median(times)


def device_info() -> dict:
    """Platform, device kind, device count and jax version of this process."""
    devs = jax.devices()
    d = devs[0]
    return dict(
        platform=d.platform,
        device_kind=d.device_kind,
        num_devices=len(devs),
        devices=[str(x) for x in devs],
        jax_version=jax.__version__,
    )
