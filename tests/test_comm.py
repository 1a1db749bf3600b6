"""jaxsem.parallel.comm on a single process: size 1, identities, and no MPI import at all."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.parallel.comm import Comm, allreduce_sum, get_comm, launcher_size, sendrecv

_LAUNCHER_PREFIXES = ("PMI_", "OMPI_", "MV2_", "PMIX_", "HYDRA_", "MPI_")


def _single_process_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_no_mpi_import_on_single_process():
    """In a fresh interpreter (no launcher env), importing and using jaxsem.parallel.comm imports no MPI."""
    code = """
import sys, jax, jax.numpy as jnp
import jaxsem.parallel.comm as c
comm = c.get_comm()
assert comm == c.Comm(0, 1), comm
x = jnp.arange(4.0)
jax.block_until_ready(jax.jit(lambda v: c.allreduce_sum(v, comm))(x))
jax.block_until_ready(jax.jit(lambda v: c.sendrecv(v, v, 0, 0, comm))(x))
jax.grad(lambda v: c.allreduce_sum(jnp.sum(v * v), comm))(x)
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'mpi4jax'))
assert not bad, bad
print('ok')
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=_single_process_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.skipif(launcher_size() is not None, reason="this process was started by an MPI launcher")
def test_single_process_comm():
    comm = get_comm()
    assert comm == Comm(rank=0, size=1)
    assert not comm.distributed
    assert get_comm() == comm  # cached, equal, hashable (a static jit argument)
    assert hash(comm) == hash(Comm(0, 1))


def test_lead_process_writes_shared_files():
    """Only rank 0 writes files that every rank would write alike (a global series)."""
    from jaxsem.parallel.comm import ShardComm

    assert Comm().lead and Comm(rank=0, size=2).lead and not Comm(rank=1, size=2).lead
    assert ShardComm(size=1).lead  # one controller process: process 0


def test_launcher_size_from_env(monkeypatch):
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert launcher_size() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert launcher_size() == 4
    monkeypatch.setenv("PMI_SIZE", "2")
    assert launcher_size() == 2


def test_comm_is_a_pytree_without_leaves():
    comm = Comm(rank=0, size=1)
    leaves, treedef = jax.tree_util.tree_flatten(comm)
    assert leaves == []
    assert jax.tree_util.tree_unflatten(treedef, []) == comm
    # passed as an ordinary jit argument: no leaves, static rank/size
    out = jax.jit(lambda x, c: allreduce_sum(x, c) + c.size)(jnp.ones(2), comm)
    np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0])


def test_comm_validation():
    with pytest.raises(ValueError, match="size"):
        Comm(rank=0, size=0)
    with pytest.raises(ValueError, match="rank"):
        Comm(rank=1, size=1)
    with pytest.raises(TypeError, match="comm"):
        allreduce_sum(jnp.ones(2), None)


def test_collective_names_are_checked_before_any_work():
    """A bad ``collective`` is a ValueError naming it, from discretize, discretize_dg and ShardComm;
    "auto" resolves to one of the two real collectives for every device count."""
    from jaxsem.discretization import discretize, discretize_dg
    from jaxsem.mesh import box_mesh
    from jaxsem.parallel.comm import COLLECTIVES, ShardComm, resolve_collective

    mesh = box_mesh(1, 1)
    for build in (discretize, discretize_dg):
        with pytest.raises(ValueError, match="collective must be one of"):
            build(mesh, collective="alltoall")
    with pytest.raises(ValueError, match="collective must be one of"):
        ShardComm(size=2, collective="auto")  # resolved before a transport is made
    assert {resolve_collective("auto", P) for P in range(1, 17)} <= set(COLLECTIVES[1:])
    assert resolve_collective("all_to_all", 4) == "all_to_all"


def test_ops_are_identities_in_jit_and_loops():
    comm = Comm(0, 1)
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: allreduce_sum(v, comm))(x)), np.asarray(x))
    assert allreduce_sum(x, comm) is x

    def body(state):
        k, v = state
        return k + 1, sendrecv(v, v, source=0, dest=0, comm=comm) + allreduce_sum(v, comm)

    k, v = jax.jit(lambda v: jax.lax.while_loop(lambda s: s[0] < 3, body, (0, v)))(x)
    assert int(k) == 3
    np.testing.assert_array_equal(np.asarray(v), 8 * np.asarray(x))

    got = sendrecv(jnp.arange(3, dtype=jnp.int32), jax.ShapeDtypeStruct((3,), jnp.float32), 0, 0, comm)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), [0.0, 1.0, 2.0])


def test_grad_on_one_rank():
    comm = Comm(0, 1)
    x = jnp.linspace(-1.0, 1.0, 5)
    g = jax.grad(lambda v: allreduce_sum(jnp.sum(3.0 * v * v), comm))(x)
    np.testing.assert_allclose(np.asarray(g), 6.0 * np.asarray(x), rtol=1e-6)
    g2 = jax.grad(lambda v: jnp.sum(sendrecv(v, v, 0, 0, comm) ** 2))(x)
    np.testing.assert_allclose(np.asarray(g2), 2.0 * np.asarray(x), rtol=1e-6)


def test_sendrecv_argument_errors():
    comm = Comm(0, 1)
    with pytest.raises(ValueError, match="dest"):
        sendrecv(jnp.ones(2), jnp.ones(2), source=0, dest=1, comm=comm)
    with pytest.raises(TypeError, match="source"):
        sendrecv(jnp.ones(2), jnp.ones(2), source=0.0, dest=0, comm=comm)
    with pytest.raises(ValueError, match="shape"):
        sendrecv(jnp.ones(2), jnp.ones(3), source=0, dest=0, comm=comm)


def test_host_staging_tuning_switch(monkeypatch):
    """JAXSEM_MALLOPT=0 leaves the allocator alone; otherwise glibc's mallopt is called and succeeds."""
    from jaxsem.parallel import comm as C

    monkeypatch.setenv("JAXSEM_MALLOPT", "0")
    assert C._tune_host_staging() is False
    monkeypatch.setenv("JAXSEM_MALLOPT", "1")
    assert C._tune_host_staging() is True  # glibc (Linux CI): both mallopt calls return 1
    assert C.HOST_STAGING_TUNED is False  # one process: no MPI world was set up
