"""Discretizations over several devices: global arrays split along the element axis.

``discretize(mesh, devices=...)`` (and ``discretize_dg``) build every rank's part
of the discretization as for one process per rank (the plans are NumPy), pad the
parts to common shapes, and put them on the devices as *global* ``jax.Array``s:
an element field ``(..., E, n, n, n)`` becomes one array whose element axis is
the concatenation of the ranks' blocks, sharded over the one axis of a
``jax.sharding.Mesh``. The transport is a :class:`~jaxsem.parallel.comm.ShardComm`:
code outside ``shard_map`` sees global arrays, and the index-based steps
(gather–scatter, face exchange, element kernels, solves) run per device through
:meth:`ShardComm.local_map`.

Padding, internal: ranks may hold different numbers of elements and nodes. Each
block is rank r's ``E_r`` elements followed by ``E_max − E_r`` pad elements with
zero weights (``mask``, ``bmass``, ``mult``, ``G``, ``B``, ``mass``: declared per
field with ``metadata=dict(pad=0)``; other element arrays repeat the block's first
element so nothing is NaN) and ``elements = −1``. Each pad element's point is a node
of its own past the real ones (one shared "trash" node would make the gather–scatter's
sum, a scatter-add on a GPU, add every pad point into one address), and every exchange
round's index list is padded with the first of them, so pads never touch real nodes; a plan's list of shared copies is padded
with a position past the block's end, which the gather–scatter ignores. Solvers, norms and errors weight by
those zeros, so results on real elements equal an unpadded run's.

Several processes (``jax.distributed``): ``devices`` may span processes; every
process builds the host plans of all ranks (NumPy, cheap next to the solve) and
puts only its own devices' blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..mesh.partition import partition_mesh
from ..parallel.comm import Comm, ShardComm, element_specs, put_sharded
from .assembled import Assembled
from .gather_scatter import Exchange, GatherScatter

__all__ = ["device_mesh", "distribute", "to_mesh_order", "from_mesh_order", "placement_of", "replicated", "AXIS"]

AXIS = "elements"


def device_mesh(devices) -> jax.sharding.Mesh:
    """A one-axis ``jax.sharding.Mesh`` (axis :data:`AXIS`) from ``devices``.

    ``devices``: an int P (the first P of ``jax.devices()``), a sequence of devices,
    or a one-axis ``jax.sharding.Mesh`` (returned as it is).
    """
    if isinstance(devices, jax.sharding.Mesh):
        if len(devices.axis_names) != 1:
            raise ValueError(f"devices: expected a one-axis device mesh, got axes {devices.axis_names}")
        return devices
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        avail = len(jax.devices())
        if not 1 <= devices <= avail:
            raise ValueError(f"devices must be in [1, {avail}] (the devices JAX sees), got {devices}")
        devices = jax.devices()[: int(devices)]
    try:
        devices = list(devices)
    except TypeError:
        raise TypeError(f"devices must be an int, a sequence of jax devices or a jax.sharding.Mesh, "
                        f"got {type(devices).__name__}") from None
    if not devices:
        raise ValueError("devices must not be empty")
    return jax.sharding.Mesh(np.asarray(devices, dtype=object), (AXIS,))


def _partition(mesh, P: int, partition) -> np.ndarray:
    part = partition_mesh(mesh, P) if partition is None else np.asarray(partition)
    if part.shape != (mesh.num_elements,) or part.min() < 0 or part.max() >= P:
        raise ValueError(f"partition must be (E,) = ({mesh.num_elements},) ranks in [0, {P})")
    empty = np.setdiff1d(np.arange(P), part)
    if empty.size:
        raise ValueError(f"partition: ranks {empty.tolist()} have no elements "
                         f"(a mesh of {mesh.num_elements} elements over {P} devices)")
    return part


def distribute(build_rank: Callable, mesh, devices, partition=None, pad_extra: Callable | None = None):
    """Build a discretization over ``devices`` from its rank parts.

    Args:
      build_rank: ``build_rank(comm, partition)`` → the rank-local discretization
        for ``comm = Comm(rank=r, size=P)`` (NumPy-convertible leaves).
      mesh: the :class:`jaxsem.mesh.Mesh` (for the default partition).
      devices: see :func:`device_mesh`.
      partition: ``(E,)`` rank of each element (default :func:`partition_mesh`).
      pad_extra: ``pad_extra(parts, padded, sizes)`` → the padded parts with the
        fields the generic rules do not cover (DG's halo lists).
    Returns the discretization with global arrays and ``comm = ShardComm``.
    """
    dmesh = device_mesh(devices)
    P = dmesh.devices.size
    part = _partition(mesh, P, partition)
    parts = [build_rank(Comm(rank=r, size=P), part) for r in range(P)]
    if any(getattr(p, "affine", None) is None for p in parts):  # the compact factors on every rank or none
        parts = [dataclasses.replace(p, affine=None) if getattr(p, "affine", None) is not None else p for p in parts]
    comm = ShardComm(axis_name=dmesh.axis_names[0], size=P, mesh=dmesh)
    sizes = _sizes(parts)
    padded = [_pad(p, sizes, comm) for p in parts]
    if pad_extra is not None:
        padded = pad_extra(parts, padded, sizes)
    return _put_global(padded, dmesh)


def _plans(obj):
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)
            if isinstance(getattr(obj, f.name), GatherScatter)]


def _sizes(parts) -> dict:
    """Common padded sizes of the rank parts: elements, per plan nodes, round lengths, shared nodes
    and their copies, and per assembled-storage map its shared nodes."""
    E_max = max(int(np.shape(p.elements)[0]) for p in parts)
    E_min = min(int(np.shape(p.elements)[0]) for p in parts)
    plans = list(zip(*[_plans(p) for p in parts]))
    nodes = [max(g.num_global for g in gs) for gs in plans]
    rounds, shared = [], []
    nnz = [max(0 if g.csr_idx is None else int(np.shape(g.csr_idx)[0]) for g in gs) for gs in plans]
    for gs in plans:
        ex0 = gs[0].exchange
        nr = 0 if ex0 is None else len(ex0.idx)
        rounds.append([max(int(np.shape(g.exchange.idx[k])[0]) for g in gs) for k in range(nr)])
        shared.append((max(g.num_shared for g in gs),
                       max(0 if g.shared is None else int(np.shape(g.shared)[0]) for g in gs)))
    assembled = {f.name: max(int(np.shape(getattr(p, f.name).shared)[0]) for p in parts)
                 for f in dataclasses.fields(parts[0]) if isinstance(getattr(parts[0], f.name), Assembled)}
    return dict(E_max=E_max, E_min=E_min, nnz=nnz, nodes=nodes, rounds=rounds, shared=assembled, gs_shared=shared)


def _pad_axis(a: np.ndarray, axis: int, size: int, fill) -> np.ndarray:
    """Pad ``a`` along ``axis`` to ``size``: ``fill`` a number, or ``"copy0"`` (repeat index 0)."""
    k = size - a.shape[axis]
    if k == 0:
        return a
    if fill == "copy0":
        extra = np.repeat(np.take(a, [0], axis=axis), k, axis=axis)
    else:
        shape = list(a.shape)
        shape[axis] = k
        extra = np.full(shape, fill, dtype=a.dtype)
    return np.concatenate([a, extra], axis=axis)


def _pad_fields(obj, E_max: int):
    """Element arrays of a dataclass padded to ``E_max`` elements by their declared ``pad``."""
    new = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.metadata.get("static", False) or v is None or isinstance(v, (GatherScatter, Assembled)):
            continue
        if dataclasses.is_dataclass(v):
            new[f.name] = _pad_fields(v, E_max)
            continue
        a = np.asarray(v)
        if f.name == "elements":
            new[f.name] = _pad_axis(a, 0, E_max, -1)
        elif f.metadata.get("blocks", False) or a.ndim < 4:
            new[f.name] = a  # block lists (padded by their owner) and replicated operator data
        else:
            new[f.name] = _pad_axis(a, a.ndim - 4, E_max, f.metadata.get("pad", "copy0"))
    return dataclasses.replace(obj, **new)


def _pad_gs(gs: GatherScatter, E_max: int, E_min: int, N_max: int, round_len: Sequence[int], shared: tuple,
            comm: ShardComm, nnz: int = 0):
    """A rank's gather–scatter plan padded to ``E_max`` elements, its pad points given the nodes
    ``N_max, N_max + 1, …`` (one each; ``N_max + max(1, (E_max − E_min)·n³)`` nodes on every rank, the
    first past the real ones also the exchange's trash slot), ``shared = (num_shared, copies)``
    to the ranks' most shared nodes and copies, and a ``"csr"`` plan's rows to ``nnz`` entries."""
    mult = np.asarray(gs.mult)
    E = mult.shape[0]
    block = int(np.prod(mult.shape[1:]))
    L, L_max, trash = E * block, E_max * block, N_max
    num_global = N_max + max(1, (E_max - E_min) * block)
    gid = np.asarray(gs.gid)
    exchange = copies = None
    if gs.exchange is not None:
        idx = tuple(_pad_axis(np.asarray(i, np.int32), 0, k, trash) for i, k in zip(gs.exchange.idx, round_len))
        exchange = Exchange(idx=idx, partners=(-1,) * len(idx), comm=comm, rounds=gs.exchange.rounds)
        copies = _pad_axis(np.asarray(gs.shared), 0, shared[1], L_max)
    csr_off = csr_idx = None
    if gs.layout == "csr":  # the pads' rows are empty (one copy: each keeps its value)
        off = np.asarray(gs.csr_off)
        csr_off = _pad_axis(off, 0, L_max + 1, off[-1])
        csr_idx = _pad_axis(np.asarray(gs.csr_idx), 0, nnz, 0)
    return GatherScatter(gid=np.concatenate([gid, np.arange(trash, trash + L_max - L, dtype=gid.dtype)]),
                         mult=_pad_axis(mult, 0, E_max, 0), num_global=num_global, layout=gs.layout,
                         exchange=exchange, shared=copies, num_shared=shared[0] if copies is not None else 0,
                         csr_off=csr_off, csr_idx=csr_idx)


def _pad_assembled(a: Assembled, E_max: int, k: int, padded: GatherScatter):
    """A rank's assembled-storage map padded like its plan (``padded``, the padded plan): ``padded.num_global``
    slots (those past the rank's real nodes, the pads' and the trash slot, with weight 0), Dirichlet and pad nodes out of
    range, ``k`` shared nodes (the pads: the trash slot, excess 0)."""
    size = padded.num_global
    idx = np.asarray(a.idx)
    idx = _pad_axis(np.where(idx >= a.size, size, idx), 0, E_max, size)
    return Assembled(idx=idx, size=size, exchange=padded.exchange, weight=_pad_axis(np.asarray(a.weight), 0, size, 0),
                     shared=_pad_axis(np.asarray(a.shared), 0, k, size - 1), excess=_pad_axis(np.asarray(a.excess), 0, k, 0),
                     comm=padded.exchange.comm)


def _pad(part, sizes: dict, comm: ShardComm):
    out = _pad_fields(part, sizes["E_max"])
    plans = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)
             if isinstance(getattr(part, f.name), GatherScatter)}
    new = {name: _pad_gs(gs, sizes["E_max"], sizes["E_min"], N, rl, sh, comm, nnz)
           for (name, gs), N, rl, sh, nnz in zip(plans.items(), sizes["nodes"], sizes["rounds"], sizes["gs_shared"],
                                                 sizes["nnz"])}
    for f in dataclasses.fields(part):  # an assembled-storage map is padded with the plan of its exchange
        a = getattr(part, f.name)
        if isinstance(a, Assembled):
            name = next(k for k, gs in plans.items() if gs.exchange is a.exchange)
            new[f.name] = _pad_assembled(a, sizes["E_max"], sizes["shared"][f.name], new[name])
    return dataclasses.replace(out, comm=comm, **new)


def _put_global(parts, dmesh: jax.sharding.Mesh):
    """Rank parts (equal-shaped host pytrees) → one pytree of global arrays split by
    :func:`element_specs`, each block copied straight to its device (only this process's)."""
    devices = list(dmesh.devices.ravel())
    specs = element_specs(parts[0], dmesh.axis_names[0])

    def leaf(spec, *blocks):
        a0 = np.asarray(blocks[0])
        axis = next((i for i, s in enumerate(spec) if s is not None), None)
        shape = list(a0.shape)
        if axis is not None:
            shape[axis] *= len(blocks)
        mine = [(b, d) for b, d in zip(blocks, devices) if d.process_index == jax.process_index()]
        arrays = [jax.device_put(np.asarray(b), d) for b, d in mine]
        return jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(dmesh, spec), arrays)

    return jax.tree.map(leaf, specs, *parts, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))


def to_mesh_order(disc, u, axis: int = -4) -> np.ndarray:
    """A field of ``disc`` as a host array in the mesh's element order, pads dropped.

    ``u: (*lead, E, *trail)`` (element axis ``axis``, default −4) of any
    discretization (serial, sharded; under MPI: this rank's elements only) → NumPy
    ``(*lead, E_held, *trail)`` with the held elements in ascending mesh order (for a
    serial or sharded one: element e of the mesh at index e). Every process gets it.
    """
    el = disc.host_elements()
    v = disc.host(u)
    ax = axis % v.ndim
    keep = np.nonzero(el >= 0)[0]
    return np.take(v, keep[np.argsort(el[keep])], axis=ax)


def from_mesh_order(disc, u, axis: int = -4, fill: float = 0.0):
    """The inverse of :func:`to_mesh_order`: a field given in the mesh's element order,
    ``(*lead, E_mesh, *trail)``, laid out as ``disc`` holds its elements (pads = ``fill``),
    as a ``jax.Array`` split over ``disc``'s devices like its own fields."""
    el = disc.host_elements()
    v = np.asarray(u)
    ax = axis % v.ndim
    out = np.take(v, np.maximum(el, 0), axis=ax)
    valid = (el >= 0).reshape((-1,) + (1,) * (v.ndim - ax - 1))
    out = np.where(valid, out, np.asarray(fill, out.dtype))
    comm = disc.comm
    if not isinstance(comm, ShardComm) or comm.mesh is None:
        return jax.numpy.asarray(out)
    spec = element_specs(out, comm.axis_name) if out.ndim >= 4 else jax.sharding.PartitionSpec()
    return put_sharded(out, NamedSharding(comm.mesh, spec))


def replicated(disc, tree):
    """The arrays of ``tree`` (values that are the same everywhere: times, counters, a time
    series) replicated over ``disc``'s devices, as its jitted programs return them, so that a
    program is not compiled once more for its own outputs; on the default device unless
    ``disc`` is sharded."""
    comm = disc.comm
    if not isinstance(comm, ShardComm) or comm.mesh is None:
        return jax.tree.map(jax.numpy.asarray, tree)
    sharding = NamedSharding(comm.mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda x: put_sharded(x, sharding), tree)


def placement_of(disc, mesh, partition=None) -> dict:
    """``discretize`` keywords that put another discretization of ``mesh`` (same elements,
    e.g. another order) where ``disc``'s elements are: same devices and blocks, or the
    same MPI ranks (``partition``: the one ``disc`` was built with, default
    :func:`partition_mesh`), or serial."""
    comm = disc.comm
    if isinstance(comm, ShardComm):
        el = disc.host_elements()
        part = np.zeros(mesh.num_elements, np.int64)
        for r, block in enumerate(np.split(el, comm.size)):
            part[block[block >= 0]] = r
        return dict(devices=comm.mesh, partition=part)
    if comm.size > 1:
        part = partition_mesh(mesh, comm.size) if partition is None else np.asarray(partition)
        return dict(comm=comm, partition=part)
    return dict(comm=comm)
