"""What the DG models (:mod:`~jaxsem.models.advection`, :mod:`~jaxsem.models.maxwell`) share.

The physics-free plumbing around a strong-form DG right-hand side
``rhs(dg, p, q, ...)`` with ``p`` the model's coefficient pytree
(a Transport, a Material): option checks, the numerics of a run
(:class:`Scheme`), the reference derivative (for metric terms), the ``f(t, q, (dg, p))`` closure
for :func:`jaxsem.solvers.driver.run`, the metadata its checkpoints carry, the
verification drivers' box and placement checks, the power-iteration spectral
radius and the relative L2 error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..solvers import driver
from ..solvers import timestepping as ts
from ..discretization.dg import DG, discretize_dg
from ..mesh.box import Mesh

# The power iteration approaches ρ from below; this margin covers its shortfall.
RHO_MARGIN = 1.05


def check_choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Scheme:
    """The numerics of a DG run (static, hashable): the fields and checks each model's ``Scheme`` shares.

    ``flux``, ``form`` (one of the subclass's ``FORMS``), ``method``, ``cfl`` and
    ``dt``: see :class:`jaxsem.models.maxwell.Scheme`.
    """

    flux: str = "upwind"
    form: str = "split"
    method: str = "lserk4"
    cfl: float = 0.5
    dt: float | None = None

    FLUXES: ClassVar[tuple] = ("upwind", "central")
    FORMS: ClassVar[tuple] = ("split",)

    def __post_init__(self):
        name = type(self).__name__
        check_choice(self.flux, f"{name}.flux", self.FLUXES)
        check_choice(self.form, f"{name}.form", self.FORMS)
        check_choice(self.method, f"{name}.method", ts.METHODS)
        cfl = _real(self.cfl)
        if cfl is None or not 0 < cfl <= 1:
            raise ValueError(f"{name}.cfl must be a number in (0, 1] (a fraction of the stable time step), "
                             f"got {self.cfl!r}")
        object.__setattr__(self, "cfl", cfl)
        if self.dt is not None:
            dt = _real(self.dt)
            if dt is None or dt <= 0:
                raise ValueError(f"{name}.dt must be None or a positive finite number, got {self.dt!r}")
            object.__setattr__(self, "dt", dt)


def _real(x) -> float | None:
    """``x`` as a finite Python float (numbers and 0-d arrays; not bools or strings), else ``None``."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def check_scheme(scheme, cls) -> None:
    if not isinstance(scheme, cls):
        raise TypeError(f"scheme must be a {cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}, got {scheme!r}")


def check_t_final(t_final) -> None:
    v = _real(t_final)
    if v is None or v < 0:
        raise ValueError(f"t_final must be a finite number >= 0, got {t_final!r}")


def ref_derivative(D, u, a, xp=jnp):
    """Reference derivative along axis a (0: r, 1: s, 2: t) of ``u: (..., E, n, n, n)`` [k, j, i]."""
    if a == 0:
        return xp.einsum("il,...kjl->...kji", D, u)
    if a == 1:
        return xp.einsum("jl,...kli->...kji", D, u)
    return xp.einsum("kl,...lji->...kji", D, u)


def rhs_fn(rhs: Callable, **options):
    """``f(t, q, (dg, p)) = rhs(dg, p, q, **options)`` on each device's block of elements
    (:meth:`jaxsem.discretization.base.Discretization.local_map`), the form a time stepper takes."""

    def local(dg, p, q):
        return rhs(dg, p, q, **options)

    def f(t, q, args):
        dg, p = args
        return dg.local_map(local, p, q)

    return f


# ----------------------------------------------------------------------------- runs and checkpoints


def fingerprint(*arrays) -> str:
    """A short hex digest of the arrays' dtypes, shapes and bytes (host NumPy arrays)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def dg_meta(dg: DG) -> dict:
    """What identifies a discretization in a checkpoint: order, dtype, element count, mesh fingerprint.

    The fingerprint hashes the node coordinates ``dg.x`` this process holds (its
    own elements under MPI, where each rank has its own checkpoint file).
    """
    return dict(order=int(dg.order), dtype=str(dg.jac.dtype),
                elements=int(dg.num_global_elements or dg.num_elements), mesh=fingerprint(dg.host(dg.x)))


def run_options(options, dt_max: float, desc: str, meta: Callable[[], dict]):
    """``options`` as a DG driver passes them to :func:`jaxsem.solvers.driver.run`.

    ``dt_max`` the stable limit (the smaller of it and the caller's own), ``desc``
    the progress label (unless the caller set one), and, where checkpoints are
    written or read, ``meta()`` (the physics and :func:`dg_meta`) beside the
    caller's own keys.
    """
    if not isinstance(options, driver.RunOptions):
        raise TypeError(f"options must be a RunOptions, got {options!r}")
    changes = dict(dt_max=dt_max if options.dt_max is None else min(dt_max, options.dt_max))
    if options.desc == driver.RunOptions().desc:
        changes["desc"] = desc
    if options.checkpoint_path is not None or options.resume is not None:
        ours, theirs = meta(), dict(options.meta)
        clash = sorted(set(ours) & set(theirs))
        if clash:
            raise ValueError(f"RunOptions.meta key {clash[0]!r} is set by the {desc} driver itself")
        changes["meta"] = {**theirs, **ours}
    return dataclasses.replace(options, **changes)


PLACE = ("comm", "partition", "devices")


def box_lengths(mesh, who: str) -> tuple:
    """The side lengths of a :func:`jaxsem.box_mesh` that fills ``[0, L]³``; errors name ``mesh``."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{who}: mesh must be a jaxsem Mesh (from box_mesh), got {type(mesh).__name__}")
    if mesh.lengths is None:
        raise ValueError(f"{who}: mesh must be a box_mesh (the exact solution lives in the box [0, L]^3), "
                         f"got a mesh without box lengths: {mesh!r}")
    L = np.asarray(mesh.lengths, float)
    lo, hi = mesh.x.min(axis=(1, 2, 3, 4)), mesh.x.max(axis=(1, 2, 3, 4))
    tol = 1e-9 * float(L.max())
    if np.any(np.abs(lo) > tol) or np.any(np.abs(hi - L) > tol):
        raise ValueError(f"{who}: mesh must fill the box [0, L] with L = {tuple(mesh.lengths)}, "
                         f"its nodes span {lo.tolist()} to {hi.tolist()}")
    return tuple(float(v) for v in L)


def discretize(mesh: Mesh, dtype, place: dict, who: str) -> DG:
    """:func:`jaxsem.discretize_dg` of ``mesh`` placed by ``place`` (``comm``, ``partition``, ``devices``)."""
    bad = sorted(set(place) - set(PLACE))
    if bad:
        raise TypeError(f"{who}() got an unexpected keyword argument {bad[0]!r}; "
                        f"placement takes {', '.join(PLACE)} (see jaxsem.discretize_dg)")
    return discretize_dg(mesh, dtype=dtype, **place)


# ----------------------------------------------------------------------------- spectral radius


@functools.lru_cache(maxsize=None)
def _operator(f):
    return lambda v, args: f(0.0, v, args)


def spectral_radius(dg: DG, f: Callable, args, inner: Callable, lead: tuple = (), iterations: int = 60) -> float:
    """Power-iteration ρ of ``v ↦ f(0, v, args)``, ``v: (*lead, E, n, n, n)``, in the norm of ``inner``.

    ``f`` a cached :func:`rhs_fn` (the same object reuses the operator). The start
    vector is NumPy's seed-0 normal draw of the whole mesh's shape, of which each
    rank or device block takes its elements (zero on pads), so every transport gets
    the serial ρ (up to the order of the sums).
    """
    el = dg.host_elements()
    shape = lead + (dg.num_global_elements or el.size,) + (dg.n,) * 3
    v = np.take(np.random.default_rng(0).standard_normal(shape), np.maximum(el, 0), axis=-4)
    v = v * (el >= 0)[:, None, None, None]  # pads start (and stay) at zero
    like = jax.ShapeDtypeStruct(v.shape, dg.jac.dtype)
    return ts.spectral_radius(_operator(f), like, args, inner=inner, iterations=iterations, start=v)


def relative_error(dg: DG, q, q_exact) -> float:
    """Relative L2 error ‖q − q_ex‖ / ‖q_ex‖ (GLL rule, all ranks), ``q: ([C,] E, n, n, n)``."""
    return float(_relative_error(dg.mass, q, q_exact, dg.comm))


@jax.jit
def _relative_error(mass, q, q_exact, comm):
    def norm2(v):  # Σ mass |v|², the components (a leading axis beyond mass's) summed first
        v2 = v**2
        return jnp.sum(mass * (jnp.sum(v2, 0) if v2.ndim > mass.ndim else v2))

    num, den = comm.allreduce(jnp.stack([norm2(q - q_exact), norm2(q_exact)]))
    return jnp.sqrt(num / den)


def mass_norm(dg):
    """``q -> ()``: √(Σ mass·q²) over every field of ``q`` and every rank (pad elements weigh 0)."""
    return jax.jit(lambda q: jnp.sqrt(dg.comm.allreduce(jnp.sum(dg.mass * q * q))))
