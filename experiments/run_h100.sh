#!/usr/bin/env bash
# One H100 batch (issues 5 and 6), as run on the device machine nvidia-h100-x1:
#   SRC=$PWD/.snap bash .snap/experiments/run_h100.sh   -> $OUT/h100.tar.gz
# Stages in priority order, each with a time limit; results so far are packed on exit.
#   1. roofline.py: BK1-BK6 / BP1-BP6, einsum vs fused, p sweep and n sweep, BP5 t0/R fit
#   2. gradient_cost.py: time(grad)/time(forward) for PCG and LSERK4 Maxwell, memory vs steps
#   3. jaxsem bench bk5 / bp5 --impl fused at the bake-off's default config (E = 31^3 question)
set -uo pipefail
ROOT=$PWD
SRC=${SRC:-$ROOT}
cd "$SRC"
export PYTHONUNBUFFERED=1 PYTHONPATH=$SRC
RES=/tmp/res_h100; mkdir -p $RES
OUT=${OUT:-/tmp/out_h100}; mkdir -p $OUT
BUDGET=${BUDGET:-570}
ARCHIVE=h100.tar.gz
source experiments/stages.sh   # stage(), left(), pack() on exit
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | tee $RES/gpu.txt
$PY -c "import jax; print(jax.__version__, jax.devices())" | tee -a $RES/log.txt

stage roofline ${ROOF_S:-330} $PY experiments/roofline.py --orders 1-15 --sizes 1e5,1e6,4e6,1.6e7 \
    --budget-seconds $(( ${ROOF_S:-330} - 30 )) ${ROOF_ARGS:-} --out $RES/roofline_h100.json
stage gradient_cost ${GRAD_S:-150} $PY experiments/gradient_cost.py ${GRAD_ARGS:---poisson-elements 16 \
    --poisson-order 7 --maxwell-elements 8 --maxwell-order 7 --steps 100 --memory-steps 16 64 256 1024} \
    --out $RES/gradient_cost_h100 --plot
stage bench_cfg ${BENCH_S:-60} "$PY -m jaxsem bench bk5 --order 7 --elements ${CFG:-31 31 31} --impl fused --bandwidth measure --json; \
    $PY -m jaxsem bench bp5 --order 7 --elements ${CFG:-31 31 31} --impl fused --json"
