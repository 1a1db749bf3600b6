"""jaxsem.parallel.comm on a single process: size 1, identities, and no MPI import at all."""

import os
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.parallel.comm import Comm, allreduce_sum, get_comm, sendrecv
from jaxsem.parallel.launch import bind_local_device, launcher_size

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


def test_import_changes_no_environment_variable():
    """``import jaxsem`` under a launcher's environment (2 processes, local rank 1) leaves every
    environment variable as it was (measured after ``import jax``, which sets two of its own);
    binding the GPU is the run's own call."""
    code = """
import os
import jax
import jax.extend
before = dict(os.environ)
import jaxsem
print(sorted(set(os.environ.items()) ^ set(before.items())))
jaxsem.parallel.bind_local_device()
print(os.environ.get('CUDA_VISIBLE_DEVICES'))
"""
    env = dict(_single_process_env(), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "1"], proc.stdout + proc.stderr


def test_bind_local_device(monkeypatch):
    """One GPU per process under a launcher of several; nothing without one, nothing over the user's choice."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    bind_local_device()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # no launcher size: a plain process
    monkeypatch.setenv("PMI_SIZE", "4")
    bind_local_device()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    bind_local_device()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


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
    from jaxsem.parallel import mpi as C

    monkeypatch.setenv("JAXSEM_MALLOPT", "0")
    assert C._tune_host_staging() is False
    monkeypatch.setenv("JAXSEM_MALLOPT", "1")
    assert C._tune_host_staging() is True  # glibc (Linux CI): both mallopt calls return 1
    assert C.HOST_STAGING_TUNED is False  # one process: no MPI world was set up


class _Marked(Comm):
    """A transport whose exchange is a visible step in the program (an optimization barrier
    returning each message as it is): where the gather–scatter's data flow meets it."""

    def exchange(self, ex, bufs):
        return list(jax.lax.optimization_barrier(list(bufs)))


def test_gather_scatter_sends_before_the_local_part():
    """Neko's order, read from the program of a distributed gather–scatter (rank 1 of 3 on a
    3×3×3 mesh): the messages depend on no full-size sum, and the local gather–scatter (the
    segment sum over every node and the gather back to the copies) on no message."""
    import dataclasses

    from jaxsem.discretization.gather_scatter import gs_apply, make_gs_distributed
    from jaxsem.mesh import box_mesh, number_nodes, partition_mesh

    mesh = box_mesh((3, 3, 3), 2)
    part = partition_mesh(mesh, 3)
    plan, elements, _ = make_gs_distributed(number_nodes(mesh).gid, part, Comm(rank=1, size=3))
    plan = dataclasses.replace(plan, exchange=dataclasses.replace(plan.exchange, comm=_Marked(rank=1, size=3)))
    assert 0 < plan.num_shared < plan.num_global
    u = jnp.ones((3, elements.size) + (mesh.n,) * 3)
    eqns = jax.make_jaxpr(gs_apply)(plan, u).jaxpr.eqns
    L = u[0].size

    def downstream(pred):
        """Variables computed from the outputs of the equations where ``pred`` holds."""
        seen = set()
        for e in eqns:
            if pred(e) or any(v in seen for v in e.invars if isinstance(v, jax.extend.core.Var)):
                seen.update(e.outvars)
        return seen

    def full_sum(e):
        return e.primitive.name == "scatter-add" and e.outvars[0].aval.size == 3 * plan.num_global

    after_exchange = downstream(lambda e: e.primitive.name == "optimization_barrier")
    after_full_sum = downstream(full_sum)
    barrier = next(e for e in eqns if e.primitive.name == "optimization_barrier")
    assert not any(v in after_full_sum for v in barrier.invars)  # the messages: from the shared sums only
    assert not any(e.outvars[0] in after_exchange for e in eqns if full_sum(e))  # the local sum needs no message
    back = [e.outvars[0] for e in eqns if e.outvars and e.outvars[0] in after_full_sum and e.outvars[0].aval.size == 3 * L]
    assert back and back[0] not in after_exchange  # nor the copies it goes back to


def _fake_comm(*platforms):
    from types import SimpleNamespace

    return SimpleNamespace(mesh=SimpleNamespace(devices=np.array([SimpleNamespace(platform=p) for p in platforms])))


def test_gspmd_scope_only_over_several_gpus(monkeypatch):
    """Shardy crashes XLA's GPU compiler on sharded Navier–Stokes runs (jax 0.11.2, measured): the
    scope switches to GSPMD only for a comm over two or more GPUs, restores the setting on the way
    out (an exception too), and JAXSEM_SHARDY=1 keeps Shardy."""
    from jaxsem.parallel.comm import gpu_devices, gspmd_on_gpus

    monkeypatch.delenv("JAXSEM_SHARDY", raising=False)
    before = jax.config.jax_use_shardy_partitioner
    assert [gpu_devices(c) for c in (_fake_comm("gpu", "gpu"), _fake_comm("gpu"), _fake_comm("cpu", "cpu"),
                                      Comm())] == [2, 1, 0, 0]
    with gspmd_on_gpus(_fake_comm("gpu", "gpu", "gpu", "gpu")):
        assert jax.config.jax_use_shardy_partitioner is False
    assert jax.config.jax_use_shardy_partitioner == before
    with pytest.raises(RuntimeError, match="inside"):
        with gspmd_on_gpus(_fake_comm("gpu", "gpu")):
            raise RuntimeError("inside")
    assert jax.config.jax_use_shardy_partitioner == before
    for c in (_fake_comm("gpu"), _fake_comm("cpu", "cpu"), Comm()):
        with gspmd_on_gpus(c):
            assert jax.config.jax_use_shardy_partitioner == before
    monkeypatch.setenv("JAXSEM_SHARDY", "1")
    with gspmd_on_gpus(_fake_comm("gpu", "gpu")):
        assert jax.config.jax_use_shardy_partitioner == before
