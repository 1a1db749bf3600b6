#!/usr/bin/env bash
# Assembled-storage BPs on one GPU: build the kernels the run needs, check the fused assembled
# kernels (bk5a: BP5/BP6, stiffnessa: BP3/BP4) against einsum, sweep their variants at p = 7,
# then the BPs with assembled and E-vector storage across orders. Results under $OUT.
#   STAGES=build,check,bk5a,bp5,stiffnessa,bp3,bp4 (default: all)   ORDERS=3,5,7,9,11,15
set -uo pipefail
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
STAGES=${STAGES:-build,check,bk5a,bp5,stiffnessa,bp3,bp4}
ORDERS=${ORDERS:-3,5,7,9,11,15}
TAG=${TAG:-h100}
mkdir -p "$OUT"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if has build; then
    python - <<'PY'
import time
from jaxsem.backends import cuda as ck
ns = (2, 4, 6, 8, 10, 12, 13, 16)
keys = ([(op, "float64", n) for op in ("bk5a", "stiffnessa", "bk5", "stiffness") for n in ns]
        + [("mass", "float64", 6), ("gs", "float64", None)])
t = time.time()
ck.build(keys)
print(f"built {len(keys)} libraries in {time.time() - t:.0f} s", flush=True)
PY
fi
if has check; then
    python -m pytest tests/test_cuda_kernels.py tests/test_assembled.py -q -x -p no:cacheprovider \
        -k "assembled or solve_with or table" 2>&1 | tail -4
fi
bake() { python experiments/bakeoff.py --backend auto --target-points 1.12e7 --repeats 6 "$@"; }
has bk5a && bake --problems bp5 --storage auto --orders 7 --assembled-variants "${VARIANTS:-2,4,5,6,7,2p,6p}" \
    --out "$OUT/bk5a_variants_p7_$TAG.json"
has bp5 && bake --problems bp5 --storage auto,local --orders "$ORDERS" --out "$OUT/bp5_assembled_$TAG.json"
has stiffnessa && bake --problems bp3 --storage auto --orders 7 --assembled-variants "${VARIANTS_BK3:-8,9,11,8p,9p,11p}" \
    --out "$OUT/stiffnessa_variants_p7_$TAG.json"
has bp3 && bake --problems bp3 --storage auto,local --orders "$ORDERS" --out "$OUT/bp3_assembled_$TAG.json"
has bp4 && bake --problems bp4 --storage auto,local --orders 7 --out "$OUT/bp4_assembled_p7_$TAG.json"
true
