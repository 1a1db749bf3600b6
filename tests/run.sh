#!/usr/bin/env bash
# Install jaxsem into ./.venv and run the whole test suite:
#   1. serial tests      python -m pytest tests -q --ignore=tests/mpi -n auto --dist loadfile --no-loadscope-reorder  [extra args]
#   2. MPI tests         mpirun -n 2 python -m pytest tests/mpi; -n 4 on the multi-neighbour subset
#   3. notebooks         python -m pytest -n auto --dist worksteal --nbmake notebooks/   (if any exist)
#
# Usage (from anywhere):   bash tests/run.sh [extra pytest args for the serial stage]
# Needs only Python >= 3.11 (with venv) and a C compiler; MPI (MPICH), mpi4py and
# mpi4jax come from PyPI into the venv. A second run skips what is installed.
# Environment: PYTHON=python3.12 picks the interpreter for a new .venv.
# Exit status: non-zero if the install or any stage fails (all stages still run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

header() { printf '\n==================== %s ====================\n' "$*"; }
die() { printf 'tests/run.sh: error: %s\n' "$*" >&2; exit 1; }

export PIP_DISABLE_PIP_VERSION_CHECK=1

# ---------------------------------------------------------------- install
if [[ ! -x "$PY" ]]; then
    header "creating .venv"
    BASE=""
    for cand in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            BASE="$cand"
            break
        fi
    done
    [[ -n "$BASE" ]] || die "need Python >= 3.11 (set PYTHON=/path/to/python3.x)"
    echo "using $(command -v "$BASE") ($("$BASE" --version 2>&1))"
    "$BASE" -m venv "$VENV" ||
        die "python -m venv failed (on Debian/Ubuntu: apt install python3-venv); remove .venv and retry"
fi
"$PY" -c 'import sys' 2>/dev/null ||
    die ".venv is broken (moved or its Python removed): delete $VENV and run again"

# The editable install is redone whenever pyproject.toml changes.
STAMP="$VENV/.jaxsem-install-stamp"
WANT="$("$PY" - <<'EOF'
import hashlib, sys
print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest(), sys.version.split()[0])
EOF
)"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]] ||
    ! "$PY" -c 'import importlib.metadata as m; m.distribution("jaxsem")' 2>/dev/null; then
    header "installing jaxsem[test,notebooks,gmsh,tesseract] (editable)"
    "$PY" -m pip install --upgrade pip
    "$PY" -m pip install -e '.[test,notebooks,gmsh,tesseract]'
    echo "$WANT" >"$STAMP"
else
    echo "jaxsem[test,notebooks,gmsh,tesseract] already installed in .venv"
fi

if [[ -x "$VENV/bin/mpirun" && -x "$VENV/bin/mpicc" ]] && "$PY" - 2>/dev/null <<'EOF'
import importlib.metadata as m
import mpi4py, nanobind, wheel  # noqa: F401
assert int(m.version("setuptools").split(".")[0]) >= 82
EOF
then
    echo "mpich, mpi4py, nanobind, setuptools>=82, wheel already installed in .venv"
else
    header "installing MPI (mpich, mpi4py) and mpi4jax build tools"
    "$PY" -m pip install mpich mpi4py nanobind 'setuptools>=82' wheel
fi

# mpi4jax is an sdist: build it against this venv's jax and MPICH, CPU only
# (CUDA_PATH=/dev/null keeps a stray nvcc from triggering the CUDA part).
if "$PY" -c 'import mpi4jax' 2>/dev/null; then
    echo "mpi4jax already installed in .venv"
else
    header "building mpi4jax"
    CUDA_PATH=/dev/null MPI4JAX_BUILD_MPICC="$VENV/bin/mpicc" \
        "$PY" -m pip install --no-cache-dir --no-build-isolation mpi4jax
fi

# ---------------------------------------------------------------- tests
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export JAX_PLATFORMS=cpu
unset PYTHONPATH
"$PY" - <<'EOF'
import sys, jax, mpi4py, mpi4jax
print(f"python {sys.version.split()[0]}, jax {jax.__version__}, "
      f"mpi4py {mpi4py.__version__}, mpi4jax {mpi4jax.__version__}")
EOF

FAILED=()
run_stage() { # run_stage NAME CMD...: run, record a failure, keep going
    local name="$1"
    shift
    header "$name"
    local rc=0
    "$@" || rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "---- $name: FAILED (exit $rc)"
        FAILED+=("$name (exit $rc)")
    fi
}

# Under mpirun, rank 0 prints pytest's output; the other ranks write theirs to a
# log that is shown only if that rank fails. Any rank's failure fails mpirun.
MPI_LOGS="$(mktemp -d)"
trap 'rm -rf "$MPI_LOGS"' EXIT

# One persistent XLA compilation cache for this run, removed at exit (JAX's own: the key is the
# compiled program with its options and the jax/jaxlib version, so a hit loads the executable the
# compiler would have made). Each MPI rank compiles every test's serial reference, and the -n 4
# stage compiles again what the -n 2 stage did; xdist workers and check subprocesses repeat
# programs too. Programs that compile in under 0.05 s are not stored. JAXSEM_TEST_XLA_CACHE=0:
# no cache; an already set JAX_COMPILATION_CACHE_DIR is used as it is.
# The tests' programs are small and most of the suite's time is XLA compiling them for the CPU:
# LLVM without its expensive passes and at -O0, and XLA's older loop emitters for fusions and its
# plain scheduler, compile them faster (measured: a Navier-Stokes step program 7.7 s -> 3.4 s;
# the values are the same up to round-off, far below the tests' tolerances). An XLA that does not
# know a flag aborts, so each is kept only if this jaxlib accepts it.
# JAXSEM_TEST_FAST_COMPILE=0: XLA's default optimization.
if [[ "${JAXSEM_TEST_FAST_COMPILE:-1}" != 0 ]]; then
    # The notebooks run hundreds of steps: their time is the programs' own, and the loop emitters'
    # code is slower (a channel notebook cell passed 300 s with them); they keep the first two.
    NOTEBOOK_XLA_FLAGS="${XLA_FLAGS:-}"
    for flag in --xla_llvm_disable_expensive_passes=true --xla_backend_optimization_level=0 \
        --xla_cpu_use_fusion_emitters=false --xla_cpu_enable_concurrency_optimized_scheduler=false; do
        if XLA_FLAGS="$flag" "$PY" -c 'import jax.numpy as jnp; jnp.zeros(2).block_until_ready()' >/dev/null 2>&1; then
            [[ "$flag" == --xla_cpu_* ]] || NOTEBOOK_XLA_FLAGS="${NOTEBOOK_XLA_FLAGS:+$NOTEBOOK_XLA_FLAGS }$flag"
            export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$flag"
        else
            echo "tests/run.sh: this jaxlib does not accept $flag: left out"
        fi
    done
    echo "XLA_FLAGS=$XLA_FLAGS"
fi
NOTEBOOK_XLA_FLAGS="${NOTEBOOK_XLA_FLAGS-${XLA_FLAGS:-}}"

if [[ "${JAXSEM_TEST_XLA_CACHE:-1}" != 0 && -z "${JAX_COMPILATION_CACHE_DIR:-}" ]]; then
    export JAX_COMPILATION_CACHE_DIR="$MPI_LOGS/xla-cache"
    export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0.05}"
fi

mpi_pytest() { # mpi_pytest NPROCS [extra pytest args]
    local n="$1" rc=0
    shift
    rm -f "$MPI_LOGS"/rank*
    local runner=()
    # a guard against a rank left waiting in a collective, not a time limit on the tests: well
    # above the -n 2 stage's own time on a 2-core runner
    command -v timeout >/dev/null 2>&1 && runner=(timeout --signal=KILL 1500)
    ${runner[@]+"${runner[@]}"} "$VENV/bin/mpirun" -n "$n" bash -c '
        logs="$1"
        rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
        cmd=("$0" -m pytest tests/mpi -q -p no:cacheprovider "${@:2}")
        [[ "$rank" == 0 ]] && exec "${cmd[@]}"
        "${cmd[@]}" >"$logs/rank$rank.log" 2>&1 || { rc=$?; touch "$logs/rank$rank.failed"; exit $rc; }
    ' "$PY" "$MPI_LOGS" "$@" || rc=$?
    local mark
    for mark in "$MPI_LOGS"/rank*.failed; do
        [[ -e "$mark" ]] || continue
        echo "---- output of $(basename "$mark" .failed) (failed):"
        cat "${mark%.failed}.log"
    done
    return $rc
}

# Serial tests and notebooks on all cores (pytest-xdist; PYTEST_WORKERS=1 for one process):
# most of their time is single-threaded XLA compilation. The serial tests go to the workers a
# module at a time, the costliest modules first (tests/conftest.py orders them): a module's
# fixtures and programs are then made on one worker only.
WORKERS="${PYTEST_WORKERS:-auto}"
# --durations: the slowest tests in every log, to keep the suite's time in view.
run_stage "serial tests" "$PY" -m pytest tests -q --ignore=tests/mpi -n "$WORKERS" --dist loadfile --no-loadscope-reorder \
    --durations=25 "$@"
# Four ranks add what two cannot show: several neighbours per rank, nodes shared by 3-4 ranks,
# multi-round exchanges and uneven partitions of the MPI transport (the gather-scatter, PCG and
# the gradient through the exchange: test_distributed.py) and test_comm_mpi.py's closed forms in
# the world size. The models' distributed equalities run at two ranks: their exchanges are the
# same gather-scatter for every transport, and tests/test_shard.py runs them over four devices
# with uneven partitions (DG, p-multigrid, the fused DG path; Navier-Stokes over three:
# tests/test_navier_stokes.py).
FOUR_RANKS="test_comm_mpi or test_distributed"
run_stage "MPI tests, mpirun -n 2" mpi_pytest 2
run_stage "MPI tests, mpirun -n 4" mpi_pytest 4 -k "$FOUR_RANKS"

shopt -s nullglob
notebooks=(notebooks/*.ipynb)
shopt -u nullglob
if ((${#notebooks[@]})); then
    XLA_FLAGS="$NOTEBOOK_XLA_FLAGS" run_stage "notebooks (${#notebooks[@]})" "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" --dist worksteal --nbmake notebooks/
else
    header "notebooks"
    echo "no notebooks/*.ipynb: skipped"
fi

header "summary"
if ((${#FAILED[@]})); then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "all stages passed"
