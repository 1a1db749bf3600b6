"""The binomial schedule's Navier–Stokes gradient, serial or sharded over two devices: dE_k/dν
after STEPS Taylor–Green steps (Re = 1600, dt 2·10⁻³), ELEMENTS³ elements of ORDER.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m experiments.ns_binomial_sharded \\
        ELEMENTS ORDER STEPS SNAPSHOTS MODE [noguess]

``MODE``: ``serial`` (one device), ``shardy`` (two devices, JAX's default partitioner) or
``gspmd`` (two devices, ``jax_use_shardy_partitioner=False``). ``SNAPSHOTS`` 0: the square-root
schedule instead. ``noguess``: every adjoint solve starts from zero instead of the later steps'
adjoint solutions. Prints ``RESULT mode elements order steps snapshots E_k dE/dν seconds``.
``JAXSEM_TRY_SHARDED_BINOMIAL=1`` is set, so that the schedule runs sharded on GPUs too.
"""

import dataclasses
import os
import sys
import time

import jax
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.solvers.timestepping import Checkpointing


def main(argv):
    os.environ["JAXSEM_TRY_SHARDED_BINOMIAL"] = "1"
    jax.config.update("jax_enable_x64", True)
    E, p, steps, snaps, mode = int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    if mode not in ("serial", "shardy", "gspmd"):
        raise SystemExit(f"MODE must be serial, shardy or gspmd, got {mode!r}")
    if mode == "gspmd":
        jax.config.update("jax_use_shardy_partitioner", False)
    if "noguess" in argv[5:]:
        scan = NS.scheme.checkpointed_scan
        NS.scheme.checkpointed_scan = lambda one, y0, n, ck, adjoint_guess=None: scan(
            lambda y, m: one(y, m, None), y0, n, ck)
    mesh = js.box_mesh(E, p, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=2e-3, devices=None if mode == "serial" else 2)
    st0 = NS.initial_state(ns, flows.taylor_green().velocity)
    ck = Checkpointing(snapshots=snaps) if snaps > 0 else Checkpointing("sqrt")

    def loss(nu, ns, st0):
        st = NS.simulate(dataclasses.replace(ns, nu=nu), st0, steps, checkpointing=ck)
        return NS.diagnostics(ns, st).kinetic_energy

    t = time.perf_counter()
    v, g = jax.jit(jax.value_and_grad(loss))(ns.nu, ns, st0)
    print("RESULT", mode, E, p, steps, snaps, float(v), repr(float(g)), f"{time.perf_counter() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
