"""experiments/roofline.py end to end on its tiny CPU path: JSON fields, fit, plots."""

import importlib.util
import json
import os

import pytest

from jaxsem.backends.cuda import cuda_available

AUTO = "cuda" if cuda_available() else "einsum"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def roofline():
    spec = importlib.util.spec_from_file_location("roofline", os.path.join(ROOT, "experiments", "roofline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_roofline_tiny_cpu_run(roofline, tmp_path):
    out = str(tmp_path / "rl.json")
    roofline.main(["--problems", "bk1,bp5", "--orders", "2", "--sizes", "300", "--fit-sizes", "100",
                   "--iterations", "3", "--repeats", "1", "--out", out])
    res = json.load(open(out))
    for key in ("device", "device_info", "jax_version", "command", "dtype", "bandwidth_bytes_per_second",
                "sizes", "rows", "skipped", "fits", "bytes_per_dof", "elapsed_seconds"):
        assert key in res, key
    assert res["bandwidth_bytes_per_second"] > 0 and res["dtype"] == "float64"
    rows = [r for r in res["rows"] if "dofs_per_second" in r]
    assert not [r for r in res["rows"] if "error" in r]
    assert {(r["problem"], r["backend_requested"]) for r in rows} == {
        (p, i) for p in ("bk1", "bp5") for i in ("einsum", "auto")}
    for r in rows:
        assert r["backend"] == ("einsum" if r["backend_requested"] == "einsum" else AUTO)
        assert r["percent_of_ceiling"] > 0 and r["ceiling_dofs_per_second"] > 0
        assert r["bytes_per_dof"] == pytest.approx(res["bytes_per_dof"][r["problem"]][str(r["order"])])
    fit = res["fits"]["bp5_einsum_p2"]
    assert fit is None or fit["n08"] == pytest.approx(4 * fit["t0"] * fit["R_inf"])
    assert os.path.exists(str(tmp_path / "rl_order.png")) and os.path.exists(str(tmp_path / "rl_size.png"))


def test_fit_n08_and_budget(roofline, tmp_path):
    rows = [dict(points=n, seconds_per_iteration=1e-4 + n / 1e9) for n in (1e4, 1e5, 1e6)]
    f = roofline.fit_n08(rows)
    assert f["t0"] == pytest.approx(1e-4) and f["R_inf"] == pytest.approx(1e9)
    assert f["n08"] == pytest.approx(4e5)
    assert roofline.fit_n08(rows[:1]) is None
    out = str(tmp_path / "b.json")
    roofline.main(["--problems", "bk5", "--sizes", "100", "--backends", "einsum", "--budget-seconds", "0",
                   "--no-plot", "--out", out])
    res = json.load(open(out))
    assert res["rows"] == [] and len(res["skipped"]) == 1
