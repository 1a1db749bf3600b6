#!/usr/bin/env bash
# Fused DG advection right-hand side on one GPU: build, check against einsum (every form, flux and
# variant; the gradient through integrate), then the throughput (split form, upwind) at N = 7 up
# to 32³ elements and N = 14 up to 16³ with the fused kernel (the variants in $ADVECTION_VARIANTS,
# default 2 3) and the einsum reference on the same machine. Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python - <<'PY'
import time
from jaxsem.backends import cuda as ck
keys = [("advection", "float64", n) for n in (2, 4, 8, 15)]
t = time.time()
ck.build(keys)
print(f"built {len(keys)} libraries in {time.time() - t:.0f} s", flush=True)
PY
python -m pytest tests/test_cuda_kernels.py -q -x -p no:cacheprovider -k "fused_advection or advection_rhs_cuda" 2>&1 | tail -15
for v in ${ADVECTION_VARIANTS:-2 3}; do
python - "$v" "$OUT" <<'PY'
import os, sys
v, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, "experiments")
from jaxsem.backends import cuda as ck
for n in (8, 15):
    ck.TUNING[("advection", n, False, "float64")] = (v, False)
import advection_throughput as at
at.main(["--orders", "7", "14", "--min-points", os.environ.get("MIN_POINTS", "4000"), "--max-points", "1.7e7",
         "--steps", "50", "--repeats", "3", "--backend", "auto", "--out", f"{out}/advection_fused_v{v}.json"])
PY
done
[[ -n "${SKIP_EINSUM:-}" ]] || python experiments/advection_throughput.py --orders 7 14 --min-points 2e6 --max-points 1.7e7 \
    --steps 50 --repeats 3 --backend einsum --out "$OUT/advection_einsum_same_run.json" 2>&1 | tail -8
