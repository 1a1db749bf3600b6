"""How fast a scan writes a Navier–Stokes-sized state to the host's memory and reads it back.

A state of ``--leaves`` arrays of ``--elements`` elements of order ``--order`` (float64, like the
Taylor–Green state of experiments/ns_gradient_size.py: 18 fields) is carried through ``--steps``
iterations of a scan that touches every value; each iteration stores its input (a) nowhere, (b) in
the device's memory, (c) in the host's (``jax.device_put(x, jax.memory.Space.Host)``, what
``Checkpointing(offload=True)`` does), (d) in the host's as one concatenated buffer. Then a reverse
scan reads (b), (c) or (d) back and reduces it. Times are the best of three compiled runs.

    python -m experiments.host_offload_probe --out host_offload_probe.json   # one GPU
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.common import best_seconds, record, write_json

jax.config.update("jax_enable_x64", True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=18)
    ap.add_argument("--order", type=int, default=7)
    ap.add_argument("--leaves", type=int, default=18)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    n = a.order + 1
    shape = (a.elements**3, n, n, n)
    y0 = [jnp.full(shape, 1.0 + i) for i in range(a.leaves)]
    state_bytes = a.leaves * 8 * a.elements**3 * n**3
    host, dev = jax.memory.Space.Host, jax.memory.Space.Device

    def store(where):
        def body(y, _):
            y1 = [x * 1.0000001 for x in y]
            if where == "none":
                return y1, None
            if where == "device":
                return y1, y
            if where == "host":
                return y1, [jax.device_put(x, host) for x in y]
            return y1, jax.device_put(jnp.concatenate([x.ravel() for x in y]), host)  # "host_flat"

        return jax.jit(lambda y: jax.lax.scan(body, y, None, length=a.steps))

    def load(where):
        def body(c, s):
            s = jax.device_put(s, dev) if where != "device" else s
            return c + sum(jnp.sum(x) for x in jax.tree.leaves(s)), None

        return jax.jit(lambda ys: jax.lax.scan(body, jnp.zeros(()), ys, reverse=True)[0])

    res = dict(record("host_offload_probe"), case=dict(elements=a.elements, order=a.order, leaves=a.leaves,
                                                       steps=a.steps, state_bytes=state_bytes), rows=[])
    base = best_seconds(store("none"), y0)
    res["rows"].append(dict(store="none", seconds=base))
    for where in ("device", "host", "host_flat"):
        f = store(where)
        t = best_seconds(f, y0)
        _, ys = f(y0)
        tl = best_seconds(load(where), ys)
        del ys
        extra = t - base
        res["rows"].append(dict(store=where, seconds=t, extra_seconds_per_step=extra / a.steps,
                                write_GBps=state_bytes * a.steps / extra / 1e9 if extra > 0 else None,
                                load_seconds=tl, load_GBps=state_bytes * a.steps / tl / 1e9))
        print(res["rows"][-1], flush=True)
        write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
