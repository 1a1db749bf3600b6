"""Incompressible Navier–Stokes: the PN–PN splitting of Nek5000, NekRS and Neko.

∂u/∂t + (u·∇)u = −∇p + ν∇²u, ∇·u = 0 (density 1), velocity and pressure both of
order N on the GLL nodes. One step from tⁿ to tⁿ⁺¹ (BDFk/EXTk, k = 1, 2, 3, fixed Δt;
Karniadakis, Israeli & Orszag 1991, in the form of Tomboulides, Lee & Orszag 1997):

1. N(uⁿ) = −(uⁿ·∇)uⁿ, weak, on a Gauss rule of q = ⌈3(N+1)/2⌉ points per axis (the
   3/2 rule, no aliasing of the quadratic term), made nodal with the assembled
   inverse mass; extrapolated: F = Σᵢ aᵢ N(uⁿ⁺¹⁻ⁱ).
2. R = Σᵢ βᵢ uⁿ⁺¹⁻ⁱ/Δt + F − ν ∇×ω̃, ω̃ = ∇×(Σᵢ aᵢ uⁿ⁺¹⁻ⁱ) (the rotational form of
   the viscous term, ν∇²u = −ν∇×∇×u for ∇·u = 0: the pressure's Neumann condition
   follows the extrapolated vorticity, no spurious boundary layer).
3. Pressure Poisson, weak, with its Neumann data built in:
   (∇q, ∇p) = (∇q, R) − (β₀/Δt) ∮ q u_b·n, the boundary integral taken as
   (∇q, L) + (q, ∇·L) of the lift L of the velocity data; pure Neumann (the solution
   orthogonal to the constants), p-multigrid PCG from the previous pressure
   (:mod:`jaxsem.elliptic`, as every solve here).
4. Velocity Helmholtz, three components in one Jacobi-PCG:
   (β₀/Δt) B u + ν A u = B(Σᵢ βᵢ uⁿ⁺¹⁻ⁱ/Δt + F − ∇p), Dirichlet data lifted.

The first steps ramp the order up (1, 2, …, k), as Nek does. Periodic axes come
from the mesh; the other boundary faces carry a condition per named group
(:mod:`.boundary`: given velocity, no-slip, or an outflow whose pressure is a Dirichlet
condition of step 3 and whose viscous flux enters step 4), or one velocity on all of them. :func:`step` and :func:`simulate` are pure and differentiable
(the solves by implicit differentiation); :func:`run` is the host driver (chunks,
progress bar, NaN check naming the step, checkpoints that carry the BDF history, a
time series of diagnostics). Sharded over devices or under MPI the same code runs
per rank inside :meth:`SEM.local_map`.

Scalars (:mod:`.scalars`: a temperature, a concentration) ride along with the same scheme,
each advected explicitly and diffused implicitly before the flow's step, with conditions per
group (:class:`Value`, :class:`Flux`) and sources; :class:`Buoyancy` feeds one back into the
momentum equation (Boussinesq). A flow along a periodic axis is driven by a held flow rate
(:class:`FlowRate`, Nek's per-step correction) or a given mean pressure gradient
(:class:`PressureGradient`), :mod:`.driving`. :class:`Relaxation` (:mod:`.relaxation`) adds Nek's high-pass-filter
relaxation for under-resolved runs. :mod:`.statistics` keeps running averages,
Reynolds stresses, plane profiles and the wall shear of long runs.
"""

from . import driving, relaxation, runs, scalars, scheme, statistics
from .runs import Series, run
from .boundary import NO_SLIP, Outflow, Symmetry, Velocity
from .driving import FlowRate, PressureGradient
from .relaxation import Relaxation
from .scalars import INSULATED, Buoyancy, Flux, Scalar, Value
from .scheme import (Diagnostics, NavierStokes, NSOptions, StabilityWarning, State, StepInfo, bdf_ext, diagnostics,
                     initial_state, scalar_flux, setup, simulate, step, surface_force, vorticity, with_coordinates)

__all__ = ["NSOptions", "NavierStokes", "State", "StepInfo", "StabilityWarning", "Diagnostics", "Series",
           "setup", "initial_state", "step", "simulate", "diagnostics", "vorticity", "surface_force", "with_coordinates", "run", "bdf_ext",
           "Velocity", "Outflow", "Symmetry", "NO_SLIP", "Scalar", "Value", "Flux", "INSULATED", "Buoyancy",
           "scalar_flux", "FlowRate", "PressureGradient", "Relaxation"]
