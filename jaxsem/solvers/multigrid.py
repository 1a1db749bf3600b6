"""p-multigrid: a V-cycle over polynomial orders, Chebyshev-smoothed, as a PCG preconditioner.

Levels are the same elements at decreasing orders (default p → ⌈p/2⌉ → … → 1), each a
full discretization split like the finest, built by
:func:`jaxsem.discretization.hierarchy.levels` (coordinates interpolated from the finest
level, operator rediscretized there: the p-multigrid of Lottes & Fischer, J. Sci.
Comput. 2005); this module needs only their operators, gather–scatter and products. Between
levels:

* prolongation P: GLL-to-GLL Lagrange interpolation element by element,
  ``u_f = (J ⊗ J ⊗ J) u_c``. The trace of an element's polynomial on a face depends
  only on that face's nodes, so a continuous coarse field gives a continuous fine
  one (to round-off) and no averaging is needed;
* restriction R = Pᵀ in the Euclidean product of assembled vectors:
  ``r_c = mask_c·QQᵀ_c (Jᵀ ⊗ Jᵀ ⊗ Jᵀ)(mult_f · r_f)`` (each shared fine node counted
  once, then summed into the coarse nodes).

Smoothing is :func:`jaxsem.solvers.chebyshev.fourth_kind` of the Jacobi-scaled
operator, the same polynomial before and after the coarse correction; the coarsest
level is solved by a fixed number of first-kind Chebyshev steps on Ritz bounds of
its spectrum. Every step is a fixed polynomial, so the V-cycle is a fixed linear
operator, symmetric and positive definite (symmetric smoothing, an SPD coarse
polynomial, bounds ρ ≥ λ_max); plain PCG (:func:`jaxsem.solvers.pcg.linear_solve`)
takes it as ``precond`` and no flexible outer method is needed. A cycle has no
inner products, hence no global reductions: only each level's gather–scatter.

:func:`setup` measures the levels' spectra (a few Lanczos steps per level, compiled);
:func:`vcycle` is a function of rank-local data, so it runs unchanged inside :meth:`SEM.local_map` (sharded devices) and under MPI.
:func:`vcycle_assembled` is the same cycle for a solve on assembled vectors: its finest
level smooths on them (no E-vector and no gather–scatter pass there), the coarser ones on
E-vectors.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..backends import EINSUM
from ..core import basis
from ..discretization import assembled
from ..operators.tensor import interp
from ..parallel.comm import Blocks
from . import chebyshev

# The coarsest level's Chebyshev steps when κ asks for more: past this a coarser
# schedule or another coarse solver is the remedy, not more steps.
MAX_COARSE_STEPS = 500

__all__ = ["PMGOptions", "PMG", "Level", "setup", "vcycle", "vcycle_assembled", "prolong", "restrict"]


@dataclasses.dataclass(frozen=True)
class PMGOptions:
    """How the p-multigrid preconditioner is built (static, hashable).

    Attributes:
      orders: the level orders, finest first (``(7, 3, 1)``; the fine order may be left
        out); ``None``: halving, p → ⌈p/2⌉ → … → 1 (:func:`default_orders`), ended early
        (with a :class:`PMGScheduleWarning`) where the geometry interpolated to a lower
        order folds; given orders whose geometry folds are refused.
      degree: degree of the fourth-kind Chebyshev smoother, applied before and after the
        coarse correction (``degree − 1`` operator applications each, 1 ≤ degree ≤ 8).
      safety: ρ = safety · (largest Ritz value): the smoother's bound of λ_max(D⁻¹A).
      lanczos_steps: Jacobi-PCG (Lanczos) steps per level that estimate the spectrum.
      coarse_reduction: the coarsest level runs the first-kind Chebyshev steps that reduce
        its error by this factor on the estimated interval (from κ = ρ/λ_min at setup).
      coarse_steps: a fixed number of coarse Chebyshev steps instead (``None``: from
        ``coarse_reduction``).
      dtype: the V-cycle's precision: ``None`` (the solve's) or ``"float32"``: every level,
        the finest included, is rediscretized in float32 and the cycle casts the residual
        down and the correction up (NekRS's mixed-precision multigrid: half the bytes per
        smoothing pass). The cycle is then no longer exactly one fixed linear operator,
        so :func:`jaxsem.models.poisson.solve` runs flexible CG with it.
    """

    orders: tuple | None = None
    degree: int = 2
    safety: float = 1.1
    lanczos_steps: int = 20
    coarse_reduction: float = 0.1
    coarse_steps: int | None = None
    dtype: str | None = None

    def __post_init__(self):
        if self.orders is not None:
            try:
                orders = tuple(self.orders)
            except TypeError:
                raise TypeError(f"orders must be a sequence of ints, got {self.orders!r}") from None
            if not orders or any(isinstance(o, bool) or not isinstance(o, (int, np.integer)) for o in orders):
                raise TypeError(f"orders must be a non-empty sequence of ints, got {self.orders!r}")
            orders = tuple(int(o) for o in orders)
            if orders[-1] < 1 or any(a <= b for a, b in zip(orders, orders[1:])):
                raise ValueError(f"orders must decrease strictly to an order >= 1, got {orders}")
            object.__setattr__(self, "orders", orders)
        if isinstance(self.degree, bool) or not isinstance(self.degree, (int, np.integer)) \
                or not 1 <= self.degree <= 8:
            raise ValueError(f"degree must be an integer in [1, 8], got {self.degree!r}")
        if not (isinstance(self.safety, (int, float)) and 1.0 <= self.safety <= 4.0):
            raise ValueError(f"safety must be a number in [1, 4], got {self.safety!r}")
        if isinstance(self.lanczos_steps, bool) or not isinstance(self.lanczos_steps, (int, np.integer)) \
                or not 2 <= self.lanczos_steps <= 200:
            raise ValueError(f"lanczos_steps must be an integer in [2, 200], got {self.lanczos_steps!r}")
        if not (isinstance(self.coarse_reduction, (int, float)) and 0 < self.coarse_reduction < 1):
            raise ValueError(f"coarse_reduction must be in (0, 1), got {self.coarse_reduction!r}")
        if self.coarse_steps is not None and (isinstance(self.coarse_steps, bool)
                                              or not isinstance(self.coarse_steps, (int, np.integer))
                                              or not 1 <= self.coarse_steps <= 10000):
            raise ValueError(f"coarse_steps must be None or an integer in [1, 10000], got {self.coarse_steps!r}")
        if self.dtype not in (None, "float32", "float64"):
            raise ValueError(f"dtype must be None, 'float32' or 'float64', got {self.dtype!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Level:
    """One level of the hierarchy (pytree; element arrays split like the SEM's).

    Attributes:
      sem: the level's discretization (same elements and partition as the finest).
      dinv: ``(E, n, n, n)`` inverse assembled diagonal of the level operator, 0 on
        Dirichlet nodes.
      lmin, rho: ``()`` the smallest Ritz value of D⁻¹A and the bound ρ of λ_max(D⁻¹A).
      h1, h2: the coefficients on this level's quadrature points (``None`` where the
        coefficient is a scalar, kept static on :class:`PMG`).
      J: ``(n_finer, n)`` GLL-to-GLL interpolation to the next finer level (``None`` on
        the finest).
      pick, adinv: on the finest level when it has assembled storage (``None`` elsewhere):
        ``(size,)`` int32, the rank-local E-vector position (flattened) of one copy of each
        node (``E·n³``, out of range, where the node has none on this rank's elements or is a
        Dirichlet node), and ``(size,)`` the inverse diagonal on the nodes
        (:func:`vcycle_assembled`).
    """

    sem: object
    dinv: jax.Array
    lmin: jax.Array
    rho: jax.Array
    h1: jax.Array | None = None
    h2: jax.Array | None = None
    J: jax.Array | None = None
    pick: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))
    adinv: jax.Array | None = dataclasses.field(default=None, metadata=dict(blocks=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PMG:
    """A p-multigrid preconditioner built by :func:`setup` (pytree; pass it through
    :meth:`SEM.local_map` with the solve, then apply :func:`vcycle`).

    Attributes:
      levels: finest first.
      operator, diagonal: static ``(sem, h1, h2) -> (u -> A u)`` and ``-> D⁻¹`` of the
        problem (:func:`jaxsem.models.poisson.operator` and ``jacobi``).
      scalars: static ``(h1, h2)``; an entry is ``None`` where the coefficient is a field
        (then each level holds its own).
      degree, coarse_steps: static smoother degree and coarse Chebyshev steps.
      options: the :class:`PMGOptions` it was built with.
      global_operator: static ``(sem, h1, h2) -> (x -> A x)`` on assembled vectors
        (:func:`jaxsem.elliptic.global_operator`) when the finest level has assembled
        storage, else ``None``.
    """

    levels: tuple
    operator: Callable = dataclasses.field(metadata=dict(static=True))
    diagonal: Callable = dataclasses.field(metadata=dict(static=True))
    scalars: tuple = dataclasses.field(metadata=dict(static=True))
    degree: int = dataclasses.field(metadata=dict(static=True))
    coarse_steps: int = dataclasses.field(metadata=dict(static=True))
    options: PMGOptions = dataclasses.field(metadata=dict(static=True))
    global_operator: Callable | None = dataclasses.field(default=None, metadata=dict(static=True))

    @property
    def orders(self) -> tuple:
        return tuple(lv.sem.order for lv in self.levels)

    @property
    def dtype(self):
        """The V-cycle's floating-point type (that of its levels)."""
        return self.levels[0].sem.x.dtype

    def coefficients(self, level: int):
        """``(h1, h2)`` of level ``level``: the static scalars or the level's fields."""
        lv = self.levels[level]
        s1, s2 = self.scalars
        return (s1 if lv.h1 is None else lv.h1), (s2 if lv.h2 is None else lv.h2)

    def level_operator(self, level: int) -> Callable:
        """The assembled operator ``u -> A_l u`` of level ``level``."""
        return self.operator(self.levels[level].sem, *self.coefficients(level))


def prolong(J, uc, backend=EINSUM):
    """Interpolate a level's E-vector to the next finer one: ``(..., E, m, m, m) → (..., E, n, n, n)``.

    ``J: (n, m)`` GLL-to-GLL interpolation; element by element, continuous fields stay
    continuous (to round-off) and coarse polynomials are reproduced exactly. ``backend``:
    whose transfer kernel (:meth:`jaxsem.backends.Backend.interp`; the levels' own in a cycle).
    """
    return backend.interp(uc, J)


def restrict(coarse, J, mult_fine, rf):
    """Pᵀ of :func:`prolong` on assembled vectors: ``mask_c·QQᵀ_c Jᵀ(mult_f · r_f)``.

    ``rf: (..., E, n, n, n)`` a continuous (assembled) fine residual; returns the coarse
    one ``(..., E, m, m, m)``, so that ⟨P u, v⟩_f = ⟨u, R v⟩_c in the multiplicity-weighted
    products of :meth:`SEM.dot`. The transfer is ``coarse.backend``'s.
    """
    return coarse.mask * coarse.dssum(coarse.backend.interp(mult_fine * rf, J, back=True))


def vcycle(pmg: PMG, r):
    """One V-cycle ``z = M r`` of the preconditioner: ``r, z: (..., E, n, n, n)`` continuous.

    Per level: fourth-kind Chebyshev pre-smoothing from zero, restriction of the
    residual, the coarser cycle, prolongation, the same smoothing again; on the
    coarsest level the first-kind Chebyshev solve. Rank-local: call it inside
    :meth:`SEM.local_map` (with ``pmg`` among the mapped arguments) or on one device.
    ``r`` is cast to the cycle's dtype (:attr:`PMG.dtype`) and ``z`` back to ``r``'s.
    """
    return _cycle(pmg, 0, r.astype(pmg.dtype)).astype(r.dtype)


def vcycle_assembled(pmg: PMG, r):
    """:func:`vcycle` on assembled vectors of the finest level: ``r, z: (..., size)``
    (``pmg.levels[0].sem.assembled``; rank-local, as :func:`vcycle`).

    The finest level smooths with its operator on assembled vectors (the gather, element
    operator and sum of the copies in one kernel with the CUDA backend, no separate
    gather–scatter pass); its residual goes to the coarser level as an E-vector and the
    coarse correction, interpolated and continuous, comes back as one copy of each node.
    Equals ``Qᵀ(mult · vcycle(Q r))`` up to round-off (the copies of a continuous field
    differ only by it). Raises ``ValueError`` if the PMG was built without the finest
    level's node map (:func:`setup` without ``global_operator``).
    """
    lv = pmg.levels[0]
    if lv.pick is None or pmg.global_operator is None:
        raise ValueError("pmg has no assembled finest level: build it with setup(..., global_operator=...) "
                         "on a discretization with assembled storage")
    A = pmg.global_operator(lv.sem, *pmg.coefficients(0))
    down = functools.partial(assembled.to_local, lv.sem.assembled)
    up = functools.partial(_one_copy, lv.pick)
    return _cycle(pmg, 0, r.astype(pmg.dtype), A, lv.adinv, down, up).astype(r.dtype)


def _one_copy(pick, u):
    """The assembled vector of a continuous E-vector ``u: (..., E, n, n, n)`` by one copy per
    node: ``(..., size)`` (0 where ``pick`` is out of range)."""
    flat = u.reshape(u.shape[: u.ndim - 4] + (-1,))
    return jnp.take(flat, pick, axis=-1, mode="fill", fill_value=0)


@jax.jit
def _node_map(sem, dinv):
    """``Blocks((pick, adinv))`` of the finest level (:class:`Level`), per rank."""
    def local(s, dinv):
        ids = s.assembled.idx.reshape(-1)
        pos = jax.ops.segment_max(jnp.arange(ids.size, dtype=jnp.int32), ids, num_segments=s.assembled.size)
        pick = jnp.where(pos < 0, ids.size, pos).astype(jnp.int32)  # no copy here (or Dirichlet): out of range
        return Blocks((pick, _one_copy(pick, dinv)))

    return sem.local_map(local, dinv)


def _cycle(pmg: PMG, l: int, r, A=None, dinv=None, down=None, up=None):
    """Level ``l``'s cycle on E-vectors, or with its operator ``A``, inverse diagonal ``dinv`` and
    the maps ``down`` (its vectors to E-vectors) and ``up`` (continuous E-vectors to its vectors)
    given, on another storage of the level."""
    lv = pmg.levels[l]
    A = pmg.level_operator(l) if A is None else A
    dinv = lv.dinv if dinv is None else dinv
    if l == len(pmg.levels) - 1:
        return chebyshev.first_kind(A, dinv, lv.lmin, lv.rho, pmg.coarse_steps, r)
    coarse = pmg.levels[l + 1]
    x = chebyshev.fourth_kind(A, dinv, lv.rho, pmg.degree, r)
    res = r - A(x)
    rc = restrict(coarse.sem, coarse.J, lv.sem.mult, res if down is None else down(res))
    xc = prolong(coarse.J, _cycle(pmg, l + 1, rc), lv.sem.backend)
    x = x + (xc if up is None else up(xc))
    return chebyshev.fourth_kind(A, dinv, lv.rho, pmg.degree, r, x)


def setup(levels, operator: Callable, diagonal: Callable, h1=1.0, h2=0.0,
          options: PMGOptions = PMGOptions(), global_operator: Callable | None = None) -> PMG:
    """Build the p-multigrid preconditioner of ``u ↦ operator(sem, h1, h2)(u)`` on a hierarchy.

    Args:
      levels: the discretizations, finest first: the same elements at decreasing orders
        (:func:`jaxsem.discretization.hierarchy.levels`), serial, sharded over devices or
        one MPI rank's, all split alike.
      operator: ``(sem, h1, h2) -> (u -> A u)``, the assembled operator on any level
        (:func:`jaxsem.elliptic.operator`).
      diagonal: ``(sem, h1, h2) -> D⁻¹``, its inverse assembled diagonal, 0 on Dirichlet
        nodes (:func:`jaxsem.elliptic.jacobi`).
      h1, h2: coefficients on the finest level: scalars, per element ``(E, 1, 1, 1)`` or
        per quadrature point ``(E, q, q, q)`` (interpolated to each level's quadrature points).
      options: :class:`PMGOptions` (its ``orders`` and ``dtype`` shape the hierarchy and
        are read where that is built).
      global_operator: ``(sem, h1, h2) -> (x -> A x)`` on assembled vectors
        (:func:`jaxsem.elliptic.global_operator`): with it, and assembled storage on the
        finest level, :func:`vcycle_assembled` runs that level on assembled vectors.
    Returns a :class:`PMG`; one compiled Lanczos run per level measures its spectrum.
    """
    if not isinstance(options, PMGOptions):
        raise TypeError(f"options must be a PMGOptions, got {type(options).__name__}")
    sems = tuple(levels)
    if not sems or any(a.order <= b.order for a, b in zip(sems, sems[1:])):
        raise ValueError(f"levels must be discretizations of strictly decreasing order, got orders "
                         f"{tuple(getattr(s, 'order', None) for s in sems)}")
    sem, dtype = sems[0], sems[0].x.dtype
    scalars = tuple(h if _scalar(h) else None for h in (h1, h2))
    dirichlet = float(sem.comm.allreduce(jnp.sum((sem.mask == 0) * sem.valid))) > 0
    # a pure-Neumann Laplacian is singular (constants): Lanczos then starts in the range of A
    singular = not dirichlet and scalars[1] == 0
    steps = options.lanczos_steps
    built = []
    for l, s in enumerate(sems):
        hs = [None if sc is not None else _coefficient(h, sem, s) for h, sc in zip((h1, h2), scalars)]
        dinv, diag, off = _measure(s, operator, diagonal, scalars, hs[0], hs[1], steps, singular)
        # the Ritz values on the host: an eigensolver in the compiled program costs more to compile
        # than the few dozen numbers it handles
        diag, off = np.asarray(diag, np.float64), np.asarray(off, np.float64)
        lam = np.linalg.eigvalsh(np.diag(diag) + np.diag(off, 1) + np.diag(off, -1))
        lmin, lmax = jnp.asarray(lam[0], dtype), jnp.asarray(lam[-1], dtype)
        if not float(lmax) > 0:  # no unknowns on this level (all Dirichlet): the one above is the coarsest
            if l == 0:
                raise ValueError("sem has no unknowns (every node is a Dirichlet node): nothing to precondition")
            break
        J = None if l == 0 else jnp.asarray(basis.interp_matrix(s.n, sems[l - 1].n, "gll", "gll")[0], dtype)
        pick = adinv = None
        if l == 0 and global_operator is not None and s.assembled is not None:
            pick, adinv = _node_map(s, dinv).value
        built.append(Level(sem=s, dinv=dinv, lmin=lmin, rho=options.safety * lmax, h1=hs[0], h2=hs[1], J=J,
                           pick=pick, adinv=adinv))

    if options.coarse_steps is not None:
        coarse_steps = int(options.coarse_steps)
    else:
        c = built[-1]
        kappa = float(c.rho) / max(float(c.lmin), float(c.rho) * 1e-12)
        coarse_steps = min(chebyshev.steps_for(kappa, options.coarse_reduction), MAX_COARSE_STEPS)
    return PMG(levels=tuple(built), operator=operator, diagonal=diagonal, scalars=scalars,
               degree=int(options.degree), coarse_steps=coarse_steps, options=options,
               global_operator=global_operator if built[0].pick is not None else None)


def _scalar(h) -> bool:
    return isinstance(h, (int, float, np.integer, np.floating)) and not isinstance(h, bool)


def _coefficient(h, fine, level):
    """A coefficient field on ``fine``'s quadrature points, on ``level``'s (interpolated per element,
    in ``level``'s dtype)."""
    h = jnp.asarray(h, level.x.dtype)
    if h.ndim == 0 or h.shape[-3:] == (1, 1, 1) or level.n == fine.n:
        return h
    kind = "gll" if fine.quadrature == "gll" else "gauss"
    Jq = basis.interp_matrix(fine.J.shape[0], level.J.shape[0], kind, kind)[0]
    return interp(h, jnp.asarray(Jq, h.dtype))


def _start_vector(sem):
    """A rough, continuous, masked start vector that depends only on node coordinates
    (so serial, sharded and MPI runs start Lanczos from the same vector)."""
    x, y, z = sem.x[0], sem.x[1], sem.x[2]
    v = jnp.sin(12.9898 * x + 78.233 * y + 37.719 * z) * 43758.5453
    v = v - jnp.floor(v) - 0.5
    return sem.mask * sem.dssum(sem.mult * v)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 6, 7))
def _measure(sem, operator, diagonal, scalars, h1, h2, steps, singular):
    """``(dinv, diag, off)`` of one level: its Jacobi diagonal and the Lanczos tridiagonal of D⁻¹A.

    ``scalars``: static ``(h1, h2)`` (``None`` where the coefficient is the field ``h1``/``h2``).
    ``singular``: A annihilates constants; the start vector A v is orthogonal to them, so
    the Krylov space (and λ_min) stays off the null space.
    """
    def local(s, h1, h2):
        c1 = scalars[0] if h1 is None else h1
        c2 = scalars[1] if h2 is None else h2
        dinv = diagonal(s, c1, c2)
        A = operator(s, c1, c2)
        v = _start_vector(s)
        return (dinv,) + chebyshev.lanczos(A, dinv, A(v) if singular else v, s.dot, steps)

    return sem.local_map(local, h1, h2)
