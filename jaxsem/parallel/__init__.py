"""How the processes and devices of a run talk, and how a run is launched.

* :mod:`.comm` — transports: the :class:`Transport` interface, :class:`Comm`
  (serial, or MPI through mpi4jax) and :class:`ShardComm` (devices under JAX's runtime);
* :mod:`.launch` — the launcher's environment, :func:`bind_local_device` and
  :func:`init_distributed`, which a run calls once at its start;
* :mod:`.mpi` — the MPI world communicator, mpi4jax and the process's MPI tuning.
"""

from .comm import Comm, ShardComm, Transport, get_comm
from .launch import bind_local_device, init_distributed

__all__ = ["Comm", "ShardComm", "Transport", "get_comm", "bind_local_device", "init_distributed"]
