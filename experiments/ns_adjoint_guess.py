"""Adjoint solves started from the later steps' (the binomial schedule of ``NS.simulate``): the
iterations of the adjoint pressure and velocity solves per step, plain reverse mode against
``Checkpointing(snapshots=S)``, and the value-and-gradient time against the forward run's.

Taylor–Green at Re = 1600 in the periodic box, ``E³`` elements of order ``p``, the default
tolerances; the loss is the kinetic energy after ``--steps`` steps, differentiated w.r.t. ν and
the initial velocity. The iterations are read by a spy on the adjoint check. Run it on two
trees (``PYTHONPATH=<tree>``) to compare them::

    python -m experiments.ns_adjoint_guess --elements 4 --order 5 --steps 200 --snapshots 8 --out out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import record, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4)
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--snapshots", type=int, default=8)
    ap.add_argument("--dt", type=float, default=1e-2)
    ap.add_argument("--out", default="ns_adjoint_guess.json")
    a = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    import jaxsem as js
    from jaxsem.models import flows
    from jaxsem.models import navier_stokes as NS
    from jaxsem.solvers.timestepping import Checkpointing

    pcg = importlib.import_module("jaxsem.solvers.pcg")
    its, check = [], pcg.check_adjoint

    def spy(info, tol):
        jax.debug.callback(lambda i: its.append(int(np.max(i))), info.iterations)
        check(info, tol)

    pcg.check_adjoint = spy
    mesh = js.box_mesh(a.elements, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=a.dt)
    st0 = NS.initial_state(ns, flows.taylor_green().velocity)
    res = dict(record("ns_adjoint_guess"), elements=a.elements, order=a.order, steps=a.steps, dt=a.dt,
               snapshots=a.snapshots, jaxsem_file=js.__file__, rows=[])
    for name, ck in (("plain", Checkpointing()), ("binomial", Checkpointing(snapshots=a.snapshots))):
        def loss(nu, U):
            st, info = NS.simulate(dataclasses.replace(ns, nu=nu), dataclasses.replace(st0, U=U), a.steps,
                                   checkpointing=ck, info=True)
            return ns.sem.integrate(jnp.sum(st.u ** 2, 0)), info

        f = jax.jit(lambda nu, U: loss(nu, U)[0])
        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
        f(ns.nu, st0.U).block_until_ready()
        its.clear()
        (_, info), g = vg(ns.nu, st0.U)
        jax.block_until_ready(g)
        pairs = np.asarray(its).reshape(a.steps, 2)  # per step: the velocity's adjoint, then the pressure's
        tic = time.perf_counter()
        f(ns.nu, st0.U).block_until_ready()
        forward = time.perf_counter() - tic
        tic = time.perf_counter()
        jax.block_until_ready(vg(ns.nu, st0.U))
        both = time.perf_counter() - tic
        row = dict(schedule=name, forward_pressure_iterations=float(np.mean(info.pressure.iterations)),
                   forward_velocity_iterations=float(np.mean(info.velocity.iterations)),
                   adjoint_pressure_iterations=float(pairs[:, 1].mean()),
                   adjoint_velocity_iterations=float(pairs[:, 0].mean()),
                   forward_seconds=forward, value_and_grad_seconds=both, ratio=both / forward,
                   dL_dnu=float(g[0]))
        res["rows"].append(row)
        print(row, flush=True)
    write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
