"""``jaxsem solve kovasznay``: Kovasznay's steady flow, the Navier–Stokes solver against an exact solution
with inflow, walls-free lateral data and an open outflow.

On [−0.5, 1] × [−0.5, 1.5] × [0, Lz] (periodic in z, Lz = Ez elements of the y width), ν = 1/Re:
the exact velocity on xmin, ymin and ymax; on xmax an :class:`Outflow`, either the exact traction
(p and ν ∂u/∂x of the exact flow, ``"traction"``: the error is the discretization's) or zero
traction (``"zero"``: the error is mostly the boundary condition's). The run starts from the exact
solution and goes to a steady state or to ``t_final``; returns the record the CLI prints.
"""

from __future__ import annotations

import functools
import math
import time

import jax.numpy as jnp
import numpy as np

from ..mesh.box import box_mesh
from ..models import flows
from ..models import navier_stokes as NS
from ..models.navier_stokes.boundary import Outflow, Velocity
from ..solvers.driver import RunOptions
from ..solvers.stops import NonFiniteError, RunStopped
from .tgv import setup_at_cfl
from .verify import _where

__all__ = ["run_kovasznay", "ORIGIN", "LENGTHS"]

ORIGIN = (-0.5, -0.5, 0.0)
LENGTHS = (1.5, 2.0)  # x and y; z is Ez elements of the y width


@functools.lru_cache(maxsize=8)
def _data(reynolds: float):
    """``(flow, u_b, p_b, g)``: the exact flow and its boundary data functions, one set per Reynolds
    number (the same function objects each call: runs in one process share compiled programs)."""
    flow = flows.kovasznay(reynolds)
    grad = flows.velocity_gradient(flow.velocity)
    nu = flow.nu

    def flux(x, y, z, t):  # ν ∂u/∂n on xmax, n = +x
        return nu * grad(x, y, z, t)[0]

    return flow, flow.velocity, flow.pressure, flux


def _relative_l2(sem, u, exact):
    """‖u − exact‖/‖exact‖ (L2 over the domain, GLL rule; a vector field sums its components)."""
    d = u - exact
    sq = lambda a: jnp.sum(a * a, 0) if a.ndim == 5 else a * a  # noqa: E731
    return float(jnp.sqrt(sem.integrate(sq(d)) / sem.integrate(sq(exact))))


def run_kovasznay(order: int, elements, *, reynolds: float = 40.0, outflow: str = "traction",
                  t_final: float = 20.0, dt: float | None = None, cfl: float = 0.4, sample: float = 0.1,
                  steady_tol: float | None = 1e-9, backend: str = "auto", place: dict | None = None,
                  progress=lambda m: None, progress_bar: bool = False) -> dict:
    """Run Kovasznay's flow from the exact solution and compare with it; returns the record (a dict).

    ``outflow``: ``"traction"`` (the exact traction on xmax) or ``"zero"`` (zero traction);
    ``dt``: None picks the largest step with CFL ≤ ``cfl`` (of the exact flow) that divides
    ``sample``; ``steady_tol``: stop at the first sample whose ‖uⁿ⁺¹ − uⁿ‖/(Δt‖u‖) is below it
    (None: run to ``t_final``). Errors are relative L2 over the domain, the pressure compared as
    it is (the outflow fixes its level).
    """
    if outflow not in ("traction", "zero"):
        raise ValueError(f"outflow must be 'traction' or 'zero', got {outflow!r}")
    place = place or {}
    tic = time.perf_counter()
    ex, ey, ez = elements
    lz = ez * LENGTHS[1] / ey
    mesh = box_mesh(tuple(elements), order, lengths=(*LENGTHS, lz), origin=ORIGIN, periodic=(False, False, True))
    flow, u_b, p_b, g = _data(float(reynolds))
    nu = flow.nu
    out = Outflow(pressure=p_b, flux=g) if outflow == "traction" else Outflow()
    boundary = dict(xmin=Velocity(u_b), ymin=Velocity(u_b), ymax=Velocity(u_b), xmax=out)
    progress(f"Kovasznay Re {reynolds:g}: order {order}, {'x'.join(map(str, elements))} elements, "
             f"{outflow} outflow")
    u0 = lambda x, y, z: u_b(x, y, z, 0.0)  # noqa: E731
    setup = lambda step: NS.setup(mesh, nu=nu, dt=step, boundary=boundary, backend=backend, **place)  # noqa: E731
    ns, dt = setup_at_cfl(setup, u0, dt, cfl, sample)
    st = NS.initial_state(ns, u0)
    setup_seconds = time.perf_counter() - tic
    progress(f"dt {dt:.4g} (at most {round(t_final / dt)} steps), setup {setup_seconds:.1f} s")
    base = dict(problem="kovasznay", order=order, elements=list(elements), reynolds=reynolds, nu=nu,
                outflow=outflow, dt=dt, t_final=t_final, sample=sample, steady_tol=steady_tol,
                dofs=int(ns.sem.num_global), time_order=ns.options.time_order, dealias=ns.options.dealias,
                pressure_tol=ns.options.pressure_tol, velocity_tol=ns.options.velocity_tol,
                backend=ns.sem.backend.name, setup_seconds=setup_seconds, **_where(ns.sem))
    opts = RunOptions(progress=progress_bar, desc="Kovasznay")
    try:
        st, s, info = NS.run(ns, st, t_final, sample_interval=sample, steady_tol=steady_tol, options=opts)
    except (NonFiniteError, RunStopped) as e:
        return dict(base, converged=False, status=e.status, steps=e.step, t=e.t, message=str(e))
    t = float(st.t)
    x = ns.sem.x
    error_u = _relative_l2(ns.sem, st.u, ns.sem.valid * u_b(x[0], x[1], x[2], t))
    error_p = _relative_l2(ns.sem, st.p, ns.sem.valid * p_b(x[0], x[1], x[2], t))
    steady = steady_tol is not None and t < t_final - 0.5 * dt
    finite = lambda v: float(v) if math.isfinite(float(v)) else None  # noqa: E731
    return dict(base, converged=True, status="steady" if steady else "t_final", steps=info.steps, t=t,
                seconds=info.seconds, seconds_per_step=info.seconds / max(info.steps, 1),
                error_l2_velocity=error_u, error_l2_pressure=error_p,
                change=finite(s.change[-1]), divergence=finite(s.divergence[-1]), cfl=finite(np.nanmax(s.cfl)),
                pressure_iterations=finite(s.pressure_iterations[-1]),
                velocity_iterations=finite(s.velocity_iterations[-1]))
