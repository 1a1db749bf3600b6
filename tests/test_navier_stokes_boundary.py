"""Navier–Stokes boundary conditions per group: exact flows with inflow and outflow, forces,
steady states, parameters and gradients (jaxsem/models/navier_stokes/boundary.py and scheme.py).

Run as a script with ``shard P`` for the sharded-equals-serial check (in a subprocess,
XLA_FLAGS set first)."""

import dataclasses
import json
import os
import sys

if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "shard":
    from subproc import with_device_count

    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), int(sys.argv[2]))  # other flags kept

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.models.navier_stokes import NO_SLIP, Outflow, Symmetry, Velocity

sys.path.insert(0, os.path.dirname(__file__))
import subproc  # noqa: E402

jax.config.update("jax_enable_x64", True)

TIGHT = dict(pressure_tol=1e-11, velocity_tol=1e-12)
KOV = flows.kovasznay(40.0)
KOV_GRAD = flows.velocity_gradient(KOV.velocity)


def _kov_flux(x, y, z, t):
    return KOV.nu * KOV_GRAD(x, y, z, t)[0]  # ν ∂u/∂x: the outflow face's normal is +x


def kovasznay(order, outflow="traction", devices=None, forces=()):
    mesh = js.box_mesh((3, 4, 1), order, lengths=(1.5, 2.0, 0.25), origin=(-0.5, -0.5, 0.0),
                       periodic=(False, False, True))
    out = Outflow(pressure=KOV.pressure, flux=_kov_flux) if outflow == "traction" else Outflow()
    bc = {"xmin": Velocity(KOV.velocity), "ymin": Velocity(KOV.velocity), "ymax": Velocity(KOV.velocity),
          "xmax": out}
    return NS.setup(mesh, KOV.nu, 0.01, boundary=bc, forces=forces, devices=devices, options=NS.NSOptions(**TIGHT))


U0, NU_CH = 1.5, 0.5


def _poiseuille(x, y, z, t, a=U0):
    """u = a(1 − y²) on y ∈ [−1, 1]: exact plane Poiseuille flow, p = −2νa x."""
    return jnp.stack([a * (1 - y**2) + 0 * x, 0 * x, 0 * z])


def channel(order=3, forces=("ymin",), params=False, devices=None, nu=NU_CH, probes=None):
    mesh = js.box_mesh((3, 3, 1), order, lengths=(2.0, 2.0, 0.5), origin=(0.0, -1.0, 0.0),
                       periodic=(False, False, True), deform=0.0)
    inflow = Velocity(_poiseuille, params=jnp.asarray(U0)) if params else Velocity(_poiseuille)
    bc = {"xmin": inflow, "ymin": NO_SLIP, "ymax": NO_SLIP,
          "xmax": Outflow(pressure=lambda x, y, z, t: -2 * nu * U0 * (x - 2.0))}
    return NS.setup(mesh, nu, 0.02, boundary=bc, forces=forces, devices=devices, probes=probes,
                    options=NS.NSOptions(**TIGHT))


def test_poiseuille_exact_and_surface_force():
    """Plane Poiseuille flow lies in the discrete space (p ≥ 2): started from it, the flow with
    parabolic inflow, no-slip walls and the outflow's pressure stays exact, and the surface
    integral of the traction on the wall y = −1 is the exact shear force 2νU·|wall| along x and
    the pressure's −∫p dA along y."""
    ns = channel(forces=())
    st0 = NS.initial_state(ns, lambda x, y, z: _poiseuille(x, y, z, 0.0))
    st = NS.simulate(ns, st0, 5)
    s = ns.sem
    ue = _poiseuille(*s.x, 0.0)
    assert float(s.norm(st.u - ue) / s.norm(ue)) < 1e-9
    pe = -2 * NU_CH * U0 * (s.x[0] - 2.0)
    assert float(s.norm(st.p - pe) / s.norm(pe)) < 1e-8
    shear = 2 * NU_CH * U0 * 2.0 * 0.5  # τ_w = ν|du/dy| = 2νU over the 2 × 0.5 wall, along +x
    push = -2 * NU_CH * U0 * 1.0 * 1.0  # p averages 2νU·1 over the wall; it pushes the wall along −y
    g = np.asarray(NS.surface_force(ns, st, "ymin"))
    assert np.allclose(g, [shear, push, 0.0], rtol=1e-8, atol=1e-9 * shear), g


def test_probe_series():
    """The series records u, v, w, p at probe points (anywhere in an element) each sample: on the
    exact Poiseuille flow, the exact values; a point outside the mesh is refused, named."""
    pts = np.array([[0.5, 0.3, 0.25], [1.7, -0.8, 0.1], [2.0, 1.0, 0.0]])
    ns = channel(forces=(), probes=pts)
    st0 = NS.initial_state(ns, lambda x, y, z: _poiseuille(x, y, z, 0.0))
    _, s, _ = NS.run(ns, st0, 0.08, sample_interval=0.04)
    assert s.probe.shape == (3, 3, 4)
    exact = np.stack([U0 * (1 - pts[:, 1] ** 2), 0 * pts[:, 0], 0 * pts[:, 0], -2 * NU_CH * U0 * (pts[:, 0] - 2.0)], 1)
    assert np.abs(s.probe[-1] - exact).max() < 1e-8, s.probe[-1]
    with pytest.raises(ValueError, match="outside"):
        channel(forces=(), probes=[[3.0, 0.0, 0.1]])


def test_couette_residual_force_exact():
    """Couette flow between a fixed wall y = −1 and one moving at U (periodic in x): the force on
    each wall from the momentum residual (StepInfo) is the exact ±ν U/2 · |wall| along x and
    equals the surface integral. (A group next to an open boundary also collects, through the
    test function at its edge nodes, the traction of the neighbouring faces' first element row.)"""
    mesh = js.box_mesh((3, 3, 1), 3, lengths=(2.0, 2.0, 0.5), origin=(0.0, -1.0, 0.0), periodic=(True, False, True),
                       deform=0.0)
    lid = lambda x, y, z, t: jnp.stack([U0 + 0 * x, 0 * y, 0 * z])  # noqa: E731
    ns = NS.setup(mesh, NU_CH, 0.02, boundary={"ymin": NO_SLIP, "ymax": Velocity(lid)}, forces=("ymin", "ymax"),
                  options=NS.NSOptions(**TIGHT))
    exact = lambda x, y, z: jnp.stack([U0 * (1 + y) / 2, 0 * y, 0 * z])  # noqa: E731
    st, info = NS.simulate(ns, NS.initial_state(ns, exact), 5, info=True)
    f = np.asarray(info.force[-1])
    tau = NU_CH * U0 / 2 * 2.0 * 0.5
    assert np.allclose(f, [[tau, 0, 0], [-tau, 0, 0]], atol=1e-9), f
    for i, g in enumerate(("ymin", "ymax")):
        assert np.allclose(np.asarray(NS.surface_force(ns, st, g)), f[i], atol=1e-9)


def test_steady_stop_and_errors():
    """From rest, the channel flow reaches its steady state: run stops at the first sample whose
    change is below steady_tol, before t_final, at the Poiseuille profile."""
    ns = channel(forces=())
    st0 = NS.initial_state(ns, lambda x, y, z: _poiseuille(x, y, z, 0.0) * jnp.where(x > 1e-12, 0.0, 1.0))
    st, s, info = NS.run(ns, st0, 40.0, sample_interval=0.4, steady_tol=1e-6)
    assert float(st.t) < 40.0 - 1e-9 and s.change[-1] < 1e-6 <= s.change[-2], s.change[-3:]
    assert len(s.time) == info.steps // 20 + 1
    ue = _poiseuille(*ns.sem.x, 0.0)
    assert float(ns.sem.norm(st.u - ue) / ns.sem.norm(ue)) < 1e-4
    with pytest.raises(ValueError, match="steady_tol"):
        NS.run(ns, st0, 1.0, steady_tol=-1.0)


def test_symmetry_plane():
    """Half the Poiseuille channel, y ∈ [−1, 0], with a symmetry plane on the centre line y = 0:
    the exact flow stays exact (u ≠ 0 on the plane: not a wall) with the full channel's shear on
    its wall, a disturbed start keeps v = 0 on the plane and u free there. A symmetry
    group that is not an axis-aligned plane is refused, named."""
    nu = NU_CH
    mesh = js.box_mesh((3, 2, 1), 3, lengths=(2.0, 1.0, 0.5), origin=(0.0, -1.0, 0.0), periodic=(False, False, True))
    bc = {"xmin": Velocity(_poiseuille), "ymin": NO_SLIP, "ymax": Symmetry(),
          "xmax": Outflow(pressure=lambda x, y, z, t: -2 * nu * U0 * (x - 2.0))}
    ns = NS.setup(mesh, nu, 0.02, boundary=bc, forces=("ymin",), options=NS.NSOptions(**TIGHT))
    assert ns.bc.symmetry_groups == (("ymax", 1),)
    st, info = NS.simulate(ns, NS.initial_state(ns, lambda x, y, z: _poiseuille(x, y, z, 0.0)), 4, info=True)
    s = ns.sem
    ue = _poiseuille(*s.x, 0.0)
    assert float(s.norm(st.u - ue) / s.norm(ue)) < 1e-9
    assert abs(float(NS.surface_force(ns, st, "ymin")[0]) - 2 * nu * U0 * 2.0 * 0.5) < 1e-8
    assert bool(jnp.all(info.velocity.converged))
    wobble = lambda x, y, z: _poiseuille(x, y, z, 0.0) + 0.2 * jnp.stack(  # noqa: E731
        [jnp.sin(np.pi * x) * (1 + y), jnp.sin(np.pi * x) * (1 + y), 0 * z])
    st = NS.simulate(ns, NS.initial_state(ns, wobble), 3)
    on = np.asarray(jnp.abs(s.x[1]) < 1e-12)
    assert np.abs(np.asarray(st.u[1])[on]).max() < 1e-14  # v = 0 on the plane
    assert np.abs(np.asarray(st.u[0])[on]).min() > 0.5  # u is not held
    bump = lambda x: np.stack([x[0], x[1] + 0.05 * np.sin(np.pi * x[0] / 2) * (1 + x[1]), x[2]])  # noqa: E731
    bent = js.box_mesh((3, 2, 1), 3, lengths=(2.0, 1.0, 0.5), origin=(0.0, -1.0, 0.0), periodic=(False, False, True),
                       mapping=bump)
    with pytest.raises(ValueError, match="symmetry group 'ymax' is not a plane"):
        NS.setup(bent, nu, 0.02, boundary=bc)


def test_bad_boundaries_named():
    mesh = js.box_mesh((2, 2, 1), 2, periodic=(False, False, True))
    with pytest.raises(ValueError, match=r"\['inlet'\].*xmax"):
        NS.setup(mesh, 0.1, 0.01, boundary={"inlet": NO_SLIP})
    with pytest.raises(ValueError, match="no condition to 2 boundary face.*'ymax'"):
        NS.setup(mesh, 0.1, 0.01, boundary={"xmin": NO_SLIP, "xmax": Outflow(), "ymin": NO_SLIP})
    with pytest.raises(TypeError, match=r"boundary\['xmin'\] must be a Velocity, an Outflow or a Symmetry"):
        NS.setup(mesh, 0.1, 0.01, boundary={"xmin": 1.0})
    with pytest.raises(ValueError, match="forces names group"):
        NS.setup(mesh, 0.1, 0.01, forces=("cylinder",))
    with pytest.raises(TypeError, match="Outflow.pressure"):
        Outflow(pressure="zero")


def test_gradients_of_the_wall_force():
    """jax.grad of the wall force after 4 steps w.r.t. the inflow amplitude (a Velocity param)
    and the viscosity equals central differences (start: a flow that is not the steady one)."""
    ns = channel(params=True)
    st0 = NS.initial_state(ns, lambda x, y, z: _poiseuille(x, y, z, 0.0) * (1 + 0.3 * jnp.sin(np.pi * x)))

    def drag(a, nu):
        n2 = dataclasses.replace(ns, nu=nu, bc=ns.bc.with_params("xmin", a))
        _, info = NS.simulate(n2, st0, 4, info=True)
        return info.force[-1, 0, 0]

    a0, nu0 = jnp.asarray(U0), ns.nu
    ga, gn = jax.grad(drag, argnums=(0, 1))(a0, nu0)
    for g, (da, dn) in ((ga, (1e-5, 0.0)), (gn, (0.0, 1e-6))):
        h = da + dn
        fd = (drag(a0 + da, nu0 + dn) - drag(a0 - da, nu0 - dn)) / (2 * h)
        assert abs(float(g) - float(fd)) < 1e-6 * abs(float(fd)), (float(g), float(fd))


def _bumped_channel(a, order=3):
    """The channel with its wall y = −1 pushed in by a·sin(πx/2), the displacement fading to 0 at
    y = 1 (inflow and outflow faces fixed): ``(mesh, mapping)``."""
    def mapping(x):
        y = x[1] + a * np.sin(np.pi * x[0] / 2) * (1 - x[1]) / 2
        return np.stack([x[0], y, x[2]])
    mesh = js.box_mesh((3, 3, 1), order, lengths=(2.0, 2.0, 0.5), origin=(0.0, -1.0, 0.0),
                       periodic=(False, False, True), mapping=mapping)
    return mesh


@pytest.mark.slow
def test_shape_gradient_of_the_wall_force():
    """The shape derivative: jax.grad of the force on the bumped wall after 3 steps w.r.t. the
    bump's amplitude, through NS.with_coordinates, equals central differences of problems set up
    from scratch on the deformed meshes (their own preconditioners: the solves' tolerance sets
    the difference's noise)."""
    nu = NU_CH
    bc = {"xmin": Velocity(_poiseuille), "ymin": NO_SLIP, "ymax": NO_SLIP,
          "xmax": Outflow(pressure=lambda x, y, z, t: -2 * nu * U0 * (x - 2.0))}
    make = lambda mesh: NS.setup(mesh, nu, 0.02, boundary=bc, forces=("ymin",),  # noqa: E731
                                 options=NS.NSOptions(pressure_tol=1e-13, velocity_tol=1e-13))
    u0 = lambda x, y, z: _poiseuille(x, y, z, 0.0) * (1 + 0.2 * jnp.sin(np.pi * x))  # noqa: E731
    ns0 = make(_bumped_channel(0.0))
    x0 = jnp.asarray(ns0.sem.x)
    bump = jnp.stack([0 * x0[0], jnp.sin(np.pi * x0[0] / 2) * (1 - x0[1]) / 2, 0 * x0[2]])

    def force(ns):
        _, info = NS.simulate(ns, NS.initial_state(ns, u0), 3, info=True)
        return info.force[-1, 0]

    w = jnp.asarray([1.0, 0.5, 0.0])  # drag and lift together: one reverse pass
    g = jax.grad(lambda a: w @ force(NS.with_coordinates(ns0, x0 + a * bump)))(0.0)
    h = 1e-4
    fp, fm = force(make(_bumped_channel(h))), force(make(_bumped_channel(-h)))
    fd = (fp - fm) / (2 * h)
    assert abs(float(g) - float(w @ fd)) < 1e-6 * abs(float(w @ fd)), (float(g), fd)
    assert abs(float(fd[0])) > 1e-3 and abs(float(fd[1])) > 1e-3  # both components move: not a trivial zero


def _dfg_inflow(x, y, z, t):
    from jaxsem.mesh import DFG_2D_1
    x, y, z = jnp.broadcast_arrays(x, y, z)
    u = DFG_2D_1.inflow(y)
    return jnp.stack([u, 0 * u, 0 * u])


def cylinder(devices=None):
    """The DFG 2-D channel with its cylinder (level 0, order 2, one element deep), Re 20."""
    from jaxsem.mesh import DFG_2D_1, dfg_mesh
    bc = dict(inlet=Velocity(_dfg_inflow), walls=NO_SLIP, cylinder=NO_SLIP, outlet=Outflow())
    return NS.setup(dfg_mesh("2D", 2, 0), DFG_2D_1.nu, 0.01, boundary=bc, forces=("cylinder",), devices=devices,
                    options=NS.NSOptions(**TIGHT))


def _sharded(P):
    from jaxsem.discretization import to_mesh_order
    out = {}
    starts = dict(kovasznay=lambda x, y, z: KOV.velocity(x, y, z, 0.0),
                  channel=lambda x, y, z: _poiseuille(x, y, z, 0.0) * (1 + 0.3 * jnp.sin(np.pi * x)),
                  cylinder=lambda x, y, z: _dfg_inflow(x, y, z, 0.0))
    for name, build in (("kovasznay", lambda d: kovasznay(4, forces=("ymax",), devices=d)),
                        ("channel", lambda d: channel(devices=d)), ("cylinder", cylinder)):
        res = {}
        for key, devices in (("serial", None), ("shard", P)):
            ns = build(devices)
            st, info = NS.simulate(ns, NS.initial_state(ns, starts[name]), round(0.08 / float(ns.dt)), info=True)
            res[key] = (to_mesh_order(ns.sem, st.u), to_mesh_order(ns.sem, st.p), np.asarray(info.force[-1]))
        (us, ps, fs), (ud, pd, fd) = res["serial"], res["shard"]
        out[name] = dict(u=float(np.max(np.abs(us - ud)) / np.max(np.abs(us))),
                         p=float(np.max(np.abs(ps - pd)) / np.max(np.abs(ps))),
                         force=float(np.max(np.abs(fs - fd)) / np.max(np.abs(fs))))
    return out


@pytest.mark.slow
def test_sharded_equals_serial():
    """Kovasznay (velocity and outflow data, viscous flux), the channel (inflow parameters) and the
    DFG cylinder (a Gmsh mesh made periodic, forces on the body) sharded over 3 devices: serial."""
    pytest.importorskip("gmsh")
    res = subproc.result(subproc.start([__file__, "shard", "3"], devices=3))
    assert set(res) == {"kovasznay", "channel", "cylinder"}
    for name, r in res.items():
        assert r["u"] < 1e-10 and r["p"] < 1e-9 and r["force"] < 1e-9, (name, r)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "shard":
    print("RESULT " + json.dumps(_sharded(int(sys.argv[2]))))
