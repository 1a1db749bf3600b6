"""Transports: how ranks sum and exchange (serial, MPI through mpi4jax, sharded over devices)."""

from .comm import Comm, ShardComm, get_comm

__all__ = ["Comm", "ShardComm", "get_comm"]
