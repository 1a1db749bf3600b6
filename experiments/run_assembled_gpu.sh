#!/usr/bin/env bash
# Assembled-storage BP5 on one GPU: build the kernels the run needs, check the fused
# assembled kernel against einsum, sweep its variants at p = 7, then BP5 (and BP3) with
# assembled and E-vector storage across orders. Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python - <<'PY'
import time
from jaxsem.backends import cuda as ck
keys = ([("bk5a", "float64", n) for n in (2, 4, 6, 8, 10, 12, 13, 16)] + [("bk5", "float64", n) for n in (4, 6, 8, 10, 12, 16)]
        + [("mass", "float64", 6), ("stiffness", "float64", 6), ("stiffness", "float64", 8), ("gs", "float64", None)])
t = time.time()
ck.build(keys)
print(f"built {len(keys)} libraries in {time.time() - t:.0f} s", flush=True)
PY
python -m pytest tests/test_cuda_kernels.py tests/test_assembled.py -q -x -p no:cacheprovider \
    -k "assembled or solve_with" 2>&1 | tail -4
python experiments/bakeoff.py --problems bp5 --backend auto --storage auto --orders 7 --target-points 1.12e7 \
    --bk5a-variants "${VARIANTS:-2,4,5,6,7,2p,6p}" --repeats 6 --out "$OUT/bk5a_variants_p7_h100.json"
python experiments/bakeoff.py --problems bp5 --backend auto --storage auto,local --orders "${ORDERS:-3,5,7,9,11,15}" \
    --target-points 1.12e7 --repeats 6 --out "$OUT/bp5_assembled_h100.json"
