"""`mpirun -n P jaxsem solve poisson --json`: rank 0 reports, the answer equals serial."""

import json

import jax

from jaxsem.cli import main
from jaxsem.comm import Comm
from jaxsem.discretization import discretize
from jaxsem.mesh import box_mesh
from jaxsem.models import poisson


def test_cli_solve_distributed(comm, capsys):
    code = main(["solve", "poisson", "--order", "3", "--elements", "4", "2", "2", "--json", "-q"])
    out = capsys.readouterr().out
    sem = discretize(box_mesh((4, 2, 2), 3, deform=0.1), comm=Comm())
    ms = poisson.manufactured(5)
    u, info = jax.jit(lambda s: poisson.solve(s, ms.f, tol=1e-10))(sem)
    l2, _ = poisson.relative_errors(sem, u, ms.u)
    assert code == 0
    if comm.rank == 0:
        r = json.loads(out)
        assert r["ranks"] == comm.size and r["dofs"] == 16 * 27 and r["converged"] is True
        assert r["iterations"] == int(info.iterations)
        assert abs(r["error_l2"] - l2) < 1e-9 * l2
    else:
        assert out == ""
