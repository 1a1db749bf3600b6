"""Distributed advection DG equals serial (run under mpirun -n 2 and -n 4).

Every rank builds the same global periodic mesh and discretizes it twice:
serially (all elements, ``Comm()``) and distributed (its own elements; each
stage exchanges the face values of u, one packed message per neighbour rank,
then computes). Fields are compared on the rank's elements; Δt, mass, energy
and errors are global. All collectives happen before any assertion.
"""

import jax.numpy as jnp
import numpy as np

from jaxsem.backends import EMULATED
from jaxsem.parallel.comm import Comm, allreduce_max
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import advection as ad


def _rel(a, b, comm):
    num = allreduce_max(jnp.max(jnp.abs(a - b)), comm)
    den = allreduce_max(jnp.max(jnp.abs(b)), comm)
    return float(num / den)


def _run(comm, mesh, flux, t_final, velocity, rho=None, partition=None, backend="einsum"):
    """Serial (einsum) and distributed (``backend``) runs of the same problem."""
    out = []
    for c in (Comm(), comm):
        dg = discretize_dg(mesh, comm=c, partition=partition if c.size > 1 else None,
                           backend=backend if c.size > 1 else "einsum")
        tr = ad.transport(dg, velocity)
        exact = lambda x, t: ad.gaussian(x, t, velocity)
        u0 = exact(dg.x, 0.0)
        scheme = ad.Scheme(flux=flux, cfl=0.5)
        u, info, dt = ad.simulate(dg, tr, u0, t_final, scheme=scheme, rho=rho)
        out.append(dict(dg=dg, el=np.asarray(dg.elements), u=u, steps=info.steps, dt=dt,
                        m0=float(ad.mass(dg, u0)), m=float(ad.mass(dg, u)),
                        e0=float(ad.energy(dg, u0)), e=float(ad.energy(dg, u)),
                        err=ad.relative_error(dg, u, exact(dg.x, t_final))))
    return out


def _check(comm, s, d, min_steps):
    err = _rel(d["u"], s["u"][d["el"]], comm)
    nbrs = len(d["dg"].fgs.exchange.neighbors) if comm.size > 1 else 1
    assert s["steps"] == d["steps"] >= min_steps
    assert abs(d["dt"] - s["dt"]) <= 1e-12 * s["dt"]
    assert err < 1e-12, err
    for k in ("m0", "m", "e0", "e"):
        assert abs(d[k] - s[k]) <= 1e-12 * abs(s[k]), k
    assert abs(d["err"] - s["err"]) <= 1e-9 * s["err"]
    assert abs(d["m"] - d["m0"]) <= 1e-13 * abs(d["m0"])  # mass conserved, distributed too
    assert nbrs >= 1


def test_curved_upwind_distributed_power_iteration(comm):
    """Curved periodic mesh, upwind; Δt limit from the distributed power iteration."""
    mesh = box_mesh((2, 2, 2), 3, periodic=(True,) * 3, deform=0.1)
    c = (1.0, -0.5, 0.25)
    rhos = []
    for cm in (Comm(), comm):
        dg = discretize_dg(mesh, comm=cm)
        rhos.append(ad.spectral_radius(dg, ad.transport(dg, c), "upwind", iterations=20))
    s, d = _run(comm, mesh, "upwind", 0.3, c, rho=rhos[1])
    _check(comm, s, d, 6)
    assert abs(rhos[1] - rhos[0]) <= 1e-12 * rhos[0]
    assert d["e"] <= d["e0"] and s["err"] < 0.3


def test_central_uneven_partition(comm):
    """Central flux, an uneven non-grid partition, 3x2x2 elements."""
    mesh = box_mesh((3, 2, 2), 3, periodic=(True,) * 3, deform=0.05)
    E = mesh.num_elements
    part = np.minimum(np.arange(E) * comm.size // (E + 2), comm.size - 1)
    part[-1] = comm.size - 1
    s, d = _run(comm, mesh, "central", 0.3, (0.5, 1.0, -0.75), rho=40.0, partition=part)
    _check(comm, s, d, 6)
    assert np.array_equal(d["el"], np.nonzero(part == comm.rank)[0])
    assert float(jnp.sum(d["dg"].boundary)) == 0.0


def test_fused_path_local_part_then_halo(comm):
    """The fused backends' structure (the local part with the neighbours held here, then the remote
    neighbours' flux on the halo elements once the exchange is in; the emulated backend, so it runs
    on a CPU) equals serial; the halo is exactly the elements with a remote face point (with 2
    ranks, the middle layer of each half of the 6x2x2 box is not in it)."""
    mesh = box_mesh((6, 2, 2), 2, periodic=(True,) * 3, deform=0.05)
    from jaxsem.mesh.partition import partition_mesh

    part = partition_mesh(mesh, comm.size)
    s, d = _run(comm, mesh, "upwind", 0.2, (0.5, 1.0, -0.75), rho=40.0, partition=part, backend=EMULATED)
    _check(comm, s, d, 4)
    from jaxsem.discretization.dg import face_connectivity

    nb = face_connectivity(mesh).neighbors[:, :, 0]  # (E, 6) neighbour element, -1 on the boundary
    el = d["el"]
    remote = np.any((nb[el] >= 0) & (part[np.maximum(nb[el], 0)] != comm.rank), axis=1)
    assert np.array_equal(np.asarray(d["dg"].halo), np.nonzero(remote)[0])
    assert 0 < len(d["dg"].halo) and (comm.size > 2 or len(d["dg"].halo) < len(el))
