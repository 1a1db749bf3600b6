"""Fixtures for the MPI tests (tests/mpi), run as

    mpirun -n 2 python -m pytest tests/mpi -q
    mpirun -n 4 python -m pytest tests/mpi -q

(``bash tests/run.sh`` does both). Without a launcher of two or more processes
tests/conftest.py skips them. Every rank runs every test in the same order; tests call all their
collective operations before asserting, so a failure on one rank cannot leave the
other ranks waiting in a collective.
"""

import os

import jax

jax.config.update("jax_enable_x64", True)

import pytest  # noqa: E402

from jaxsem.parallel.comm import get_comm  # noqa: E402
from jaxsem.parallel.launch import bind_local_device  # noqa: E402

bind_local_device()  # one GPU per rank where there are GPUs; before any test asks JAX for devices

# What the launcher says, read here directly (not through jaxsem) so that a
# broken detection in jaxsem.parallel.comm cannot hide itself.
_LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def expected_world_size() -> int:
    """World size announced by mpirun's environment; 1 without a launcher."""
    for var in _LAUNCHER_VARS:
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def pytest_report_header(config):
    return f"jaxsem MPI tests: launcher world size {expected_world_size()}"


@pytest.fixture(scope="session")
def comm():
    """The world communicator; fails (never skips) if MPI is not really multi-process."""
    c = get_comm()
    expected = expected_world_size()
    assert c.size == expected, (
        f"mpirun started {expected} processes but jaxsem.parallel.comm sees size {c.size}: "
        "mpi4py/mpi4jax missing or built against another MPI than this mpirun"
    )
    return c
