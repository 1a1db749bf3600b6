"""Several processes, one program: multi-controller JAX (jax.distributed) equals serial.

    mpirun -n 2 python tests/distributed_check.py

Each process forces 2 CPU devices (XLA_FLAGS, set before jax is imported), joins
the others through :func:`jaxsem.parallel.init_distributed` (rank and
coordinator from MPI via mpi4py; gloo collectives between the CPU processes) and
discretizes over *all* processes' devices. It checks against a serial run in the
same process: BP5 and BP4 solves, relative errors, a gradient through a solve,
6 advection steps and a Maxwell right-hand side. Process 0
prints ``RESULT <json>``; the exit status is 1 if any check failed (see
tests/test_distributed_jax.py).
"""

from __future__ import annotations

import json
import os
import sys

if "jax" in sys.modules:  # pragma: no cover
    raise RuntimeError("distributed_check.py must set XLA_FLAGS before jax is imported")
from subproc import with_device_count  # noqa: E402  (no jax import)

os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), 2)  # other flags kept
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxsem.parallel.comm import Comm  # noqa: E402
from jaxsem.parallel.launch import init_distributed  # noqa: E402

from check_record import FAILED, RESULTS, check, rel  # noqa: E402


def main():
    assert init_distributed(), "run me under mpirun -n 2"
    import jax.numpy as jnp

    import jaxsem as js
    from jaxsem import timestepping as ts
    from jaxsem.models import advection as ad
    from jaxsem.models import maxwell as mx
    from jaxsem.models import poisson

    devices = jax.devices()
    check("devices", [len(devices), jax.process_count()], len(devices) == 2 * jax.process_count())
    mesh = js.box_mesh((3, 2, 2), 3, deform=0.1)
    for bp in (5, 4):
        ms, (h1, h2) = poisson.manufactured(bp), poisson.coefficients(bp)
        solve = jax.jit(lambda s: poisson.solve(s, ms.f, h1, h2, tol=1e-12))
        serial = poisson.bp_discretize(mesh, bp, comm=Comm())
        dist = poisson.bp_discretize(mesh, bp, devices=devices)
        us, i_s = solve(serial)
        ud, i_d = solve(dist)
        check(f"bp{bp}_err", rel(js.to_mesh_order(dist, ud), us), rel(js.to_mesh_order(dist, ud), us) < 1e-12)
        check(f"bp{bp}_iterations", [int(i_d.iterations), int(i_s.iterations)], int(i_d.iterations) == int(i_s.iterations))
        e_s, e_d = poisson.relative_errors(serial, us, ms.u), poisson.relative_errors(dist, ud, ms.u)
        check(f"bp{bp}_errors_err", max(abs(a - b) / a for a, b in zip(e_s, e_d)),
              max(abs(a - b) / a for a, b in zip(e_s, e_d)) < 1e-10)

    def loss(sem, f):
        u, _ = poisson.solve(sem, f, tol=1e-13)
        return sem.dot(u, u)

    serial, dist = poisson.bp_discretize(mesh, 3, comm=Comm()), poisson.bp_discretize(mesh, 3, devices=devices)
    f = 1.0 + np.random.default_rng(1).uniform(size=serial.geom.B.shape)
    _, g_s = jax.jit(jax.value_and_grad(loss, argnums=1))(serial, f)
    _, g_d = jax.jit(jax.value_and_grad(loss, argnums=1))(dist, js.from_mesh_order(dist, f))
    check("grad_f_err", rel(js.to_mesh_order(dist, g_d), g_s), rel(js.to_mesh_order(dist, g_d), g_s) < 1e-11)

    pmesh = js.box_mesh((4, 2, 2), 3, periodic=(True,) * 3, deform=0.1)
    c, dt, steps = (1.0, -0.5, 0.25), 0.004, 6
    f = ad.make_rhs("upwind", "split")
    run = jax.jit(lambda d, t, u: ts.integrate(lambda tt, v: f(tt, v, (d, t)), u, dt, steps))
    dg = js.discretize_dg(pmesh)
    ref = run(dg, ad.transport(dg, c), ad.gaussian(dg.x, 0.0, c))
    dgd = js.discretize_dg(pmesh, devices=devices)
    out = run(dgd, ad.transport(dgd, c), js.from_mesh_order(dgd, ad.gaussian(dg.x, 0.0, c)))
    check("advection_err", rel(js.to_mesh_order(dgd, out), ref), rel(js.to_mesh_order(dgd, out), ref) < 1e-12)

    dg = js.discretize_dg(mesh)
    q = np.random.default_rng(3).standard_normal((6,) + dg.jac.shape)
    ref = mx.rhs(dg, mx.material(dg), jnp.asarray(q))
    dgd = js.discretize_dg(mesh, devices=devices)
    out = jax.jit(lambda d, q: mx.rhs(d, mx.material(d), q))(dgd, js.from_mesh_order(dgd, q))
    check("maxwell_rhs_err", rel(js.to_mesh_order(dgd, out), ref), rel(js.to_mesh_order(dgd, out), ref) < 1e-12)

    RESULTS["failed"] = FAILED
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(RESULTS), flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
