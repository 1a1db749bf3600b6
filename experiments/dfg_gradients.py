"""Gradients of the DFG 3D-1Z drag (Schäfer & Turek 1996) against central differences.

The drag coefficient c_D after ``--steps`` steps from the inflow profile extended through the
channel, on the 3D-1Z mesh (``jaxsem.mesh.dfg_mesh("3D", order, level)``, needs gmsh), w.r.t.
(a) the inflow's amplitude (a ``Velocity`` parameter), (b) the viscosity and (c) the amplitude
of a smooth deformation of the cylinder's surface (a cos 2θ radial mode around its axis, faded
to zero 0.04 m into the volume), by ``jax.grad`` (one reverse pass each) and by central
differences with step ``h`` relative to the parameter. Writes a JSON record.

    python -m experiments.dfg_gradients                    # order 2, level 0, 3 steps (CPU, minutes)
    python -m experiments.dfg_gradients --order 3 --steps 5 --out experiments/results/dfg_gradients_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp

from experiments.common import record as head, write_json

jax.config.update("jax_enable_x64", True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--order", type=int, default=2)
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dt", type=float, default=2e-3)
    ap.add_argument("--h", type=float, default=1e-5, help="central-difference step, relative to the parameter")
    ap.add_argument("--out", default=None, help="write the JSON record here")
    args = ap.parse_args(argv)

    from jaxsem.mesh import DFG_3D_1Z as case
    from jaxsem.mesh import dfg_mesh
    from jaxsem.models import navier_stokes as NS

    geo = case.geometry
    tic = time.perf_counter()
    mesh = dfg_mesh("3D", args.order, args.level)

    def inflow(x, y, z, t, a):
        x, y, z = jnp.broadcast_arrays(x, y, z)
        u = a * case.inflow(y, z)
        return jnp.stack([u, jnp.zeros_like(u), jnp.zeros_like(u)])

    bc = dict(inlet=NS.Velocity(inflow, params=jnp.asarray(1.0)), walls=NS.NO_SLIP, cylinder=NS.NO_SLIP,
              outlet=NS.Outflow())
    ns = NS.setup(mesh, case.nu, args.dt, boundary=bc, forces=("cylinder",),
                  options=NS.NSOptions(pressure_tol=1e-12, velocity_tol=1e-12))
    st0 = NS.initial_state(ns, lambda x, y, z: inflow(x, y, z, 0.0, 1.0))
    setup_seconds = time.perf_counter() - tic

    x0 = jnp.asarray(ns.sem.x)
    cx, cy = geo.centre[:2]
    R = geo.radius
    dx, dy = x0[0] - cx, x0[1] - cy
    r, theta = jnp.hypot(dx, dy), jnp.arctan2(dy, dx)
    s = jnp.clip((r - R) / 0.04, 0.0, 1.0)
    mode = R * jnp.cos(2 * theta) * (1 - s) ** 3 * (1 + 3 * s + 6 * s**2)

    def drag(a, nu, b):
        x = jnp.stack([x0[0] + b * mode * dx / r, x0[1] + b * mode * dy / r, x0[2]])
        n2 = NS.with_coordinates(dataclasses.replace(ns, nu=nu, bc=ns.bc.with_params("inlet", a)), x)
        _, info = NS.simulate(n2, st0, args.steps, info=True)
        return case.coefficient_scale * info.force[-1, 0, 0]

    p0 = (jnp.asarray(1.0), ns.nu, jnp.asarray(0.0))
    f = jax.jit(drag)
    tic = time.perf_counter()
    c0 = float(f(*p0))
    forward_seconds = time.perf_counter() - tic
    tic = time.perf_counter()
    grads = [float(g) for g in jax.jit(jax.grad(drag, argnums=(0, 1, 2)))(*p0)]
    grad_seconds = time.perf_counter() - tic
    rows = []
    for i, name in enumerate(("inflow_amplitude", "viscosity", "cylinder_cos2theta")):
        h = args.h * (abs(float(p0[i])) if float(p0[i]) else 1.0)
        up = list(p0)
        dn = list(p0)
        up[i] = p0[i] + h
        dn[i] = p0[i] - h
        fd = (float(f(*up)) - float(f(*dn))) / (2 * h)
        rows.append(dict(parameter=name, value=float(p0[i]), step=h, grad=grads[i], central_difference=fd,
                         relative_difference=abs(grads[i] - fd) / abs(fd)))
        print(f"{name:20s} grad {grads[i]: .10e}  FD {fd: .10e}  rel {rows[-1]['relative_difference']:.2e}",
              flush=True)
    record = dict(head("dfg_gradients"), case="3D-1Z", order=args.order, level=args.level,
                  elements=int(mesh.num_elements), dofs=int(ns.sem.num_global), steps=args.steps, dt=args.dt,
                  drag_coefficient=c0, gradients=rows, setup_seconds=setup_seconds,
                  forward_seconds_incl_compile=forward_seconds, grad_seconds_incl_compile=grad_seconds)
    if args.out:
        write_json(args.out, record)
    print(json.dumps({k: record[k] for k in ("order", "dofs", "steps", "drag_coefficient")}))
    return record


if __name__ == "__main__":
    main()
