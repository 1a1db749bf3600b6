"""Write docs/api.md, the API reference, from the docstrings of jaxsem's public modules.

    python docs/make_api.py            # rewrites docs/api.md
    python docs/make_api.py --check    # exit 1 if docs/api.md is not what the docstrings give

Each module's ``__all__`` is listed in order with its signature and docstring, as written.
tests/test_api_doc.py runs the check, so the reference cannot fall behind the code.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import re
import sys

MODULES = [
    ("jaxsem.mesh", "Meshes"),
    ("jaxsem.discretization.sem", "Continuous (SEM) discretization"),
    ("jaxsem.discretization.dg", "Discontinuous (DG) discretization"),
    ("jaxsem.discretization.hierarchy", "Coarser orders of a discretization (p-multigrid levels)"),
    ("jaxsem.elliptic", "The elliptic solve (Helmholtz, Poisson, pressure)"),
    ("jaxsem.parallel", "Transports and launching"),
    ("jaxsem.models.poisson", "Poisson and the bake-off problems"),
    ("jaxsem.models.inverse", "Parameter studies"),
    ("jaxsem.models.navier_stokes", "Incompressible Navier–Stokes"),
    ("jaxsem.models.navier_stokes.scalars", "Scalars and buoyancy"),
    ("jaxsem.models.navier_stokes.driving", "Driven flows"),
    ("jaxsem.models.navier_stokes.statistics", "Flow statistics"),
    ("jaxsem.models.flows", "Exact and reference flows"),
    ("jaxsem.models.maxwell", "Maxwell"),
    ("jaxsem.models.advection", "Advection"),
    ("jaxsem.solvers.pcg", "Conjugate gradients"),
    ("jaxsem.solvers.multigrid", "p-multigrid"),
    ("jaxsem.solvers.timestepping", "Time stepping"),
    ("jaxsem.solvers.driver", "Long runs"),
    ("jaxsem.solvers.stops", "Why a run stopped"),
    ("jaxsem.gradcheck", "Gradient verification"),
    ("jaxsem.io.vtu", "Files for ParaView"),
    ("jaxsem.io.checkpoint", "Checkpoints"),
    ("jaxsem.io.atomic", "Files written atomically"),
]

OUT = pathlib.Path(__file__).resolve().parent / "api.md"


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return re.sub(r" at 0x[0-9a-f]+", "", sig)  # function defaults: no addresses (stable output)


def _entry(name, obj) -> str:
    kind = "class" if inspect.isclass(obj) else ("function" if callable(obj) else "value")
    head = f"### `{name}{_signature(obj) if kind != 'value' else ''}`"
    doc = inspect.getdoc(obj) if kind != "value" else None
    if kind == "value":
        doc = f"`{re.sub(r' at 0x[0-9a-f]+', '', repr(obj))}`"
    return f"{head}\n\n{doc or '(no docstring)'}\n"


def render() -> str:
    parts = ["# API reference\n",
             "Generated from the docstrings by `python docs/make_api.py`; do not edit by hand. "
             "Shapes follow Nek5000: element-local fields `(E, n, n, n)`, `n = order + 1`, "
             "vector fields `(3, E, n, n, n)`; see [usage.md](usage.md) for boundary conditions, "
             "coefficient shapes and the time series.\n"]
    for modname, title in MODULES:
        mod = importlib.import_module(modname)
        parts.append(f"## {title}: `{modname}`\n")
        parts.append((inspect.getdoc(mod) or "").strip() + "\n")
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if obj is None or inspect.ismodule(obj):
                continue
            parts.append(_entry(name, obj))
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with docs/api.md instead of writing it")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is out of date: run python docs/make_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
