"""Helmholtz/Poisson problems and the CEED bake-off problems BP1–BP6.

Solves h₁(−∇²u) + h₂u = f weakly: ``A u = b`` with A = mask·QQᵀ·(h₁ A_e + h₂ B_e)
on E-vectors, Jacobi-preconditioned CG with multiplicity-weighted inner
products. BPk uses BKk's element operator (mass for BP1/2 with Neumann
conditions; stiffness for BP3–6 with Dirichlet), Gauss q = N + 2 quadrature
for BP1–4 and collocated GLL for BP5/6; BP2/4/6 solve three components at once.

Manufactured solutions on the unit box (deformed or not) give exact errors.

Boundary conditions per named boundary group: :func:`setup` takes ``{group: Dirichlet(g) |
Neumann(h)}`` and returns a :class:`Problem` that :func:`solve` takes in place of a SEM.
Nonzero Dirichlet data are lifted: u = u₀ + ℓ with ℓ the nodal interpolant of g on the
Dirichlet nodes, u₀ solved for with right-hand side b − Aℓ; Neumann data enter b as ∮ v h dA.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..core import geometry as geo
from ..discretization import surface as surf_
from ..discretization.sem import SEM, discretize, with_dirichlet
from ..elliptic import Helmholtz, global_operator, jacobi, local_operator, operator, pmg, solve_local
from ..mesh.box import Mesh
from ..mesh.numbering import number_nodes
from ..operators import BK_SPECS
from ..operators.tensor import interp, interp_t
from ..solvers import multigrid

__all__ = [
    "BP_SPECS", "bp_discretize", "local_operator", "operator", "global_operator", "jacobi", "load",
    "solve", "pmg", "manufactured", "relative_errors", "coefficients", "Dirichlet", "Neumann", "Problem", "setup",
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
      sem: from :func:`bp_discretize` or :func:`jaxsem.discretize`, or a :class:`Problem` from
        :func:`setup` (boundary data per group: returns u = u₀ + ℓ; pure Neumann with h₂ = 0
        solves orthogonally to the constants, and f and the fluxes must balance).
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
    lift = neumann = None
    if isinstance(sem, Problem):
        sem, lift, neumann = sem.sem, sem.lift, sem.neumann
    _check_inputs(sem, f, h1, h2, rhs)
    if precond is not None and not isinstance(precond, multigrid.PMG):
        raise TypeError(f"precond must be None (Jacobi) or a PMG from poisson.pmg, got {type(precond).__name__}")
    if precond is not None and precond.levels[0].sem.order != sem.order:
        raise ValueError(f"precond was built for order {precond.levels[0].sem.order}, sem has order {sem.order}")
    nullspace = lift is not None and sem.dirichlet is False and _is_zero(h2)  # pure Neumann
    H = Helmholtz.of(sem, h1, h2, pmg=precond, nullspace=nullspace)
    return sem.local_map(_solve, f, H, tol, maxiter, rhs, method, lift, neumann)


def _is_zero(h):
    return isinstance(h, (int, float)) and not isinstance(h, bool) and h == 0


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


def _solve(sem: SEM, f, H: Helmholtz, tol, maxiter, rhs, method, lift=None, neumann=None):
    b = load(sem, f) if rhs is None else rhs
    if lift is None:
        return solve_local(H, b, tol=tol, maxiter=maxiter, method=method)
    u0, info = solve_local(H, b + neumann - H.apply(lift), tol=tol, maxiter=maxiter, method=method)
    return u0 + lift, info


# --- boundary conditions per named boundary group -----------------------------------------

@dataclasses.dataclass(frozen=True)
class Dirichlet:
    """u = g on a boundary group; ``g``: a number or ``g(x, y, z)`` written with ``jnp``."""

    g: Callable | float = 0.0


@dataclasses.dataclass(frozen=True)
class Neumann:
    """h₁ ∂u/∂n = h (outward flux) on a boundary group, entering as ∮ v h dA; ``h``: a number or
    ``h(x, y, z)`` written with ``jnp`` (∂u/∂n = h for h₁ = 1)."""

    h: Callable | float = 0.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Problem:
    """A Poisson/Helmholtz problem with boundary data per group (pytree; :func:`setup` builds it).

    Attributes:
      sem: the discretization, its mask 0 on the Dirichlet groups' nodes.
      lift: ``(E, n, n, n)`` ℓ, the Dirichlet data at the Dirichlet nodes, 0 elsewhere.
      neumann: ``(E, n, n, n)`` assembled ∮ v h dA of the Neumann data (masked).
      conditions: static ``((group, "dirichlet" | "neumann"), …)`` for every group of the mesh.
    """

    sem: SEM
    lift: jax.Array
    neumann: jax.Array
    conditions: tuple = dataclasses.field(metadata=dict(static=True), default=())


def setup(mesh_or_sem, boundary: dict | None = None, **discretize_kw) -> Problem:
    """The problem on ``mesh_or_sem`` with ``boundary = {group: Dirichlet(g) | Neumann(h)}``.

    Groups of the mesh that ``boundary`` does not name get homogeneous Dirichlet conditions
    (``boundary=None``: every face, the behaviour of :func:`solve` on a plain SEM). Where
    Dirichlet groups meet, the shared nodes take the data of the group named last. A Mesh is
    discretized with ``discretize_kw`` (:func:`jaxsem.discretize`'s); a SEM gets its Dirichlet
    nodes by :func:`jaxsem.discretization.with_dirichlet`. The data are evaluated with ``jnp``
    here, so ``jax.grad`` through ``solve(setup(...), f)`` reaches parameters they close over.
    Raises ``ValueError`` naming unknown groups (and listing the mesh's), and, where a Neumann
    group is given, boundary faces in no group.
    """
    boundary = {} if boundary is None else dict(boundary)
    mesh = mesh_or_sem.source.mesh if isinstance(mesh_or_sem, SEM) else mesh_or_sem
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh_or_sem must be a jaxsem Mesh or SEM, got {type(mesh_or_sem).__name__}")
    if isinstance(mesh_or_sem, SEM) and discretize_kw:
        raise ValueError(f"discretize keywords {sorted(discretize_kw)} apply to a Mesh, not to a SEM")
    unknown = [g for g in boundary if g not in mesh.boundaries]
    if unknown:
        raise ValueError(f"boundary names group(s) {unknown} the mesh does not have; "
                         f"its groups: {sorted(mesh.boundaries)}")
    bad = {g: c for g, c in boundary.items() if not isinstance(c, (Dirichlet, Neumann))}
    if bad:
        raise TypeError(f"boundary values must be Dirichlet(g) or Neumann(h), got {bad}")
    conds = {g: boundary.get(g, Dirichlet(0.0)) for g in mesh.boundaries}
    conditions = tuple((g, "dirichlet" if isinstance(c, Dirichlet) else "neumann") for g, c in conds.items())
    dgroups = tuple(g for g, c in conds.items() if isinstance(c, Dirichlet))
    ngroups = tuple(g for g, c in conds.items() if isinstance(c, Neumann))
    if ngroups:
        _check_covered(mesh)
    dirichlet = True if not ngroups else (dgroups or False)
    if isinstance(mesh_or_sem, SEM):
        sem = mesh_or_sem if mesh_or_sem.dirichlet == dirichlet else with_dirichlet(mesh_or_sem, dirichlet)
    else:
        sem = discretize(mesh, dirichlet=dirichlet, **discretize_kw)
    lift = neumann = jnp.zeros_like(sem.mask)
    data = tuple(g for g, c in boundary.items() if isinstance(c, Dirichlet) or not _is_zero(c.h))
    if data:  # one surface of the groups with data; the order given (the last Dirichlet group wins)
        s = surf_.surface(sem, data)
        xf = surf_.face_values(s, sem.x)
        hf = 0.0
        for k, g in enumerate(data):
            on = (s.group == k)[:, None, None]
            if isinstance(boundary[g], Neumann):
                hf = hf + jnp.where(on, _values(boundary[g].h, xf, s.weight), 0.0)
                continue
            ind = surf_.face_scatter(s, jnp.broadcast_to(on, s.weight.shape).astype(s.weight.dtype), sem.mask)
            at = sem.local_map(lambda t, i: t.dssum(i) > 0, ind)  # every copy of the group's nodes
            lift = jnp.where(at, _values(boundary[g].g, sem.x, sem.mask), lift)
        if ngroups:
            b = surf_.face_scatter(s, s.weight * hf, sem.mask)
            neumann = sem.local_map(lambda t, b: t.mask * t.dssum(b), b)
    return Problem(sem=sem, lift=lift, neumann=neumann, conditions=conditions)


def _check_covered(mesh: Mesh):
    """``ValueError`` if a face of the domain boundary is in no boundary group (its condition
    would be unsaid)."""
    named = {int(e) * 6 + int(f) for rows in mesh.boundaries.values() for e, f in rows}
    rest = [(int(e), int(f)) for e, f in number_nodes(mesh).boundary_faces if int(e) * 6 + int(f) not in named]
    if rest:
        raise ValueError(f"{len(rest)} boundary face(s) are in no boundary group (first (element, face): "
                         f"{rest[:3]}); with a Neumann group every boundary face must be in a named group")


def _values(g, x, like):
    """Data ``g`` (a number or ``g(x, y, z)``) at points ``x: (3, ...)``, shaped like ``like``."""
    v = g(x[0], x[1], x[2]) if callable(g) else g
    return jnp.broadcast_to(jnp.asarray(v, like.dtype), like.shape)


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
