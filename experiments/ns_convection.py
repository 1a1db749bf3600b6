"""The dealiased convective term's formulations, timed and checked against the model's own.

The element-local part of N(u) = −(u·∇)u on the 3/2 rule (interpolate, differentiate, multiply by
B·∂r/∂x, project back; no gather–scatter) in several formulations on a Taylor–Green box mesh:

* ``previous``: the form the model ran before the fused kernel (GLL gradient, then each part
  interpolated);
* ``shared``: the gradient taken on the rule with the partial contractions shared (fewer flops, fewer
  intermediate fields): :func:`jaxsem.operators.convection.advection_local`, the einsum backend's;
* ``rotate``: ``shared`` with every contraction on the last axis, the result's axis moved to the front
  (one layout for every matrix product);
* ``affine``: ``shared`` with B·∂r/∂x from one 3 × 3 matrix per element and the rule's weights (box
  meshes: every element affine), so the (3, 3, E, q, q, q) field is not read;
* ``backend``: what the model runs, the discretization's backend (on a GPU the CUDA backend's fused
  kernel, :func:`jaxsem.backends.cuda.convection_cuda`);
* ``backend_with_dssum``: the model's whole term (gather–scatter and B⁻¹ included);
* ``vjp_einsum``, ``vjp_backend``: value and VJP of u ↦ (u·∇)u (the reverse pass), einsum form
  and the backend's (on a GPU the transposed kernel, :func:`jaxsem.backends.cuda.convection_vjp_cuda`).

Each row: milliseconds (best of repeats, jitted), the largest difference from ``previous`` relative to
its largest value, points. ::

    python -m experiments.ns_convection --order 7 --elements 36 --out conv.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jaxsem as js
from jaxsem.models import flows
from jaxsem.models import navier_stokes as NS
from jaxsem.operators.convection import advection_local, on_rule
from jaxsem.operators.tensor import grad_gll, interp, interp_t

from experiments.common import Results, best_seconds

jax.config.update("jax_enable_x64", True)


def previous(u, Brx, J, D, Dd):
    ur, us, ut = grad_gll(u, D)
    uq = interp(u, J)
    c = [Brx[a, 0] * uq[0] + Brx[a, 1] * uq[1] + Brx[a, 2] * uq[2] for a in range(3)]
    return interp_t(c[0] * interp(ur, J) + c[1] * interp(us, J) + c[2] * interp(ut, J), J)


def shared(u, Brx, J, D, Dd):
    return advection_local(u, u, J, Dd, Brx)


def _rot(M, x):
    """Contract the last axis with ``M: (q, n)`` and put the new axis first among the last three."""
    y = jnp.matmul(x, M.T)  # [..., k, j, a]
    return jnp.moveaxis(y, -1, -3)  # [..., a, k, j]


def rotate(u, Brx, J, D, Dd):
    iJ, iD = _rot(J, u), _rot(Dd, u)  # [..., a, k, j]
    jJ_iJ, jD_iJ, jJ_iD = _rot(J, iJ), _rot(Dd, iJ), _rot(J, iD)  # [..., b, a, k]
    uq, ur, us, ut = _rot(J, jJ_iJ), _rot(J, jJ_iD), _rot(J, jD_iJ), _rot(Dd, jJ_iJ)  # [..., c, b, a]
    c = [Brx[a, 0] * uq[0] + Brx[a, 1] * uq[1] + Brx[a, 2] * uq[2] for a in range(3)]
    w = c[0] * ur + c[1] * us + c[2] * ut
    return _rot(J.T, _rot(J.T, _rot(J.T, w)))


def affine(u, G, J, D, Dd, wq):
    """``G: (3, 3, E)``: J·∂r_a/∂x_d per element (constant on affine elements); ``wq: (q, q, q)``."""
    uq, ur, us, ut = on_rule(u, J, Dd)
    g = G[..., None, None, None]
    c = [g[a, 0] * uq[0] + g[a, 1] * uq[1] + g[a, 2] * uq[2] for a in range(3)]
    return interp_t(wq * (c[0] * ur + c[1] * us + c[2] * ut), J)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--elements", type=int, nargs="+", default=[4])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="ns_convection.json")
    a = ap.parse_args(argv)
    rows = Results(a.out, "ns_convection")
    for K in a.elements:
        mesh = js.box_mesh(K, a.order, lengths=(2 * np.pi,) * 3, origin=(-np.pi,) * 3, periodic=(True,) * 3)
        ns = NS.setup(mesh, nu=1 / 1600, dt=1e-3)
        u = NS.initial_state(ns, flows.taylor_green().velocity).u
        s = ns.sem
        J, D = ns.Jd, s.D
        order, q = a.order, ns.Jd.shape[0]
        rule = js.core.geometry.quadrature(order, "gauss", q=q)
        Dd = jnp.asarray(rule.Dt)
        wq = jnp.asarray(np.einsum("k,j,i->kji", rule.w, rule.w, rule.w))
        # J·∂r/∂x per element from the first rule point (exact on affine elements)
        G = ns.Brx[:, :, :, 0, 0, 0] / wq[0, 0, 0]
        ref = jax.jit(previous)(u, ns.Brx, J, D, Dd)
        scale = float(jnp.max(jnp.abs(ref)))
        vjp_ref = jax.jit(lambda u: jax.vjp(lambda u: previous(u, ns.Brx, J, D, Dd), u)[1](u)[0])(u)
        backend = lambda u, Brx, J, Dd: s.backend.convection(u, u, J, Dd, Brx)
        variants = dict(previous=(previous, (u, ns.Brx, J, D, Dd)), shared=(shared, (u, ns.Brx, J, D, Dd)),
                        rotate=(rotate, (u, ns.Brx, J, D, Dd)), affine=(affine, (u, G, J, D, Dd, wq)),
                        backend=(backend, (u, ns.Brx, J, ns.Dd)))
        for name, (fn, args) in variants.items():
            f = jax.jit(fn)
            diff = float(jnp.max(jnp.abs(f(*args) - ref))) / scale
            ms = 1e3 * best_seconds(f, *args, repeats=a.repeats)
            r = dict(variant=name, backend=s.backend.name, elements=K, order=order, q=q, points=K**3 * order**3, ms=ms,
                     relative_difference=diff)
            rows.append(r)
            print(r, flush=True)
        # the reverse pass: value and VJP in (u) of the term u·∇u, einsum form against the backend's
        for name, fn in (("vjp_einsum", lambda u: js.backends.EINSUM.convection(u, u, J, ns.Dd, ns.Brx)),
                         ("vjp_backend", lambda u: s.backend.convection(u, u, J, ns.Dd, ns.Brx))):
            f = jax.jit(lambda u, fn=fn: jax.vjp(fn, u)[1](u)[0])
            r = dict(variant=name, backend=s.backend.name, elements=K, order=order, q=q, points=K**3 * order**3,
                     ms=1e3 * best_seconds(f, u, repeats=a.repeats),
                     relative_difference=float(jnp.max(jnp.abs(f(u) - vjp_ref)) / jnp.max(jnp.abs(vjp_ref))))
            rows.append(r)
            print(r, flush=True)
        full = jax.jit(lambda ns, u: ns.sem.local_map(lambda s_, ns_, u_: NS.scheme._convection(ns_, s_, u_), ns, u))
        r = dict(variant="backend_with_dssum", backend=s.backend.name, elements=K, order=order, q=q, points=K**3 * order**3,
                 ms=1e3 * best_seconds(full, ns, u, repeats=a.repeats), relative_difference=0.0)
        rows.append(r)
        print(r, flush=True)


if __name__ == "__main__":
    main()
