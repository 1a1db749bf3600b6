"""The ``jaxsem`` command: JSON contract, exit codes, one-line errors."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxsem.app import cli
from jaxsem.backends.cuda import cuda_available

# BP5, order 4, 2x2x2 elements, deform 0.1, tol 1e-10 (float64 and float32 alike):
# measured relative L2 1.78e-3 and max 8.58e-4; the bounds are 3x that.
SMALL = ["--order", "4", "--elements", "2", "2", "2"]
L2_BOUND = 5.3e-3
MAX_BOUND = 2.6e-3

SOLVE_KEYS = {
    "problem", "order", "elements", "dofs", "iterations", "converged", "error_l2", "error_max",
    "seconds", "dofs_per_second", "device", "ranks", "jax_version",
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _json(capsys):
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and out.endswith("\n")
    return json.loads(out), err


def test_solve_json_in_process(capsys):
    assert cli.main(["solve", "poisson", *SMALL, "--json"]) == 0
    r, err = _json(capsys)
    assert SOLVE_KEYS <= set(r)
    assert r["problem"] == "poisson" and r["bp"] == 5
    assert r["order"] == 4 and r["elements"] == [2, 2, 2]
    assert r["dofs"] == 8 * 4**3 == r["points"]
    assert r["converged"] is True and 0 < r["iterations"] < 1000
    assert r["error_l2"] < L2_BOUND and r["error_max"] < MAX_BOUND
    assert r["ranks"] == 1 and r["seconds"] > 0
    assert r["dofs_per_second"] == pytest.approx(r["dofs"] * r["iterations"] / r["seconds"])
    assert "solving" in err  # progress goes to stderr


def test_solve_float32_and_vector_dofs(capsys):
    assert cli.main(["solve", "poisson", "--bp", "6", "--order", "2", "--elements", "1", "1", "2",
                     "--dtype", "float32", "--json", "-q"]) == 0
    r, err = _json(capsys)
    assert err == ""
    assert r["dtype"] == "float32" and r["tol"] == 1e-5 and r["converged"] is True
    assert r["points"] == 2 * 2**3 and r["dofs"] == 3 * r["points"]  # vector: all 3 components


def test_solve_subprocess_json():
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    p = subprocess.run(
        [sys.executable, "-m", "jaxsem", "solve", "poisson", *SMALL, "--json"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout  # exactly one JSON object, nothing else
    r = json.loads(lines[0])
    assert SOLVE_KEYS <= set(r)
    assert r["dofs"] == 8 * 4**3 and r["elements"] == [2, 2, 2]
    assert r["converged"] is True
    assert r["error_l2"] < L2_BOUND and r["error_max"] < MAX_BOUND
    assert "compiling" in p.stderr and "Traceback" not in p.stderr


def test_nonconvergence_exits_1(capsys):
    assert cli.main(["solve", "poisson", *SMALL, "--maxiter", "3", "--json", "-q"]) == 1
    r, _ = _json(capsys)
    assert r["converged"] is False and r["iterations"] == 3
    assert math.isfinite(r["error_l2"])


def test_no_arguments_runs_default_report(capsys, monkeypatch):
    ns = cli.build_parser().parse_args(["solve", "poisson"])
    assert (ns.problem, ns.bp, ns.order, ns.elements, ns.deform) == ("poisson", 5, 6, [3, 3, 3], 0.1)
    # Run the no-argument path at the small size (the real default takes a few seconds).
    monkeypatch.setitem(cli.DEFAULTS, "order", 4)
    monkeypatch.setitem(cli.DEFAULTS, "elements", (2, 2, 2))
    assert cli.main([]) == 0
    out, _ = capsys.readouterr()
    assert "BP5" in out and "converged" in out and "NOT" not in out
    assert "relative L2" in out and "DOFs/s" in out and "iterations" in out


BAD = [
    (["solve", "poisson", "--order", "0"], "--order"),
    (["solve", "poisson", "--order", "21"], "--order"),
    (["solve", "poisson", "--order", "x"], "--order"),
    (["solve", "poisson", "--elements", "2", "0", "2"], "--elements"),
    (["solve", "poisson", "--elements", "2", "2"], "--elements"),
    (["solve", "heat"], "problem"),
    (["solve", "poisson", "--dtype", "float16"], "--dtype"),
    (["solve", "poisson", "--tol", "-1"], "--tol"),
    (["solve", "poisson", "--tol", "0"], "--tol"),
    (["solve", "poisson", "--tol", "nan"], "--tol"),
    (["solve", "poisson", "--tol", "abc"], "--tol"),
    (["solve", "poisson", "--bp", "7"], "--bp"),
    (["solve", "poisson", "--deform", "0.3"], "--deform"),
    (["solve", "poisson", "--maxiter", "0"], "--maxiter"),
    (["bench", "bp7"], "problem"),
    (["bench", "bk5", "--iterations", "10"], "--iterations"),
    (["bench", "bp5", "--order", "0"], "--order"),
    (["bench", "bp5", "--bandwidth", "-1"], "--bandwidth"),
    (["bench", "bp5", "--dtype", "int32"], "--dtype"),
    (["frobnicate"], "command"),
    (["solve", "poisson", "--bogus"], "--bogus"),
    (["solve", "maxwell", "--backend", "einsum"], "--backend"),
    (["solve", "poisson", "--backend", "fused"], "--backend"),
    (["solve", "poisson", "--elements", "1000"], "--elements"),  # ~1e5 GB: refused before building
    (["solve", "maxwell", "--elements", "800", "--order", "9"], "--elements"),
    (["bench", "bp5", "--elements", "1000"], "--elements"),
    (["solve", "poisson", "--devices", "0"], "--devices"),
    (["solve", "poisson", "--devices", "4096"], "--devices"),
    (["solve", "poisson", "--transport", "shard"], "--transport"),  # applies under mpirun only
    (["solve", "tgv", "--t-final", "-1"], "--t-final"),
    (["solve", "tgv", "--dt", "0.5"], "--dt"),  # longer than the sample interval
    (["solve", "tgv", "--dt", "0.03"], "--sample (0.1)"),  # 3.33 steps per sample
    (["solve", "tgv", "--dt", "0.05", "--t-final", "0.125"], "--t-final (0.125)"),  # 2.5 steps
    (["solve", "tgv", "--reynolds", "0"], "--reynolds"),
    (["solve", "tgv", "--order", "1"], "--order"),
    (["solve", "tgv", "--pressure-tol", "0"], "--pressure-tol"),
    (["solve", "tgv", "--velocity-tol", "1"], "--velocity-tol"),
    (["solve", "tgv", "--pressure-projection", "-1"], "--pressure-projection"),
    (["solve", "tgv", "--pressure-projection", "65"], "--pressure-projection"),
    (["solve", "tgv", "--resume", "/nonexistent/ckpt.npz"], "--resume"),
    (["solve", "tgv", "--elements", "1000"], "--elements"),
    (["solve", "tgv", "--vtu-every", "0.2"], "--vtu-every"),  # needs --vtu
    (["solve", "tgv", "--vtu", "/tmp/x.vtu", "--vtu-every", "0.15"], "--vtu-every"),  # not a multiple of 0.1
    (["solve", "tgv", "--checkpoint-every", "0.2"], "--checkpoint-every"),  # needs --checkpoint
    (["solve", "tgv", "--checkpoint", "/tmp/x.npz", "--checkpoint-every", "0.15"], "--checkpoint-every"),
]
if not cuda_available():  # CPU machines: a clear error before any JAX work
    BAD += [(["solve", "poisson", "--backend", "cuda"], "--backend"), (["bench", "bk5", "--backend", "cuda"], "--backend")]


@pytest.mark.parametrize("argv,name", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_one_line(argv, name, capsys, monkeypatch):
    def no_jax_work(*a, **k):
        raise AssertionError("validation must happen before any JAX work")

    monkeypatch.setattr("jaxsem.app.verify.solve_poisson", no_jax_work)
    monkeypatch.setattr("jaxsem.app.bench.bench", no_jax_work)
    monkeypatch.setattr("jaxsem.app.tgv.run_tgv", no_jax_work)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0] and name in lines[0] and "Traceback" not in err


def test_bench_json(capsys):
    argv = ["bench", "BP5", "--order", "2", "--elements", "1", "1", "2", "--iterations", "3",
            "--repeats", "2", "--bandwidth", "100", "--json", "-q"]
    assert cli.main(argv) == 0
    r, _ = _json(capsys)
    assert {"problem", "order", "elements", "dofs", "iterations", "converged", "seconds",
            "dofs_per_second", "device", "ranks", "jax_version", "percent_of_ceiling"} <= set(r)
    assert r["problem"] == "bp5" and r["dofs"] == 2 * 2**3 and r["iterations"] == 3
    assert r["dofs_per_second"] == pytest.approx(r["dofs"] * 3 / r["seconds"])
    assert r["bandwidth"] == 100e9
    assert r["percent_of_ceiling"] == pytest.approx(100 * r["dofs_per_second"] * r["bytes_per_dof"] / 100e9)


# "auto": the CUDA kernels where they run (a GPU with nvcc), the einsum chain elsewhere
AUTO = "cuda" if cuda_available() else "einsum"


@pytest.mark.parametrize("backend,ran", [("auto", AUTO), ("einsum", "einsum")])
def test_bench_backend_switch(capsys, backend, ran):
    """--backend picks the element kernels; "auto" is the einsum chain on a CPU (the CUDA kernels
    on a GPU) — and both give the same residual history."""
    argv = ["bench", "bp5", "--order", "2", "--elements", "1", "1", "2", "--iterations", "3",
            "--repeats", "1", "--backend", backend, "--json", "-q"]
    assert cli.main(argv) == 0
    r, _ = _json(capsys)
    assert r["backend"] == ran and r["iterations"] == 3
    ref = cli.main(argv[:-4] + ["--backend", "einsum", "--json", "-q"])
    r_ref, _ = _json(capsys)
    assert ref == 0 and r["residual_reduction"] == pytest.approx(r_ref["residual_reduction"], rel=1e-12)


@pytest.mark.parametrize("bp", [3, 5])
def test_solve_backend_switch(capsys, bp):
    """solve --backend: "auto" (the CUDA kernels on a GPU, einsum on a CPU) and "einsum" reach
    the same solution in the same iterations."""
    argv = ["solve", "poisson", "--bp", str(bp), "--order", "2", "--elements", "1", "1", "2", "--json", "-q"]
    assert cli.main(argv) == 0
    auto, _ = _json(capsys)
    assert cli.main(argv + ["--backend", "einsum"]) == 0
    ref, _ = _json(capsys)
    assert auto["backend"] == AUTO and ref["backend"] == "einsum"
    assert ref["iterations"] == auto["iterations"]
    assert ref["error_l2"] == pytest.approx(auto["error_l2"], rel=1e-10)


def test_info_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    r, _ = _json(capsys)
    for key in ("jaxsem_version", "jax_version", "jaxlib_version", "numpy_version", "x64",
                "platform", "device", "num_devices", "ranks", "mpi4jax_available"):
        assert key in r
    assert r["x64"] is True and r["num_devices"] >= 1 and r["ranks"] == 1
    assert isinstance(r["mpi4jax_available"], bool)
    assert cli.main(["info"]) == 0
    out, _ = capsys.readouterr()
    assert "jax" in out and "MPI" in out


def test_solve_precond_pmg_default_and_jacobi(capsys):
    """solve poisson preconditions with p-multigrid by default (JSON: precond, pmg_orders,
    setup_seconds) and reaches the Jacobi solution in far fewer iterations."""
    argv = ["solve", "poisson", "--order", "4", "--elements", "3", "2", "2", "--json", "-q"]
    assert cli.main(argv) == 0
    pmg, _ = _json(capsys)
    assert cli.main(argv + ["--precond", "jacobi"]) == 0
    jac, _ = _json(capsys)
    assert (pmg["precond"], pmg["pmg_orders"], jac["precond"], jac["pmg_orders"]) == ("pmg", [4, 2, 1], "jacobi", None)
    assert pmg["setup_seconds"] > 0 and jac["setup_seconds"] == 0
    assert pmg["converged"] and jac["converged"] and 3 * pmg["iterations"] < jac["iterations"]
    assert pmg["error_l2"] == pytest.approx(jac["error_l2"], rel=1e-6)


def test_solve_tgv_json_contract(capsys, tmp_path):
    """``jaxsem solve tgv ... --json``: one JSON object with the time series sampled every 0.1 and
    at T, E_k(0) ≈ 0.125, the energy decaying; CSV and PNG written."""
    argv = ["solve", "tgv", "--order", "3", "--elements", "2", "--t-final", "0.3", "--dt", "0.05",
            "--out", str(tmp_path), "--vtu", str(tmp_path / "s.vtu"), "--vtu-every", "0.2", "--json"]
    assert cli.main(argv) == 0
    r, _ = _json(capsys)
    assert r["problem"] == "tgv" and r["reynolds"] == 1600 and r["converged"] is True and r["steps"] == 6
    assert r["time"] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    n = len(r["time"])
    assert all(len(r[k]) == n for k in ("kinetic_energy", "dissipation", "enstrophy"))
    # the GLL rule of 2^3 elements at p = 3 integrates 1/2|u|^2 to 0.1285 (exact: 0.125)
    assert r["kinetic_energy"][0] == pytest.approx(0.125, rel=0.05) and r["dissipation"][0] is None
    assert r["enstrophy"][0] == pytest.approx(0.375, rel=0.1)
    assert all(a > b for a, b in zip(r["kinetic_energy"][1:], r["kinetic_energy"][2:]))
    assert r["seconds_per_step"] > 0 and r["dt"] == 0.05
    assert (tmp_path / "tgv.csv").read_text().count("\n") == n + 1 and (tmp_path / "tgv.png").stat().st_size > 0
    # snapshots at 0.2 and at t_final, in two run segments that give the one-run series
    assert r["vtu"] == [str(tmp_path / "s_t0.2.vtu"), str(tmp_path / "s.vtu")]
    assert all(os.path.getsize(p) > 0 for p in r["vtu"])


def test_solve_tgv_tolerances_reach_the_solves(capsys):
    """``--pressure-tol``/``--velocity-tol`` set the solves' tolerances (in the record): at
    NekRS's 1e-4/1e-6 the energy moves by less than 1e-5 relative from the default run's, and it
    does move (the solves stop earlier)."""
    base = ["solve", "tgv", "--order", "3", "--elements", "2", "--t-final", "0.3", "--dt", "0.05", "--json", "-q"]
    assert cli.main(base) == 0
    tight, _ = _json(capsys)
    assert cli.main(base + ["--pressure-tol", "1e-4", "--velocity-tol", "1e-6"]) == 0
    loose, _ = _json(capsys)
    assert (tight["pressure_tol"], tight["velocity_tol"]) == (1e-8, 1e-10)
    assert (loose["pressure_tol"], loose["velocity_tol"]) == (1e-4, 1e-6)
    a, b = np.asarray(tight["kinetic_energy"]), np.asarray(loose["kinetic_energy"])
    assert 0 < np.max(np.abs(a - b) / a) < 1e-5, np.max(np.abs(a - b) / a)


def test_solve_tgv_pressure_cycle_is_float32_by_default(capsys):
    """The default pressure V-cycle is float32 (in the record); the float64 cycle gives the same
    energies to the solves' tolerance, and the two runs differ (the cycle did change)."""
    base = ["solve", "tgv", "--order", "3", "--elements", "2", "--t-final", "0.3", "--dt", "0.05", "--json", "-q"]
    assert cli.main(base) == 0
    f32, _ = _json(capsys)
    assert cli.main(base + ["--pmg-dtype", "float64"]) == 0
    f64, _ = _json(capsys)
    assert (f32["pmg_dtype"], f64["pmg_dtype"]) == ("float32", "float64")
    a, b = np.asarray(f64["kinetic_energy"]), np.asarray(f32["kinetic_energy"])
    assert 0 < np.max(np.abs(a - b) / a) < 1e-8, np.max(np.abs(a - b) / a)


def _refused(argv, capsys, monkeypatch) -> str:
    """The one stderr line of a command refused with exit 2 before any set-up."""
    def no_jax_work(*a, **k):
        raise AssertionError("validation must happen before any JAX work")

    monkeypatch.setattr("jaxsem.app.tgv.run_tgv", no_jax_work)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_tgv_output_paths_are_checked_before_the_run(tmp_path, capsys, monkeypatch):
    """--checkpoint, --vtu and the files of --out: a symlink (dangling or not), a directory or a
    missing folder in their place is refused with exit 2, naming the argument and the path."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "ck.npz").symlink_to(victim)
    (tmp_path / "s.vtu").symlink_to(tmp_path / "nowhere")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tgv.csv").symlink_to(victim)
    tgv = ["solve", "tgv", "--order", "2", "--elements", "1"]
    for argv, want in [
        (["--checkpoint", str(tmp_path / "ck.npz")], r"--checkpoint: checkpoint '.*ck\.npz' is a symbolic link"),
        (["--vtu", str(tmp_path / "s.vtu")], r"--vtu: output path '.*s\.vtu' is a symbolic link"),
        (["--out", str(out)], r"--out: output file '.*tgv\.csv' is a symbolic link"),
        (["--out", str(tmp_path / "no" / "such")], None),  # made at the end: its parent is writable
        (["--out", str(victim / "sub")], r"--out: .*victim' exists and is not a folder|--out: .*not a folder"),
        (["--checkpoint", str(tmp_path)], r"--checkpoint: checkpoint '.*' is a directory"),
        (["--checkpoint", str(tmp_path / "no" / "ck.npz")], r"--checkpoint: .*does not exist"),
    ]:
        if want is None:
            monkeypatch.setattr("jaxsem.app.tgv.run_tgv", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
            assert cli.main(tgv + argv + ["-q"]) == 130  # validation passed; Ctrl-C at the first step
            capsys.readouterr()
            continue
        err = _refused(tgv + argv, capsys, monkeypatch)
        assert re.search(want, err), err
    assert victim.read_text() == "keep" and not (tmp_path / "no").exists()


def test_tgv_resume_and_reference_files_are_checked_before_the_run(tmp_path, capsys, monkeypatch):
    """--resume: a file that is not a checkpoint, or one whose step is negative; $JAXSEM_TGV_REFERENCE:
    a folder, a missing or a malformed file. Each is refused with exit 2 naming the file, not after the run."""
    from jaxsem.io import save_checkpoint

    junk = tmp_path / "junk.npz"
    junk.write_text("not a checkpoint")
    ck = tmp_path / "ck.npz"
    save_checkpoint(ck, {"y": np.zeros(1)}, 0.0, 0)
    with np.load(ck) as z:
        fields = dict(z)
    np.savez(tmp_path / "neg.npz", **dict(fields, step=np.int64(-4)))
    tgv = ["solve", "tgv", "--order", "2", "--elements", "1"]
    err = _refused(tgv + ["--resume", str(junk)], capsys, monkeypatch)
    assert "--resume" in err and "junk.npz" in err and "not a checkpoint" in err
    err = _refused(tgv + ["--resume", str(tmp_path / "neg.npz")], capsys, monkeypatch)
    assert "neg.npz" in err and "step must be an integer >= 0, got -4" in err
    bad = tmp_path / "bad.gdiag"
    bad.write_text("0 0.125 0\n")
    for value, want in [(tmp_path, "Is a directory"), (tmp_path / "none.gdiag", "no TGV reference file"),
                        (bad, "expected 4 columns")]:
        monkeypatch.setenv("JAXSEM_TGV_REFERENCE", str(value))
        err = _refused(tgv, capsys, monkeypatch)
        assert "JAXSEM_TGV_REFERENCE" in err and str(value) in err and want in err, err


def test_help_names_the_default_preconditioner(capsys):
    assert cli.main(["solve", "--help"]) == 0
    assert "p-multigrid by default" in capsys.readouterr().out
    assert cli.main(["solve", "poisson", "--help"]) == 0
    assert "(pmg, default)" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["bench", "--help"]) == 0
    assert "Jacobi-preconditioned PCG iterations" in " ".join(capsys.readouterr().out.split())


def test_a_stop_dropped_inside_a_callback_is_kept_without_a_traceback(capsys):
    """Python drops an exception raised in a garbage-collector callback (XLA's): under the CLI's
    handlers a Ctrl-C landing there prints no "Exception ignored" traceback, and the signal is
    kept for the driver to act on."""
    import signal

    from jaxsem.app import cli as cli_
    from jaxsem.solvers.stops import raise_on_signal, take_pending_signal

    class RaisesOnDelete:
        def __del__(self):
            raise_on_signal(signal.SIGINT)

    with cli_._signals_raise():
        obj = RaisesOnDelete()
        del obj
        assert take_pending_signal() == signal.SIGINT
    assert "Exception ignored" not in capsys.readouterr().err
    with cli_._signals_raise():  # one the command never read is not left for a later run in the process
        obj = RaisesOnDelete()
        del obj
    assert take_pending_signal() == 0
