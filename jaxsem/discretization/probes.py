"""Values of SEM fields at arbitrary points: locate on the host, evaluate as a linear map.

``probes = locate(sem, points)`` finds each point's element (bounding boxes, then Newton in
the reference element on the GLL interpolant of the geometry) and keeps 1-D Lagrange weights,
so that ``evaluate(sem, probes, u)`` is a gather plus three small contractions, linear and
differentiable in ``u``. A point on a face, edge or vertex shared by several elements belongs
to the first (lowest mesh index); distributed, the rank or device block holding that element
contributes its value and the others 0, so the sum over ranks counts every point once.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core import basis
from ..mesh.box import Mesh
from ..parallel.comm import Blocks, ShardComm
from .sem import SEM
from .surface import element_blocks

__all__ = ["Probes", "locate", "evaluate", "NEWTON_TOL", "INSIDE_TOL"]

NEWTON_TOL = 1e-12  # Newton stops when the reference-coordinate step is below this
INSIDE_TOL = 1e-10  # a point is in an element where |r|, |s|, |t| <= 1 + INSIDE_TOL
BOX_MARGIN = 0.05  # element bounding boxes grow by this times their size (curved faces bulge between nodes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Probes:
    """Points located in a SEM's elements (pytree; :func:`locate` builds it).

    Attributes (P points, n = N + 1; one copy per rank or device block, concatenated):
      element: ``(P,)`` int32 local element index of each point (0 where not held).
      held: ``(P,)`` 1.0 where this rank or block holds the point's element, else 0.0.
      r: ``(P, 3)`` reference coordinates (r, s, t) in [−1, 1]³.
      weights: ``(P, 3, n)`` Lagrange weights ℓ_i(r), ℓ_j(s), ℓ_k(t).
      mesh_element: ``(P,)`` mesh index of each point's element.
      blocks: static, the number of blocks (devices when sharded, else 1).
    """

    element: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    held: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    r: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    weights: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    mesh_element: jax.Array = dataclasses.field(metadata=dict(blocks=True))
    blocks: int = dataclasses.field(metadata=dict(static=True), default=1)

    @property
    def num_points(self) -> int:
        return int(self.element.shape[0]) // self.blocks


def locate(sem_or_mesh, points) -> Probes:
    """Find ``points: (P, 3)`` in the mesh (host, NumPy): :class:`Probes` for :func:`evaluate`.

    Candidates by bounding box, then Newton on x(r) = Σ x_kji ℓ_i(r)ℓ_j(s)ℓ_k(t) to
    :data:`NEWTON_TOL` in r; a point belongs to the first element with |r| ≤ 1 +
    :data:`INSIDE_TOL`. Given a SEM, element indices are those of the rank or device block
    holding the element; given a Mesh, mesh indices (serial). Raises ``ValueError`` listing the
    first points outside the mesh.
    """
    if isinstance(sem_or_mesh, SEM):
        blocks = element_blocks(sem_or_mesh)
        mesh = sem_or_mesh.source.mesh
    elif isinstance(sem_or_mesh, Mesh):
        mesh, blocks = sem_or_mesh, [np.arange(sem_or_mesh.num_elements)]
    else:
        raise TypeError(f"sem_or_mesh must be a jaxsem SEM or Mesh, got {type(sem_or_mesh).__name__}")
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 3 or not np.isfinite(pts).all():
        raise ValueError(f"points must be finite coordinates of shape (P, 3), got shape {pts.shape}")
    elem, r = _find(mesh.x, pts)
    nodes = basis.gll_points(mesh.order)[0]
    w = np.stack([basis.lagrange_matrix(nodes, r[:, d]) for d in range(3)], axis=1)  # (P, 3, n)
    local = np.zeros(mesh.num_elements, np.int64)
    owner = np.full(mesh.num_elements, -1, np.int64)
    for b, held in enumerate(blocks):
        local[held] = np.arange(held.size)
        owner[held] = b
    mine = [owner[elem] == b for b in range(len(blocks))]
    cat = lambda parts: np.concatenate(parts)
    out = Probes(element=cat([np.where(m, local[elem], 0) for m in mine]).astype(np.int32),
                 held=cat([m.astype(np.float64) for m in mine]),
                 r=cat([r] * len(blocks)), weights=cat([w] * len(blocks)),
                 mesh_element=cat([elem] * len(blocks)).astype(np.int32), blocks=len(blocks))
    if isinstance(sem_or_mesh, SEM):  # laid out like the SEM's own arrays (split over its devices)
        out = sem_or_mesh.local_map(lambda s, p: p, Blocks(out)).value
    return jax.tree.map(jnp.asarray, out)


def _find(x: np.ndarray, pts: np.ndarray):
    """``(P,)`` mesh element and ``(P, 3)`` reference coordinates of each point (host)."""
    E, n = x.shape[1], x.shape[-1]
    flat = x.reshape(3, E, -1)
    lo, hi = flat.min(axis=2).T, flat.max(axis=2).T  # (E, 3)
    pad = BOX_MARGIN * (hi - lo).max(axis=1, keepdims=True) + 1e-12
    lo, hi = lo - pad, hi + pad
    P = len(pts)
    found = np.full(P, -1, np.int64)
    ref = np.zeros((P, 3))
    chunk = max(1, 2**22 // E)
    for start in range(0, P, chunk):
        p = pts[start:start + chunk]
        cand = np.all((p[:, None, :] >= lo[None]) & (p[:, None, :] <= hi[None]), axis=2)  # (p, E)
        ip, ie = np.nonzero(cand)  # sorted by point, then element
        r, ok = _newton(x, ie, p[ip], n)
        ip, ie, r = ip[ok], ie[ok], r[ok]
        first, at = np.unique(ip, return_index=True)
        found[start + first] = ie[at]
        ref[start + first] = r[at]
    out = np.nonzero(found < 0)[0]
    if out.size:
        show = "; ".join(f"#{i}: {pts[i].tolist()}" for i in out[:5])
        raise ValueError(f"points: {out.size} of {P} lie outside the mesh (first: {show})")
    return found, np.clip(ref, -1.0, 1.0)


def _newton(x: np.ndarray, elem: np.ndarray, p: np.ndarray, n: int, maxiter: int = 40):
    """Reference coordinates of points ``p: (m, 3)`` in elements ``elem: (m,)`` and whether they
    are inside (converged to :data:`NEWTON_TOL`, |r| ≤ 1 + :data:`INSIDE_TOL`)."""
    nodes = basis.gll_points(n - 1)[0]
    xe = np.moveaxis(x[:, elem], 1, 0)  # (m, 3, n, n, n) [k, j, i]
    r = np.zeros((len(elem), 3))
    step = np.full(len(elem), np.inf)
    for _ in range(maxiter):
        L = [basis.lagrange_matrix(nodes, r[:, d]) for d in range(3)]
        dL = [basis.derivative_matrix(nodes, r[:, d]) for d in range(3)]
        val = np.einsum("mckji,mk,mj,mi->mc", xe, L[2], L[1], L[0])
        jac = np.stack([np.einsum("mckji,mk,mj,mi->mc", xe, *(dL[2] if d == 2 else L[2],
                                                          dL[1] if d == 1 else L[1],
                                                          dL[0] if d == 0 else L[0])) for d in range(3)], axis=2)
        det = np.linalg.det(jac)
        bad = ~(np.abs(det) > 1e-300)
        jac[bad] = np.eye(3)
        dr = np.linalg.solve(jac, (p - val)[..., None])[..., 0]
        dr[bad] = 0.0
        r = np.clip(r + dr, -3.0, 3.0)  # far outside: the element is not the point's, keep it finite
        step = np.where(bad, np.inf, np.abs(dr).max(axis=1))
        if not (step > NEWTON_TOL).any():
            break
    ok = (step <= NEWTON_TOL) & (np.abs(r).max(axis=1) <= 1 + INSIDE_TOL)
    return r, ok


def evaluate(sem: SEM, probes: Probes, u):
    """Values of ``u: (..., E, n, n, n)`` at the probes' points: ``(..., P)`` (summed over ranks,
    each point once). Linear in ``u``: Σ_kji u[e, k, j, i] ℓ_k(t) ℓ_j(s) ℓ_i(r)."""
    blocks = sem.comm.size if isinstance(sem.comm, ShardComm) else 1
    if probes.blocks != blocks:
        raise ValueError(f"probes were located for {probes.blocks} block(s), sem has {blocks}; "
                         f"locate the points with this sem")
    lead = u.shape[:-4]

    def local(s, pr, u):
        v = jnp.take(u, pr.element, axis=-4)  # (..., P, n, n, n)
        w = pr.weights.astype(u.dtype)
        val = jnp.einsum("...pkji,pk,pj,pi->...p", v, w[:, 2], w[:, 1], w[:, 0]) * pr.held.astype(u.dtype)
        return s.comm.allreduce(val.reshape(-1))  # 1-D: one global value, not an element field

    return sem.local_map(local, probes, u).reshape(lead + (probes.num_points,))
