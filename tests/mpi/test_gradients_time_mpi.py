"""Distributed jax.grad through Maxwell time stepping equals serial (mpirun -n 2 and -n 4).

Every rank builds the same global mesh and differentiates the same global loss
(the electric energy after 10 LSERK4 steps plus the record of E at a probe,
summed over ranks) w.r.t. a per-element ε, serially (all elements, plain
scan) and distributed (its own elements, face exchange through mpi4jax,
``Checkpointing("sqrt")``). ``jax.checkpoint`` cannot partially evaluate
mpi4jax's ordered effects, so the distributed run takes ``integrate``'s
custom_vjp schedule (``remat="auto"``): this also checks that schedule against
the plain reverse pass. All collectives happen before any assertion.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxsem import timestepping as ts
from jaxsem.parallel.comm import Comm, allreduce_max, allreduce_sum
from jaxsem.discretization.dg import discretize_dg
from jaxsem.mesh import box_mesh
from jaxsem.models import maxwell as mx


def test_eps_gradient_distributed_equals_serial(comm):
    mesh = box_mesh((2, 2, 2), 2)  # affine: the chain-rule curl is the same operator, cheaper to compile
    eps = np.random.default_rng(0).uniform(1.0, 2.0, mesh.num_elements)
    out = []
    for c, every in ((Comm(), None), (comm, "sqrt")):
        dg = discretize_dg(mesh, comm=c)
        el = np.asarray(dg.elements)
        q0 = mx.cavity_mode(dg.x, 0.0)
        # a probe: the centre node of global element 0, on the rank that owns it
        here = jnp.asarray(el == 0, dg.jac.dtype)

        def loss(eps, dg=dg, q0=q0, every=every, here=here):
            mat = mx.material(dg, eps)
            f = lambda t, q: mx.rhs(dg, mat, q, form="chain")
            q, obs = ts.integrate(f, q0, 0.04, 10, checkpointing=ts.Checkpointing(every),
                                  observe=lambda q: jnp.sum(here * q[:3, :, 1, 1, 1], axis=1))
            local = jnp.sum(dg.mass * q[:3] ** 2) + jnp.sum(obs**2)
            return allreduce_sum(local, dg.comm)

        value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(eps[el]))
        out.append((el, float(value), grad))
    (_, v_s, g_s), (el, v_d, g_d) = out
    err = float(allreduce_max(jnp.max(jnp.abs(g_d - g_s[el])), comm)) / float(jnp.max(jnp.abs(g_s)))
    v_max = float(allreduce_max(jnp.asarray(v_d), comm))
    assert g_d.shape == (len(el),)
    assert abs(v_d - v_s) <= 1e-13 * v_s and v_max == v_d  # every rank has the global loss
    assert err < 1e-12, err
