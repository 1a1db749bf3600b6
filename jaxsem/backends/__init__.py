"""How element work runs, chosen once per discretization.

A :class:`Backend` applies the element operators (mass, stiffness on Gauss points,
collocated stiffness on GLL points) and says how the gather–scatter runs:

* ``"einsum"``: the reference — tensor contractions with ``jnp.einsum`` on every
  platform. It is the test oracle, and its linearization is the derivative rule of
  every other backend.
* ``"cuda"``: fused CUDA kernels through the XLA FFI (:mod:`jaxsem.backends.cuda`),
  compiled for the GPU on first use; one kernel launch per operator application,
  and the single-device gather–scatter as one gather kernel. Their tangents are the
  einsum reference's, so ``jax.grad`` and ``jax.jvp`` work; an FFI call has no
  transpose rule, so solvers differentiate them through a custom rule
  (:attr:`Backend.transposable` is False).

:func:`resolve` turns the user's choice (``"auto"``, ``"einsum"`` or ``"cuda"``)
into a :class:`Backend` for one discretization's order, quadrature size and
dtype; :func:`jaxsem.discretize` calls it once and stores the result, static, on
the discretization. Nothing below asks again.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ..operators.mass import mass
from ..operators.stiffness import stiffness, stiffness_assembled, stiffness_gll, stiffness_gll_assembled

__all__ = ["Backend", "BACKENDS", "EINSUM", "resolve"]

BACKENDS = ("auto", "einsum", "cuda")


@dataclasses.dataclass(frozen=True)
class Backend:
    """An element-kernel backend: ``name`` is ``"einsum"`` or ``"cuda"`` (hashable, static).

    Every method has the contract of the einsum reference it names; ``u: (..., E, n, n, n)``,
    leading axes (vector components) in one call.
    """

    name: str = "einsum"

    def __post_init__(self):
        if self.name not in ("einsum", "cuda"):
            raise ValueError(f"backend name must be 'einsum' or 'cuda', got {self.name!r}")

    @property
    def transposable(self) -> bool:
        """Whether JAX can transpose the operators as linear maps (only the einsum path)."""
        return self.name == "einsum"

    @property
    def gs_layout(self) -> str:
        """Gather–scatter layout on one device: the CUDA gather kernel (``"csr"``) or ``"segment"``."""
        return "csr" if self.name == "cuda" else "segment"

    def mass(self, u, J, B, h=None):
        """:func:`jaxsem.operators.mass.mass`: ``Jᵀ⊗Jᵀ⊗Jᵀ (hB ⊙ J⊗J⊗J u)``."""
        if self.name == "cuda":
            from . import cuda

            return cuda.mass_cuda(u, J, B, h)
        return mass(u, J, B, h)

    def stiffness(self, u, J, Dt, G, h=None):
        """:func:`jaxsem.operators.stiffness.stiffness` on Gauss points."""
        if self.name == "cuda":
            from . import cuda

            return cuda.stiffness_cuda(u, J, Dt, G, h)
        return stiffness(u, J, Dt, G, h)

    def stiffness_gll(self, u, D, G, h=None):
        """:func:`jaxsem.operators.stiffness.stiffness_gll`: collocated on GLL points (BK5/BK6)."""
        if self.name == "cuda":
            from . import cuda

            return cuda.stiffness_gll_cuda(u, D, G, h)
        return stiffness_gll(u, D, G, h)


    def stiffness_gll_assembled(self, x, idx, D, G, h=None):
        """BK5/BK6 on assembled vectors ``x: (..., nf)``: ``Qᵀ stiffness_gll(Q x)`` with ``Q x`` =
        ``x`` taken at ``idx: (E, n, n, n)`` (0 where ``idx >= nf``, the Dirichlet nodes) and Qᵀ the
        sum of the copies; the CUDA kernel does all three in one launch."""
        if self.name == "cuda":
            from . import cuda

            return cuda.stiffness_gll_assembled_cuda(x, idx, D, G, h)
        return stiffness_gll_assembled(x, idx, D, G, h)

    def stiffness_assembled(self, x, idx, J, Dt, G, h=None):
        """BK3/BK4 on assembled vectors ``x: (..., nf)``: ``Qᵀ stiffness(Q x)`` on Gauss points
        (``Q``, ``Qᵀ`` as for :meth:`stiffness_gll_assembled`); one CUDA launch."""
        if self.name == "cuda":
            from . import cuda

            return cuda.stiffness_assembled_cuda(x, idx, J, Dt, G, h)
        return stiffness_assembled(x, idx, J, Dt, G, h)


EINSUM = Backend("einsum")


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
    from . import cuda

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
        return Backend("cuda")
    if backend == "cuda":
        raise ValueError(f"backend 'cuda' cannot run here: {why}; use backend='auto' or 'einsum'")
    return EINSUM
