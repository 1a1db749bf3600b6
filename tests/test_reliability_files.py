"""Files that cannot be lost or hijacked, and runs that stop cleanly: each class of failure tried.

* concurrent writers of one checkpoint path (threads, processes);
* a writer that fails or is killed mid-write (an exception, a full disk, SIGKILL);
* a symlink where a checkpoint or an output file goes;
* a checkpoint whose step, time or arrays are out of range, named in the refusal;
* resumes in pieces, bit-identical to one run (ODE driver and Navier–Stokes);
* ``jaxsem solve tgv`` stopped by SIGTERM or SIGINT: one line, JSON, exit 128 + signal.
"""

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import io
from jaxsem.io import load_checkpoint, save_checkpoint
from jaxsem.solvers import driver
from jaxsem.solvers import timestepping as ts
from jaxsem.solvers.stops import RunInterrupted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A = jnp.array([[-0.1, 2.0], [-2.0, -0.1]])
Y0 = jnp.array([1.0, 0.0])


def f_lin(t, y):
    return A @ y + jnp.array([jnp.sin(t), 0.0])


def _only(folder, *names):
    """Assert ``folder`` holds exactly ``names`` (no temporary file beside them)."""
    assert sorted(os.listdir(folder)) == sorted(names), os.listdir(folder)


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)


# ----------------------------------------------------------------------------- concurrent writers


def test_threads_saving_one_checkpoint_path_leave_one_whole_file(tmp_path):
    """Four writers, 12 saves each, interleaved on one path: none fails, the file is one writer's
    whole state (all its values, its step), no temporary file remains."""
    path = tmp_path / "ck.npz"
    errors = []

    def writer(k):
        y = np.full(200_000, float(k))
        try:
            for i in range(12):
                save_checkpoint(path, {"y": y}, 0.1 * i, 100 * k + i, writer=k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ck = load_checkpoint(path, {"y": np.zeros(200_000)})
    k = ck.meta["writer"]
    assert ck.step == 100 * k + 11 and np.all(ck.fields["y"] == k)
    _only(tmp_path, "ck.npz")


def test_processes_saving_one_checkpoint_path_leave_one_whole_file(tmp_path):
    """Two processes writing the same --checkpoint path 40 times each both finish (a fixed temporary
    name made one's rename fail) and leave a loadable file."""
    path = tmp_path / "ck.npz"
    code = textwrap.dedent(f"""
        import sys, numpy as np
        from jaxsem.io import save_checkpoint
        k = int(sys.argv[1])
        for i in range(40):
            save_checkpoint({str(path)!r}, {{"y": np.full(100_000, float(k))}}, 0.0, 100 * k + i, writer=k)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], env=_env(), stderr=subprocess.PIPE, text=True)
             for k in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    ck = load_checkpoint(path, {"y": np.zeros(100_000)})
    k = ck.meta["writer"]
    assert ck.step == 100 * k + 39 and np.all(ck.fields["y"] == k)
    _only(tmp_path, "ck.npz")


# ----------------------------------------------------------------------------- failed or killed writers


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device"),
                                 MemoryError()])
def test_a_write_that_fails_midway_keeps_the_old_checkpoint(tmp_path, monkeypatch, exc):
    """The second array's write fails after half of it: the previous checkpoint is intact, no temporary file."""
    path = tmp_path / "ck.npz"
    save_checkpoint(path, {"a": np.ones(1000), "b": np.ones(10)}, 1.0, 10)
    before = path.read_bytes()
    real = np.lib.format.write_array
    calls = []

    def half_then_fail(fp, array, *a, **k):
        calls.append(1)
        if len(calls) == 4:  # t, step, field a, then field b fails
            fp.write(b"\x93NUMPY partial")
            raise exc
        return real(fp, array, *a, **k)

    monkeypatch.setattr(np.lib.format, "write_array", half_then_fail)
    with pytest.raises(type(exc)):
        save_checkpoint(path, {"a": np.zeros(1000), "b": np.zeros(10)}, 2.0, 20)
    assert path.read_bytes() == before
    _only(tmp_path, "ck.npz")


def test_a_full_file_system_keeps_the_old_checkpoint(tmp_path):
    """A real short write: the process may not write past 64 kB (RLIMIT_FSIZE, what a full quota does)."""
    path = tmp_path / "ck.npz"
    save_checkpoint(path, {"y": np.ones(100)}, 1.0, 1)
    before = path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError) as err:
            save_checkpoint(path, {"y": np.zeros(1_000_000)}, 2.0, 2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert err.value.errno == errno.EFBIG
    assert path.read_bytes() == before
    _only(tmp_path, "ck.npz")


def test_a_writer_killed_mid_write_leaves_the_last_whole_checkpoint(tmp_path):
    """SIGKILL while a 32 MB checkpoint is being written: the file on disk is the last whole one; the
    killed writer's temporary file is removed by the next save of that path."""
    path = tmp_path / "ck.npz"
    code = textwrap.dedent(f"""
        import numpy as np
        from jaxsem.io import save_checkpoint
        y = np.arange(4_000_000, dtype=np.float64)
        for i in range(10_000):
            save_checkpoint({str(path)!r}, {{"y": y + i}}, float(i), i)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None:  # a whole file, then the next one half written
            names = os.listdir(tmp_path)
            if "ck.npz" in names and any(n.endswith(".tmp") and os.path.getsize(tmp_path / n) > 1 << 20
                                         for n in names if n.startswith(".ck.npz.")):
                break
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == -signal.SIGKILL
    stale = [n for n in os.listdir(tmp_path) if n != "ck.npz"]
    assert len(stale) == 1 and stale[0].startswith(".ck.npz.")  # killed mid-write indeed
    ck = load_checkpoint(path, {"y": np.zeros(4_000_000)})
    assert np.array_equal(ck.fields["y"], np.arange(4_000_000) + ck.step) and ck.t == ck.step
    save_checkpoint(path, ck.fields, ck.t, ck.step)
    _only(tmp_path, "ck.npz")


# ----------------------------------------------------------------------------- symlinks


@pytest.mark.parametrize("target", ["file", "dangling", "folder"])
def test_checkpoint_and_outputs_refuse_a_symlink_destination(tmp_path, target):
    """A symlink planted where the checkpoint, the CSV or the plot goes: refused naming the path; its
    target is neither written nor replaced, and the link stays."""
    from jaxsem.app import tgv
    from jaxsem.models import navier_stokes as NS

    victim = {"file": tmp_path / "victim.txt", "dangling": tmp_path / "absent", "folder": tmp_path / "dir"}[target]
    if target == "file":
        victim.write_text("keep")
    if target == "folder":
        victim.mkdir()
    series = NS.Series(*[np.linspace(0.0, 1.0, 3)] * len(NS.Series._fields))
    writers = [
        ("ck.npz", r"checkpoint '.*ck\.npz' is a symbolic link", lambda p: save_checkpoint(p, {"y": Y0}, 0.0, 0)),
        ("tgv.csv", r"output file '.*tgv\.csv' is a symbolic link", lambda p: tgv._write_csv(str(p), series, 1e-3)),
        ("tgv.png", r"output file '.*tgv\.png' is a symbolic link", lambda p: tgv.plot(series, 1e-3, str(p))),
        ("u.vtu", r"output path '.*u\.vtu' is a symbolic link", lambda p: io.check_writable(p)),
    ]
    for name, msg, write in writers:
        link = tmp_path / name
        link.symlink_to(victim)
        with pytest.raises(ValueError, match=msg):
            write(link)
        assert os.readlink(link) == str(victim)
    assert (victim.read_text() == "keep") if target == "file" else True
    assert not victim.exists() if target == "dangling" else True
    assert os.listdir(victim) == [] if target == "folder" else True
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_run_refuses_a_symlinked_checkpoint_path(tmp_path):
    """run() with checkpoint_path a symlink: the first save refuses it; the link's target is untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "ck.npz").symlink_to(victim)
    with pytest.raises(ValueError, match="is a symbolic link"):
        driver.run(f_lin, Y0, 0.01, 20, options=driver.RunOptions(chunk_steps=5, checkpoint_path=tmp_path / "ck.npz"))
    assert victim.read_bytes() == b"precious"


# ----------------------------------------------------------------------------- out-of-range checkpoints


@pytest.mark.parametrize("field,value,msg", [
    ("step", np.int64(-1), r"step must be an integer in 0\.\.40 \(this run has 40 steps\), got -1"),
    ("step", np.int64(-(2**62)), r"step must be an integer in 0\.\.40 .*got -4611686018427387904"),
    ("step", np.int64(41), r"step must be an integer in 0\.\.40 .*got 41"),
    ("step", np.int64(2**62), r"got 4611686018427387904"),
    ("step", np.float64(20.0), r"step must be an integer, got an array of shape \(\) and dtype float64"),
    ("step", np.bool_(True), r"step must be an integer, got .*dtype bool"),
    ("t", np.float64(np.nan), r"t must be a finite number, got nan"),
    ("t", np.float64(np.inf), r"t must be a finite number, got inf"),
    ("t", np.array([0.2, 0.3]), r"t must be a finite number, got an array of shape \(2,\)"),
    ("field.z", np.zeros(2), r"holds the fields \['y', 'z'\], this run's state has \['y'\]"),
    ("field.y", np.zeros((2, 1)), r"field 'y' has shape \(2, 1\) and dtype float64, this run's has shape \(2,\)"),
    ("field.y", np.zeros(2, np.complex128), r"dtype complex128, this run's has shape \(2,\) and dtype float64"),
])
def test_out_of_range_checkpoints_are_refused_naming_the_file_before_any_step(tmp_path, field, value, msg):
    """A checkpoint edited or damaged out of range: the resume refuses it, naming the file, the field, the
    value and what is allowed, before a step is taken (a negative step used to resume silently)."""
    good = tmp_path / "good.npz"
    driver.run(f_lin, Y0, 0.01, 20, options=driver.RunOptions(chunk_steps=20, checkpoint_path=good))
    with np.load(good) as z:
        fields = dict(z)
    bad = tmp_path / "edited.npz"
    np.savez(bad, **dict(fields, **{field: value}))
    calls = []
    adv = ts.advance_fn(f_lin, "lserk4", with_args=False)
    advance = lambda y, a, m0, n: calls.append(int(m0)) or adv(y, a, jnp.asarray(0.0), jnp.asarray(0.01), m0, n)
    with pytest.raises(ValueError, match=msg) as exc:
        driver.drive(advance, Y0, 40, dt=0.01, t0=0.0, label="lserk4", options=driver.RunOptions(resume=bad))
    assert f"checkpoint {str(bad)!r}" in str(exc.value) and calls == []


# ----------------------------------------------------------------------------- resumes in pieces


def test_resume_loops_are_bit_identical(tmp_path):
    """300 steps in one run == the same steps in pieces ending at 37, 38, 150 and 300 (chunks of 16),
    each piece resuming from the previous piece's checkpoint; a resume at the end takes no step."""
    path = tmp_path / "ck.npz"
    opts = driver.RunOptions(chunk_steps=16, meta={"case": "loop"})
    y_full, _ = driver.run(f_lin, Y0, 0.01, 300, options=opts)
    y, resume, prev = Y0, None, None
    for end in (37, 38, 150, 300):
        y, info = driver.run(f_lin, Y0, 0.01, end, options=driver.RunOptions(chunk_steps=16, meta={"case": "loop"},
                                                                     checkpoint_path=path, resume=resume))
        assert info.step == end and info.resumed_from == prev
        resume, prev = path, end
    assert np.array_equal(np.asarray(y), np.asarray(y_full))
    y_again, info = driver.run(f_lin, Y0, 0.01, 300, options=driver.RunOptions(chunk_steps=16, meta={"case": "loop"},
                                                                       resume=path))
    assert info.steps == 0 and np.array_equal(np.asarray(y_again), np.asarray(y_full))
    _only(tmp_path, "ck.npz")


_SIGTERM_RUN = textwrap.dedent("""
    import json, os, signal, sys, threading
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jaxsem.io import load_checkpoint, save_checkpoint
    from jaxsem.mesh.box import box_mesh
    from jaxsem.models import flows
    from jaxsem.models import navier_stokes as NS
    from jaxsem.solvers import driver
    from jaxsem.solvers.stops import RunInterrupted

    path = sys.argv[1]
    mesh = box_mesh((2, 1, 1), 2, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=0.05)
    st0 = NS.initial_state(ns, flows.taylor_green().velocity)
    st_full, s_full, _ = NS.run(ns, st0, 1.5, sample_interval=0.05)
    sent = []

    def save_then_signal(*a, **k):
        save_checkpoint(*a, **k)
        if not sent:
            sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
            sender.start()
            sender.join()
            sent.append(True)

    driver.save_checkpoint = save_then_signal
    try:
        NS.run(ns, st0, 1.5, sample_interval=0.05, options=driver.RunOptions(checkpoint_path=path))
        out = dict(interrupted=None)
    except RunInterrupted as e:
        out = dict(interrupted=str(e), step=e.step, signal=int(e.signal))
    driver.save_checkpoint = save_checkpoint
    out["saved_step"] = load_checkpoint(path).step
    st, s, info = NS.run(ns, st0, 1.5, sample_interval=0.05, options=driver.RunOptions(resume=path))
    out.update(resumed_from=info.resumed_from, steps=info.steps,
               same_u=bool(np.array_equal(np.asarray(st.u), np.asarray(st_full.u))),
               same_series=all(bool(np.array_equal(a, b, equal_nan=True)) for a, b in zip(s, s_full)))
    print("RESULT " + json.dumps(out))
""")


def test_navier_stokes_stopped_by_sigterm_resumes_bit_identically(tmp_path):
    """A Navier–Stokes run sent SIGTERM from another thread (right after its first checkpoint;
    the sending thread is joined before the run goes on) stops after a whole sample with its
    checkpoint; resumed, it ends with the uninterrupted run's state and series, bit for bit. In
    its own process: the signal is the process's, not a test runner's worker's."""
    r = subprocess.run([sys.executable, "-c", _SIGTERM_RUN, str(tmp_path / "ck.npz")], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert out["interrupted"] is not None and "interrupted by SIGTERM at step" in out["interrupted"], out
    step = out["step"]
    assert out["signal"] == signal.SIGTERM and 1 <= out["saved_step"] == step < 30
    assert out["resumed_from"] == step and out["steps"] == 30 - step
    assert out["same_u"] and out["same_series"], out


# ----------------------------------------------------------------------------- the CLI stopped by a signal


def _tgv(tmp_path, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "jaxsem", "solve", "tgv", "--order", "2", "--elements", "2", "1", "1",
         "--t-final", "50", "--dt", "0.05", "--sample", "0.05", "--json", "-q", *extra],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _term_once_written(p, path, settle=0.0):
    """SIGTERM to the process ``p`` once ``path`` exists (and ``settle`` seconds later): its output."""
    try:
        deadline = time.time() + 120
        while not path.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(settle)
        p.send_signal(signal.SIGTERM)
        return p.communicate(timeout=120)
    finally:
        p.kill()


@pytest.mark.parametrize("every", [[], ["--checkpoint-every", "1.5"]], ids=["every_sample", "every_30_samples"])
def test_cli_sigterm_during_the_steps_keeps_the_checkpoint_and_says_where(tmp_path, every):
    """SIGTERM once the first checkpoint exists: exit 143, one line on stderr (no traceback), one JSON
    object on stdout with status, step and t, and the checkpoint on disk at that step (written at the
    stop also where the interval had not come round)."""
    path = tmp_path / "ck.npz"
    p = _tgv(tmp_path, "--checkpoint", str(path), *every)
    out, err = _term_once_written(p, path)
    assert p.returncode == 143, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("jaxsem: interrupted by SIGTERM at step ")
    lines = out.splitlines()
    assert len(lines) == 1, out
    r = json.loads(lines[0])
    assert (r["status"], r["signal"], r["checkpoint"], r["problem"]) == ("interrupted", "SIGTERM", str(path), "tgv")
    saved = load_checkpoint(path).step
    assert r["step"] == saved >= 1 and r["t"] == pytest.approx(0.05 * saved)
    assert f"--resume {path}" in r["message"]
    _only(tmp_path, "ck.npz")


def test_cli_channel_sigterm_names_its_checkpoint_and_the_steps_of_the_run(tmp_path):
    """The channel checkpoints at the end of each sample, its own way: SIGTERM after the first
    one reports the run's step count (not the current sample's), the file, and the step and time
    of the state it holds; --resume is offered."""
    path = tmp_path / "ck.npz"
    p = subprocess.Popen(
        [sys.executable, "-m", "jaxsem", "solve", "channel", "--order", "2", "--elements", "2", "2", "2",
         "--reynolds-bulk", "400", "--t-final", "200", "--average-from", "100", "--sample", "0.25",
         "--checkpoint", str(path), "--json", "-q"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _term_once_written(p, path, settle=0.5)
    assert p.returncode == 143, err
    r = json.loads(out)
    ck = load_checkpoint(path)
    assert (r["status"], r["checkpoint"], r["problem"]) == ("interrupted", str(path), "channel")
    assert ck.step >= 1 and r["step"] >= ck.step and r["t"] >= ck.t
    assert f"checkpoint {path} holds the state of step {ck.step} (t = {ck.t:.6g})" in r["message"], r["message"]
    assert f"--resume {path}" in r["message"]


@pytest.mark.parametrize("when", ["after_save", "before_steps"])
def test_channel_stop_between_samples_names_the_run_step(when, tmp_path, capsys, monkeypatch):
    """A SIGTERM that lands between the channel's samples (while it writes a sample's checkpoint,
    or while the next sample compiles) still reports the run's step and time and the file's
    state, never "outside the time steps"; after the write the file holds the state reported."""
    from jaxsem.app import cli
    from jaxsem.models import navier_stokes as NS

    path = tmp_path / "ck.npz"
    if when == "after_save":
        real = io.save_checkpoint

        def save_then_stop(*a, **k):
            real(*a, **k)
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: still in the sample's block

        monkeypatch.setattr(io, "save_checkpoint", save_then_stop)
    else:
        real, calls = NS.run, []

        def stop_before_second(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the CLI's handler raises here, before any step
            return real(*a, **k)

        monkeypatch.setattr(NS, "run", stop_before_second)
    code = cli.main(["solve", "channel", "--order", "2", "--elements", "2", "2", "2", "--reynolds-bulk", "400",
                     "--t-final", "1", "--average-from", "0.5", "--sample", "0.25", "--dt", "0.05",
                     "--checkpoint", str(path), "--json", "-q"])
    r = json.loads(capsys.readouterr().out)
    assert code == 143 and r["status"] == "interrupted", r
    ck = load_checkpoint(path)
    assert (ck.step, ck.t) == (5, pytest.approx(0.25))
    assert r["step"] == 5 and r["t"] == pytest.approx(0.25)
    assert f"checkpoint {path} holds the state of step 5 (t = 0.25)" in r["message"], r["message"]
    assert f"--resume {path}" in r["message"]


def test_cli_sigint_during_set_up_exits_130_with_json(tmp_path):
    """Ctrl-C before the steps (set-up, compilation): exit 130, one line on stderr, JSON with status
    interrupted and no step."""
    p = subprocess.Popen(
        [sys.executable, "-m", "jaxsem", "solve", "tgv", "--order", "2", "--elements", "2", "1", "1",
         "--t-final", "50", "--dt", "0.05", "--sample", "0.05", "--json"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the first progress line comes after the imports and the mesh, before the flow's set-up
        # (discretization, p-multigrid) and the compilation: interrupt there, whatever their speed
        first = p.stderr.readline()
        assert "Taylor-Green" in first, first
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    last = err.splitlines()[-1]
    assert "Traceback" not in err and "SIGINT" in last, err
    r = json.loads(out)
    assert (r["status"], r["signal"], r["step"], r["t"]) == ("interrupted", "SIGINT", None, None)
