"""Boundary surfaces (jaxsem.discretization.surface): normals, area weights, ∮ over named groups.

Checks: outward normals ±e_x… on a box; ∮ n dA = 0 and ∮ x·n dA = 3|Ω| on a closed surface
(to round-off: on a box, trilinear and sine-mapped curved boxes); the outer face
of an annulus converging spectrally to 2πRL; face_scatter the transpose of face_values;
jax.grad of an area w.r.t. the coordinates equal to central differences; sharded over 4
devices equal to serial (this file run as a script, tests/subproc.py).
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.discretization import discretize
from jaxsem.discretization import surface as S
from jaxsem.mesh import box_mesh

ALL = ("xmin", "xmax", "ymin", "ymax", "zmin", "zmax")


def test_box_normals_are_the_axes_and_areas_the_sides():
    mesh = box_mesh((3, 2, 4), 3, lengths=(1.0, 2.0, 1.5), deform=0.1)
    sem = discretize(mesh)
    for k, g in enumerate(ALL):
        surf = S.surface(sem, g)
        e = np.zeros(3)
        e[k // 2] = 1.0 if k % 2 else -1.0
        live = np.asarray(surf.live, bool)
        assert np.abs(np.asarray(surf.normal)[:, live] - e[:, None, None, None]).max() < 1e-14, g
        side = np.prod([L for d, L in enumerate((1.0, 2.0, 1.5)) if d != k // 2])
        assert abs(float(S.area(sem, surf)) - side) < 1e-13, g


def trilinear(x):
    """A trilinear (per element) map of the unit box: curved faces, polynomial geometry."""
    return jnp.stack([x[0] + 0.1 * x[1] * x[2], x[1] + 0.15 * x[0] * x[2], x[2] + 0.1 * x[0] * x[1]])


def sine(x):
    """A smooth, non-polynomial map: the faces are curved and the quadrature inexact."""
    b = np.sin(np.pi * x[0]) * np.sin(np.pi * x[1]) + 0.5 * np.sin(np.pi * x[2])
    return np.stack([x[0] + 0.05 * b, x[1] + 0.04 * np.cos(x[0]) * x[2], x[2] + 0.05 * np.sin(2 * x[1])])


@pytest.mark.parametrize("mapping", [None, trilinear, sine])
def test_closed_surface_identities(mapping):
    # ∮ n dA = Σ GLL(x_u × x_v): x_u × x_v has degree ≤ 2N − 1 in u and v, which GLL integrates
    # exactly, and conforming faces close up node for node: 0 to round-off on any mesh.
    # ∮ x·n dA = 3|Ω| with |Ω| = Σ w·jac: both sides are GLL sums of the collocated derivatives
    # of the interpolated geometry, and the GLL derivative with its weights is summation by
    # parts (exact to degree 2N − 1), so the discrete divergence theorem holds to round-off even
    # for the non-polynomial sine map (measured 1e-15 relative for N = 3, 5, 7): tolerance 1e-13.
    mesh = box_mesh((3, 3, 3), 5, deform=0.1 if mapping is None else 0.0,
                    mapping=None if mapping is None else lambda x: np.asarray(mapping(x)))
    sem = discretize(mesh)
    surf = S.surface(sem, ALL)
    assert np.abs(np.asarray(S.integrate(sem, surf, surf.normal))).max() < 1e-14
    vol = float(sem.integrate(jnp.ones_like(sem.mask)))
    assert abs(float(S.flux(sem, surf, sem.x)) - 3 * vol) < 1e-13 * vol
    if mapping is None:  # deform keeps the faces flat: ∮ x·n = 3 exactly; |Ω| by quadrature
        assert abs(float(S.flux(sem, surf, sem.x)) - 3.0) < 1e-13


def annulus(R0, R1, L, theta):
    def mapping(x):
        r, t = R0 + (R1 - R0) * x[0], theta * x[1]
        return np.stack([r * np.cos(t), r * np.sin(t), L * x[2]])
    return mapping


def test_cylinder_face_area_converges_spectrally():
    R0, R1, L = 1.0, 1.5, 0.7
    errs = []
    for p in (2, 3, 4, 5, 6):
        mesh = box_mesh((1, 4, 1), p, periodic=(False, True, False), mapping=annulus(R0, R1, L, 2 * np.pi))
        sem = discretize(mesh)
        errs.append(abs(float(S.area(sem, S.surface(sem, "xmax"))) / (2 * np.pi * R1 * L) - 1))
        if p == 6:  # inner face: its normal points towards the axis (out of the shell)
            surf = S.surface(sem, "xmin")
            xf = S.face_values(surf, sem.x)
            radial = xf[:2] / jnp.sqrt(xf[0] ** 2 + xf[1] ** 2)
            assert np.abs(np.asarray(surf.normal[:2] + radial)).max() < 1e-4  # the interpolant's normal
    errs = np.array(errs)
    assert np.all(errs[1:] < errs[:-1] / 5) and errs[-1] < 1e-7, errs  # 4 elements per 2π: (π/4)^(2N) ish


def test_face_scatter_is_the_transpose_of_face_values():
    sem = discretize(box_mesh((3, 3, 3), 3, deform=0.1))
    surf = S.surface(sem, ("xmax", "ymin", "zmax"))
    rng = np.random.default_rng(0)
    u = jnp.asarray(rng.standard_normal(sem.mask.shape))
    g = jnp.asarray(rng.standard_normal(surf.weight.shape)) * surf.live[:, None, None]
    lhs = jnp.sum(S.face_values(surf, u) * g)
    rhs = jnp.sum(u * S.face_scatter(surf, g, u))
    assert abs(float(lhs - rhs)) < 1e-12 * abs(float(lhs))


def test_unknown_group_named():
    sem = discretize(box_mesh((3, 3, 3), 2, periodic=(True, False, False)))
    with pytest.raises(ValueError, match=r"'ymax'.*unknown: \['xmin'\]"):
        S.surface(sem, ("ymin", "xmin"))


def test_shape_derivative_equals_central_differences():
    mesh = box_mesh((3, 3, 3), 3, deform=0.1)
    sem = discretize(mesh)
    rng = np.random.default_rng(1)
    dx = jnp.asarray(rng.standard_normal(sem.x.shape)) * 0.01

    def weighted_area(x):  # a smooth surface functional: ∮ (1 + x·n_z-ish) dA of two groups
        s2 = sem.with_coordinates(x)
        surf = S.surface(s2, ("xmax", "zmin"))
        xf = S.face_values(surf, x)
        return S.integrate(s2, surf, 1.0 + xf[0] * surf.normal[2] + xf[1] ** 2)

    g = jax.grad(weighted_area)(sem.x)
    eps = 1e-5
    fd = (weighted_area(sem.x + eps * dx) - weighted_area(sem.x - eps * dx)) / (2 * eps)
    assert abs(float(jnp.sum(g * dx) - fd)) < 1e-8 * abs(float(fd))


def shard_check(P):
    out = {}
    for name, mesh in (("deformed", box_mesh((4, 3, 2), 4, deform=0.1)),
                       ("annulus", box_mesh((2, 4, 1), 4, periodic=(False, True, False),
                                            mapping=annulus(1.0, 1.5, 0.7, 2 * np.pi)))):
        groups = tuple(mesh.boundaries)
        vals = []
        for devices in (None, P):
            sem = discretize(mesh, devices=devices)
            surf = S.surface(sem, groups)
            one = S.surface(sem, groups[-1])
            u = sem.interpolate(lambda x, y, z: jnp.sin(x) * y + z * z)
            vals.append(np.concatenate([np.asarray(S.integrate(sem, surf, surf.normal)),
                                        [float(S.flux(sem, surf, sem.x)), float(S.area(sem, one)),
                                         float(S.integrate(sem, one, S.face_values(one, u)))]]))
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
