"""How element work runs, chosen once per discretization: a :class:`Backend` owns every kernel.

A backend applies the SEM element operators (mass, stiffness on Gauss points, collocated
stiffness on GLL points, on element or assembled vectors), says how the gather–scatter runs,
and computes the DG right-hand sides (Maxwell with its curls, advection) with their
derivative rules. Models call ``sem.backend.…`` / ``dg.backend.…`` and never ask which one
it is:

* :class:`Backend` (``"einsum"``): the reference — tensor contractions with ``jnp.einsum``
  on every platform. It is the test oracle, and its linearization is the derivative rule of
  every other backend. Its DG right-hand sides exchange the face values, then compute
  (:mod:`._maxwell_ref`, :mod:`._advection_ref`).
* :class:`CudaBackend` (``"cuda"``): hand-written CUDA kernels through the XLA FFI
  (:mod:`jaxsem.backends.cuda`), compiled for the GPU on first use; one launch per operator
  application, the single-device gather–scatter as one gather kernel, the Navier–Stokes
  convective term on the 3/2 rule as one kernel, and each DG
  right-hand side as one fused kernel (:mod:`._fused_dg`: Maxwell wherever its chain-rule
  curl is the operator asked for — the chain form, and the default split form on affine
  meshes). Tangents are the einsum reference's or the fused rules' transposes; an FFI call
  has no transpose rule, so solvers differentiate the SEM kernels through a custom rule
  (:attr:`Backend.transposable` is False). What it has no kernel for, it inherits.
* :class:`EmulatedBackend` (``"emulated"``): the CUDA backend's DG dispatch and derivative
  rules with einsum values, so tests reach the fused path on a CPU (pass ``EMULATED`` as
  ``backend=``).

:func:`resolve` turns the user's choice (``"auto"``, ``"einsum"``, ``"cuda"`` or a
:class:`Backend`) into a backend for one discretization's order, quadrature size and dtype;
:func:`jaxsem.discretize` and :func:`jaxsem.discretize_dg` call it once and store the result,
static, on the discretization. Nothing below asks again.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from . import _advection_ref as adv_ref
from . import _maxwell_ref as mx_ref
from . import cuda
from ._fused_dg import FusedDG
from ..operators.convection import advection_local
from ..operators.mass import mass
from ..operators.stiffness import stiffness, stiffness_assembled, stiffness_gll, stiffness_gll_assembled
from ..operators.tensor import grad_gll, grad_gll_sums, grad_gll_t, grad_gll_t_sums, interp, interp_t

__all__ = ["Backend", "CudaBackend", "EmulatedBackend", "BACKENDS", "EINSUM", "EMULATED", "CUDA", "resolve"]

BACKENDS = ("auto", "einsum", "cuda")


@dataclasses.dataclass(frozen=True)
class Backend:
    """The einsum reference backend: every element kernel as ``jnp.einsum`` contractions.

    Hashable and static on a discretization. Every method is the readable truth its
    overrides are tested against: the SEM operators take ``u: (..., E, n, n, n)``, leading
    axes (vector components) in one call; the DG right-hand sides take the discretization,
    the model's coefficient pytree and the field (:mod:`jaxsem.models.maxwell`,
    :mod:`jaxsem.models.advection`).
    """

    name: ClassVar[str] = "einsum"
    #: Whether JAX can transpose the SEM operators as linear maps (the solvers' derivative rule).
    transposable: ClassVar[bool] = True
    #: Gather–scatter layout on one device: ``"segment"`` sums or the CUDA gather kernel (``"csr"``).
    gs_layout: ClassVar[str] = "segment"
    #: Whether the collocated stiffness operators get the compact affine factors
    #: ``(6, E, 1, 1, 1)`` on meshes of affine elements (:attr:`jaxsem.SEM.affine`); the
    #: reference reads the factors it computed.
    compact_affine: ClassVar[bool] = False

    def mass(self, u, J, B, h=None):
        """:func:`jaxsem.operators.mass.mass`: ``Jᵀ⊗Jᵀ⊗Jᵀ (hB ⊙ J⊗J⊗J u)``."""
        return mass(u, J, B, h)

    def stiffness(self, u, J, Dt, G, h=None):
        """:func:`jaxsem.operators.stiffness.stiffness` on Gauss points."""
        return stiffness(u, J, Dt, G, h)

    def stiffness_gll(self, u, D, G, h=None):
        """:func:`jaxsem.operators.stiffness.stiffness_gll`: collocated on GLL points (BK5/BK6)."""
        return stiffness_gll(u, D, G, h)

    def stiffness_gll_assembled(self, x, idx, D, G, h=None):
        """BK5/BK6 on assembled vectors ``x: (..., nf)``: ``Qᵀ stiffness_gll(Q x)`` with ``Q x`` =
        ``x`` taken at ``idx: (E, n, n, n)`` (0 where ``idx >= nf``, the Dirichlet nodes) and Qᵀ the
        sum of the copies."""
        return stiffness_gll_assembled(x, idx, D, G, h)

    def stiffness_assembled(self, x, idx, J, Dt, G, h=None):
        """BK3/BK4 on assembled vectors ``x: (..., nf)``: ``Qᵀ stiffness(Q x)`` on Gauss points
        (``Q``, ``Qᵀ`` as for :meth:`stiffness_gll_assembled`)."""
        return stiffness_assembled(x, idx, J, Dt, G, h)

    def grad_gll(self, u, D):
        """The collocated reference gradient ``(ur, us, ut)`` of ``u: (..., E, n, n, n)``:
        :func:`jaxsem.operators.tensor.grad_gll`."""
        return grad_gll(u, D)

    def grad_gll_t(self, wr, ws, wt, D):
        """Its transpose: :func:`jaxsem.operators.tensor.grad_gll_t`."""
        return grad_gll_t(wr, ws, wt, D)

    def interp(self, u, J, back: bool = False):
        """The transfer between two orders of p-multigrid: ``(J⊗J⊗J) u`` (``J: (n, m)``,
        ``u: (..., E, m, m, m)`` → ``(..., E, n, n, n)``), or with ``back`` the transpose
        ``(Jᵀ⊗Jᵀ⊗Jᵀ) v`` (``(..., E, n, n, n)`` → ``(..., E, m, m, m)``):
        :func:`jaxsem.operators.tensor.interp` / ``interp_t``."""
        return interp_t(u, J) if back else interp(u, J)

    def convection(self, c, u, J, Dd, Brx):
        """The element-local weak (u·∇)c on a quadrature rule, not assembled:
        :func:`jaxsem.operators.convection.advection_local` (``c: (m, E, n, n, n)``,
        ``u: (3, E, n, n, n)``, ``J, Dd: (q, n)``, ``Brx: (3, 3, E, q, q, q)``)."""
        return advection_local(c, u, J, Dd, Brx)

    def maxwell_curls(self, dg, q, form):
        """``(∇×E, ∇×H)`` of ``q: (6, E, n, n, n)`` in the volume form ``"split"`` or ``"chain"``
        (no fluxes; :func:`jaxsem.backends._maxwell_ref.curls`)."""
        return mx_ref.curls(dg, q, form)

    def maxwell_rhs(self, dg, mat, q, flux, bc, form):
        """The SEDG Maxwell dq/dt on this rank, ``q: (6, E, n, n, n)``: the face exchange, then
        curls and fluxes (:func:`jaxsem.backends._maxwell_ref.rhs`)."""
        return mx_ref.rhs(dg, mat, q, flux, bc, form)

    def advection_rhs(self, dg, tr, u, flux, form):
        """The DG advection du/dt on this rank, ``u: (E, n, n, n)``: the face exchange, then the
        volume and surface terms (:func:`jaxsem.backends._advection_ref.rhs`)."""
        return adv_ref.rhs(dg, tr, u, flux, form)


class _LocalKernels:
    """The fused kernels' values in einsum form (what :class:`EmulatedBackend` computes)."""

    def convection(self, c, u, J, Dd, Brx):
        """The CUDA backend's convective term and derivative rules, the kernels' values in einsum
        form (:func:`jaxsem.backends.cuda.convection_emulated`); off the 3/2 rule the einsum form."""
        n = c.shape[-1]
        if tuple(J.shape) != (cuda.convection_q(n), n):
            return advection_local(c, u, J, Dd, Brx)
        return cuda.convection_emulated(c, u, J, Dd, Brx)

    def maxwell_kernel(self, dg, mat, q, flux, bc):
        """The local Maxwell operator (chain curl, neighbours through ``dg.nbr``, remote mirrored)."""
        return mx_ref.rhs_local(dg, mat, q, flux, bc)

    def maxwell_material_kernel_vjp(self, dg, mat, q, ct, flux, bc):
        """The cotangents of ``mat``'s fields for a cotangent ``ct`` of :meth:`maxwell_kernel` at fixed ``q``."""
        return mx_ref.material_vjp(dg, mat, q, ct, flux, bc)

    def advection_kernel(self, dg, tr, u, flux, form):
        """The local advection operator (neighbours through ``dg.nbr``, remote ones 0)."""
        return adv_ref.rhs_local(dg, tr, u, flux, form)


@dataclasses.dataclass(frozen=True)
class EmulatedBackend(FusedDG, _LocalKernels, Backend):
    """The CUDA backend's dispatch and derivative rules with einsum values, on any platform.

    The DG right-hand sides and the Navier–Stokes convective term take the fused path exactly
    where :class:`CudaBackend` does (the same primitives, transpose and material-adjoint rules,
    halo correction), each kernel's value computed by the einsum local operator: tests of that
    path need no GPU. The SEM operators are the einsum reference's, given the compact
    affine factors where the CUDA backend would get them; the collocated gradient is the CUDA
    backend's unrolled sums (pure JAX, so the same everywhere).
    """

    name: ClassVar[str] = "emulated"
    compact_affine: ClassVar[bool] = True

    def grad_gll(self, u, D):
        """The CUDA backend's form: :func:`jaxsem.operators.tensor.grad_gll_sums`."""
        return grad_gll_sums(u, D)

    def grad_gll_t(self, wr, ws, wt, D):
        """The CUDA backend's form: :func:`jaxsem.operators.tensor.grad_gll_t_sums`."""
        return grad_gll_t_sums(wr, ws, wt, D)


@dataclasses.dataclass(frozen=True)
class CudaBackend(FusedDG, Backend):
    """Hand-written CUDA kernels through the XLA FFI (:mod:`jaxsem.backends.cuda`).

    Overrides the SEM operators (one launch per application; tangents the einsum reference's,
    no transpose: solvers differentiate them through a custom rule; on affine meshes BK5/BK6
    recompute the geometric factors from six constants per element), the single-device
    gather–scatter (one gather kernel) and the DG kernels of :class:`FusedDG`; inherits the rest
    (the Maxwell split form on curved meshes) from :class:`Backend`.
    """

    name: ClassVar[str] = "cuda"
    transposable: ClassVar[bool] = False
    gs_layout: ClassVar[str] = "csr"
    compact_affine: ClassVar[bool] = True

    def mass(self, u, J, B, h=None):
        return cuda.mass_cuda(u, J, B, h)

    def stiffness(self, u, J, Dt, G, h=None):
        return cuda.stiffness_cuda(u, J, Dt, G, h)

    def stiffness_gll(self, u, D, G, h=None):
        return cuda.stiffness_gll_cuda(u, D, G, h)

    def stiffness_gll_assembled(self, x, idx, D, G, h=None):
        return cuda.stiffness_gll_assembled_cuda(x, idx, D, G, h)

    def grad_gll(self, u, D):
        """:func:`jaxsem.operators.tensor.grad_gll_sums`: one elementwise pass per direction."""
        return grad_gll_sums(u, D)

    def grad_gll_t(self, wr, ws, wt, D):
        """:func:`jaxsem.operators.tensor.grad_gll_t_sums`."""
        return grad_gll_t_sums(wr, ws, wt, D)

    def interp(self, u, J, back: bool = False):
        """:func:`jaxsem.backends.cuda.interp_cuda` where it runs the sizes (2 ≤ m < n ≤ 16), else
        the einsum form."""
        if not cuda.transfer_supported(u, J, back):
            return super().interp(u, J, back)
        return cuda.interp_cuda(u, J, back)

    def stiffness_assembled(self, x, idx, J, Dt, G, h=None):
        return cuda.stiffness_assembled_cuda(x, idx, J, Dt, G, h)

    def convection(self, c, u, J, Dd, Brx):
        """:func:`jaxsem.backends.cuda.convection_cuda` on the 3/2 rule; another rule (the GLL
        points, no dealiasing) is the einsum form's."""
        n = c.shape[-1]
        if tuple(J.shape) != (cuda.convection_q(n), n):
            return super().convection(c, u, J, Dd, Brx)
        return cuda.convection_cuda(c, u, J, Dd, Brx)

    def maxwell_kernel(self, dg, mat, q, flux, bc):
        """:func:`jaxsem.backends.cuda.maxwell_rhs_cuda` (no derivative rule of its own)."""
        return cuda.maxwell_rhs_cuda(q, dg.D, dg.rx, mat.eps, mat.mu, dg.normal, mat.cE, mat.aE, mat.cH, mat.aH,
                                     dg.nbr, flux == "upwind", bc == "pmc")

    def maxwell_material_kernel_vjp(self, dg, mat, q, ct, flux, bc):
        """:func:`jaxsem.backends.cuda.maxwell_material_vjp_cuda`, as a pytree like ``mat``."""
        gn, gf = cuda.maxwell_material_vjp_cuda(q, ct, dg.D, dg.rx, mat.eps, mat.mu, dg.normal, mat.cE, mat.aE,
                                                mat.cH, mat.aH, dg.nbr, flux == "upwind", bc == "pmc")
        return mx_ref.material_from(mat, gn, gf)

    def advection_kernel(self, dg, tr, u, flux, form):
        """:func:`jaxsem.backends.cuda.advection_rhs_cuda`."""
        return cuda.advection_rhs_cuda(u, dg.D, tr.A, dg.jac, tr.an, tr.vn, tr.lw, dg.nbr, form, flux == "upwind")


EINSUM = Backend()
EMULATED = EmulatedBackend()
CUDA = CudaBackend()


def resolve(backend: str | Backend, order: int, q: int, dtype, distributed: bool = False) -> Backend:
    """The :class:`Backend` for ``backend`` at this order, quadrature size ``q`` and dtype.

    ``"auto"``: the CUDA kernels where they run these sizes (a CUDA GPU as JAX's default
    backend, nvcc or a built kernel, ``n = order + 1 ≤ cuda.MAX_N``, Gauss quadrature
    with ``q = n + 1`` or collocated), else einsum. ``"cuda"`` raises ``ValueError``
    naming what is missing. ``distributed`` is accepted for symmetry: every backend runs
    inside ``shard_map`` and under MPI (the gather–scatter then uses segment sums).
    """
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "einsum":
        return EINSUM
    n = order + 1
    why = None
    if jnp.dtype(dtype) not in (jnp.float32, jnp.float64):
        why = f"dtype {jnp.dtype(dtype)} (float32 or float64 only)"
    elif not 2 <= n <= cuda.MAX_N:
        why = f"order {order} (the kernels take 1 <= order <= {cuda.MAX_N - 1})"
    elif q not in (n, n + 1):
        why = f"q = {q} quadrature points (the kernels take q = order + 1 or order + 2)"
    elif not cuda.cuda_available():
        why = "no CUDA GPU as JAX's default backend, or no nvcc to build the kernels"
    if why is None:
        return CUDA
    if backend == "cuda":
        raise ValueError(f"backend 'cuda' cannot run here: {why}; use backend='auto' or 'einsum'")
    return EINSUM
