"""Distributed Maxwell DG equals serial (run under mpirun -n 2 and -n 4).

Every rank builds the same global mesh and discretizes it twice: serially (all
elements, ``Comm()``) and distributed (its own elements, face exchange with one
packed message per neighbour rank). Fields are compared on the rank's elements;
Δt, energies and errors are global. All collectives happen before any assertion.
Kept small: under 4 oversubscribed ranks each LSERK4 step / power iteration is
dominated by message latency.
"""

import os
import tempfile

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem import timestepping as ts
from jaxsem.solvers import driver
from jaxsem.solvers.stops import NonFiniteError
from jaxsem.parallel.comm import Comm, allreduce_max
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx


def _rel(a, b, comm):
    num = allreduce_max(jnp.max(jnp.abs(a - b)), comm)
    den = allreduce_max(jnp.max(jnp.abs(b)), comm)
    return float(num / den)


def _run(comm, mesh, exact, flux, t_final, rho=None, partition=None, eps=1.0, mu=1.0, form="split"):
    """Serial and distributed runs; ``rho=None``: each finds its own Δt limit (power iteration)."""
    out = []
    for c in (Comm(), comm):
        dg = discretize_dg(mesh, comm=c, partition=partition if c.size > 1 else None)
        el = np.asarray(dg.elements)
        mat = mx.material(dg, np.broadcast_to(eps, (mesh.num_elements,))[el],
                          np.broadcast_to(mu, (mesh.num_elements,))[el])
        q0 = exact(dg.x, 0.0)
        q, info, dt = mx.simulate(dg, mat, q0, t_final, scheme=mx.Scheme(flux=flux, form=form, cfl=0.5), bc="pec",
                                  rho=rho)
        out.append(dict(dg=dg, el=el, q=q, steps=info.steps, dt=dt, e0=float(mx.energy(dg, mat, q0)),
                        e=float(mx.energy(dg, mat, q)), err=mx.relative_error(dg, q, exact(dg.x, t_final))))
    return out


def _check(comm, s, d, min_steps):
    el = d["el"]
    err = _rel(d["q"], s["q"][:, el], comm)
    bnd = float(allreduce_max(jnp.max(jnp.abs(d["dg"].boundary - s["dg"].boundary[el])), comm))
    nbrs = len(d["dg"].fgs.exchange.neighbors) if comm.size > 1 else 1
    assert s["steps"] == d["steps"] >= min_steps
    assert abs(d["dt"] - s["dt"]) <= 1e-12 * s["dt"]
    assert err < 1e-12, err
    assert abs(d["e"] - s["e"]) <= 1e-12 * s["e"] and abs(d["e0"] - s["e0"]) <= 1e-12 * s["e0"]
    assert abs(d["err"] - s["err"]) <= 1e-9 * s["err"]
    assert bnd == 0.0 and nbrs >= 1  # physical boundary faces only; rank faces exchanged


def test_pec_cavity_curved_upwind(comm):
    """PEC cavity mode on a curved mesh, upwind flux; Δt limit from the distributed power iteration."""
    mesh = box_mesh((2, 2, 2), 3, deform=0.1)
    rhos = []
    for c in (Comm(), comm):
        dg = discretize_dg(mesh, comm=c)
        rhos.append(mx.spectral_radius(dg, mx.material(dg), "upwind", iterations=20))
    s, d = _run(comm, mesh, mx.cavity_mode, "upwind", 0.5, rho=rhos[1])
    _check(comm, s, d, 20)
    assert abs(rhos[1] - rhos[0]) <= 1e-12 * rhos[0]
    assert s["err"] < 0.05 and d["e"] <= d["e0"]
    if comm.size > 1:  # rank faces are not mirrored: fewer boundary faces than the element count allows
        assert float(jnp.sum(d["dg"].boundary)) < 6 * d["dg"].num_elements - 3


def test_periodic_plane_wave_central_uneven_partition(comm):
    """Periodic plane wave, central flux, per-element ε and μ, an uneven non-grid partition.

    The central flux conserves the energy up to the LSERK4 error. Affine mesh, so the
    cheaper-to-compile ``form="chain"`` is the same operator as the default split form.
    """
    mesh = box_mesh((2, 2, 2), 3, periodic=(True,) * 3)
    part = np.minimum(np.arange(mesh.num_elements) * comm.size // (mesh.num_elements + 2), comm.size - 1)
    part[-1] = comm.size - 1
    rng = np.random.default_rng(3)
    eps, mu = 1.0 + 0.5 * rng.uniform(size=8), 1.0 + 0.5 * rng.uniform(size=8)
    s, d = _run(comm, mesh, mx.plane_wave, "central", 1.0, rho=32.0, partition=part, eps=eps, mu=mu,
                form="chain")
    _check(comm, s, d, 20)
    assert abs(d["e"] / d["e0"] - 1) < 1e-3
    assert np.array_equal(d["el"], np.nonzero(part == comm.rank)[0])
    assert float(jnp.sum(d["dg"].boundary)) == 0.0  # fully periodic: no mirrored face on any rank


def test_blow_up_is_detected_on_every_rank(comm):
    """A NaN on one rank only must stop all ranks at the same step (no hang)."""
    def f(t, y):
        # rank 0 blows up from step 3 on; the others stay finite
        bad = (comm.rank == 0) & (t > 2.5)
        return jnp.where(bad, jnp.nan, 0.0) * y + 1.0

    with pytest.raises(NonFiniteError) as err:
        driver.run(f, jnp.ones(4), 1.0, 10, method="rk4", options=driver.RunOptions(chunk_steps=5), comm=comm)
    assert err.value.step == 3  # the first step (1-based) whose stages reach t > 2.5


def test_checkpoint_resume_and_refusal_on_every_rank(comm):
    """Each rank writes its own checkpoint; a resume is bit-identical, and a mismatch on one
    rank only (its ε) is refused on every rank together (no rank left waiting)."""
    dg = discretize_dg(box_mesh((2, 2, 2), 2), comm=comm)
    q0 = mx.cavity_mode(dg.x, 0.0)
    tmp = tempfile.TemporaryDirectory()  # per process (pytest's tmp_path root is shared by the ranks)
    path = os.path.join(tmp.name, "mx.npz")
    scheme = mx.Scheme(form="chain", dt=0.04)  # affine: the chain-rule curl is the split form's operator

    def run(steps, options, scheme=scheme, eps=1.0):  # rho: above this mesh's (limit 0.094 > dt)
        return mx.simulate(dg, mx.material(dg, eps), q0, steps * 0.04, scheme=scheme, rho=32.0, options=options)

    full, _, _ = run(6, driver.RunOptions(chunk_steps=2))
    run(2, driver.RunOptions(chunk_steps=2, checkpoint_path=path))
    resume = driver.RunOptions(chunk_steps=2, resume=path)
    res, info, _ = run(6, resume)
    errors = []
    for kw in (dict(scheme=mx.Scheme(flux="central", form="chain", dt=0.04)),
               dict(eps=2.0 if comm.rank == comm.size - 1 else 1.0)):
        try:
            run(6, resume, **kw)
        except ValueError as e:
            errors.append(str(e))
    diff = float(allreduce_max(jnp.max(jnp.abs(res - full)), comm))
    tmp.cleanup()
    assert info.resumed_from == 2 and info.steps == 4 and diff == 0.0
    assert len(errors) == 2, errors
    assert "flux = 'upwind' in the checkpoint, 'central' in this run" in errors[0]
    assert f"rank{comm.rank}-of-{comm.size}" in errors[0]
    if comm.rank == comm.size - 1:
        assert "material = " in errors[1]
    else:
        assert "the checkpoint of another rank does not match this run" in errors[1]


def test_fused_path_equals_serial(comm):
    """The fused DG path under MPI (the kernel reads the neighbours a rank has and mirrors, or
    for advection zeroes, the remote ones; their flux is added on the halo elements) equals
    serial on an uneven partition: Maxwell's right-hand side (PEC, PMC), its ε-gradient through
    3 LSERK4 steps, and advection's right-hand side, against the serial einsum reference. Off a
    GPU the emulated backend runs the same path with the kernels' einsum values."""
    import jax

    from jaxsem.backends import EMULATED
    from jaxsem.models import advection as ad

    fused = EMULATED if jax.default_backend() == "cpu" else "cuda"
    mesh = box_mesh((3, 2, 2), 2, deform=0.1)
    part = np.minimum(np.arange(mesh.num_elements) * comm.size // (mesh.num_elements + 2), comm.size - 1)
    part[-1] = comm.size - 1
    rng = np.random.default_rng(3)
    q = rng.standard_normal((6, mesh.num_elements) + (3,) * 3)
    eps = 1.0 + 0.1 * rng.random((mesh.num_elements,) + (3,) * 3)
    u = rng.standard_normal((mesh.num_elements,) + (3,) * 3)
    el = np.nonzero(part == comm.rank)[0]
    out = {}
    for c in (Comm(), comm):
        dg = discretize_dg(mesh, comm=c, partition=part if c.size > 1 else None,
                           backend=fused if c.size > 1 else "einsum")
        sel = (lambda a: a) if c.size == 1 else (lambda a: a[..., el, :, :, :])
        for bc in mx.BCS:
            f = mx.make_rhs("upwind", bc, "chain")
            out[bc, c.size] = f(0.0, jnp.asarray(sel(q)), (dg, mx.material(dg, jnp.asarray(sel(eps)))))

        def loss(e):
            mat = mx.material(dg, e)
            y = ts.integrate(lambda t, v: f(t, v, (dg, mat)), jnp.asarray(sel(q)), 0.01, 3)
            return dg.integrate(jnp.sum(y * y, 0))

        out["grad", c.size] = jax.grad(loss)(jnp.asarray(sel(eps)))
        tr = ad.transport(dg, (1.0, -0.5, 0.25))
        out["adv", c.size] = ad.make_rhs("upwind", "split")(0.0, jnp.asarray(sel(u)), (dg, tr))
    errs = {k: _rel(out[k, comm.size], out[k, 1][..., el, :, :, :], comm) for k in ("pec", "pmc", "grad", "adv")}
    assert all(e < 1e-12 for e in errs.values()), errs
