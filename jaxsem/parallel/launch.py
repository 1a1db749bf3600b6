"""Launching: what the launcher's environment says, device binding and ``jax.distributed`` start-up.

``mpirun``/``srun`` announce the world size and this process's rank in environment
variables; these functions read them without importing MPI. Two things a run does
once, before JAX picks its devices, and only when asked (``import jaxsem`` changes
no environment variable):

* :func:`bind_local_device` — one GPU per process (``CUDA_VISIBLE_DEVICES``);
* :func:`init_distributed` — multi-controller JAX, so that one sharded program spans
  every process's devices (:class:`jaxsem.parallel.ShardComm`).

The ``jaxsem`` command calls both where its run is launched; an MPI script calls
them at its top.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import zlib

import jax

__all__ = ["launcher_size", "launcher_rank", "local_rank", "bind_local_device", "init_distributed"]

# Launchers' node-local rank variables: Open MPI, MPICH/Hydra, MVAPICH, Slurm.
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")

# Environment variables through which MPI launchers announce the world size:
# MPICH / Intel MPI (Hydra) and Slurm's PMI2 set PMI_SIZE; Open MPI sets
# OMPI_COMM_WORLD_SIZE; MVAPICH sets MV2_COMM_WORLD_SIZE.
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_size() -> int | None:
    """World size announced by the MPI launcher's environment, without importing MPI.

    Returns:
        The number of processes ``mpirun``/``mpiexec`` started (read from
        ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE`` or ``MV2_COMM_WORLD_SIZE``), or
        ``None`` when no launcher variable is set (a plain ``python`` process).
    """
    return _int_from_env(_LAUNCHER_SIZE_VARS)


def _int_from_env(names) -> int | None:
    """The first of the environment variables ``names`` that holds an integer."""
    for var in names:
        value = os.environ.get(var)
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> int | None:
    """This process's rank from the launcher's environment (None without a launcher); no MPI call."""
    return _int_from_env(_RANK_VARS) if launcher_size() is not None else None


def local_rank() -> int | None:
    """This process's rank on its node, from the launcher's environment (None without one)."""
    return _int_from_env(_LOCAL_RANK_VARS)


def bind_local_device() -> None:
    """One process per GPU: under an MPI launcher, restrict this process to GPU ``local_rank``.

    Sets ``CUDA_VISIBLE_DEVICES`` to the node-local rank unless the user set it
    (or no launcher started us). Call it first thing in an MPI script, before JAX
    initializes its GPU backend (the ``jaxsem`` command does); ``import jaxsem`` does
    not. Two processes on one GPU time-slice it, which makes every timing meaningless.
    """
    size = launcher_size()
    lr = local_rank()
    if size is None or size <= 1 or lr is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = str(lr)


def init_distributed() -> bool:
    """Start multi-controller JAX when a launcher (``mpirun``, ``srun``) started several processes.

    Call it first thing, before any JAX computation: afterwards ``jax.devices()`` lists
    every process's devices, and ``discretize(mesh, devices=jax.devices())`` spans them
    all (NCCL between GPUs; gloo between CPU processes). Rank and size come from MPI
    through mpi4py (``cluster_detection_method="mpi4py"``); the coordinator's address is
    agreed over MPI (:func:`_coordinator`), and process 0 serves it on that address only,
    not on every interface of its host. Returns True when it initialized (or already
    had), False on a single process.
    """
    size = launcher_size()
    if size is None or size <= 1:
        return False
    if jax.distributed.is_initialized():
        return True
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # used only by CPU devices
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise RuntimeError(f"a launcher started {size} processes, but multi-controller JAX needs mpi4py "
                           "to find its peers: pip install mpi4py") from None
    # JAX's MPI detection would take GPU number <local rank> on each node, but a process bound to its GPU
    # (bind_local_device, or the user's CUDA_VISIBLE_DEVICES) sees its GPUs numbered from 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = list(range(len(visible.split(",")))) if visible else None
    from mpi4py import MPI

    address, bind = _coordinator(MPI.COMM_WORLD)
    jax.distributed.initialize(address, cluster_detection_method="mpi4py", local_device_ids=ids,
                               coordinator_bind_address=bind)
    return True


def _coordinator(world) -> tuple[str, str]:
    """``(address, bind)``: where every process reaches the ``jax.distributed`` coordinator, and
    the ``ip:port`` process 0 serves it on; decided by process 0 of the mpi4py communicator
    ``world`` and broadcast, so that every process gets the same answer or the same error.

    ``$JAX_COORDINATOR_ADDRESS`` (``host:port``), when set, is the address, served on that
    host's IP; else :func:`_coordinator_address` on ``$JAX_COORDINATOR_PORT`` or a port chosen
    from process 0's host name. ``$JAX_COORDINATOR_BIND_ADDRESS`` overrides the bind address.
    """
    hosts = world.allgather(socket.gethostname())
    answer = None
    if world.Get_rank() == 0:
        try:
            given = os.environ.get("JAX_COORDINATOR_ADDRESS")
            if given:
                host, port = given.rsplit(":", 1)
                answer = (given, f"{_host_ip(host.strip('[]'))}:{port}")
            else:
                # the range JAX's own mpi4py detection draws from; the host name keeps it stable
                port = os.environ.get("JAX_COORDINATOR_PORT") or str(61440 + zlib.crc32(hosts[0].encode()) % 4096)
                address = _coordinator_address(hosts, port)
                answer = (address, address)
        except (OSError, ValueError) as err:
            answer = f"{type(err).__name__}: {err}"
    answer = world.bcast(answer, root=0)
    if isinstance(answer, str):
        raise RuntimeError(f"jax.distributed: no coordinator address for process 0 on {hosts[0]} ({answer}); "
                           "set JAX_COORDINATOR_ADDRESS=<IP of that host on the network the processes "
                           "share>:<port>")
    address, bind = answer
    return address, os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or bind


def _host_ip(host: str) -> str:
    """``host`` if it is an IP address, else its IPv4 address."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return socket.gethostbyname(host)


def _route_ip(peer: str) -> str:
    """This host's address on the route to IP ``peer`` (connecting a UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def _coordinator_address(hosts, port, resolve=_host_ip, route=_route_ip) -> str:
    """``ip:port`` of the coordinator of processes on ``hosts`` (host names, process 0's first).

    All on one host: the loopback address, which no other machine can reach. Across hosts:
    process 0's host resolved, or, where that gives a loopback address (Debian's /etc/hosts
    maps the host name to 127.0.1.1), this host's address on the route to another host.
    ``ValueError`` when neither is an address the other hosts can reach.
    """
    if all(h == hosts[0] for h in hosts):
        return f"127.0.0.1:{port}"
    ip = resolve(hosts[0])
    if ipaddress.ip_address(ip).is_loopback:
        peer = next(h for h in hosts if h != hosts[0])
        ip = route(resolve(peer))
        if ipaddress.ip_address(ip).is_loopback:
            raise ValueError(f"host {hosts[0]} resolves to a loopback address, and so does its route to {peer}")
    return f"{ip}:{port}"
