"""jax.grad through Navier–Stokes steps: the dot-product test and central differences.

Two flows on 3×3×3 elements of order 3 (interior nodes shared by eight elements that
touch no boundary: on 2×2×2 periodic elements a wrong pressure adjoint agreed to 1e-10),
each four steps of :func:`jaxsem.models.navier_stokes.simulate` (BDF1, BDF2, then BDF3:
the ramp-up and the full order), solves to 1e-12:

* ``periodic``: the Taylor–Green vortex plus a random smooth field, ν = 0.05, Δt = 0.05
  (the pressure is pure Neumann: its null space, the constants, is in play);
* ``walls``: Ethier–Steinman in a curved box with its time-dependent wall data (the
  lift and its Neumann data in the pressure), ν = 0.5, Δt = 0.01.

Checked, with the loss L = Σ c·B·|u|² over element-local nodes, c random per node (so
the cotangent is discontinuous across shared nodes, as a user's loss may be):

1. the dot-product test ⟨J v, w⟩ = ⟨v, Jᵀ w⟩ of the linearized map U⁰ ↦ uⁿ for random
   element-local v, w, to 1e-9 relative (measured ≤ 3e-12);
2. ⟨∇L, v⟩ against central differences along three random directions v of U⁰, and
   ∂L/∂ν, to 1e-7 relative (measured ≤ 2e-9; steps of 1e-4 relative sit between the
   O(h²) truncation and the solves' O(tol/h) noise);
3. the sign (periodic): more viscosity dissipates more, ∂L/∂ν < 0.

The first two fail on the adjoint that let the pressure's Krylov directions drift along
the constants (relative errors 1e-5 to 1.4 on these meshes).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsem as js
from jaxsem.gradcheck import directional_errors, dot_product as dot_product_test, random_directions
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS

STEPS = 4
OPTIONS = NS.NSOptions(pressure_tol=1e-12, velocity_tol=1e-12)
ES = flows.ethier_steinman(nu=0.5)


def _periodic():
    mesh = js.box_mesh(3, 4, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=0.02, dt=0.01, options=OPTIONS)
    x = ns.sem.x
    bump = 0.2 * jnp.stack([jnp.sin(x[1] + 2 * x[2]), jnp.cos(2 * x[0] - x[2]), jnp.sin(x[0] + x[1])])
    return ns, flows.taylor_green().velocity(*x) + bump


def _walls():
    mesh = js.box_mesh(3, 3, lengths=(2.0,) * 3, origin=(-1.0,) * 3, deform=0.05)
    ns = NS.setup(mesh, nu=0.5, dt=0.01, boundary=ES.velocity, options=OPTIONS)
    return ns, lambda x, y, z: ES.velocity(x, y, z, 0.0)


CASES = {"periodic": _periodic, "walls": _walls}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    ns, u0 = CASES[request.param]()
    st0 = NS.initial_state(ns, u0)
    x = ns.sem.x
    c = 1.0 + 0.3 * jnp.sin(x[0] + 0.5) * jnp.cos(x[1] - x[2])  # smooth: the cotangent nearly solenoidal

    def final(nu, U):
        n = dataclasses.replace(ns, nu=nu)
        return NS.simulate(n, dataclasses.replace(st0, U=U), STEPS).u

    def loss(nu, U):
        return jnp.sum(c * ns.sem.bmass * jnp.sum(final(nu, U) ** 2, 0))

    return request.param, ns, st0, final, loss


def test_dot_product_test(case):
    name, ns, st0, final, _ = case
    errs = dot_product_test(lambda U: final(ns.nu, U), st0.U)
    print(name, [f"{e:.1e}" for e in errs])
    assert max(errs) < 1e-9, errs


def test_random_directions_match_central_differences(case):
    name, ns, st0, _, loss = case
    nu = float(ns.nu)
    x = (jnp.asarray(nu), st0.U)
    dirs = [(jnp.zeros(()), v) for v in random_directions(st0.U, 3)] + [(jnp.asarray(nu), jnp.zeros_like(st0.U))]
    errs, grad = directional_errors(lambda p: loss(*p), x, dirs, h=1e-4)
    print(name, [f"{e:.1e}" for e in errs])
    assert max(errs) < 1e-7, errs
    if name == "periodic":  # no wall data: more viscosity dissipates more
        assert float(grad[0]) < 0, float(grad[0])


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [dict(every="sqrt"), dict(every=3, remat="custom_vjp"), dict(every=3, offload=True),
                                           dict(snapshots=2)])
def test_checkpointed_gradient_equals_plain(checkpointing):
    """Bounded-memory reverse mode (a segmented scan that recomputes its chunks, the BDF/EXT
    history in the stored state) gives the plain scan's gradient w.r.t. ν and the initial
    velocity, to round-off: the same arithmetic, scheduled differently. 7 steps: chunks of 3
    (√7 → 3) and a remainder of 1."""
    from jaxsem.solvers.timestepping import Checkpointing

    ns, u0 = _walls()
    st0 = NS.initial_state(ns, u0)
    c = 1.0 + 0.3 * jnp.sin(ns.sem.x[0] + 0.5)

    def loss(nu, U, ck):
        st = NS.simulate(dataclasses.replace(ns, nu=nu), dataclasses.replace(st0, U=U), 7, checkpointing=ck)
        return jnp.sum(c * ns.sem.bmass * jnp.sum(st.u ** 2, 0))

    import jax
    plain = jax.grad(loss, argnums=(0, 1))(ns.nu, st0.U, Checkpointing())
    chunked = jax.grad(loss, argnums=(0, 1))(ns.nu, st0.U, Checkpointing(**checkpointing))
    assert abs(float(chunked[0] - plain[0])) < 1e-11 * abs(float(plain[0]))
    assert float(jnp.max(jnp.abs(chunked[1] - plain[1]))) < 1e-11 * float(jnp.max(jnp.abs(plain[1])))
    assert float(jnp.max(jnp.abs(plain[1]))) > 0


def test_binomial_schedule_starts_each_adjoint_from_the_later_steps():
    """With ``Checkpointing(snapshots=…)`` the reverse pass starts each step's adjoint solves from
    the adjoint solutions of the steps after it, extrapolated: the same gradient (to the solves'
    tolerance), with the pressure adjoint's iterations (read by a spy on the adjoint check) cut
    by more than a third. The loss reads the solves' info (``has_aux``), as simulate's docstring
    suggests: integer observations go through the schedule's reverse pass."""
    import importlib

    import jax

    from jaxsem.solvers.timestepping import Checkpointing

    pcg = importlib.import_module("jaxsem.solvers.pcg")
    mesh = js.box_mesh(3, 5, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=1 / 1600, dt=1e-2)  # the default tolerances
    st0 = NS.initial_state(ns, flows.taylor_green().velocity)

    def loss(nu, U, ck):
        st, info = NS.simulate(dataclasses.replace(ns, nu=nu), dataclasses.replace(st0, U=U), 40, checkpointing=ck,
                               info=True)
        return ns.sem.integrate(jnp.sum(st.u ** 2, 0)), info

    iterations, check = [], pcg.check_adjoint

    def spy(info, tol):
        jax.debug.callback(lambda i: iterations.append(int(np.max(i))), info.iterations)
        check(info, tol)

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pcg, "check_adjoint", spy)
        for name, ck in (("plain", Checkpointing()), ("binomial", Checkpointing(snapshots=3))):
            iterations.clear()
            (_, info), g = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(ns.nu, st0.U, ck)
            assert bool(np.all(info.pressure.converged))
            # per step, the velocity's adjoint is transposed first, then the pressure's
            out[name] = (g, float(np.mean(np.asarray(iterations).reshape(40, 2)[:, 1])))
    (gp, plain), (gb, binomial) = out["plain"], out["binomial"]
    assert abs(float(gb[0] - gp[0])) < 1e-9 * abs(float(gp[0]))
    assert float(jnp.max(jnp.abs(gb[1] - gp[1]))) < 1e-9 * float(jnp.max(jnp.abs(gp[1])))
    assert binomial < (2 / 3) * plain, (binomial, plain)


def test_fused_convection_gradient_equals_einsum():
    """Through four steps, the gradient w.r.t. ν and U⁰ with the fused convective term's derivative
    rules (the linear primitive and its transposed kernel; values from the einsum form) and the
    CUDA backend's gradients as unrolled sums — the emulated backend — equals the einsum
    backend's to round-off."""
    import jax

    from jaxsem.backends import EMULATED

    grads = []
    for backend in ("einsum", EMULATED):
        mesh = js.box_mesh(3, 4, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
        ns = NS.setup(mesh, nu=0.02, dt=0.01, options=OPTIONS, backend=backend)
        st0 = NS.initial_state(ns, flows.taylor_green().velocity)

        def loss(nu, U):
            st = NS.simulate(dataclasses.replace(ns, nu=nu), dataclasses.replace(st0, U=U), STEPS)
            return jnp.sum(ns.sem.bmass * jnp.sum(st.u ** 2, 0))

        grads.append(jax.grad(loss, argnums=(0, 1))(ns.nu, st0.U))
    (a_nu, a_u), (b_nu, b_u) = grads
    assert abs(float(a_nu - b_nu)) < 1e-11 * abs(float(a_nu))
    assert float(jnp.max(jnp.abs(a_u - b_u))) < 1e-11 * float(jnp.max(jnp.abs(a_u)))


def test_binomial_schedule_sharded_over_gpus_is_refused_by_name(monkeypatch):
    """Sharded over several GPUs the binomial schedule crashes XLA's GPU compiler (jax 0.11.2, measured;
    under GSPMD its gradient came out NaN): simulate raises a NotImplementedError naming the schedule and
    the way round (the sqrt schedule, measured to run there) before any tracing; one
    GPU, CPU devices, the plain schedule and the environment switch pass."""
    from types import SimpleNamespace

    from jaxsem.models.navier_stokes.scheme import _refuse_sharded_binomial_on_gpus
    from jaxsem.solvers.timestepping import Checkpointing

    def comm(*platforms):
        return SimpleNamespace(mesh=SimpleNamespace(devices=np.array([SimpleNamespace(platform=p) for p in platforms])))

    monkeypatch.delenv("JAXSEM_TRY_SHARDED_BINOMIAL", raising=False)
    with pytest.raises(NotImplementedError, match=r"Checkpointing\(snapshots=14\) on a run sharded over 2 GPUs.*"
                                                  r"Checkpointing\(\"sqrt\"\) over the GPUs.*or on one GPU"):
        _refuse_sharded_binomial_on_gpus(comm("gpu", "gpu"), Checkpointing(snapshots=14))
    for c, ck in [(comm("gpu"), Checkpointing(snapshots=14)), (comm("cpu", "cpu"), Checkpointing(snapshots=14)),
                  (comm("gpu", "gpu"), Checkpointing()), (comm("gpu", "gpu"), Checkpointing("sqrt")),
                  (SimpleNamespace(), Checkpointing(snapshots=14))]:
        assert _refuse_sharded_binomial_on_gpus(c, ck) is None
    monkeypatch.setenv("JAXSEM_TRY_SHARDED_BINOMIAL", "1")
    assert _refuse_sharded_binomial_on_gpus(comm("gpu", "gpu"), Checkpointing(snapshots=14)) is None
    # and simulate calls it first: a sharded discretization whose devices say "gpu" is refused
    monkeypatch.delenv("JAXSEM_TRY_SHARDED_BINOMIAL")
    mesh = js.box_mesh(2, 2, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
    ns = NS.setup(mesh, nu=0.05, dt=0.05)
    ns_gpu = dataclasses.replace(ns, sem=dataclasses.replace(ns.sem, comm=comm("gpu", "gpu")))
    with pytest.raises(NotImplementedError, match="sharded over 2 GPUs"):
        NS.simulate(ns_gpu, NS.initial_state(ns, flows.taylor_green().velocity), 3,
                    checkpointing=Checkpointing(snapshots=2))
