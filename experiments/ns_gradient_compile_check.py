"""Does the gradient of a Taylor–Green run compile and run here? One configuration per process.

    python -m experiments.ns_gradient_compile_check BACKEND DEVICES SCHEDULE ELEMENTS [VARIANT ...]
    e.g. python -m experiments.ns_gradient_compile_check cuda 2 binomial 4   (plain | sqrt | binomial | run)

Order 7, ``ELEMENTS``³ elements, 10 steps of 10⁻³, the loss E_k at the end; the forward run and
``value_and_grad`` w.r.t. ν and u⁰ are each compiled apart (``jit(...).lower().compile()``),
then run. Lines ``COMPILE``/``RUN``/``RESULT`` on stdout say how far it got; the fault handler
prints the Python stack if the process crashes (a compiler segfault ends it with status 139).
``navier_stokes.simulate`` refuses the binomial schedule sharded over GPUs unless
``JAXSEM_TRY_SHARDED_BINOMIAL=1``, which this script sets. ``run``: no gradient, ``NS.run`` (the
driver's chunks) for 10 steps instead. Variants: ``nocallback`` leaves out the host callback that
warns when an adjoint solve misses its tolerance (``pcg.check_adjoint``); ``noguess`` starts the
adjoint solves from zero; ``noshardy`` compiles with GSPMD (``jax_use_shardy_partitioner=False``).
On GPUs ``NS.run`` itself compiles under GSPMD (``parallel.comm.gspmd_on_gpus``) unless
``JAXSEM_SHARDY=1``. Measured on 2 H200s: experiments/results/shardy_crash_h200x4.json.
"""

import dataclasses
import faulthandler
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers.timestepping import Checkpointing


def main(argv):
    faulthandler.enable()
    os.environ["JAXSEM_TRY_SHARDED_BINOMIAL"] = "1"  # this script is the check whether XLA still crashes
    backend, devices, schedule, elements = argv[0], int(argv[1]), argv[2], int(argv[3])
    if schedule not in ("plain", "sqrt", "binomial", "run"):
        raise SystemExit(f"SCHEDULE must be plain, sqrt, binomial or run, got {schedule!r}")
    if "noshardy" in argv[4:]:
        jax.config.update("jax_use_shardy_partitioner", False)
    if "noguess" in argv[4:]:
        scan = NS.scheme.checkpointed_scan
        NS.scheme.checkpointed_scan = lambda one, y0, n, ck, adjoint_guess=None: scan(lambda y, m: one(y, m, None), y0, n, ck)
    if "nocallback" in argv[4:]:
        from jaxsem.solvers import pcg
        pcg.check_adjoint = lambda info, tol: None
    mesh = js.box_mesh(elements, 7, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=1e-3, devices=devices if devices > 1 else None, backend=backend)
    st0 = NS.initial_state(ns, flows.taylor_green().velocity)
    if schedule == "run":
        print("RUN run", backend, devices, elements, flush=True)
        st, _, _ = NS.run(ns, st0, 0.01, sample_interval=0.005)
        print("RESULT run", float(NS.diagnostics(ns, st).kinetic_energy), flush=True)
        return
    ck = {"plain": Checkpointing(), "sqrt": Checkpointing("sqrt"), "binomial": Checkpointing(snapshots=4)}[schedule]

    def loss(nu, u0, ns, st0):
        st = dataclasses.replace(st0, U=st0.U.at[0].set(u0))
        st = NS.simulate(dataclasses.replace(ns, nu=nu), st, 10, checkpointing=ck)
        return NS.diagnostics(ns, st).kinetic_energy

    tag = f"{backend} dev{devices} {schedule} E{elements} ({ns.sem.backend.name}) {' '.join(argv[4:])}"
    for name, fn in (("fwd", loss), ("grad", jax.value_and_grad(loss, (0, 1)))):
        print("COMPILE", name, tag, flush=True)
        compiled = jax.jit(fn).lower(ns.nu, st0.u, ns, st0).compile()
        print("RUN", name, tag, flush=True)
        out = jax.block_until_ready(compiled(ns.nu, st0.u, ns, st0))
        if name == "grad":
            v, (g_nu, g_u) = out
            print("RESULT", tag, float(v), float(g_nu), float(jnp.linalg.norm(g_u)), flush=True)
        else:
            print("RESULT", tag, float(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
