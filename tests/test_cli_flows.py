"""``jaxsem solve kovasznay``, ``jaxsem solve cylinder`` and ``jaxsem solve rbc``: JSON records,
convergence in p against the exact Kovasznay flow, the DFG cylinder's outputs, the onset of
Rayleigh–Bénard convection, arguments refused before any work."""

import contextlib
import csv
import importlib.util
import io
import json
import math

import numpy as np
import pytest

from jaxsem.app import cli
from jaxsem.app.cylinder import shedding

KOVASZNAY = ["solve", "kovasznay", "--elements", "3", "4", "1", "--t-final", "2.0", "--json", "-q"]


def _json(capsys):
    out, _ = capsys.readouterr()
    assert out.count("\n") == 1 and out.endswith("\n")
    return json.loads(out)


@pytest.fixture(scope="module")
def kovasznay_runs():
    """The records of p = 4 and p = 6 (exact traction) and p = 6 (zero traction, no steady-state
    stop: the record and its report without a steady tolerance), to t = 2."""
    out = {}
    for key, extra in (("p4", ["--order", "4"]), ("p6", ["--order", "6"]),
                       ("p6_zero", ["--order", "6", "--outflow", "zero", "--steady-tol", "0"])):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):  # a module fixture has no capsys
            assert cli.main(KOVASZNAY + extra) == 0
        out[key] = json.loads(buf.getvalue())
    return out


@pytest.mark.slow
def test_kovasznay_error_falls_with_order(kovasznay_runs):
    """Velocity data on three sides, the exact traction (pressure and ν∂u/∂n) on the outflow: the
    error of the (nearly) steady state falls spectrally, p = 4 → 6 by more than 50× (measured
    1.6e-3 → 1.5e-5 for the velocity, 3x4x1 elements, the default CFL 0.4)."""
    p4, p6 = kovasznay_runs["p4"], kovasznay_runs["p6"]
    for r in (p4, p6):
        assert r["problem"] == "kovasznay" and r["converged"] is True and r["status"] == "t_final"
        assert r["t"] == pytest.approx(2.0) and r["steps"] == round(2.0 / r["dt"])
        assert r["elements"] == [3, 4, 1] and r["outflow"] == "traction" and r["dofs"] > 0
        assert r["seconds_per_step"] > 0 and r["setup_seconds"] > 0 and r["divergence"] < 1e-2
        assert 0 < r["change"] < 1e-2 and 0 < r["cfl"] <= 0.4 + 1e-9
    assert p4["error_l2_velocity"] < 3e-3 and p6["error_l2_velocity"] < 3e-5 and p6["error_l2_pressure"] < 1e-4
    assert p4["error_l2_velocity"] > 50 * p6["error_l2_velocity"]
    assert p4["error_l2_pressure"] > 50 * p6["error_l2_pressure"]
    assert p6["divergence"] < 5e-5


@pytest.mark.slow
def test_kovasznay_zero_traction_is_the_larger_error(kovasznay_runs):
    """Zero traction is not the exact flow's outflow condition: its error is the condition's."""
    exact, zero = kovasznay_runs["p6"], kovasznay_runs["p6_zero"]
    assert zero["outflow"] == "zero" and zero["converged"] is True and zero["steady_tol"] is None
    assert zero["error_l2_velocity"] > 10 * exact["error_l2_velocity"]
    assert zero["error_l2_pressure"] > 10 * exact["error_l2_pressure"]


@pytest.mark.slow
def test_cylinder_2d1_short_run_and_files(capsys, tmp_path):
    argv = ["solve", "cylinder", "--case", "2D-1", "--order", "3", "--level", "0", "--t-final", "0.2",
            "--out", str(tmp_path), "--json", "-q"]
    assert cli.main(argv) == 0
    r = _json(capsys)
    assert r["problem"] == "cylinder" and r["case"] == "2D-1" and r["converged"] is True
    assert r["status"] == "t_final" and r["steps"] == round(0.2 / r["dt"]) and r["elements"] == 176
    assert math.isfinite(r["drag_coefficient"]) and r["drag_coefficient"] > 0
    assert math.isfinite(r["lift_coefficient"]) and r["delta_p"] > 0
    assert r["reference"] == {"c_D": [5.57, 5.59], "c_L": [0.0104, 0.011], "dp": [0.1172, 0.1176]}
    names = {"drag_coefficient", "lift_coefficient", "delta_p"}
    assert set(r["within_reference"]) == set(r["reference_deviation"]) == names
    assert r["seconds_per_step"] > 0 and r["setup_seconds"] > 0 and r["dofs"] > 0
    with open(tmp_path / "cylinder.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0][:4] == ["time", "drag_coefficient", "lift_coefficient", "delta_p"] and len(rows) == 1 + 3
    assert float(rows[-1][1]) == pytest.approx(r["drag_coefficient"], rel=1e-8)
    assert (tmp_path / "cylinder.png").stat().st_size > 0


def test_shedding_of_a_known_signal():
    """St, c_D,max and c_L,max of a sampled sine with a growing onset: the period and the last maxima."""
    D, U, f = 0.1, 1.0, 3.0  # St = D f / U = 0.3
    t = np.arange(0, 4, 0.001)
    onset = 1 - np.exp(-5 * t)  # settled in the last half, where the crossings are taken
    lift = 0.5 + onset * np.sin(2 * np.pi * f * t)
    drag = 3.0 + 0.2 * onset * np.sin(4 * np.pi * f * t + 0.3)
    st, cd_max, cl_max = shedding(t, drag, lift, D, U)
    assert st == pytest.approx(D * f / U, rel=2e-3)
    assert cl_max == pytest.approx(1.5, rel=1e-4) and cd_max == pytest.approx(3.2, rel=1e-4)
    assert shedding(t[:200], drag[:200], lift[:200], D, U) == (None, None, None)  # 0.2 s: no full period


BAD = [
    (["solve", "cylinder", "--case", "4D"], "--case"),
    (["solve", "cylinder", "--level", "7"], "--level"),
    (["solve", "cylinder", "--order", "1"], "--order"),
    (["solve", "cylinder", "--case", "2D-2", "--t-final", "0.015"], "--t-final"),  # 1.5 samples of 0.01
    (["solve", "cylinder", "--dt", "0.03"], "--dt"),  # does not divide the 0.1 sample
    (["solve", "cylinder", "--cfl", "2"], "--cfl"),
    (["solve", "kovasznay", "--order", "1"], "--order"),
    (["solve", "kovasznay", "--outflow", "foo"], "--outflow"),
    (["solve", "kovasznay", "--elements", "3", "4"], "--elements"),
    (["solve", "kovasznay", "--elements", "3", "0", "1"], "--elements"),
    (["solve", "kovasznay", "--reynolds", "-40"], "--reynolds"),
    (["solve", "kovasznay", "--steady-tol", "nan"], "--steady-tol"),
    (["solve", "kovasznay", "--t-final", "2.05"], "--t-final"),
    (["solve", "kovasznay", "--elements", "400", "400", "400"], "--elements"),
    (["solve", "rbc", "--rayleigh", "-1"], "--rayleigh"),
    (["solve", "rbc", "--prandtl", "0"], "--prandtl"),
    (["solve", "rbc", "--amplitude", "nan"], "--amplitude"),
    (["solve", "rbc", "--dt", "0.003"], "--dt"),  # does not divide the 0.1 sample
    (["solve", "rbc", "--t-final", "0.15"], "--t-final"),
    (["solve", "rbc", "--elements", "3", "1"], "--elements"),
    (["solve", "channel", "--average-from", "300"], "--average-from"),
    (["solve", "channel", "--reynolds-bulk", "0"], "--reynolds-bulk"),
    (["solve", "channel", "--lengths", "1", "-1"], "--lengths"),
    (["solve", "channel", "--resume", "/nonexistent/ck.npz"], "--resume"),
    (["solve", "channel", "--relaxation", "-1"], "--relaxation"),
    (["solve", "channel", "--relaxation-modes", "8"], "--relaxation-modes"),
]


def _no_work(monkeypatch):
    def no_jax_work(*a, **k):
        raise AssertionError("validation must happen before any JAX work")

    monkeypatch.setattr("jaxsem.app.kovasznay.run_kovasznay", no_jax_work)
    monkeypatch.setattr("jaxsem.app.cylinder.run_cylinder", no_jax_work)
    monkeypatch.setattr("jaxsem.app.rbc.run_rbc", no_jax_work)
    monkeypatch.setattr("jaxsem.app.channel.run_channel", no_jax_work)


@pytest.mark.parametrize("argv,name", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_refused_by_name(argv, name, capsys, monkeypatch):
    _no_work(monkeypatch)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "error" in err and name in err


def test_cylinder_without_gmsh_is_a_clear_argument_error(capsys, monkeypatch):
    _no_work(monkeypatch)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gmsh" else find_spec(name, *a))
    assert cli.main(["solve", "cylinder", "--order", "3"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "--case" in err and "gmsh" in err and "pip install" in err


@pytest.mark.slow
def test_rayleigh_benard_onset(capsys):
    """Rigid walls, one critical wavelength (k = 3.117) wide, Pr = 1, p = 5 on 3x1x3 elements: the
    roll decays at Ra = 1650 and grows at 1770 (measured σ = −0.4430 and +0.4701 in thermal-diffusion
    units, settled to 1e-4 after t = 0.2); the interpolated zero is within 1% of 1707.76 (measured
    1708.2); the Nusselt number stays 1 (conduction) to 1e-4 while the roll is small."""
    sigma = {}
    for ra in (1650.0, 1770.0):
        assert cli.main(["solve", "rbc", "--rayleigh", str(ra), "--t-final", "0.6", "--sample", "0.2", "--json",
                         "-q"]) == 0
        r = _json(capsys)
        assert r["problem"] == "rbc" and r["status"] == "t_final" and r["converged"] is True
        assert r["steps"] == 300 and r["time"] == pytest.approx([0.0, 0.2, 0.4, 0.6])
        assert r["growth_rate_series"][0] is None and r["nusselt_series"][0] is None
        assert abs(r["growth_rate_series"][-1] - r["growth_rate_series"][-2]) < 1e-3
        assert all(abs(v - 1) < 1e-4 for v in r["nusselt_series"][1:])
        sigma[ra] = r["growth_rate"]
    assert sigma[1650.0] < 0 < sigma[1770.0], sigma
    ra_c = 1650.0 + 120.0 * (-sigma[1650.0]) / (sigma[1770.0] - sigma[1650.0])
    assert abs(ra_c - 1707.76) < 0.01 * 1707.76, ra_c


CHANNEL = ["solve", "channel", "--order", "3", "--elements", "2", "2", "2", "--reynolds-bulk", "400",
           "--sample", "0.25", "--average-from", "0.5", "--json", "-q"]


@pytest.mark.slow
def test_channel_record_and_a_resumed_run_equal_one_run(capsys, tmp_path):
    """A tiny laminar channel (Re_b 400): the bulk velocity held at 1, averages from t = 0.5,
    Re_tau from the wall shear agrees with the one from the mean pressure gradient (the momentum
    balance, to 1%), profiles in wall units, files; stopped at t = 0.5 and resumed from its
    checkpoint, the run ends with the same record as one run to t = 1 (bit for bit)."""
    ck = str(tmp_path / "ch.npz")
    assert cli.main(CHANNEL + ["--t-final", "1.0", "--out", str(tmp_path / "out")]) == 0
    one = _json(capsys)
    assert one["status"] == "t_final" and one["samples_averaged"] == 2 and one["u_bulk"] == pytest.approx(1.0, abs=1e-12)
    c = one["comparison"]
    assert c["re_tau"] == pytest.approx(c["re_tau_from_gradient"], rel=1e-2)
    p = one["profiles"]
    assert p["y_plus"][0] == 0.0 and p["u_plus"][0] == pytest.approx(0.0, abs=1e-12) and np.all(np.diff(p["y_plus"]) > 0)
    with open(tmp_path / "out" / "channel.csv") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][:2] == ["y_plus", "u_plus"] and len(rows) == len(p["y_plus"]) + 1
    assert cli.main(CHANNEL + ["--t-final", "0.5", "--checkpoint", ck]) == 0
    half = _json(capsys)
    assert half["re_tau"] is None and half["samples_averaged"] == 0
    assert cli.main(CHANNEL + ["--t-final", "1.0", "--resume", ck]) == 0
    resumed = _json(capsys)
    assert resumed["re_tau"] == one["re_tau"] and resumed["profiles"] == one["profiles"]
    assert resumed["series"] == one["series"]


def test_cut_dt_brings_the_cfl_number_to_its_target_and_divides_the_sample():
    """dt = 0.1 reached CFL 1.0 against a target of 0.4 over samples of 0.5: 0.5/13 (CFL 0.385);
    a low CFL number lengthens the step at most twofold, always to a divisor of the sample."""
    from jaxsem.app.channel import cut_dt

    assert cut_dt(0.1, 1.0, 0.4, 0.5) == 0.5 / 13
    assert cut_dt(0.05, 0.4, 0.4, 0.5) == 0.05  # at the target: unchanged
    assert cut_dt(0.5 / 3, 0.1, 0.4, 0.5) == 0.5 / 2  # lengthened to CFL 0.4 would be 0.5/1: at most 2x
    assert cut_dt(0.05, 0.1, 0.4, 0.5) == 0.1  # 4x allowed by the CFL number, 2x taken
    for dt, c in ((0.1, 0.9), (0.02, 3.3), (0.125, 0.51), (0.01, 0.05), (0.5 / 7, 0.15)):
        new = cut_dt(dt, c, 0.4, 0.5)
        assert c * new / dt <= 0.4 + 1e-12 and new <= 2 * dt + 1e-15 and abs(0.5 / new - round(0.5 / new)) < 1e-9


@pytest.mark.slow
def test_channel_with_cut_steps_resumes_as_one_run(capsys, tmp_path, monkeypatch):
    """Every sample cuts the step (forced: CUT = 0 and halving): the history restarts at first
    order each time, the bulk velocity stays held, and a run stopped and resumed from its
    checkpoint (which carries the current step) ends with the record of one run, bit for bit."""
    import jaxsem.app.channel as ch

    monkeypatch.setattr(ch, "CUT", 0.0)
    monkeypatch.setattr(ch, "cut_dt", lambda dt, c, target, sample: dt / 2)
    args = CHANNEL + ["--average-from", "0.25", "--relaxation", "2"]
    assert cli.main(args + ["--t-final", "0.75"]) == 0
    one = _json(capsys)
    assert one["status"] == "t_final" and one["dt_changes"] == 2 and one["dt_final"] == one["dt"] / 8
    assert one["series"]["dt"] == [one["dt"], one["dt"] / 2, one["dt"] / 4]
    assert np.allclose(one["series"]["bulk_velocity"], 1.0, rtol=0, atol=1e-12)
    ck = str(tmp_path / "ch.npz")
    assert cli.main(args + ["--t-final", "0.5", "--checkpoint", ck]) == 0
    _json(capsys)
    assert cli.main(args + ["--t-final", "0.75", "--resume", ck]) == 0
    resumed = _json(capsys)
    assert resumed["series"] == one["series"] and resumed["profiles"] == one["profiles"]
    assert resumed["dt_final"] == one["dt_final"]
