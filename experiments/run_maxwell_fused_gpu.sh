#!/usr/bin/env bash
# Fused Maxwell right-hand side on one GPU: build, check against einsum, then the NekCEM saturation
# study (chain curl) with the fused kernel (the variants in $MAXWELL_VARIANTS, default 2 3: Maxwell
# has variants 2 and 3 only) and the einsum reference on the same machine. Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python - <<'PY'
import time
from jaxsem.backends import cuda as ck
keys = [("maxwell", "float64", n) for n in (2, 4, 8, 15)]
t = time.time()
ck.build(keys)
print(f"built {len(keys)} libraries in {time.time() - t:.0f} s", flush=True)
PY
python -m pytest tests/test_cuda_kernels.py -q -x -p no:cacheprovider -k "fused_maxwell and ${TEST_K:-fused}" 2>&1 | tail -3
for v in ${MAXWELL_VARIANTS:-2 3}; do
python - "$v" "$OUT" <<'PY'
import os, sys
v, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, "experiments")
from jaxsem.backends import cuda as ck
for n in (8, 15):
    ck.TUNING[("maxwell", n, False, "float64")] = (v, False)
import maxwell_throughput as mt
mt.main(["--orders", "7", "14", "--min-points", os.environ.get("MIN_POINTS", "4000"), "--max-points", "1.7e7",
         "--steps", "50", "--repeats", "3",
         "--backend", "auto", "--out", f"{out}/maxwell_fused_v{v}_h100.json"])
PY
done
[[ -n "${SKIP_EINSUM:-}" ]] || python experiments/maxwell_throughput.py --orders 7 14 --min-points 2e6 --max-points 1.7e7 --steps 50 --repeats 3 \
    --backend einsum --out "$OUT/maxwell_einsum_same_run_h100.json" 2>&1 | tail -4
