#!/usr/bin/env bash
# CUDA kernel variants (csrc/sem_kernels.cu, 2-7) on one H100: check against einsum, then time
# BK1-BK6 at p = 7 and BK5/BK1/BK3 across orders. As run on the device machine nvidia-h100-x1:
#   SRC=$PWD/.snap [LIB=folder of prebuilt sem_{op}_{dt}.so] bash .snap/experiments/run_cuda_variants.sh
# Writes $OUT/${TAG}_{p7,orders}_h100.json (+ PNGs), TAG=cuda_variants unless set.
set -uo pipefail
cd "${SRC:-$PWD}"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ -n "${LIB:-}" ]; then export JAXSEM_CUDA_LIB=$LIB; fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
IMPLS=${IMPLS:-cuda2,cuda3,cuda4,cuda5,cuda6,cuda7}
cd experiments
timeout ${P7_S:-200} python3 cuda_kernels.py --check-orders ${CHECK:-1,2,7,9,15} --orders 7 \
    --problems ${P7_PROBLEMS:-bk1,bk2,bk3,bk4,bk5,bk6} --impls "$IMPLS" --out "$OUT/${TAG:-cuda_variants}_p7_h100.json"
timeout ${ORD_S:-260} python3 cuda_kernels.py --check-orders 3 --orders ${ORDERS:-3-15} \
    --problems ${ORD_PROBLEMS:-bk5,bk1,bk3} --impls "${ORD_IMPLS:-$IMPLS}" --budget-seconds $(( ${ORD_S:-260} - 20 )) \
    --out "$OUT/${TAG:-cuda_variants}_orders_h100.json"
