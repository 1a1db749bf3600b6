"""Test-wide settings: float64 everywhere; tests/mpi only under an MPI launcher.

``pytest`` from the repository root runs the serial suite. The tests in
tests/mpi need several ranks (``mpirun -n 2 python -m pytest tests/mpi``;
``bash tests/run.sh`` runs them with 2 and 4): without a launcher that starts at
least two processes they are skipped with that reason, never run as a
one-rank case that proves nothing (and that some of them do not support).
"""

import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import pytest  # noqa: E402

from jaxsem.parallel.comm import launcher_size  # noqa: E402

_MPI_DIR = pathlib.Path(__file__).resolve().parent / "mpi"


def pytest_collection_modifyitems(config, items):
    size = launcher_size()
    if size is not None and size > 1:
        return
    skip = pytest.mark.skip(
        reason=f"needs an MPI launcher with >= 2 processes (launcher world size: {size or 'none'}); "
               "run: mpirun -n 2 python -m pytest tests/mpi")
    for item in items:
        if _MPI_DIR in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
