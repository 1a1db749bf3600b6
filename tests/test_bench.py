"""Bake-off benchmark helpers: result dicts, DOF counting, bandwidth model (no timing asserts)."""

import pytest

from jaxsem.app import bench

ORDER, ELEMENTS = 2, (1, 1, 2)
POINTS = 2 * ORDER**3


def _common(r, problem, components):
    assert r["problem"] == problem
    assert r["order"] == ORDER and r["elements"] == list(ELEMENTS) and r["num_elements"] == 2
    assert r["components"] == components
    assert r["points"] == POINTS and r["dofs"] == components * POINTS
    assert r["seconds"] > 0 and r["seconds_min"] > 0 and len(r["times"]) == r["repeats"]
    assert r["seconds_min"] <= r["seconds"]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_bench_bk(k):
    r = bench.bench_bk(k, ORDER, ELEMENTS, repeats=2)
    _common(r, f"bk{k}", 3 if k % 2 == 0 else 1)
    assert r["iterations"] == 1
    assert r["dofs_per_second"] == r["dofs"] / r["seconds"]
    assert r["bytes_per_dof"] == bench.bytes_per_dof(f"bk{k}", ORDER)
    assert r["bytes_per_second"] == pytest.approx(r["dofs_per_second"] * r["bytes_per_dof"])
    assert "percent_of_ceiling" not in r


@pytest.mark.parametrize("k", [2, 5])
def test_bench_bp(k):
    r = bench.bench_bp(k, ORDER, ELEMENTS, iterations=4, repeats=2, bandwidth=1e11)
    _common(r, f"bp{k}", 3 if k == 2 else 1)
    assert r["iterations"] == 4 and r["converged"] is None
    assert r["dofs_per_second"] == r["dofs"] * r["iterations"] / r["seconds"]
    assert 0 <= r["residual_reduction"] < 1
    assert r["ceiling_dofs_per_second"] == pytest.approx(1e11 / r["bytes_per_dof"])
    assert r["percent_of_ceiling"] == pytest.approx(100 * r["dofs_per_second"] / r["ceiling_dofs_per_second"])


def test_cuda_kernel_record():
    """Rows of the CUDA kernels name the variant and L2 prefetch the defaults chose; others
    carry neither key (on a CPU bench_bk runs einsum)."""
    import jax.numpy as jnp

    from jaxsem.backends import cuda as ck
    from jaxsem.operators.bk import BK_SPECS

    u1, u3 = jnp.zeros((4, 8, 8, 8)), jnp.zeros((3, 4, 8, 8, 8))
    keys = ("cuda_variant", "cuda_prefetch", "cuda_op")
    assert bench.kernel_record(BK_SPECS[1], "cuda", u1) == dict(zip(keys, ck.defaults("mass", u1) + ("mass",)))
    assert bench.kernel_record(BK_SPECS[6], "cuda", u3) == dict(
        zip(keys, ck.TUNING["bk5", 8, True, "float64"] + ("bk5",)))
    # BP5/BP6 in assembled storage run the fused kernel: its own table row
    assert bench.kernel_record(BK_SPECS[6], "cuda", u3, assembled=True) == dict(
        zip(keys, ck.TUNING["bk5a", 8, True, "float64"] + ("bk5a",)))
    # BP3/BP4 likewise (stiffnessa); BP1/BP2's mass has no assembled kernel
    assert bench.kernel_record(BK_SPECS[3], "cuda", u1, assembled=True) == dict(
        zip(keys, ck.TUNING["stiffnessa", 8, False, "float64"] + ("stiffnessa",)))
    assert bench.kernel_record(BK_SPECS[1], "cuda", u1, assembled=True)["cuda_op"] == "mass"
    assert bench.kernel_record(BK_SPECS[3], "cuda", u1)["cuda_prefetch"] is True  # BK3 p = 7: on
    assert bench.kernel_record(BK_SPECS[5], "einsum", u1) == {}
    r = bench.bench_bk(1, ORDER, ELEMENTS, repeats=1, backend="einsum")
    assert "cuda_variant" not in r and "cuda_prefetch" not in r


def test_bench_dispatch_and_float32():
    r = bench.bench("BP3", ORDER, ELEMENTS, iterations=2, repeats=1, dtype="float32")
    assert r["problem"] == "bp3" and r["dtype"] == "float32" and r["iterations"] == 2
    assert r["storage"] == "assembled"  # one device
    assert r["bytes_per_dof"] == pytest.approx(bench.bytes_per_dof("bp3", ORDER, "float64", "assembled") / 2)


def test_bytes_per_dof_assembled_model():
    """Assembled BP5 at p = 7: 6.5 words per local node (G and the int32 map) and 16 per global
    node (3 for the operator's vectors, 13 for PCG's): 205.6 B/DOF against 298.5 with E-vectors."""
    assert bench.bytes_per_dof("bp5", 7, storage="assembled") == pytest.approx(8 * (6.5 * 512 + 16 * 343) / 343)
    assert bench.bytes_per_dof("bp5", 7, storage="assembled") == pytest.approx(205.6, abs=0.05)
    # three components share G and the map
    assert bench.bytes_per_dof("bp6", 7, storage="assembled") == pytest.approx(8 * (6.5 * 512 + 44 * 343) / (3 * 343))
    assert bench.bytes_per_dof("bk5", 7, storage="assembled") == bench.bytes_per_dof("bk5", 7)  # BKs have none
    with pytest.raises(ValueError, match="storage must be one of"):
        bench.bytes_per_dof("bp5", 7, storage="global")


def test_bytes_per_dof_model():
    # SEEDS.md §1: BK5 at p = 7 in FP64 reads u and 6 factors and writes w: 95.5 B/DOF.
    assert bench.bytes_per_dof("bk5", 7) == pytest.approx(8 * 8 * 8**3 / 7**3)
    assert bench.bytes_per_dof("bk5", 7) == pytest.approx(95.5, abs=0.05)
    # The vector kernel shares the geometric factors among its 3 components.
    assert bench.bytes_per_dof("bk6", 7) == pytest.approx(12 * 8 * 8**3 / (3 * 7**3))
    # Gauss q = p + 2: B or G live on (p + 2)^3 points.
    assert bench.bytes_per_dof("bk1", 3) == pytest.approx((2 * 64 + 125) * 8 / 27)
    # A PCG iteration adds 12c + 5 words per node.
    assert bench.bytes_per_dof("bp5", 7) == pytest.approx((8 + 17) * 8 * 8**3 / 7**3)
    assert bench.count_dofs(3, 7, (2, 3, 4)) == (24 * 343, 3 * 24 * 343)


def test_measure_bandwidth_and_device_info():
    assert bench.measure_bandwidth(nbytes=2**20, repeats=2) > 0
    d = bench.device_info()
    assert {"platform", "device_kind", "num_devices", "jax_version"} <= set(d)
    assert d["num_devices"] >= 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: bench.bench_bk(7, 2, 1),
        lambda: bench.bench_bk(1, 0, 1),
        lambda: bench.bench_bk(1, 2, (1, 0, 1)),
        lambda: bench.bench_bk(1, 2, 1, repeats=0),
        lambda: bench.bench_bp(5, 2, 1, iterations=0),
        lambda: bench.bench_bp(5, 2, 1, dtype="int32"),
        lambda: bench.bench_bp(5, 2, 1, bandwidth=-1.0),
        lambda: bench.bench("bq5", 2, 1),
        lambda: bench.bytes_per_dof("bk5", 7, "float16"),
    ],
)
def test_bad_arguments_raise(call):
    with pytest.raises(ValueError):
        call()


def test_bp_time_to_solution():
    """bench bp reports the p-multigrid time to solution beside the fixed iterations (tol 0 skips it)."""
    r = bench.bench_bp(5, 3, (3, 2, 2), iterations=3, repeats=1, backend="einsum", tol=1e-8)
    assert r["tts_converged"] and r["tts_tol"] == 1e-8 and r["tts_pmg_orders"] == [3, 2, 1]
    assert 0 < r["tts_iterations"] < r["tts_jacobi_iterations"] and r["tts_seconds"] > 0
    assert "tts_seconds" not in bench.bench_bp(5, 3, (2, 2, 2), iterations=3, repeats=1, backend="einsum", tol=0)
    with pytest.raises(ValueError, match="tol"):
        bench.bench_bp(5, 3, (2, 2, 2), iterations=3, repeats=1, tol=2.0)
