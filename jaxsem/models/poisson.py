"""Helmholtz/Poisson problems and the CEED bake-off problems BP1–BP6.

Solves h₁(−∇²u) + h₂u = f weakly: ``A u = b`` with A = mask·QQᵀ·(h₁ A_e + h₂ B_e)
on E-vectors, Jacobi-preconditioned CG with multiplicity-weighted inner
products. BPk uses BKk's element operator (mass for BP1/2 with Neumann
conditions; stiffness for BP3–6 with Dirichlet), Gauss q = N + 2 quadrature
for BP1–4 and collocated GLL for BP5/6; BP2/4/6 solve three components at once.

Manufactured solutions on the unit box (deformed or not) give exact errors.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..core import geometry as geo
from ..discretization.sem import SEM, discretize
from ..elliptic import Helmholtz, global_operator, jacobi, local_operator, operator, pmg, solve_local
from ..mesh.box import Mesh
from ..operators import BK_SPECS
from ..operators.tensor import interp, interp_t
from ..solvers import multigrid

__all__ = [
    "BP_SPECS", "bp_discretize", "local_operator", "operator", "global_operator", "jacobi", "load",
    "solve", "pmg", "manufactured", "relative_errors", "coefficients",
]

BP_SPECS = BK_SPECS


def _check_bp(bp):
    if isinstance(bp, bool) or not isinstance(bp, (int, np.integer)) or int(bp) not in BP_SPECS:
        raise ValueError(f"bp must be one of 1..6, got {bp!r}")
    return BP_SPECS[int(bp)]


def coefficients(bp: int):
    """(h₁, h₂) of BPk: (0, 1) for the mass problems, (1, 0) for the stiffness ones."""
    spec = _check_bp(bp)
    return (0.0, 1.0) if spec.operator == "mass" else (1.0, 0.0)


def bp_discretize(mesh: Mesh, bp: int, **kw) -> SEM:
    """``discretize`` with BPk's quadrature and boundary conditions."""
    spec = _check_bp(bp)
    return discretize(mesh, quadrature=spec.quadrature, dirichlet=spec.dirichlet, **kw)


def load(sem: SEM, f):
    """Right-hand side b = mask·QQᵀ(Jᵀ B f) of a source.

    ``f``: a callable ``f(x, y, z)`` evaluated at the quadrature points, or an
    array of values there, ``(..., E, q, q, q)``.
    """
    g = sem.geom
    fq = f(g.xq[0], g.xq[1], g.xq[2]) if callable(f) else jnp.asarray(f)
    fq = jnp.asarray(fq, sem.x.dtype)
    return sem.mask * sem.dssum(interp_t(g.B * fq, sem.J))


def solve(sem: SEM, f, h1=1.0, h2=0.0, tol: float = 1e-10, maxiter: int = 1000, rhs=None,
          method: str = "classic", precond: multigrid.PMG | None = None):
    """Solve h₁(−∇²u) + h₂u = f on ``sem`` (boundary conditions from its mask).

    Args:
      sem: from :func:`bp_discretize` or :func:`jaxsem.discretize`.
      f: source, callable ``f(x, y, z)`` or values at quadrature points; ignored
        when ``rhs`` (an assembled E-vector) is given.
      h1, h2: coefficients ≥ 0, not both zero: scalars, per element ``(E, 1, 1, 1)`` or
        per quadrature point ``(E, q, q, q)``.
      tol: relative residual tolerance (0: exactly ``maxiter`` iterations).
      method: PCG variant, ``"classic"``, ``"single-reduction"`` or ``"flexible"`` (see
        :func:`jaxsem.solvers.pcg`).
      precond: None (Jacobi) or a p-multigrid preconditioner from :func:`pmg` (that is,
        :func:`jaxsem.elliptic.pmg`) built for this
        ``sem``, ``h1`` and ``h2`` (a fixed SPD operator, so plain PCG stays correct; a
        float32 cycle in a float64 solve, ``PMGOptions(dtype="float32")``, is not exactly
        linear, and ``method="classic"`` then runs as ``"flexible"``).
    Returns ``(u, PCGInfo)``; ``u: (E, n, n, n)`` (or ``(3, E, n, n, n)``).
    Raises ``ValueError`` naming the argument, before any solve, for a coefficient of
    another shape, and for NaN/Inf or negative values in ``f``, ``h1``, ``h2`` or ``rhs``
    (checked where they are concrete; traced values are flagged by ``info.breakdown``).
    The element kernels are ``sem.backend``'s. Differentiable w.r.t. f, h1, h2 and the
    geometry by one adjoint solve; with the CUDA backend the adjoint runs the kernels too
    and the one extra operator application of a derivative runs the einsum reference.
    """
    _check_inputs(sem, f, h1, h2, rhs)
    if precond is not None and not isinstance(precond, multigrid.PMG):
        raise TypeError(f"precond must be None (Jacobi) or a PMG from poisson.pmg, got {type(precond).__name__}")
    if precond is not None and precond.levels[0].sem.order != sem.order:
        raise ValueError(f"precond was built for order {precond.levels[0].sem.order}, sem has order {sem.order}")
    return sem.local_map(_solve, f, Helmholtz.of(sem, h1, h2, pmg=precond), tol, maxiter, rhs, method)


def _concrete(a) -> bool:
    return not isinstance(a, jax.core.Tracer)


def _check_inputs(sem: SEM, f, h1, h2, rhs):
    """Shapes and values of the problem data, before any tracing (errors name the argument)."""
    q = int(sem.geom.B.shape[-1])
    E = sem.num_elements
    for name, h in (("h1", h1), ("h2", h2)):
        shape = np.shape(h)
        if shape not in ((), (E, 1, 1, 1), (E, q, q, q)):
            raise ValueError(f"{name} must be a scalar, per element (E, 1, 1, 1) = ({E}, 1, 1, 1) or per "
                             f"quadrature point (E, q, q, q) = ({E}, {q}, {q}, {q}); got shape {shape}")
        if _concrete(h):
            bad = _nonfinite(h)
            if bad:
                raise ValueError(f"{name} has {bad} non-finite value(s) (NaN or Inf)")
            with jax.ensure_compile_time_eval():
                low = float(jnp.min(jnp.asarray(h)))
            if low < 0:
                raise ValueError(f"{name} must be >= 0 (the operator must be positive), got min {low:g}")
    if all(isinstance(h, (int, float)) and not isinstance(h, bool) and h == 0 for h in (h1, h2)):
        raise ValueError("h1 and h2 are both 0: the operator h1(-Δ) + h2 vanishes")
    if rhs is None and not callable(f):
        if np.ndim(f) < 4 or np.shape(f)[-4:] != (E, q, q, q):
            raise ValueError(f"f must be a callable f(x, y, z) or values at the quadrature points "
                             f"(..., E, q, q, q) = (..., {E}, {q}, {q}, {q}); got shape {np.shape(f)}")
    for name, a in (("f", None if callable(f) else f), ("rhs", rhs)):
        if a is not None and _concrete(a):
            bad = _nonfinite(a)
            if bad:
                raise ValueError(f"{name} has {bad} non-finite value(s) (NaN or Inf) of {np.size(a)}")


def _nonfinite(a) -> int:
    """Number of NaN/Inf entries of a concrete array (one reduction where it lives)."""
    with jax.ensure_compile_time_eval():  # concrete data inside a jit trace is checked eagerly
        a = jnp.asarray(a)
        return int(a.size - jnp.count_nonzero(jnp.isfinite(a))) if jnp.issubdtype(a.dtype, jnp.inexact) else 0


def _solve(sem: SEM, f, H: Helmholtz, tol, maxiter, rhs, method):
    b = load(sem, f) if rhs is None else rhs
    return solve_local(H, b, tol=tol, maxiter=maxiter, method=method)


@dataclasses.dataclass(frozen=True)
class Manufactured:
    """Exact solution ``u(x, y, z)`` and source ``f`` for given (h₁, h₂), unit box."""

    u: Callable
    f: Callable
    components: int


def manufactured(bp: int) -> Manufactured:
    """Smooth exact solutions for BPk on the unit box [0, 1]³.

    Dirichlet (BP3–6): u = Π_d sin(k_d π x_d) (vanishes on the boundary),
    f = π²|k|² u. Neumann mass (BP1/2): u smooth and non-polynomial, f = u.
    Vector forms use different wave numbers per component.
    """
    spec = _check_bp(bp)
    ks = [(1, 1, 1), (2, 1, 1), (1, 1, 2)][: spec.components]
    if spec.operator == "stiffness":
        def u(x, y, z):
            out = [jnp.sin(a * jnp.pi * x) * jnp.sin(b * jnp.pi * y) * jnp.sin(c * jnp.pi * z) for a, b, c in ks]
            return out[0] if spec.components == 1 else jnp.stack(out)

        def f(x, y, z):
            out = [
                (a * a + b * b + c * c) * jnp.pi**2
                * jnp.sin(a * jnp.pi * x) * jnp.sin(b * jnp.pi * y) * jnp.sin(c * jnp.pi * z)
                for a, b, c in ks
            ]
            return out[0] if spec.components == 1 else jnp.stack(out)
    else:
        def u(x, y, z):
            out = [jnp.cos(a * jnp.pi * x) * jnp.exp(0.5 * b * y) * jnp.cos(c * z) + x * y for a, b, c in ks]
            return out[0] if spec.components == 1 else jnp.stack(out)

        f = u
    return Manufactured(u, f, spec.components)


def relative_errors(sem: SEM, u_h, u_exact: Callable):
    """Relative L2 (Gauss rule q = N + 4) and max-norm (GLL nodes) errors of ``u_h``.

    Returns two Python floats. ``u_exact(x, y, z)`` must be written with ``jnp``.
    """
    quad = geo.quadrature(sem.order, "gauss", q=sem.order + 4)
    sums, maxes = _errors(sem.x.astype(jnp.float64), u_h.astype(jnp.float64), sem.valid.astype(jnp.float64),
                          jnp.asarray(quad.J), jnp.asarray(quad.Dt), jnp.asarray(quad.w), u_exact)
    sums, maxes = sem.comm.allreduce(sums), sem.comm.allreduce(maxes, "max")
    return float(jnp.sqrt(sums[0] / sums[1])), float(maxes[0] / maxes[1])


@functools.partial(jax.jit, static_argnums=6)
def _errors(x, u_h, valid, J, Dt, w, u_exact):
    g = geo.factors(x, J, Dt, w, False)
    uq = interp(u_h, J)
    ue = u_exact(g.xq[0], g.xq[1], g.xq[2])
    un = u_exact(x[0], x[1], x[2])
    B = g.B * valid
    sums = jnp.stack([jnp.sum(B * (uq - ue) ** 2), jnp.sum(B * ue**2)])
    maxes = jnp.stack([jnp.max(valid * jnp.abs(u_h - un)), jnp.max(valid * jnp.abs(un))])
    return sums, maxes
