"""The same program over several processes: multi-controller JAX equals serial.

Runs tests/distributed_check.py under ``mpirun -n 2`` (2 processes × 2 forced CPU
devices, one global 4-device mesh, gloo collectives): BP5 and BP4 solves, their
error norms, a gradient through a solve, advection steps and a
Maxwell right-hand side equal the serial ones to 1e-12 (1e-11 for the gradient),
with equal iteration counts. Skipped where no ``mpirun`` or mpi4py is installed.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import subproc

CHECK = Path(__file__).with_name("distributed_check.py")
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def launch_env():
    """CPU JAX in an environment without this process's own MPI launcher variables (when pytest
    itself runs under mpirun, the inner mpirun must not take them for its own)."""
    return subproc.env(base={k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "MV2_"))})


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_two_processes_equal_serial():
    pytest.importorskip("mpi4py")
    rc, res, text = subproc.finish(subproc.start([CHECK], launcher=[MPIRUN, "-n", "2"], base_env=launch_env()))
    assert res is not None, f"no RESULT (exit {rc}):\n{text[-4000:]}"
    assert res["failed"] == [] and rc == 0, res
    assert res["devices"] == [4, 2]
    for name in ("bp5", "bp4"):
        assert res[f"{name}_err"] < 1e-12 and res[f"{name}_errors_err"] < 1e-10
        it_d, it_s = res[f"{name}_iterations"]
        assert it_d == it_s > 0
    assert res["grad_f_err"] < 1e-11
    assert res["advection_err"] < 1e-12 and res["maxwell_rhs_err"] < 1e-12


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_cli_transport_shard_two_processes():
    """`mpirun -n 2 jaxsem solve poisson --transport shard`: one JSON from process 0, the serial numbers."""
    pytest.importorskip("mpi4py")
    env = launch_env()
    args = ["solve", "poisson", "--order", "3", "--elements", "4", "2", "2", "--json", "-q"]
    proc = subprocess.run([MPIRUN, "-n", "2", sys.executable, "-m", "jaxsem"] + args + ["--transport", "shard"],
                          env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout
    r = json.loads(lines[0])
    ref = json.loads(subprocess.run([sys.executable, "-m", "jaxsem"] + args, env=env, text=True,
                                    capture_output=True, timeout=300).stdout)
    assert (r["transport"], r["devices"], r["ranks"]) == ("shard", 2, 2)
    assert r["iterations"] == ref["iterations"] and r["error_l2"] == pytest.approx(ref["error_l2"], rel=1e-10)
