"""docs/api.md is what the docstrings give (python docs/make_api.py rewrites it)."""

import importlib.util
import pathlib

MAKE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "make_api.py"


def test_api_reference_is_current():
    spec = importlib.util.spec_from_file_location("make_api", MAKE)
    make_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_api)
    assert make_api.main(["--check"]) == 0, "docs/api.md is out of date: run python docs/make_api.py"
    text = make_api.OUT.read_text(encoding="utf-8")
    for entry in ("### `setup(mesh", "### `solve(sem", "### `simulate(ns", "### `run(ns", "### `linear_solve("):
        assert entry in text, entry
