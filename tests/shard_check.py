"""Sharded (shard_map + ppermute) SEM equals serial SEM: run as a script.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
        python tests/shard_check.py P

(the flags must be set before jax is imported, hence a separate process; see
tests/test_shard.py). Builds the same meshes serially (``Comm()``) and sharded
over the first P devices, compares, prints one line ``RESULT <json>`` with
every measured number and a list of failed checks, and exits 1 if any failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

if "jax" in sys.modules:  # pragma: no cover
    raise RuntimeError("shard_check.py must set XLA_FLAGS before jax is imported")
if "host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # four devices, other flags kept
    from subproc import with_device_count  # no jax import

    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), 4)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jaxsem as js  # noqa: E402
from jaxsem.parallel.comm import Comm, ShardComm  # noqa: E402
from jaxsem.discretization import discretize  # noqa: E402
from jaxsem.mesh import box_mesh  # noqa: E402
from jaxsem.models import poisson  # noqa: E402

from check_record import FAILED, RESULTS, check, rel  # noqa: E402


def uneven_partition(E, P):
    part = np.minimum(np.arange(E) * P // (E + 2), P - 1)
    part[-1] = P - 1
    return part


def dssum_dot(sem, v):
    return sem.dssum(v), sem.dot(v[0], v[1])


def csr_backend():
    """The CUDA backend on a GPU; on a CPU the emulated one with its gather-scatter as the CUDA
    backend's ("csr" rows, summed by their JAX form)."""
    if jax.default_backend() != "cpu":
        return "cuda"
    from typing import ClassVar

    from jaxsem.backends import EmulatedBackend

    class CsrEmulated(EmulatedBackend):
        gs_layout: ClassVar[str] = "csr"

    return CsrEmulated()


def check_gather_scatter(P):
    cases = [
        ("gs_box", box_mesh((4, 3, 2), 3, deform=0.05), None, "auto"),
        ("gs_periodic_x", box_mesh((2, 2, 2), 3, periodic=(True, False, False), deform=0.05), None, "auto"),
        # periodic in two directions: a pair of ranks can share two faces
        ("gs_periodic_xy", box_mesh((3, 3, 1), 3, periodic=(True, True, False)), None, "auto"),
        ("gs_uneven", box_mesh((5, 3, 1), 2, deform=0.1), "uneven", "auto"),
        # each rank sums its own copies by "csr" rows (the CUDA backend's plan), then exchanges
        ("gs_uneven_csr", box_mesh((5, 3, 1), 2, deform=0.1), "uneven", csr_backend()),
    ]
    for name, mesh, part, backend in cases:
        part = uneven_partition(mesh.num_elements, P) if part == "uneven" else None
        serial = discretize(mesh, comm=Comm())
        ss = discretize(mesh, devices=P, partition=part, backend=backend)
        if name.endswith("_csr"):
            check(f"{name}_layout", ss.gs.layout, ss.gs.layout == "csr" and ss.gs.exchange is not None)
            # reverse mode: QQᵀ is symmetric, so the gradient of <w, QQᵀ u> is QQᵀ w
            w = np.array(js.from_mesh_order(ss, np.cos(u)))
            g = jax.jit(jax.grad(lambda v, s_: jnp.sum(s_.dssum(v) * w)))(us, ss)
            g_err = rel(js.to_mesh_order(ss, g), js.to_mesh_order(ss, jax.jit(lambda s_: s_.dssum(w))(ss)))
            check(f"{name}_grad_err", g_err, g_err < 1e-13)
        assert isinstance(ss.comm, ShardComm) and ss.comm.size == P
        assert ss.x.sharding.spec == jax.sharding.PartitionSpec(None, ss.comm.axis_name)
        rng = np.random.default_rng(0)
        u = rng.standard_normal((3,) + serial.mask.shape)
        us = np.array(js.from_mesh_order(ss, u))
        # garbage on the pad elements must not reach real ones
        pad = np.broadcast_to((np.asarray(ss.elements) < 0)[None, :, None, None, None], us.shape)
        us[pad] = 1e3 * rng.standard_normal(int(pad.sum()))
        out, d = jax.jit(dssum_dot)(ss, us)
        out = np.asarray(out)
        ref, d_ref = jax.jit(dssum_dot)(serial, u)
        err = rel(js.to_mesh_order(ss, out), ref)
        check(f"{name}_err", err, err < 1e-13)
        check(f"{name}_finite", bool(np.all(np.isfinite(out))), bool(np.all(np.isfinite(out))))
        m_err = float(np.max(np.abs(js.to_mesh_order(ss, ss.mult) - np.asarray(serial.mult))))
        check(f"{name}_mult_err", m_err, m_err == 0.0)
        d_err = abs(float(d) - float(d_ref))
        check(f"{name}_dot_err", d_err, d_err < 1e-12)
        rounds = len(ss.gs.exchange.rounds)
        check(f"{name}_rounds", rounds, rounds >= 1)
        if part is not None:
            el = np.asarray(ss.elements).reshape(P, -1)
            sizes = np.sum(el >= 0, axis=1).tolist()
            check(f"{name}_sizes", sizes, len(set(sizes)) > 1 and sum(sizes) == mesh.num_elements)
            # every pad point is a node of its own past the block's real nodes: no two copies
            # (one shared trash node made the GPU's scatter-add conflict on one address)
            gid = np.asarray(ss.gs.gid).reshape(P, el.shape[1], -1)
            own = all(np.unique(g[e < 0]).size == g[e < 0].size and g[e < 0].min() > g[e >= 0].max()
                      for g, e in zip(gid, el) if np.any(e < 0))
            check(f"{name}_pads_own_nodes", own, own)


def check_bp(P, bp, mesh, name, partition=None, tol=1e-12, maxiter=1000, storage="auto", pmg=False, **kw):
    """A sharded solve (Krylov vectors in ``storage``; Jacobi, or p-multigrid built on each
    discretization) equals the serial one (E-vectors)."""
    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    solve = jax.jit(lambda s, p: poisson.solve(s, ms.f, h1, h2, tol=tol, maxiter=maxiter, precond=p))
    pre = (lambda s: poisson.pmg(s, h1, h2)) if pmg else (lambda s: None)
    serial = poisson.bp_discretize(mesh, bp, comm=Comm(), storage="local")
    us, info_s = solve(serial, pre(serial))
    ss = poisson.bp_discretize(mesh, bp, devices=P, partition=partition, storage=storage, **kw)
    check(f"{name}_storage", ss.assembled is not None, (ss.assembled is not None) == (storage == "auto"))
    pd = pre(ss)
    if pmg:  # the sharded cycle's finest level on assembled vectors (each device's node map)
        check(f"{name}_assembled_cycle", pd.levels[0].pick is not None, pd.levels[0].pick is not None)
    ud, info_d = solve(ss, pd)
    err = rel(js.to_mesh_order(ss, ud), us)
    check(f"{name}_err", err, err < 1e-12)
    check(f"{name}_iterations", [int(info_d.iterations), int(info_s.iterations)],
          int(info_d.iterations) == int(info_s.iterations) and (tol > 0 or int(info_d.iterations) == maxiter))
    if tol > 0:
        check(f"{name}_converged", bool(info_d.converged), bool(info_d.converged))
    r_err = abs(float(info_d.residual) - float(info_s.residual)) / float(info_s.residual0)
    check(f"{name}_residual_err", r_err, r_err < 1e-12)
    e_s, e_d = poisson.relative_errors(serial, us, ms.u), poisson.relative_errors(ss, ud, ms.u)
    e_err = max(abs(a - b) / a for a, b in zip(e_s, e_d))
    check(f"{name}_errors_err", e_err, e_err < 1e-10)


def check_affine(P):
    """On an affine mesh the CUDA backend (on a CPU: the emulated one, the same choice) keeps the
    compact geometric factors on every device, and the sharded solve equals the serial einsum one."""
    from jaxsem.backends import EMULATED

    fused = EMULATED if jax.default_backend() == "cpu" else "cuda"
    mesh = box_mesh((3, 2, 2), 3)
    m = mesh.num_elements
    ss = poisson.bp_discretize(mesh, 5, devices=P, partition=uneven_partition(m, P), backend=fused)
    compact = ss.affine is not None and tuple(ss.affine.shape[-3:]) == (1, 1, 1)
    check("bp5_affine_compact", compact, compact)
    check_bp(P, 5, mesh, "bp5_affine", partition=uneven_partition(m, P), backend=fused)
    # curved where x > 1/3 only: the first rank's elements are affine, the others' not; every
    # device then reads the stored factors
    x = np.array(mesh.x)
    x[1] += 0.05 * np.maximum(x[0] - 1 / 3, 0.0) ** 2 * np.sin(np.pi * x[2])
    half = dataclasses.replace(mesh, x=x)
    cx = x[0].reshape(m, -1).mean(axis=1)
    part = np.where(cx < 1 / 3, 0, 1 + np.cumsum(cx >= 1 / 3) % (P - 1))
    ss = poisson.bp_discretize(half, 5, devices=P, partition=part, backend=fused)
    check("bp5_half_affine_stored", ss.affine is None, ss.affine is None)


def check_bench(P):
    """The bake-off's fixed-iteration run on assembled vectors split over the devices (``Blocks``):
    the same residual history as on one device."""
    from jaxsem.app import bench

    mesh = box_mesh((4, 3, 2), 3, deform=0.1)
    hist = {}
    for name, where in (("serial", dict(comm=Comm())), ("sharded", dict(devices=P))):
        sem = poisson.bp_discretize(mesh, 5, **where)
        run, args = bench.bp_run(bench.check_problem("bp5")[1], sem, 12)
        x, info = jax.jit(run)(*args)
        hist[name] = np.asarray(info.history) / float(info.residual0)
        size = sem.assembled.size * (P if name == "sharded" else 1)
        check(f"bench_shape_{name}", list(x.shape), x.shape == (size,))
    err = float(np.max(np.abs(hist["sharded"] - hist["serial"])))
    check("bench_history_err", err, err < 1e-12)


def grad_loss(sem, f):
    u, _ = poisson.solve(sem, f, 1.0, 0.0, tol=1e-13)
    return sem.dot(u, u)


def check_grad(P):
    mesh = box_mesh((2, 2, 2), 3, deform=0.1, periodic=(True, False, False))
    serial = poisson.bp_discretize(mesh, 3, comm=Comm())
    f = 1.0 + np.random.default_rng(1).uniform(size=serial.geom.B.shape)
    l_s, g_s = jax.jit(jax.value_and_grad(grad_loss, argnums=1))(serial, f)
    ss = poisson.bp_discretize(mesh, 3, devices=P)
    l_d, g_d = jax.jit(jax.value_and_grad(grad_loss, argnums=1))(ss, js.from_mesh_order(ss, f))
    l_err = abs(float(l_d) - float(l_s)) / float(l_s)
    check("periodic_loss_err", l_err, l_err < 1e-12)
    err = rel(js.to_mesh_order(ss, g_d), g_s)
    check("grad_f_err", err, err < 1e-11)


def check_adjoint_guess(P):
    """An adjoint guess's round trip (the time stepper's reverse pass hands each solve the adjoint
    solution of the one after it, as the cotangent of its guess): handed back its own cotangent
    plus a constant (the pure-Neumann pressure's null space, which no adjoint solve changes),
    a sharded solve returns that again, pass after pass, as serial does (a round trip that sums
    the ranks' parts of the interface nodes makes the constant grow; docs/gradients.md)."""
    from jaxsem import elliptic

    mesh = box_mesh((3, 3, 3), 2, periodic=(True,) * 3, deform=0.1)
    x = np.asarray(mesh.x)
    b_np, c_np = np.sin(x[0]) * np.cos(2 * x[1]), np.cos(x[0] + 0.3) * np.sin(x[2])

    def passes(sem, b, c):
        H = elliptic.helmholtz(sem, 1.0, 0.0, nullspace=True)

        def f(b, g, c, H):
            return H.sem.local_map(lambda s_, H_, b_, g_, c_: s_.dot(c_, elliptic.solve_local(
                H_, s_.mask * s_.dssum(b_), tol=1e-12, maxiter=300, adjoint_guess=g_)[0]), H, b, g, c)

        grad = jax.jit(jax.grad(f, argnums=(0, 1)))
        gb, G = grad(b, jnp.zeros_like(b), c, H)
        K, means = jnp.ones_like(G), []
        for _ in range(3):
            _, G2 = grad(b, G + K, c, H)
            K = G2 - G
            means.append(float(sem.dot(K, jnp.ones_like(K)) / sem.dot(jnp.ones_like(K), jnp.ones_like(K))))
        return gb, means

    serial = discretize(mesh, comm=Comm())
    gb_s, m_s = passes(serial, jnp.asarray(b_np), jnp.asarray(c_np))
    ss = discretize(mesh, devices=P, partition=uneven_partition(mesh.num_elements, P))
    gb_d, m_d = passes(ss, js.from_mesh_order(ss, b_np), js.from_mesh_order(ss, c_np))
    err = rel(js.to_mesh_order(ss, gb_d), gb_s)
    check("adjoint_guess_grad_err", err, err < 1e-10)
    growth = max(abs(m / m_d[0] - 1) for m in m_d)
    check("adjoint_guess_growth", growth, growth < 1e-10)
    s_growth = max(abs(m / m_s[0] - 1) for m in m_s)
    check("adjoint_guess_serial_growth", s_growth, s_growth < 1e-10)


def check_dg(P):
    """Advection (both schedules, 6 LSERK4 steps) and a Maxwell rhs, sharded vs serial, uneven partition."""
    import jax.numpy as jnp

    from jaxsem import timestepping as ts
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import advection as ad
    from jaxsem.models import maxwell as mx

    mesh = box_mesh((3, 2, 2), 3, periodic=(True,) * 3, deform=0.1)
    part = uneven_partition(mesh.num_elements, P)
    c = (1.0, -0.5, 0.25)
    dg = discretize_dg(mesh)
    tr = ad.transport(dg, c)
    u0 = ad.gaussian(dg.x, 0.0, c)
    dt, steps = 0.004, 6
    dgs = discretize_dg(mesh, devices=P, partition=part)
    trs = ad.transport(dgs, c)
    el = np.asarray(dgs.elements).reshape(P, -1)
    check("dg_sizes", [int(v) for v in np.sum(el >= 0, axis=1)], True)
    check("dg_halo", [P, int(np.asarray(dgs.halo).shape[0]) // P], True)
    u0s = js.from_mesh_order(dgs, u0)
    f = ad.make_rhs("upwind", "split")
    run = jax.jit(lambda d, t, u: ts.integrate(lambda tt, v: f(tt, v, (d, t)), u, dt, steps))
    ref = run(dg, tr, u0)
    us = run(dgs, trs, u0s)
    err = rel(js.to_mesh_order(dgs, us), ref)
    check("advection_err", err, err < 1e-12)
    pads_zero = bool(np.all(np.asarray(us)[np.asarray(dgs.elements) < 0] == 0.0))
    check("advection_dummies_zero", pads_zero, pads_zero)
    rho_s, rho_d = ad.spectral_radius(dg, tr), ad.spectral_radius(dgs, trs)
    check("advection_rho_err", abs(rho_s - rho_d) / rho_s, abs(rho_s - rho_d) < 1e-10 * rho_s)
    # Maxwell (PEC box, non-periodic): one rhs evaluation of a random field
    mesh = box_mesh((3, 2, 2), 3, deform=0.1)
    dg = discretize_dg(mesh)
    q = np.random.default_rng(3).standard_normal((6,) + dg.jac.shape)
    ref = mx.rhs(dg, mx.material(dg), jnp.asarray(q))
    dgs = discretize_dg(mesh, devices=P, partition=uneven_partition(mesh.num_elements, P))
    out = jax.jit(lambda d, q: mx.rhs(d, mx.material(d), q))(dgs, js.from_mesh_order(dgs, q))
    err = rel(js.to_mesh_order(dgs, out), ref)
    check("maxwell_rhs_err", err, err < 1e-12)
    check_fused_dg(P)


def check_fused_dg(P):
    """The fused DG right-hand sides distributed (uneven partition) equal serial: Maxwell's value
    for both boundary kinds and its ε-gradient through 3 LSERK4 steps, advection's value. The
    fused path (kernel, then the remote neighbours' flux on the halo elements) runs on the CUDA
    backend on a GPU and on the emulated backend (the same dispatch and derivative rules,
    einsum values) on a CPU; the serial reference is the einsum backend."""
    import jax.numpy as jnp

    from jaxsem import timestepping as ts
    from jaxsem.discretization.dg import discretize_dg
    from jaxsem.models import advection as ad
    from jaxsem.models import maxwell as mx

    from jaxsem.backends import EMULATED

    fused = EMULATED if jax.default_backend() == "cpu" else "cuda"
    mesh = box_mesh((3, 2, 2), 3, deform=0.1)
    dg = discretize_dg(mesh, backend="einsum")
    dgs = discretize_dg(mesh, devices=P, partition=uneven_partition(mesh.num_elements, P), backend=fused)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((6,) + dg.jac.shape)
    eps = 1.0 + 0.1 * rng.random(dg.jac.shape)
    for bc in mx.BCS:
        f = mx.make_rhs("upwind", bc, "chain")
        rhs = jax.jit(lambda d, e, v: f(0.0, v, (d, mx.material(d, e))))
        err = rel(js.to_mesh_order(dgs, rhs(dgs, js.from_mesh_order(dgs, eps), js.from_mesh_order(dgs, q))),
                  rhs(dg, jnp.asarray(eps), jnp.asarray(q)))
        check(f"maxwell_fused_{bc}_err", err, err < 1e-12)

    def loss(d, e, q0):
        mat = mx.material(d, e)
        y = ts.integrate(lambda t, v: f(t, v, (d, mat)), q0, 0.01, 3)
        return d.integrate(jnp.sum(y * y, 0))

    grad = jax.jit(jax.grad(loss, 1))
    gs = grad(dgs, js.from_mesh_order(dgs, eps), js.from_mesh_order(dgs, q))  # ε = 0 on the pads
    err = rel(js.to_mesh_order(dgs, gs), grad(dg, jnp.asarray(eps), jnp.asarray(q)))
    check("maxwell_fused_grad_eps_err", err, err < 1e-12)
    finite = bool(np.all(np.isfinite(np.asarray(gs))))  # the pads' entries too
    check("maxwell_fused_grad_finite", finite, finite)
    mesh = box_mesh((3, 2, 2), 3, periodic=(True,) * 3, deform=0.1)
    dg = discretize_dg(mesh, backend="einsum")
    dgs = discretize_dg(mesh, devices=P, partition=uneven_partition(mesh.num_elements, P), backend=fused)
    c = (1.0, -0.5, 0.25)
    u = rng.standard_normal(dg.jac.shape)
    f = ad.make_rhs("upwind", "split")
    rhs = jax.jit(lambda d, t, v: f(0.0, v, (d, t)))
    err = rel(js.to_mesh_order(dgs, rhs(dgs, ad.transport(dgs, c), js.from_mesh_order(dgs, u))),
              rhs(dg, ad.transport(dg, c), jnp.asarray(u)))
    check("advection_fused_err", err, err < 1e-12)


def main(P):
    t0 = time.perf_counter()
    if len(jax.devices()) < P:
        raise SystemExit(f"need {P} devices, have {len(jax.devices())}")
    check_gather_scatter(P)
    check_bp(P, 5, box_mesh((3, 2, 2), 3, deform=0.1), "bp5")
    check_bp(P, 4, box_mesh((3, 2, 2), 3, deform=0.1), "bp4")
    check_affine(P)
    m = box_mesh((5, 3, 1), 2, deform=0.1)
    check_bp(P, 5, m, "bp5_uneven_fixed17", partition=uneven_partition(m.num_elements, P), tol=0.0, maxiter=17)
    check_bp(P, 5, m, "bp5_local_fixed17", partition=uneven_partition(m.num_elements, P), tol=0.0, maxiter=17,
             storage="local")
    check_bp(P, 5, m, "bp5_pmg_uneven", partition=uneven_partition(m.num_elements, P), pmg=True)
    check_bench(P)
    check_grad(P)
    check_adjoint_guess(P)
    check_dg(P)
    RESULTS["seconds"] = round(time.perf_counter() - t0, 2)
    RESULTS["P"] = P
    RESULTS["failed"] = FAILED
    print("RESULT " + json.dumps(RESULTS), flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
