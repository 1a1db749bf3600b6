"""The one elliptic solve: h₁(−∇²u) + h₂u = b on a continuous SEM (NekRS's ``elliptic``).

A :class:`Helmholtz` holds the discretization, the coefficients and the preconditioner
(Jacobi, or p-multigrid on the hierarchy :mod:`jaxsem.discretization.hierarchy` builds,
in the solve's or in single precision), and whether constants span the operator's null
space (pure Neumann, h₂ = 0). :func:`solve` keeps the Krylov vectors where the
discretization says (assembled, one value per node, or E-vectors), masks and projects
them, and is differentiable by one adjoint solve (:func:`jaxsem.solvers.pcg.linear_solve`).
Poisson and BP1–BP6, the Navier–Stokes pressure and velocity and the inverse problems
all call it. Operators follow Deville, Fischer & Mund (2002): ``A u = mask·QQᵀ(h₁A_e +
h₂B_e)u`` on E-vectors, ``Qᵀ(h₁A_e + h₂B_e)Q x`` on assembled vectors.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .discretization import assembled, hierarchy
from .discretization.hierarchy import PMGScheduleWarning
from .discretization.sem import SEM
from .operators import mass_diagonal, stiffness_diagonal
from .solvers import multigrid
from .solvers.pcg import linear_solve, pcg

__all__ = ["Helmholtz", "helmholtz", "solve", "solve_local", "transpose_solve_local", "local_operator",
           "operator", "global_operator", "jacobi", "unit_diagonals", "pmg", "pure_neumann", "PMGScheduleWarning"]


def _is_zero(h):
    return isinstance(h, (int, float)) and not isinstance(h, bool) and h == 0


def _unit(h):
    """True for the Python scalar 1 (a coefficient that needs no multiply)."""
    return isinstance(h, (int, float)) and not isinstance(h, bool) and h == 1


def _split(h):
    """``(factor, field)`` of a coefficient: a scalar multiplies outside the element kernel
    (``field`` None), a field ``(E, 1, 1, 1)`` or ``(E, q, q, q)`` goes into it."""
    if _unit(h):
        return None, None
    if np.ndim(h) == 0:
        return h, None
    return None, h


def _scaled(c, w):
    return w if c is None else c * w


# --- the operator and its diagonal (rank-local: call inside SEM.local_map) ----------------

def _element_apply(sem: SEM, u, h1, h2):
    g, k = sem.geom, sem.backend
    w = 0.0
    if not _is_zero(h1):
        c, h = _split(h1)
        w = _scaled(c, k.stiffness_gll(u, sem.D, sem.stiffness_factors, h) if sem.quadrature == "gll"
                    else k.stiffness(u, sem.J, sem.Dt, g.G, h))
    if not _is_zero(h2):
        c, h = _split(h2)
        m = (g.B if h is None else g.B * h) * u if sem.quadrature == "gll" else k.mass(u, sem.J, g.B, h)
        w = w + _scaled(c, m)
    return w


def local_operator(sem: SEM, h1=1.0, h2=0.0) -> Callable:
    """Element operator u ↦ h₁A_e u + h₂B_e u (no assembly) for ``u: (..., E, n, n, n)``.

    ``h1, h2``: scalars or fields on the quadrature points ``(E, 1, 1, 1)``/``(E, q, q, q)``.
    The element kernels are ``sem.backend``'s (:mod:`jaxsem.backends`); per device when sharded.
    """
    return lambda u: sem.local_map(_element_apply, u, h1, h2)


def operator(sem: SEM, h1=1.0, h2=0.0) -> Callable:
    """Assembled operator on E-vectors: u ↦ mask·QQᵀ(h₁A_e + h₂B_e)u (rank-local data inside
    :meth:`SEM.local_map`, global arrays outside)."""
    return lambda u: sem.local_map(lambda s, u: s.mask * s.dssum(_element_apply(s, u, h1, h2)), u)


def global_operator(sem: SEM, h1=1.0, h2=0.0) -> Callable:
    """The operator on assembled vectors (one value per node, ``sem.assembled``):
    ``x ↦ Qᵀ(h₁A_e + h₂B_e)Q x`` for ``x: (..., size)``, 0 on Dirichlet nodes (per device
    when sharded; distributed, Qᵀ adds the neighbours' sums of the interface nodes).

    The stiffness alone runs as one fused kernel with the CUDA backend (gather, element
    operator and sum of the copies); other operators as ``Q``, the element kernels of
    ``sem.backend`` and ``Qᵀ``. Raises ``ValueError`` if ``sem`` has no assembled storage.
    """
    if sem.assembled is None:
        raise ValueError("sem has no assembled storage (it was discretized with storage='local'); "
                         "use the E-vector operator")
    if _is_zero(h2) and not _is_zero(h1):
        c, h = _split(h1)

        def apply(s, x):
            if s.quadrature == "gll":
                y = s.backend.stiffness_gll_assembled(x, s.assembled.idx, s.D, s.stiffness_factors, h)
            else:
                y = s.backend.stiffness_assembled(x, s.assembled.idx, s.J, s.Dt, s.geom.G, h)
            return _scaled(c, assembled.assemble(s.assembled, y))

        return lambda x: sem.local_map(apply, x)
    return lambda x: sem.local_map(
        lambda s, x: assembled.scatter(s.assembled, _element_apply(s, assembled.to_local(s.assembled, x), h1, h2)), x)


def unit_diagonals(sem: SEM):
    """The assembled diagonals of −∇² and of the mass matrix, each summed over a node's copies
    and without the mask: ``(dA, dB)``, each ``(E, n, n, n)`` (rank-local). With them the
    diagonal of h₁(−∇²) + h₂ for scalar coefficients is ``h₁·dA + h₂·dB``: no element work per
    solve (:attr:`Helmholtz.diagonals`)."""
    return (sem.dssum(stiffness_diagonal(sem.J, sem.Dt, sem.geom.G)),
            sem.dssum(mass_diagonal(sem.J, sem.geom.B)))


def jacobi(sem: SEM, h1=1.0, h2=0.0, diagonals=None):
    """Inverse of the exact assembled diagonal, 0 on Dirichlet nodes: ``(E, n, n, n)``.
    ``diagonals``: :func:`unit_diagonals` of ``sem``'s nodes (any mask), used where both
    coefficients are scalars."""
    if diagonals is not None and np.ndim(h1) == 0 and np.ndim(h2) == 0:
        dA, dB = diagonals
        d = (0.0 if _is_zero(h1) else _scaled(_split(h1)[0], dA)) + (0.0 if _is_zero(h2) else _scaled(_split(h2)[0], dB))
        return sem.mask / jnp.where(sem.mask > 0, d, 1.0)
    d = 0.0
    if not _is_zero(h1):
        c, h = _split(h1)
        d = _scaled(c, stiffness_diagonal(sem.J, sem.Dt, sem.geom.G, h))
    if not _is_zero(h2):
        c, h = _split(h2)
        d = d + _scaled(c, mass_diagonal(sem.J, sem.geom.B, h))
    d = sem.dssum(d)
    return sem.mask / jnp.where(sem.mask > 0, d, 1.0)


# --- the solve object ----------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Helmholtz:
    """h₁(−∇²) + h₂ on ``sem`` with its preconditioner (pytree; :func:`helmholtz` builds it).

    Attributes:
      sem: the discretization (its mask: the Dirichlet nodes; its ``assembled``: the storage
        of the Krylov vectors).
      fields: ``(h1, h2)`` where a coefficient is an array (a scalar array ``()``, per element
        ``(E, 1, 1, 1)`` or per quadrature point ``(E, q, q, q)``), else None.
      pmg: the p-multigrid preconditioner, or None (Jacobi).
      scalars: static ``(h1, h2)`` where a coefficient is a Python number (0 drops its term,
        1 its multiply), else None.
      nullspace: static: the constants span the null space (pure Neumann, h₂ = 0); solutions
        are then orthogonal to them.
      diagonals: :func:`unit_diagonals` of ``sem``, or None: the Jacobi preconditioner's
        diagonal for scalar coefficients without element work in each solve.
    """

    sem: SEM
    fields: tuple
    pmg: multigrid.PMG | None = None
    scalars: tuple = dataclasses.field(default=(1.0, 0.0), metadata=dict(static=True))
    nullspace: bool = dataclasses.field(default=False, metadata=dict(static=True))
    diagonals: tuple | None = None

    @classmethod
    def of(cls, sem: SEM, h1=1.0, h2=0.0, *, pmg: multigrid.PMG | None = None, nullspace: bool = False,
           diagonals=None):
        """The solve object without host work (usable inside ``jit``: no preconditioner set-up).
        ``diagonals``: :func:`unit_diagonals` of ``sem``'s nodes, computed once by the caller
        (a time stepper that solves with the same nodes every step)."""
        py = lambda h: isinstance(h, (int, float)) and not isinstance(h, bool)
        scalars = tuple(float(h) if py(h) else None for h in (h1, h2))
        fields = tuple(None if py(h) else h for h in (h1, h2))
        return cls(sem=sem, fields=fields, pmg=pmg, scalars=scalars, nullspace=bool(nullspace), diagonals=diagonals)

    @property
    def h1(self):
        return self.scalars[0] if self.fields[0] is None else self.fields[0]

    @property
    def h2(self):
        return self.scalars[1] if self.fields[1] is None else self.fields[1]

    def apply_elements(self, u):
        """``(h₁A_e + h₂B_e) u`` element by element, no assembly and no mask (rank-local)."""
        return _element_apply(self.sem, u, self.h1, self.h2)

    def apply(self, u):
        """``A u`` on E-vectors (rank-local)."""
        return self.sem.mask * self.sem.dssum(_element_apply(self.sem, u, self.h1, self.h2))

    def solve(self, b, *, x0=None, tol: float = 1e-10, maxiter: int = 1000, method: str = "classic"):
        """:func:`solve` of this problem."""
        return solve(self, b, x0=x0, tol=tol, maxiter=maxiter, method=method)


def pure_neumann(sem: SEM) -> SEM:
    """``sem`` without Dirichlet nodes (the same nodes all free): the space of a pure-Neumann
    problem such as the Navier–Stokes pressure. Assembled storage keeps every node."""
    return sem.with_mask(jnp.ones_like(sem.mask), False)


def pmg(sem: SEM, h1=1.0, h2=0.0, options: multigrid.PMGOptions = multigrid.PMGOptions()) -> multigrid.PMG:
    """The p-multigrid preconditioner of h₁(−∇²) + h₂ on ``sem``: levels by order
    (:func:`jaxsem.discretization.hierarchy.levels`, ``options.orders`` and ``options.dtype``),
    Chebyshev-smoothed (:mod:`jaxsem.solvers.multigrid`). Host set-up."""
    if not isinstance(options, multigrid.PMGOptions):
        raise TypeError(f"options must be a PMGOptions, got {type(options).__name__}")
    levels = hierarchy.levels(sem, options.orders, options.dtype)
    return multigrid.setup(levels, operator, jacobi, h1=h1, h2=h2, options=options, global_operator=global_operator)


PRECONDITIONERS = ("jacobi", "pmg")


def helmholtz(sem: SEM, h1=1.0, h2=0.0, *, precond="jacobi", options: multigrid.PMGOptions = multigrid.PMGOptions(),
              nullspace: bool = False) -> Helmholtz:
    """Set up the solve of h₁(−∇²u) + h₂u = b on ``sem`` (host work: the preconditioner).

    Args:
      sem: a :class:`~jaxsem.discretization.SEM` (Dirichlet nodes from its mask).
      h1, h2: coefficients ≥ 0: Python numbers, scalar arrays, per element ``(E, 1, 1, 1)``
        or per quadrature point ``(E, q, q, q)``.
      precond: ``"jacobi"`` (the inverse assembled diagonal, rebuilt from the coefficients
        in each solve), ``"pmg"`` (p-multigrid built here for these coefficients) or a
        :class:`~jaxsem.solvers.multigrid.PMG` built before.
      options: the p-multigrid's :class:`~jaxsem.solvers.multigrid.PMGOptions` (orders,
        smoother, ``dtype="float32"`` for the single-precision cycle).
      nullspace: True for a pure-Neumann operator (no Dirichlet nodes, h₂ = 0): solutions
        orthogonal to the constants.
    """
    if not isinstance(sem, SEM):
        raise TypeError(f"sem must be a jaxsem SEM, got {type(sem).__name__}")
    if isinstance(precond, str):
        if precond not in PRECONDITIONERS:
            raise ValueError(f"precond must be one of {PRECONDITIONERS} or a PMG, got {precond!r}")
        pre = pmg(sem, h1, h2, options) if precond == "pmg" else None
    elif isinstance(precond, multigrid.PMG):
        if precond.levels[0].sem.order != sem.order:
            raise ValueError(f"precond was built for order {precond.levels[0].sem.order}, sem has order {sem.order}")
        pre = precond
    else:
        raise TypeError(f"precond must be 'jacobi', 'pmg' or a PMG, got {type(precond).__name__}")
    return Helmholtz.of(sem, h1, h2, pmg=pre, nullspace=nullspace)


def solve(H: Helmholtz, b, *, x0=None, tol: float = 1e-10, maxiter: int = 1000, method: str = "classic"):
    """Solve ``A x = b`` for an assembled right-hand side ``b: (..., E, n, n, n)`` (leading
    axes: components solved together), from ``x0`` (an E-vector guess, or None).

    Returns ``(x, PCGInfo)``, ``x`` shaped like ``b``. ``tol``: relative residual (0: exactly
    ``maxiter`` iterations); ``method``: :func:`jaxsem.solvers.pcg.pcg`'s (a float32 V-cycle in
    a float64 solve runs ``"classic"`` as ``"flexible"``). Differentiable w.r.t. ``b``, the
    coefficients and the arrays of ``sem`` by one adjoint solve, whose non-convergence warns.
    Global arrays: maps :func:`solve_local` over the devices or ranks.
    """
    return H.sem.local_map(lambda _, H, b, x0: solve_local(H, b, x0=x0, tol=tol, maxiter=maxiter, method=method),
                           H, b, x0)


def _method(H: Helmholtz, method: str) -> str:
    pre = H.pmg
    if pre is not None and pre.dtype != H.sem.x.dtype and method == "classic":
        return "flexible"
    return method


def _precond(H: Helmholtz):
    """``r -> z`` on E-vectors: the V-cycle, or the Jacobi diagonal of the coefficients."""
    if H.pmg is not None:
        return lambda r: multigrid.vcycle(H.pmg, r)
    dinv = jacobi(H.sem, H.h1, H.h2, H.diagonals)
    return lambda r: dinv * r


def solve_local(H: Helmholtz, b, *, x0=None, tol: float = 1e-10, maxiter: int = 1000, method: str = "classic",
                adjoint_guess=None):
    """:func:`solve` on rank-local data (inside :meth:`SEM.local_map`, or on one device).

    ``adjoint_guess``: None, or an E-vector like ``b`` that starts the adjoint solve and whose
    cotangent is that solve's result in the same form (:func:`jaxsem.solvers.pcg.linear_solve`):
    a time stepper's reverse pass hands each step's back to the step before it, extrapolated.
    The value and the forward derivative do not depend on it."""
    sem = H.sem
    method = _method(H, method)
    keep_z = H.pmg is not None
    if sem.assembled is None:
        M = _precond(H)
        ones = jnp.broadcast_to(sem.valid * jnp.ones_like(sem.mask), b.shape)
        return linear_solve(
            operator(sem, H.h1, H.h2), b, dot=sem.dot, dots=sem.dots, project=lambda u: sem.mask * sem.dssum(sem.mult * u),
            weight=sem.mult * sem.mask, precond=M, tol=tol, maxiter=maxiter, method=method,
            transposable=sem.backend.transposable, keep_z=keep_z, x0=x0, nullspace=ones if H.nullspace else None,
            adjoint_guess=adjoint_guess)
    a = sem.assembled
    g = lambda u: assembled.from_local(a, u, sem.mult)
    keep = g(sem.mask)  # 1 on free nodes, 0 on Dirichlet ones
    # the continuous, masked subspace: a node's copies on several ranks made equal (the weighted
    # sum of the copies), the weight of each copy 1/(its ranks), as mult is for E-vectors
    weight = keep if a.weight is None else keep * a.weight
    project = (lambda x: keep * x) if a.weight is None else (lambda x: keep * assembled.assemble(a, a.weight * x))
    gb = g(b)
    if H.pmg is None:  # Jacobi: the inverse diagonal on the assembled nodes, no E-vector per iteration
        dinv = g(jacobi(sem, H.h1, H.h2, H.diagonals))
        precond = lambda r: dinv * r  # noqa: E731
    elif H.pmg.levels[0].pick is not None:  # the cycle's finest level on assembled vectors too
        precond = functools.partial(multigrid.vcycle_assembled, H.pmg)
    else:  # a PMG built on E-vector levels
        precond = lambda r: g(multigrid.vcycle(H.pmg, assembled.to_local(a, r)))  # noqa: E731
    x, info = linear_solve(
        global_operator(sem, H.h1, H.h2), gb, dot=functools.partial(assembled.dot, a), project=project,
        weight=weight, precond=precond, tol=tol, maxiter=maxiter,
        dots=functools.partial(assembled.dots, a), method=method, transposable=sem.backend.transposable,
        keep_z=keep_z, x0=None if x0 is None else g(x0),
        nullspace=jnp.broadcast_to(keep, gb.shape) if H.nullspace else None,
        adjoint_guess=None if adjoint_guess is None else _guess_to_assembled(a, adjoint_guess))
    return assembled.to_local(a, x), info


def _guess_to_assembled(a, g):
    """An adjoint guess carried as an E-vector → this rank's assembled vector: ``Q_rᵀ(g/√c_r)``,
    ``c_r`` the copies of each node on this rank and ``Q_rᵀ`` their sum without the exchange.
    Its transpose ``Q_r(·)/√c_r`` hands the adjoint solution back as an E-vector that this maps
    onto the same assembled vector again (``Q_rᵀ Q_r = c_r``: the identity on every rank's
    partial values). A round trip through the exchange would sum the ranks' parts of an
    interface node on every pass of a reverse run, and a guess's constant part (the pressure's
    null space, which no adjoint solve removes) would grow without bound."""
    copies = assembled.to_local(a, assembled.scatter_local(a, jnp.ones(g.shape[g.ndim - 4:], g.dtype)))
    return assembled.scatter_local(a, jnp.where(copies > 0, g / jnp.sqrt(jnp.where(copies > 0, copies, 1)), 0))


def transpose_solve_local(H: Helmholtz, c, *, tol: float = 1e-10, maxiter: int = 1000, method: str = "classic"):
    """The adjoint of :func:`solve_local` on E-vectors: ``(Sᵀ c, PCGInfo)`` with
    ``Sᵀ c = w·pcg(A, mask·QQᵀ(c))`` (w the inverse multiplicity on free nodes), for
    hand-written backward passes that must read the adjoint's info (rank-local)."""
    sem = H.sem
    weight = sem.mult * sem.mask
    rhs = sem.mask * sem.dssum(sem.mult * (c / jnp.where(weight != 0, weight, 1)))
    ones = sem.valid * jnp.ones_like(rhs) if H.nullspace else None
    y, info = pcg(operator(sem, H.h1, H.h2), rhs, dot=sem.dot, dots=sem.dots, precond=_precond(H), tol=tol,
                  maxiter=maxiter, method=_method(H, method), keep_z=H.pmg is not None, nullspace=ones)
    return weight * y, info
