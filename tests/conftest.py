"""Test-wide settings: float64 everywhere; tests/mpi only under an MPI launcher.

``pytest`` from the repository root runs the serial suite. The tests in
tests/mpi need several ranks (``mpirun -n 2 python -m pytest tests/mpi``;
``bash tests/run.sh`` runs them with 2 and 4): without a launcher that starts at
least two processes they are skipped with that reason, never run as a
one-rank case that proves nothing (and that some of them do not support).
"""

import gc
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import pytest  # noqa: E402

from jaxsem.parallel.launch import launcher_size  # noqa: E402

_MPI_DIR = pathlib.Path(__file__).resolve().parent / "mpi"


# tests/run.sh hands whole modules to the pytest-xdist workers (``--dist loadfile``: a module's
# fixtures and compiled programs are made once, on one worker) in collection order
# (``--no-loadscope-reorder``): the modules that cost the most worker time go first, in that
# order (measured with ``--durations``), so that a run does not end with one worker on a long
# module while the other idles. The sort is stable: each module stays in one piece.
_SLOW_FIRST = ("test_navier_stokes_gradients", "test_navier_stokes", "test_navier_stokes_boundary",
               "test_tesseract_ns_grid", "test_scalars", "test_cli_flows", "test_gradient_protocol", "test_shard",
               "test_poisson", "test_maxwell", "test_multigrid", "test_driving", "test_distributed_jax", "test_gradients",
               "test_reliability_files", "test_gradients_time", "test_relaxation", "test_ns_projection", "test_cli")


# The slow tests (marker ``slow``; ``pytest -m "not slow"`` is the quick suite): whole modules of
# solver runs, subprocess and multi-process checks, and the slowest tests of the other modules.
_SLOW_MODULES = {"test_shard", "test_distributed_jax", "test_navier_stokes", "test_navier_stokes_gradients",
                 "test_gradients_time", "test_maxwell", "test_maxwell_adjoint", "test_multigrid", "test_assembled",
                 "test_advection", "test_reliability_files", "test_cli", "test_bench", "test_roofline",
                 "test_gradients", "test_tesseract_ns_grid", "test_tesseract_thermal"}
_SLOW_TESTS = ("test_neumann_helmholtz_converges", "test_single_reduction_cg_has_the_classic_iterates",
               "test_reverse_pass_of_a_nonlinear_f", "test_both_remat_schedules", "test_exponential_convergence_in_p",
               "test_algebraic_rate_p_plus_1_in_h")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(pathlib.Path(str(item.path)).stem, len(rank)))
    for item in items:
        if pathlib.Path(str(item.path)).stem in _SLOW_MODULES or item.name.startswith(_SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    size = launcher_size()
    if size is not None and size > 1:
        return
    skip = pytest.mark.skip(
        reason=f"needs an MPI launcher with >= 2 processes (launcher world size: {size or 'none'}); "
               "run: mpirun -n 2 python -m pytest tests/mpi")
    for item in items:
        if _MPI_DIR in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_stop_signal_left():
    """Each test starts without a stop signal noted by another (jaxsem.solvers.stops keeps one
    per process until a run reads it)."""
    from jaxsem.solvers.stops import take_pending_signal

    take_pending_signal()
    yield


@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_freed_after_each_module():
    """Each module's compiled programs are dropped when it ends. A process keeps every program
    it compiled (JAX's caches), and XLA's CPU code lives in memory maps of its own: one test
    module makes thousands of them (tests/test_driving.py about 5,700), a pytest worker
    that runs half the suite ran past Linux's 65,530 maps per process (vm.max_map_count),
    and the worker died inside XLA (SIGABRT, or silently). Programs that later modules
    share come back from the persistent compilation cache that tests/run.sh sets."""
    yield
    jax.clear_caches()
    gc.collect()
