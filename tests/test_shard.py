"""Discretizations over several devices (discretize(mesh, devices=P): global arrays, shard_map inside) equal serial.

Runs tests/shard_check.py in a subprocess (XLA_FLAGS must be set before jax
is imported) with 4 forced CPU devices, sharded over all four, and checks what
it printed: the sharded gather–scatter (periodic axes, an
uneven partition with random junk on the padding elements) equals the serial
one to 1e-13; BP5 and BP4 (3-vector) PCG solves (tol 1e-12) equal the
serial ones to 1e-12 with equal iteration counts; a fixed 17-iteration BP5 on
an uneven partition ((5, 3, 1) elements) and a solve on a periodic mesh equal
serial (Krylov vectors in assembled storage, and as E-vectors); the bake-off's
fixed-iteration run on assembled vectors split over the devices has the serial residual
history; and jax.grad through a sharded solve w.r.t. the source values at the
quadrature points equals the serial gradient to 1e-11.

Four devices cover what two would: uneven element counts, several neighbours per
device with exchanges of several rounds (checked), and on the mesh periodic in x
and y a pair of devices that shares two faces. Fewer devices run in
`jaxsem solve --devices 2` below, the Navier–Stokes check (three devices) and
tests/test_distributed_jax.py (two processes); `python tests/shard_check.py 2`
runs these checks on two by hand. Each run of them compiles its programs and the
serial references anew: a second device count would double the module's time.

The MPI backend is checked against the same serial results in
tests/mpi/test_distributed.py (same meshes, same tolerances), so equality with
serial here implies equality with the MPI backend to round-off.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import subproc

CHECK = Path(__file__).with_name("shard_check.py")
P = 4  # devices the checks shard over


def run_checks() -> subproc.Finished:
    return subproc.finish(subproc.start([CHECK, P], devices=P))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """shard_check.py's results, computed once per test session.

    Under pytest-xdist the tests of this module may land on different workers, each with its
    own module fixture; the first worker to get here runs the checks and leaves the results in
    the session's shared temporary directory, the others wait for them there.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_checks()
    shared = tmp_path_factory.getbasetemp().parent  # one per session, shared by the workers
    out, lock = shared / "shard_check.json", shared / "shard_check.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another worker runs them
        deadline = time.monotonic() + 1500  # subproc.finish kills a check after 600 s
        while not out.exists():
            assert time.monotonic() < deadline, f"no {out} from the worker that took {lock}"
            time.sleep(0.2)
        return subproc.Finished(*json.loads(out.read_text()))
    res = subproc.Finished(-1, None, "shard_check.py not run")
    try:
        res = run_checks()
        return res
    finally:  # always leave something, so that no worker waits in vain
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(res)))
        tmp.replace(out)


def test_sharded_equals_serial(results):
    rc, res, text = results
    assert res is not None, f"shard_check.py {P} printed no RESULT (exit {rc}):\n{text[-4000:]}"
    assert res["P"] == P and res["failed"] == [], res
    assert rc == 0, text[-4000:]
    for name in ("gs_box", "gs_periodic_x", "gs_periodic_xy", "gs_uneven", "gs_uneven_csr"):
        assert res[f"{name}_err"] < 1e-13 and res[f"{name}_mult_err"] == 0.0, res
        assert res[f"{name}_finite"] and res[f"{name}_dot_err"] < 1e-12, res
    assert len(set(res["gs_uneven_sizes"])) > 1 and sum(res["gs_uneven_sizes"]) == 15
    assert res["gs_uneven_pads_own_nodes"] and res["gs_uneven_csr_pads_own_nodes"], res
    # the CUDA backend's plan sharded: each device sums its own copies by "csr" rows, then exchanges
    assert res["gs_uneven_csr_layout"] == "csr" and res["gs_uneven_csr_grad_err"] < 1e-13, res
    # an adjoint guess handed back its own cotangent returns it again: no growth pass after pass
    assert res["adjoint_guess_growth"] < 1e-10 and res["adjoint_guess_serial_growth"] < 1e-10, res
    assert res["adjoint_guess_grad_err"] < 1e-10, res
    assert res["gs_periodic_xy_rounds"] >= 2 and res["gs_uneven_rounds"] >= 2, res  # several rounds per exchange
    for name in ("bp5", "bp4", "bp5_affine", "bp5_pmg_uneven"):
        assert res[f"{name}_err"] < 1e-12 and res[f"{name}_converged"], res
        it_d, it_s = res[f"{name}_iterations"]
        assert it_d == it_s > 0, res
    for name in ("bp5_uneven_fixed17", "bp5_local_fixed17"):  # assembled and E-vector Krylov vectors
        assert res[f"{name}_iterations"] == [17, 17] and res[f"{name}_err"] < 1e-12, res
    assert res["bp5_storage"] is True and res["bp5_local_fixed17_storage"] is False
    assert res["bp5_pmg_uneven_assembled_cycle"] is True
    assert res["bp5_affine_compact"] is True  # the compact factors of affine elements, on every device
    assert res["bp5_half_affine_stored"] is True  # one rank's elements affine, the others' not: none compact
    assert res["bench_history_err"] < 1e-12 and res["bench_shape_sharded"] != res["bench_shape_serial"], res
    assert res["periodic_loss_err"] < 1e-12
    assert res["grad_f_err"] < 1e-11


def test_sharded_dg_equals_serial(results):
    """DG on the shard backend: 6 LSERK4 advection steps and a
    Maxwell right-hand side on an uneven partition equal serial; dummy elements stay exactly 0."""
    rc, res, text = results
    assert res is not None, text[-4000:]
    assert sum(res["dg_sizes"]) == 12 and len(set(res["dg_sizes"])) > 1, res
    assert res["dg_halo"][0] == P and res["dg_halo"][1] >= 1
    assert res["advection_err"] < 1e-12, res
    assert res["advection_dummies_zero"], res
    assert res["maxwell_rhs_err"] < 1e-12, res


def test_sharded_fused_dg_equals_serial(results):
    """The fused DG path distributed (the kernel reads the neighbours a device has and mirrors,
    or for advection zeroes, the remote ones; their flux is added on the halo elements) equals
    serial: Maxwell's right-hand side for PEC and PMC and its ε-gradient through 3 LSERK4 steps
    (finite on the pad elements too), advection's right-hand side. On CPU the kernel is its
    einsum form."""
    rc, res, text = results
    assert res is not None, text[-4000:]
    for name in ("maxwell_fused_pec", "maxwell_fused_pmc", "maxwell_fused_grad_eps", "advection_fused"):
        assert res[f"{name}_err"] < 1e-12, res
    assert res["maxwell_fused_grad_finite"], res  # pads (ε given as 0 there) included


def test_cli_devices_equals_serial():
    """`jaxsem solve ... --devices 2` (forced CPU devices) reports the serial run's numbers."""
    env = subproc.env(devices=2)
    out = {}
    for problem, extra in (("poisson", []), ("advection", ["--t-final", "0.05"])):
        for devices in ("1", "2"):
            argv = [sys.executable, "-m", "jaxsem", "solve", problem, "--order", "3", "--elements", "3", "2", "2",
                    "--devices", devices, "--json", "-q"] + extra
            proc = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            out[problem, devices] = json.loads(proc.stdout)
    for problem in ("poisson", "advection"):
        one, two = out[problem, "1"], out[problem, "2"]
        assert (one["transport"], one["devices"]) == ("serial", 1)
        assert (two["transport"], two["devices"]) == ("shard", 2)
        assert two["error_l2"] == pytest.approx(one["error_l2"], rel=1e-10)
    assert out["poisson", "2"]["iterations"] == out["poisson", "1"]["iterations"]
    assert out["advection", "2"]["steps"] == out["advection", "1"]["steps"]
