"""Point values (jaxsem.discretization.probes): locate on the host, evaluate as a linear map.

Checks: exact (1e-12) on polynomials of degree ≤ N per variable on an affine mesh, points on
shared faces, edges and vertices included and counted once; on a curved mesh equal to the
interpolant (x itself recovers the points); outside points named; linear in u (jax.grad is
the weights); sharded over 4 devices equal to serial to 1e-14 (this file run as a script).
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.discretization import probes as Pr
from jaxsem.mesh import box_mesh

L = (1.0, 2.0, 1.5)


def poly(x, y, z, N=4):
    return x**N * y ** (N - 1) - 2 * z**N * x + y**N * z**2 * x**3 + 1.5


def points(rng, m=40):
    """Random points of the box plus points on shared faces, edges and vertices and its corners."""
    p = rng.uniform(0, 1, (m, 3)) * np.array(L)
    special = [[1 / 3, 0.7, 0.4], [1 / 3, 2 / 3, 0.1], [1 / 3, 2 / 3, 0.75], [0, 0, 0], list(L), [0.5, 2.0, 0.0]]
    return np.concatenate([p, special])


def test_exact_on_polynomials_of_degree_N_affine():
    N = 4
    sem = discretize(box_mesh((3, 3, 2), N, lengths=L))
    pts = points(np.random.default_rng(0))
    pr = Pr.locate(sem, pts)
    v = Pr.evaluate(sem, pr, sem.interpolate(poly))
    exact = poly(*pts.T)
    assert np.abs(np.asarray(v) - exact).max() < 1e-12 * np.abs(exact).max()
    assert np.asarray(pr.held).sum() == len(pts)  # each point in one element


def test_curved_mesh_equals_the_interpolant():
    sem = discretize(box_mesh((3, 3, 3), 5, deform=0.1))
    rng = np.random.default_rng(1)
    pts = np.concatenate([rng.uniform(0, 1, (30, 3)), [[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.0, 1 / 3, 0.2]]])
    pr = Pr.locate(sem, pts)
    assert np.abs(np.asarray(Pr.evaluate(sem, pr, sem.x)) - pts.T).max() < 1e-12  # x(r(p)) = p
    # a field is evaluated as its interpolant: Σ u_kji ℓ_i(r) ℓ_j(s) ℓ_k(t) at the located r
    u = sem.interpolate(lambda x, y, z: jnp.sin(3 * x) * jnp.exp(y) * z)
    r = np.asarray(pr.r)
    from jaxsem.core import basis
    nodes = basis.gll_points(5)[0]
    e = np.asarray(pr.element)
    ref = [np.einsum("kji,k,j,i->", np.asarray(u)[e[p]], *(basis.lagrange_matrix(nodes, r[p, d:d + 1])[0]
                                                            for d in (2, 1, 0))) for p in range(len(pts))]
    assert np.abs(np.asarray(Pr.evaluate(sem, pr, u)) - ref).max() < 1e-13


def test_outside_points_named():
    sem = discretize(box_mesh((3, 3, 3), 3, deform=0.1))
    with pytest.raises(ValueError, match=r"2 of 3 lie outside.*#1: \[1.5"):
        Pr.locate(sem, [[0.5, 0.5, 0.5], [1.5, 0.5, 0.5], [0.5, -0.01, 0.5]])


def test_linear_in_u_and_batched():
    sem = discretize(box_mesh((3, 3, 3), 3, deform=0.1))
    rng = np.random.default_rng(2)
    pr = Pr.locate(sem, rng.uniform(0, 1, (7, 3)))
    u = jnp.asarray(rng.standard_normal((2,) + sem.mask.shape))
    v = Pr.evaluate(sem, pr, u)
    assert v.shape == (2, 7)
    c = jnp.asarray(rng.standard_normal((2, 7)))
    g = jax.grad(lambda u: jnp.sum(c * Pr.evaluate(sem, pr, u)))(u)
    assert abs(float(jnp.sum(g * u) - jnp.sum(c * v))) < 1e-12 * float(jnp.abs(c * v).sum())


def shard_check(P):
    out = {}
    rng = np.random.default_rng(3)
    for name, mesh in (("affine", box_mesh((4, 3, 2), 4, lengths=L)), ("curved", box_mesh((4, 3, 3), 4, deform=0.1))):
        pts = points(rng) if name == "affine" else np.concatenate([rng.uniform(0, 1, (30, 3)), [[0.5, 1 / 3, 0.5]]])
        vals = []
        for devices in (None, P):
            sem = discretize(mesh, devices=devices)
            u = sem.interpolate(lambda x, y, z: jnp.stack([poly(x, y, z), jnp.sin(x) * y + z]))
            pr = Pr.locate(sem, pts)
            vals.append(np.asarray(Pr.evaluate(sem, pr, u)))
        out[name] = float(np.abs(vals[0] - vals[1]).max() / np.abs(vals[0]).max())
    return out


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "shard":
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() >= int(sys.argv[2]), jax.devices()
    print("RESULT " + json.dumps(shard_check(int(sys.argv[2]))))


def test_sharded_equals_serial():
    import subproc

    res = subproc.result(subproc.start([__file__, "shard", 4], devices=4))
    assert max(res.values()) < 1e-14, res
