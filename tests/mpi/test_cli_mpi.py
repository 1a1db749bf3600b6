"""`mpirun -n P jaxsem solve poisson --json`: rank 0 reports, the answer equals serial."""

import json

import jax
import pytest

from jaxsem.app.cli import main
from jaxsem.parallel.comm import Comm
from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson


@pytest.mark.parametrize("backend, precond", [("auto", "jacobi"), ("einsum", "jacobi"), ("einsum", "pmg")])
def test_cli_solve_distributed(comm, capsys, backend, precond):
    """The distributed CLI solve takes the serial library solve's iterations and error."""
    mesh = box_mesh((4, 2, 2), 3, deform=0.1)
    code = main(["solve", "poisson", "--order", "3", "--elements", "4", "2", "2", "--backend", backend,
                 "--precond", precond, "--json", "-q"])
    out = capsys.readouterr().out
    sem = discretize(mesh, comm=Comm())
    ms = poisson.manufactured(5)
    pre = poisson.pmg(sem) if precond == "pmg" else None
    u, info = jax.jit(lambda s, p: poisson.solve(s, ms.f, tol=1e-10, precond=p))(sem, pre)
    l2, _ = poisson.relative_errors(sem, u, ms.u)
    assert code == 0
    if comm.rank == 0:
        r = json.loads(out)
        assert r["ranks"] == comm.size and r["dofs"] == 16 * 27 and r["converged"] is True
        assert r["backend"] == "einsum"  # on a CPU, auto is einsum
        assert r["iterations"] == int(info.iterations)
        assert abs(r["error_l2"] - l2) < 1e-9 * l2
    else:
        assert out == ""


def test_cli_maxwell_distributed(comm, capsys):
    from jaxsem.app.verify import verify_maxwell

    args = ["solve", "maxwell", "--order", "3", "--elements", "2", "2", "2", "--t-final", "0.05", "--json", "-q"]
    code = main(args)
    out = capsys.readouterr().out
    ref = verify_maxwell(3, (2, 2, 2), 0.05, deform=0.1)  # serial (no place) on every rank
    assert code == 0
    if comm.rank == 0:
        r = json.loads(out)
        assert r["ranks"] == comm.size and r["steps"] == ref["steps"] and r["converged"] is True
        assert abs(r["error_l2"] - ref["error_l2"]) < 1e-10 * ref["error_l2"]
    else:
        assert out == ""
