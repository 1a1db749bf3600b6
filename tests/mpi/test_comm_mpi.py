"""jaxsem.parallel.comm under mpirun -n 2 and -n 4: numbers checked against closed forms and NumPy.

Each test performs all its collective calls first and asserts afterwards (see conftest).
"""

import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsem.parallel.comm import allreduce_sum, sendrecv


def test_world_is_really_distributed(comm):
    """The fixture already compared size with the launcher; ranks must be distinct too."""
    ranks = allreduce_sum(jnp.zeros(comm.size).at[comm.rank].set(1.0), comm)
    assert comm.distributed == (comm.size > 1)
    np.testing.assert_array_equal(np.asarray(ranks), np.ones(comm.size))
    if comm.size > 1:
        assert "mpi4jax" in sys.modules


def test_exactly_one_lead_rank(comm):
    leads = float(allreduce_sum(jnp.asarray(float(comm.lead)), comm))
    assert leads == 1.0 and comm.lead == (comm.rank == 0)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.int32])
def test_allreduce_sum_jit_closed_form(comm, dtype):
    r, p = comm.rank, comm.size

    @jax.jit
    def f(x):
        return allreduce_sum(x, comm)

    i = jnp.arange(6, dtype=dtype).reshape(2, 3)
    out = f((r + 1) * i + r * r)
    # sum_r (r + 1) = p(p+1)/2, sum_r r^2 = (p-1)p(2p-1)/6
    expected = (p * (p + 1) // 2) * np.arange(6).reshape(2, 3) + (p - 1) * p * (2 * p - 1) // 6
    assert out.dtype == dtype and out.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(out), expected.astype(dtype))


def test_allreduce_sum_in_while_loop(comm):
    """A while_loop whose trip count depends on a global sum (as in a Krylov solver)."""
    r, p = comm.rank, comm.size

    @jax.jit
    def run(x):
        def cond(state):
            k, total = state
            return total < 10.0 * p * (p + 1) / 2  # global, so identical on all ranks

        def body(state):
            k, total = state
            return k + 1, total + allreduce_sum(x, comm)

        return jax.lax.while_loop(cond, body, (0, jnp.zeros((), x.dtype)))

    k, total = run(jnp.asarray(r + 1.0))
    assert int(k) == 10
    assert float(total) == 10.0 * p * (p + 1) / 2


def test_weighted_dot_matches_serial(comm):
    """Dot product of a vector split into contiguous blocks that share their end points.

    As for SEM shared nodes, each rank holds global indices [lo, hi] inclusive and
    neighbouring blocks overlap in one point; weighting by inverse multiplicity makes
    each global point count once.
    """
    r, p = comm.rank, comm.size
    n = 1001
    rng = np.random.default_rng(1234)  # the same global data on every rank
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    cuts = np.linspace(0, n - 1, p + 1).round().astype(int)
    lo, hi = cuts[r], cuts[r + 1]
    mult = np.ones(n)
    mult[cuts[1:-1]] = 2.0
    w = 1.0 / mult[lo : hi + 1]

    @jax.jit
    def wdot(xl, yl, wl):
        return allreduce_sum(jnp.sum(wl * xl * yl), comm)

    got = float(wdot(x[lo : hi + 1], y[lo : hi + 1], w))
    serial = float(np.dot(x, y))
    exact = math.fsum(x * y)
    assert abs(exact) > 1.0  # the data set is not a near-cancelling one
    assert abs(got - serial) <= 1e-14 * abs(serial)
    assert abs(got - exact) <= 1e-14 * abs(exact)


def test_grad_through_allreduce_sum(comm):
    """L = sum_r f_r(x_r), f_r(x) = (r+1)/2 |x|^2 + c_r.x  =>  dL/dx_r = (r+1) x_r + c_r."""
    r, p = comm.rank, comm.size
    x = jnp.linspace(-1.0, 2.0, 5) + r
    c = jnp.arange(5.0) * (r - 1.5)

    def loss(x):
        local = 0.5 * (r + 1) * jnp.sum(x * x) + jnp.dot(c, x)
        return allreduce_sum(local, comm)

    value, grad = jax.jit(jax.value_and_grad(loss))(x)

    # a nonlinearity after the reduction: L2 = (sum_r sum(x_r))^2, dL2/dx_r = 2 S on every entry
    loss2 = lambda x: allreduce_sum(jnp.sum(x), comm) ** 2  # noqa: E731
    grad2 = jax.jit(jax.grad(loss2))(x)

    expected_value = sum(
        0.5 * (q + 1) * np.sum((np.linspace(-1.0, 2.0, 5) + q) ** 2)
        + np.dot(np.arange(5.0) * (q - 1.5), np.linspace(-1.0, 2.0, 5) + q)
        for q in range(p)
    )
    s = sum(np.sum(np.linspace(-1.0, 2.0, 5) + q) for q in range(p))
    np.testing.assert_allclose(float(value), expected_value, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(grad), (r + 1) * np.asarray(x) + np.asarray(c), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(grad2), np.full(5, 2.0 * s), rtol=1e-14)


def test_sendrecv_ring_shift(comm):
    r, p = comm.rank, comm.size
    right, left = (r + 1) % p, (r - 1) % p

    @jax.jit
    def shift(x):
        return sendrecv(x, x, source=left, dest=right, comm=comm)

    @jax.jit
    def shift_p_times(x):  # p shifts bring every block home
        return jax.lax.fori_loop(0, p, lambda k, v: shift(v), x)

    x = 10.0 * r + jnp.arange(4.0)
    once = shift(x)
    around = shift_p_times(x)
    template = jax.ShapeDtypeStruct((3,), jnp.int32)
    ints = jax.jit(lambda v: sendrecv(v, template, left, right, comm))(jnp.full(3, r, jnp.int32))

    np.testing.assert_array_equal(np.asarray(once), 10.0 * left + np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(around), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(ints), np.full(3, left))


def test_grad_through_sendrecv(comm):
    """L = sum_r w_r . shift(x)_r with shift(x)_r = x_{r-1}  =>  dL/dx_r = w_{r+1}."""
    r, p = comm.rank, comm.size
    right, left = (r + 1) % p, (r - 1) % p
    w = jnp.arange(3.0) + 100.0 * r

    def loss(x):
        received = sendrecv(x, x, source=left, dest=right, comm=comm)
        return allreduce_sum(jnp.dot(w, received), comm)

    grad = jax.jit(jax.grad(loss))(jnp.ones(3) * r)
    np.testing.assert_allclose(np.asarray(grad), np.arange(3.0) + 100.0 * right, rtol=1e-15)
