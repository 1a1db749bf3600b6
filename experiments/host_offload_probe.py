"""How fast a scan writes a Navier–Stokes-sized state to the host's memory and reads it back.

A state of ``--leaves`` arrays of ``--elements`` elements of order ``--order`` (float64, like the
Taylor–Green state of experiments/ns_gradient_size.py: 18 fields) is carried through ``--steps``
iterations of a scan that touches every value; each iteration stores its input (a) nowhere, (b) in
the device's memory, (c) in the host's (``jax.device_put(x, jax.memory.Space.Host)``, what
``Checkpointing(offload=True)`` does), (d) in the host's as one concatenated buffer. Then a reverse
scan reads (b), (c) or (d) back and reduces it. Times are the best of three compiled runs.

``--calls N`` measures the first-call cost instead: one compiled program stores the states in the
host's memory and reads them back (the host buffer a temporary of the program, as in a
checkpointed gradient), called N times in a fresh process, every call's time kept.

    python -m experiments.host_offload_probe --out host_offload_probe.json   # one GPU
    python -m experiments.host_offload_probe --steps 120 --calls 3 --out first_call.json
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
    ap.add_argument("--calls", type=int, default=0, help="time N calls of one store-and-load program (first-call cost)")
    a = ap.parse_args(argv)
    if a.calls:
        return first_calls(a)
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


def first_calls(a):
    """Every call's wall time of one compiled program that keeps ``a.steps`` states in the host's
    pinned memory and reads them back."""
    import time

    n = a.order + 1
    shape = (a.elements**3, n, n, n)
    y0 = [jnp.full(shape, 1.0 + i) for i in range(a.leaves)]
    state_bytes = a.leaves * 8 * a.elements**3 * n**3
    dev = jax.devices()[0]
    to_host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    to_dev = jax.sharding.SingleDeviceSharding(dev, memory_kind="device")

    def program(y):
        def fwd(y, _):
            return [x * 1.0000001 for x in y], [jax.device_put(x, to_host) for x in y]

        y, ys = jax.lax.scan(fwd, y, None, length=a.steps)

        def bwd(c, s):
            return c + sum(jnp.sum(jax.device_put(x, to_dev)) for x in s), None

        c, _ = jax.lax.scan(bwd, jnp.zeros(()), ys, reverse=True)
        return c + sum(jnp.sum(x) for x in y)

    t0 = time.perf_counter()
    f = jax.jit(program).lower(y0).compile()
    compile_s = time.perf_counter() - t0
    res = dict(record("host_offload_first_call"),
               case=dict(elements=a.elements, order=a.order, leaves=a.leaves, steps=a.steps, state_bytes=state_bytes,
                         host_bytes=state_bytes * a.steps),
               compile_seconds=compile_s, calls=[])
    for _ in range(a.calls):
        t0 = time.perf_counter()
        v = float(f(y0))
        res["calls"].append(time.perf_counter() - t0)
        print(dict(call=len(res["calls"]), seconds=res["calls"][-1], value=v), flush=True)
        write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
