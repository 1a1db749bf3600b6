import numpy as np
import pytest

from jaxsem import basis


def _moment(k):
    return 2.0 / (k + 1) if k % 2 == 0 else 0.0


@pytest.mark.parametrize("order", range(1, 21))
def test_gll_exact_to_degree_2n_minus_1(order):
    x, w = basis.gll_points(order)
    assert x.shape == w.shape == (order + 1,)
    assert x[0] == -1.0 and x[-1] == 1.0 and np.all(np.diff(x) > 0)
    assert abs(w.sum() - 2.0) < 1e-14
    for k in range(2 * order):
        assert abs(w @ x**k - _moment(k)) < 1e-14, k
    # and not one degree more: P_N^2 (degree 2N) integrates to 2/N instead of 2/(2N+1)
    pn, _ = basis.legendre(order, x)
    assert abs(w @ pn**2 - 2.0 / order) < 1e-13


@pytest.mark.parametrize("q", range(1, 23))
def test_gauss_exact_to_degree_2q_minus_1(q):
    x, w = basis.gauss_points(q)
    assert abs(w.sum() - 2.0) < 1e-14
    for k in range(2 * q):
        assert abs(w @ x**k - _moment(k)) < 2e-15, k
    # P_q vanishes at the nodes, so P_q^2 (degree 2q) integrates to 0, not 2/(2q+1)
    pq, _ = basis.legendre(q, x)
    assert abs(w @ pq**2) < 1e-25


@pytest.mark.parametrize("order", [1, 2, 3, 7, 12, 20])
def test_derivative_matrix_exact_on_monomials(order):
    x, _ = basis.gll_points(order)
    D = basis.derivative_matrix(x)
    for k in range(order + 1):
        exact = k * x ** (k - 1) if k else np.zeros_like(x)
        assert np.max(np.abs(D @ x**k - exact)) < 1e-13 * max(1, order**2)
    assert np.max(np.abs(D.sum(axis=1))) < 1e-12


@pytest.mark.parametrize("order", [1, 4, 9, 15])
def test_interpolation_between_node_sets_is_exact_for_polynomials(order):
    xg, _ = basis.gll_points(order)
    xq, _ = basis.gauss_points(order + 2)
    J = basis.lagrange_matrix(xg, xq)
    Dt = basis.derivative_matrix(xg, xq)
    J2, D2 = basis.interp_matrix(order + 1, order + 2, "gll", "gauss")
    np.testing.assert_array_equal(J, J2)
    np.testing.assert_array_equal(Dt, D2)
    np.testing.assert_allclose(J.sum(axis=1), 1.0, atol=1e-14)
    for k in range(order + 1):
        assert np.max(np.abs(J @ xg**k - xq**k)) < 1e-13
        dk = k * xq ** (k - 1) if k else 0 * xq
        assert np.max(np.abs(Dt @ xg**k - dk)) < 1e-12 * max(1, order**2)
    # at its own nodes the Lagrange matrix is the identity exactly
    np.testing.assert_array_equal(basis.lagrange_matrix(xg, xg), np.eye(order + 1))


def test_cached_results_are_copies():
    x, w = basis.gll_points(4)
    x[:] = 0
    assert basis.gll_points(4)[0][0] == -1.0


@pytest.mark.parametrize("bad", [0, 21, -3])
def test_bad_order_raises_naming_argument(bad):
    with pytest.raises(ValueError, match="order"):
        basis.gll_points(bad)


def test_non_integer_order_raises():
    with pytest.raises(TypeError, match="order"):
        basis.gll_points(2.5)


@pytest.mark.parametrize("q", [23, 24, 32, 48, basis.MAX_GAUSS_POINTS])
def test_long_gauss_rules_exact(q):
    """The error norms of orders 19 and 20 use q = N + 4 = 23, 24 Gauss points: exact moments."""
    x, w = basis.gauss_points(q)
    for k in (0, 2, 10, 2 * q - 2):
        exact = 2.0 / (k + 1)
        assert abs(np.dot(w, x**k) - exact) < 2e-15 * max(1.0, exact)


def test_gauss_points_beyond_max_raises():
    with pytest.raises(ValueError, match="q"):
        basis.gauss_points(basis.MAX_GAUSS_POINTS + 1)
