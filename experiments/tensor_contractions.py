"""One-direction tensor contractions of an E-vector, as XLA compiles them: einsum against unrolled sums.

``_i``, ``_j``, ``_k`` of :mod:`jaxsem.operators.tensor` apply an (n × n) matrix along one axis
of ``u: (c, E, n, n, n)``. As einsums XLA emits GEMMs (with transposes for j and k); as an
unrolled sum of n scaled slices (``Σ_j M[b, j] u[..., j, :]``) one elementwise pass. Each
form, each direction and the whole GLL gradient are timed (best of ``--repeats`` compiled
calls, 10 applications a call) and checked against the einsum form.

    python -m experiments.tensor_contractions --elements 36 --order 7 --comps 3 --out tensor_contractions.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.common import best_seconds, record, write_json
from jaxsem.operators import tensor

jax.config.update("jax_enable_x64", True)


def einsum_forms():
    return tensor._i, tensor._j, tensor._k


def unrolled_forms():
    return tensor._i_sums, tensor._j_sums, tensor._k_sums


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=8, help="elements per direction (36: the TGV case, on a GPU)")
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--comps", type=int, default=3)
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    n = a.order + 1
    u = jax.random.normal(jax.random.PRNGKey(0), (a.comps, a.elements**3, n, n, n), a.dtype)
    M = jax.random.normal(jax.random.PRNGKey(1), (n, n), a.dtype)
    res = dict(record("tensor_contractions"), case=dict(elements=a.elements, order=a.order, comps=a.comps,
                                                        dtype=a.dtype, bytes=u.size * u.dtype.itemsize), rows=[])
    ref = einsum_forms()
    for form, fns in (("einsum", ref), ("unrolled", unrolled_forms())):
        for name, f in zip("ijk", fns):
            def many(M, u, f=f):  # ten applications, each on the last one's output (no reuse across them)
                for _ in range(10):
                    u = f(M, u) * 0.125
                return u
            g = jax.jit(many)
            t = best_seconds(g, M, u, repeats=a.repeats) / 10
            err = float(jnp.max(jnp.abs(jax.jit(f)(M, u) - jax.jit(ref["ijk".index(name)])(M, u))))
            row = dict(form=form, direction=name, ms=1e3 * t, GBps=2 * res["case"]["bytes"] / t / 1e9, max_abs_diff=err)
            res["rows"].append(row)
            print(row, flush=True)
        grad = jax.jit(lambda M, u, fns=fns: fns[0](M, u) + fns[1](M, u) + fns[2](M, u))
        t = best_seconds(grad, M, u, repeats=a.repeats)
        res["rows"].append(dict(form=form, direction="sum of the three (a gradient's work)", ms=1e3 * t))
        print(res["rows"][-1], flush=True)
        write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
