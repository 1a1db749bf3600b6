#!/usr/bin/env bash
# The speed targets of one GPU in one batch (device machine, one H100), results under $OUT:
#   bash experiments/run_speed_targets.sh
#   1. builds the libraries it needs, runs the CUDA tests of the DG right-hand sides
#   2. SEDG Maxwell and DG advection throughput, N = 7 (32^3 elements) and N = 14 (16^3)
#   3. gradient / forward time of LSERK4 Maxwell (8^3 elements, N = 7, 100 steps)
#   4. BP3 and BP5 (100 Jacobi-PCG iterations, p = 7, 11.2 M points), assembled and E-vectors
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAXSEM_CUDA_CACHE=${JAXSEM_CUDA_CACHE:-$PWD/build/kcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python - <<'PY'
import time
from jaxsem.backends import cuda as ck
keys = [(op, "float64", n) for op in ("maxwell", "maxwellm", "advection") for n in (2, 4, 8, 15)]
keys += [(op, "float64", 8) for op in ("bk5", "bk5a", "stiffness", "stiffnessa", "mass")] + [("gs", "float64", None)]
t = time.time(); ck.build(keys, verbose=False); print(f"built {len(keys)} libraries in {time.time() - t:.0f} s")
PY
timeout 240 python -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider \
  -k "fused_maxwell or material_adjoint or fused_advection or advection_rhs_cuda or tuning_table" 2>&1 \
  | tail -3 | tee "$OUT/tests.txt"
for m in maxwell advection; do
  timeout 150 python experiments/${m}_throughput.py --orders 7 14 --min-points 1.3e7 --max-points 1.7e7 \
    --steps 50 --repeats 3 --backend auto --out "$OUT/${m}_throughput.json" 2>&1 | grep -v -i warn | tail -4
done
timeout 120 python experiments/gradient_cost.py --maxwell-elements 8 --maxwell-order 7 --steps 100 \
  --skip pcg memory --out "$OUT/gradient_cost" 2>&1 | grep ratio
timeout 150 python experiments/bakeoff.py --problems bp3,bp5 --backend auto --storage auto,local --orders 7 \
  --target-points 1.12e7 --repeats 6 --out "$OUT/bp3_bp5.json" 2>&1 | grep -v -i warn | tail -8
