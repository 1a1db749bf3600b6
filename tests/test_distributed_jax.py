"""The same program over several processes: multi-controller JAX equals serial.

Runs tests/distributed_check.py under ``mpirun -n 2`` (2 processes × 2 forced CPU
devices, one global 4-device mesh, gloo collectives): BP5 and BP4 solves, their
error norms, a gradient through a solve, advection steps (overlap schedule) and a
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

CHECK = Path(__file__).with_name("distributed_check.py")
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_two_processes_equal_serial():
    pytest.importorskip("mpi4py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "MV2_"))}
    env.update(JAX_PLATFORMS="cpu")
    proc = subprocess.run([MPIRUN, "-n", "2", sys.executable, str(CHECK)], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    res = json.loads(lines[-1][7:])
    assert res["failed"] == [] and proc.returncode == 0, res
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "MV2_"))}
    env.update(JAX_PLATFORMS="cpu")
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
