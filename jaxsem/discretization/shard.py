"""One process, several devices: ``jax.shard_map`` + ``lax.ppermute`` (NCCL on GPUs).

The second distributed backend beside MPI (:mod:`jaxsem.comm`). One process
builds every rank's part of the discretization (the plans are pure NumPy, see
:func:`jaxsem.discretization.discretize` with ``comm=Comm(rank=r, size=P)``),
pads them to common shapes, stacks them along a new leading axis of size P and
shards that axis over P devices. Inside ``jax.shard_map`` each device sees an
ordinary :class:`~jaxsem.discretization.SEM` whose ``comm`` is a
:class:`~jaxsem.comm.ShardComm`: global sums are ``psum``, the gather–scatter
exchange is one ``ppermute`` per round of rank pairs. Every model and solver
runs unchanged on it.

Typical use::

    import jaxsem as js
    from jaxsem import shard
    from jaxsem.models import poisson

    mesh = js.box_mesh((8, 8, 8), 7, deform=0.1)
    sem_s, dmesh = shard.discretize_sharded(mesh, quadrature="gll", dirichlet=True)

    # BPk bench/solve: a cached, jitted solver of stacked SEMs
    solve = shard.bp_solver(dmesh, bp=5, tol=0.0, maxiter=100)
    u_s, info = solve(sem_s)             # u_s: (P, E_max, n, n, n); info: PCGInfo of scalars
    u = shard.gather_elements(u_s, sem_s)  # (E, n, n, n), global element order

    # Any per-rank function ``fn(sem, *args)`` (written as for one rank):
    run = jax.jit(shard.shard_fn(lambda sem, f: poisson.solve(sem, f, tol=1e-10), dmesh))
    f_s = shard.distribute_elements(f_global, sem_s)   # (E, q, q, q) -> (P, E_max, q, q, q)
    u_s, info_s = run(sem_s, f_s)        # every output gets a leading (P,) axis; info_s.iterations[0]

Padding (ranks may hold different numbers of elements and nodes): rank r's
``E_r`` elements come first, then ``E_max - E_r`` *dummy* elements with
``G = B = bmass = mask = mult = 0`` (``x``, ``xq``, ``jac``, ``rx`` copied from
the rank's first element so nothing is NaN) and ``elements = -1``. All dummy
nodes share one extra "trash" node (local id ``N_max``, so ``gs.num_global =
N_max + 1``), and each exchange round's index list is padded to the longest in
that round with the trash position. The two ranks of a pair share the same
number of nodes, so their padded tails line up: trash is only ever added to
trash, never to a real node. After a gather–scatter the dummy elements hold
unspecified (finite) values; everything the solvers use is multiplied by
``mask``/``mult``/``G`` (all 0 there), so results on real elements are exactly
those of an unpadded rank. Don't read dummy values; :func:`gather_elements`
drops them. Inside a shard ``sem.num_elements`` is ``E_max`` (dummies
included): count DOFs from the mesh. Functions that integrate over ``sem.x``
themselves (``poisson.relative_errors``) would count the dummies: evaluate
them on the gathered solution with a serial SEM instead.

Stacked arrays: a per-rank field of shape ``(..., E_max, n, n, n)`` is stored
as ``(P, ..., E_max, n, n, n)`` sharded over its first axis (spec
``PartitionSpec(axis_name)``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from ..parallel.comm import Comm, ShardComm
from .sem import SEM, discretize
from .gather_scatter import Exchange, GatherScatter
from ..mesh.box import Mesh
from ..mesh.numbering import number_nodes
from ..mesh.partition import partition_mesh

__all__ = [
    "discretize_sharded", "discretize_dg_sharded", "per_rank", "shard_fn", "shard_call",
    "distribute_elements", "gather_elements", "bp_solver", "shard_map",
]


def shard_map(f, mesh, in_specs, out_specs):
    """``jax.shard_map`` (jax ≥ 0.10), else ``jax.experimental.shard_map.shard_map``.

    Varying-manual-axes checking is off (``check_vma=False``): the solvers'
    ``lax.custom_linear_solve`` returns a sharded solution together with
    replicated (psum'd) info, which the checker rejects.
    """
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map as _sm  # pragma: no cover

    return _sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)  # pragma: no cover


# --------------------------------------------------------------------------- building


def _pad_axis(a: np.ndarray, axis: int, size: int, fill) -> np.ndarray:
    """Pad ``a`` along ``axis`` to ``size``: ``fill`` is a scalar or ``"copy0"`` (repeat index 0)."""
    k = size - a.shape[axis]
    if k == 0:
        return a
    if isinstance(fill, str):
        extra = np.repeat(np.take(a, [0], axis=axis), k, axis=axis)
    else:
        shape = list(a.shape)
        shape[axis] = k
        extra = np.full(shape, fill, dtype=a.dtype)
    return np.concatenate([a, extra], axis=axis)


def _pad_gs(gs: GatherScatter, E_max: int, N_max: int, round_len: Sequence[int], comm: ShardComm):
    """A rank's gather–scatter plan padded to ``E_max`` elements and ``N_max + 1`` nodes (NumPy leaves).

    Works for any per-element block (``n³`` volume nodes, ``6n²`` face points):
    the block size is read from ``gs.mult``.
    """
    h = lambda a: np.asarray(a)
    mult = h(gs.mult)
    E = mult.shape[0]
    block = int(np.prod(mult.shape[1:]))
    L, L_max, trash = E * block, E_max * block, N_max
    gid = h(gs.gid)
    it = gid.dtype
    if gs.exchange is None:
        exchange = None
    else:
        ex = gs.exchange
        idx = tuple(np.concatenate([h(i).astype(np.int32), np.full(k - h(i).size, trash, np.int32)])
                    for i, k in zip(ex.idx, round_len))
        exchange = Exchange(idx=idx, partners=(-1,) * len(idx), comm=comm, rounds=ex.rounds)
    return GatherScatter(
        gid=np.concatenate([gid, np.full(L_max - L, trash, it)]),
        mult=_pad_axis(mult, 0, E_max, 0),
        num_global=N_max + 1,
        layout=gs.layout,
        exchange=exchange,
    )


def _pad_rank(sem: SEM, E_max: int, N_max: int, round_len: Sequence[int], comm: ShardComm) -> SEM:
    """Rank-local SEM (NumPy leaves) padded to ``E_max`` elements and ``N_max + 1`` nodes."""
    h = lambda a: np.asarray(a)
    g = sem.geom
    geom = dataclasses.replace(
        g,
        G=_pad_axis(h(g.G), 1, E_max, 0),
        B=_pad_axis(h(g.B), 0, E_max, 0),
        jac=_pad_axis(h(g.jac), 0, E_max, "copy0"),
        rx=_pad_axis(h(g.rx), 2, E_max, "copy0"),
        xq=_pad_axis(h(g.xq), 1, E_max, "copy0"),
    )
    return dataclasses.replace(
        sem,
        x=_pad_axis(h(sem.x), 1, E_max, "copy0"),
        D=h(sem.D), J=h(sem.J), Dt=h(sem.Dt),
        geom=geom,
        gs=_pad_gs(sem.gs, E_max, N_max, round_len, comm),
        mask=_pad_axis(h(sem.mask), 0, E_max, 0),
        bmass=_pad_axis(h(sem.bmass), 0, E_max, 0),
        elements=_pad_axis(h(sem.elements).astype(np.int64), 0, E_max, -1),
        comm=comm,
    )


def _put_stacked(parts, dmesh: jax.sharding.Mesh):
    """Rank parts (pytrees of equal-shaped host arrays) → one pytree of ``(P, ...)`` arrays sharded
    over ``dmesh``'s axis, each part copied straight to its device: no host-side ``np.stack``
    (a second copy of everything, ≈ 24 GB for BP5 at 79 M DOFs)."""
    devices = list(dmesh.devices.ravel())
    sharding = NamedSharding(dmesh, PS(_axis(dmesh)))

    def leaf(*a):
        shards = [jax.device_put(np.asarray(x)[None], d) for x, d in zip(a, devices)]
        return jax.make_array_from_single_device_arrays((len(a),) + np.shape(a[0]), sharding, shards)

    return jax.tree.map(leaf, *parts)


def _plan_sizes(plans):
    """Common padded sizes of P rank plans: ``(N_max, round_len)``."""
    N_max = max(p.num_global for p in plans)
    ex0 = plans[0].exchange
    nrounds = 0 if ex0 is None else len(ex0.idx)
    round_len = [max(int(p.exchange.idx[k].shape[0]) for p in plans) for k in range(nrounds)]
    return N_max, round_len


def _device_mesh(devices, axis_name: str) -> jax.sharding.Mesh:
    if devices is None:
        devices = jax.devices()
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(jax.devices()):
            raise ValueError(f"devices must be in [1, {len(jax.devices())}] (available devices), got {devices}")
        devices = jax.devices()[: int(devices)]
    devices = list(devices)
    if not devices:
        raise ValueError("devices must not be empty")
    return jax.sharding.Mesh(np.asarray(devices), (axis_name,))


def _mesh_and_partition(mesh: Mesh, devices, axis_name: str, partition):
    """Validated ``(device_mesh, P, partition)``: every one of the P ranks gets ≥ 1 element."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jaxsem Mesh, got {type(mesh).__name__}")
    dmesh = _device_mesh(devices, axis_name)
    P = dmesh.devices.size
    part = partition_mesh(mesh, P) if partition is None else np.asarray(partition)
    if part.shape != (mesh.num_elements,) or part.min() < 0 or part.max() >= P:
        raise ValueError(f"partition must be (E,) = ({mesh.num_elements},) ranks in [0, {P})")
    empty = np.setdiff1d(np.arange(P), part)
    if empty.size:
        raise ValueError(f"ranks {empty.tolist()} have no elements in the partition")
    return dmesh, P, part


def discretize_sharded(mesh: Mesh, devices=None, axis_name: str = "ranks", partition=None,
                       **discretize_kwargs):
    """Discretize ``mesh`` over P devices of this process, as stacked, sharded rank parts.

    Args:
      mesh: a :class:`jaxsem.mesh.Mesh` with at least P elements.
      devices: a sequence of devices, an int P (the first P of ``jax.devices()``),
        or None (all devices).
      axis_name: name of the device-mesh axis (and of the ``ShardComm``).
      partition: ``(E,)`` rank in ``[0, P)`` of each element (default
        :func:`jaxsem.partition.partition_mesh`); every rank needs ≥ 1 element.
      **discretize_kwargs: ``quadrature``, ``dirichlet``, ``backend``,
        ``dtype``, ``q``, ``numbering`` of :func:`jaxsem.discretize`.

    Returns:
      ``(sem_stacked, device_mesh)``: ``sem_stacked`` is a :class:`SEM` whose
      every leaf has a leading axis of size P sharded with
      ``NamedSharding(device_mesh, PartitionSpec(axis_name))`` — e.g. ``x: (P,
      3, E_max, n, n, n)``, ``mask: (P, E_max, n, n, n)``, ``elements: (P,
      E_max)`` (global element indices, −1 for dummies), ``gs.gid: (P, E_max·n³)``;
      its static ``comm`` is ``ShardComm(axis_name, P)``. Use it through
      :func:`shard_fn` / :func:`shard_call`. ``device_mesh``: the
      ``jax.sharding.Mesh`` with one axis ``axis_name`` of size P.
    """
    if "comm" in discretize_kwargs:
        raise TypeError("discretize_sharded sets 'comm' itself (ShardComm)")
    dmesh, P, part = _mesh_and_partition(mesh, devices, axis_name, partition)
    if discretize_kwargs.get("numbering") is None:
        discretize_kwargs["numbering"] = number_nodes(mesh)
    sems = [discretize(mesh, comm=Comm(rank=r, size=P), partition=part, **discretize_kwargs) for r in range(P)]
    E_max = max(s.num_elements for s in sems)
    N_max, round_len = _plan_sizes([s.gs for s in sems])
    comm = ShardComm(axis_name=axis_name, size=P)
    padded = [_pad_rank(s, E_max, N_max, round_len, comm) for s in sems]
    return _put_stacked(padded, dmesh), dmesh


def _pad_dg(dg, E_max: int, N_max: int, round_len: Sequence[int], H_max: int, comm: ShardComm):
    """Rank-local DG (NumPy leaves) padded to ``E_max`` elements; halo lists to ``H_max``."""
    h = lambda a: np.asarray(a)
    halo = halo_map = None
    if dg.halo is not None:
        lens = [int(np.shape(i)[0]) for i in dg.fgs.exchange.idx]
        offs = np.concatenate([[0], np.cumsum(lens)])
        offs_p = np.concatenate([[0], np.cumsum(round_len)])
        hm = h(dg.halo_map).astype(np.int64)
        r = np.clip(np.searchsorted(offs, hm, side="right") - 1, 0, len(lens) - 1)
        hm = np.where(hm < offs[-1], offs_p[r] + hm - offs[r], offs_p[-1])  # positions in the padded rounds
        halo = _pad_axis(h(dg.halo).astype(np.int32), 0, H_max, 0)
        halo_map = _pad_axis(hm.astype(np.int32), 0, H_max, int(offs_p[-1]))  # padded rows: the zero slot
    return dataclasses.replace(
        dg,
        x=_pad_axis(h(dg.x), 1, E_max, "copy0"), D=h(dg.D),
        rx=_pad_axis(h(dg.rx), 2, E_max, "copy0"),
        jac=_pad_axis(h(dg.jac), 0, E_max, "copy0"),
        mass=_pad_axis(h(dg.mass), 0, E_max, 0),
        normal=_pad_axis(h(dg.normal), 1, E_max, "copy0"),
        sJ=_pad_axis(h(dg.sJ), 0, E_max, "copy0"),
        lift=_pad_axis(h(dg.lift), 0, E_max, "copy0"),
        boundary=_pad_axis(h(dg.boundary), 0, E_max, 0),
        fgs=_pad_gs(dg.fgs, E_max, N_max, round_len, comm),
        elements=_pad_axis(h(dg.elements).astype(np.int64), 0, E_max, -1),
        halo=halo, halo_map=halo_map, comm=comm,
    )


def discretize_dg_sharded(mesh: Mesh, devices=None, axis_name: str = "ranks", partition=None,
                          dtype=jnp.float64):
    """:func:`jaxsem.dg.discretize_dg` over P devices of this process (stacked, sharded rank parts).

    The DG counterpart of :func:`discretize_sharded` (same arguments, same
    stacking and padding rules): returns ``(dg_stacked, device_mesh)`` with
    every leaf ``(P, ...)``, e.g. ``x: (P, 3, E_max, n, n, n)``, ``elements:
    (P, E_max)`` (−1 for dummies), and ``comm = ShardComm(axis_name, P)``.
    The face exchange is one ``ppermute`` per round of rank pairs.

    Dummy elements have ``mass = 0`` and copy rank-local element 0's geometry;
    all their face points map to one trash point, so a field that is 0 on
    them (as :func:`distribute_elements` fills) stays 0 under the models'
    right-hand sides. Use through :func:`shard_fn`. Fields computed on the host
    from coordinates (e.g. :func:`jaxsem.models.advection.transport`'s metric
    terms) need the per-rank loop of :func:`per_rank`.
    """
    from .dg import discretize_dg, face_connectivity

    dmesh, P, part = _mesh_and_partition(mesh, devices, axis_name, partition)
    conn = face_connectivity(mesh)
    dgs = [discretize_dg(mesh, dtype=dtype, connectivity=conn, comm=Comm(rank=r, size=P),
                         partition=part) for r in range(P)]
    E_max = max(d.num_elements for d in dgs)
    N_max, round_len = _plan_sizes([d.fgs for d in dgs])
    H_max = max((int(d.halo.shape[0]) for d in dgs if d.halo is not None), default=0)
    comm = ShardComm(axis_name=axis_name, size=P)
    padded = [_pad_dg(d, E_max, N_max, round_len, H_max, comm) for d in dgs]
    return _put_stacked(padded, dmesh), dmesh


def per_rank(fn: Callable, stacked, mesh: jax.sharding.Mesh):
    """Apply a host-side (NumPy) function to each rank's part and stack the results, sharded.

    ``fn(part) -> pytree of arrays`` sees rank r's leaves (the leading axis
    taken away); the results are stacked along a new leading axis and sharded
    over ``mesh``'s axis.
    """
    P = mesh.devices.size
    outs = [fn(jax.tree.map(lambda a: np.asarray(a)[r], stacked)) for r in range(P)]
    return _put_stacked(outs, mesh)


# --------------------------------------------------------------------------- running


def _axis(dmesh) -> str:
    if len(dmesh.axis_names) != 1:
        raise ValueError(f"expected a one-axis device mesh, got axes {dmesh.axis_names}")
    return dmesh.axis_names[0]


def shard_fn(fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
    """Turn a per-rank function into one of stacked arguments (not jitted: wrap in ``jax.jit``).

    Args:
      fn: ``fn(sem, *args) -> pytree of arrays``, written as for one rank
        (``sem`` an ordinary rank-local SEM with a ShardComm; ``args`` rank-local).
      mesh: the device mesh from :func:`discretize_sharded`.

    Returns:
      ``g(sem_stacked, *args_stacked)``: every leaf of every argument has the
      leading (P,) axis (see :func:`distribute_elements`); inside each shard it
      is squeezed away before ``fn`` runs, and put back on every output leaf, so
      a per-rank ``(E_max, n, n, n)`` result comes back as ``(P, E_max, n, n,
      n)`` and a global scalar (psum'd, the same on every rank) as ``(P,)``
      (take ``[0]``). Differentiable: ``jax.grad`` of ``g(...)[0]`` (or of
      the mean of the P copies) of a psum'd loss gives each rank its own part
      of the gradient; the *sum* of the P copies would give P times it.
    """
    spec = PS(_axis(mesh))

    def local(*stacked):
        out = fn(*jax.tree.map(lambda a: a[0], stacked))
        return jax.tree.map(lambda a: jnp.asarray(a)[None], out)

    def g(*stacked):
        return shard_map(local, mesh, in_specs=(spec,) * len(stacked), out_specs=spec)(*stacked)

    return g


@functools.lru_cache(maxsize=64)
def _jitted(fn, mesh):
    return jax.jit(shard_fn(fn, mesh))


def shard_call(fn: Callable, sem_stacked: SEM, *args, mesh: jax.sharding.Mesh):
    """``jax.jit(shard_fn(fn, mesh))(sem_stacked, *args)``, compiled once per ``(fn, mesh)``.

    Pass a module-level function (not a fresh lambda) to reuse the compilation.
    """
    return _jitted(fn, mesh)(sem_stacked, *args)


def _locate(sem_stacked: SEM):
    el = np.asarray(sem_stacked.elements)  # (P, E_max), -1 for dummies
    r, l = np.nonzero(el >= 0)
    E = int(el.max()) + 1
    rank = np.full(E, -1, np.int64)
    loc = np.full(E, -1, np.int64)
    rank[el[r, l]], loc[el[r, l]] = r, l
    if np.any(rank < 0):
        raise ValueError("sem_stacked.elements does not cover 0..E-1")
    return el, rank, loc


def gather_elements(u_stacked, sem_stacked: SEM, axis: int = -4):
    """Assemble a global array from the shards, dropping dummy elements.

    Args:
      u_stacked: ``(P, *lead, E_max, *trail)`` (e.g. ``(P, 3, E_max, n, n, n)``).
      sem_stacked: from :func:`discretize_sharded` (its ``elements`` must be concrete).
      axis: position of the element axis in the per-rank array (default −4,
        i.e. ``(..., E, n, n, n)`` or ``(..., E, q, q, q)``).
    Returns ``(*lead, E, *trail)`` in global element order. Differentiable.
    """
    _, rank, loc = _locate(sem_stacked)
    xp = jnp if isinstance(u_stacked, jax.core.Tracer) else np  # host-side when concrete
    u = xp.asarray(u_stacked)
    ax = axis % (u.ndim - 1)
    v = xp.moveaxis(u, ax + 1, 1)[rank, loc]  # (E, rest)
    return jnp.asarray(xp.moveaxis(v, 0, ax))


def distribute_elements(u_global, sem_stacked: SEM, axis: int = -4, fill: float = 0.0):
    """Split a global per-element array into the stacked, sharded rank layout.

    Args:
      u_global: ``(*lead, E, *trail)``, global element order (e.g. a source at
        the quadrature points ``(E, q, q, q)``).
      axis: position of the element axis (default −4).
      fill: value on dummy elements.
    Returns ``(P, *lead, E_max, *trail)`` sharded like ``sem_stacked``
    (the inverse of :func:`gather_elements`). Differentiable.
    """
    el, _, _ = _locate(sem_stacked)
    traced = isinstance(u_global, jax.core.Tracer)
    xp = jnp if traced else np  # host-side when concrete
    u = xp.asarray(u_global)
    ax = axis % u.ndim
    v = xp.moveaxis(u, ax, 0)[np.maximum(el, 0)]  # (P, E_max, rest)
    valid = (el >= 0).reshape(el.shape + (1,) * (v.ndim - 2))
    v = xp.where(valid, v, xp.asarray(fill, v.dtype))
    out = xp.moveaxis(v, 1, ax + 1)
    sharding = sem_stacked.elements.sharding
    if traced or not isinstance(sharding, NamedSharding):
        return jnp.asarray(out)
    return jax.device_put(out, NamedSharding(sharding.mesh, PS(*sharding.spec[:1])))


# --------------------------------------------------------------------------- BP solves


@functools.lru_cache(maxsize=32)
def bp_solver(mesh: jax.sharding.Mesh, bp: int, tol: float = 0.0, maxiter: int = 100) -> Callable:
    """A jitted solver of BPk on stacked SEMs (compiled once per ``sem_stacked`` shape).

    The right-hand side is BPk's manufactured source
    (:func:`jaxsem.models.poisson.manufactured`) loaded at the quadrature
    points; ``tol = 0`` runs exactly ``maxiter`` iterations (the bake-off mode).

    Returns ``solve(sem_stacked) -> (u_stacked, info)``: ``u_stacked: (P, E_max,
    n, n, n)`` (BP1/3/5) or ``(P, 3, E_max, n, n, n)`` (BP2/4/6); ``info`` a
    :class:`jaxsem.solvers.PCGInfo` of global values (``iterations`` a scalar,
    ``history (maxiter + 1,)``).
    """
    from ..models import poisson

    ms = poisson.manufactured(bp)
    h1, h2 = poisson.coefficients(bp)
    fn = shard_fn(lambda sem: poisson.solve(sem, ms.f, h1, h2, tol=tol, maxiter=maxiter), mesh)

    @jax.jit
    def solve(sem_stacked):
        u, info = fn(sem_stacked)
        return u, jax.tree.map(lambda a: a[0], info)

    return solve

