#!/usr/bin/env bash
# Multi-GPU scaling batches (BP5, Maxwell, advection), as run on the device
# machine nvidia-h200-x4 (4x H200, Open MPI not CUDA-aware, jax with CUDA; mpi4jax built here from .carry/):
#
#   PART=bp5 bash experiments/run_h200.sh   -> $OUT/h200_bp5.tar.gz   (BP5 p=7, shard P=1,2,4 and MPI P=2,4)
#   PART=bp5_8 / PART=dg_8 bash experiments/run_h200.sh  -> the P = 1 and P = 8 points on nvidia-h200-x8
#   PART=cuda bash experiments/run_h200.sh  -> BP5 p=7 with the CUDA kernels, shard P=1,2 and MPI P=2, and
#                                              tests/mpi/test_distributed.py under mpirun -n 2 (nvidia-h200-x2)
#   PART=dg  bash experiments/run_h200.sh   -> $OUT/h200_dg.tar.gz    (Maxwell N=7 scaling, advection overlap,
#                                                                  mpi4jax host-staging variants)
# Each stage has its own time limit and the results so far are packed on exit, so a slow stage costs
# only itself. Run from a snapshot of the committed tree (SRC, default: this checkout).
set -uo pipefail
PART=${PART:-bp5}
ROOT=$PWD
CARRY=${CARRY:-$ROOT/.carry}
SRC=${SRC:-$ROOT}
cd "$SRC"
export PYTHONUNBUFFERED=1 PYTHONPATH=$SRC NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RES=/tmp/res_$PART; mkdir -p $RES
BUDGET=${BUDGET:-560}   # seconds for all stages of this part
OUT=${OUT:-/tmp/out_$PART}; mkdir -p $OUT
ARCHIVE=h200_$PART.tar.gz
source experiments/stages.sh   # stage(), left(), pack() on exit

PY=${PY:-python3}
MPI=${MPI:-mpirun -n}
ORDER=${ORDER:-7}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tee $RES/gpus.txt
$PY -c "import jax; print(jax.__version__, jax.devices())" | tee -a $RES/log.txt
install() {
  [[ -n ${SKIP_INSTALL:-} ]] && return 0
  python3 -c "import mpi4jax; print('mpi4jax', mpi4jax.__version__, '(already built)')" 2>/dev/null && return 0
  python3 -c "import nanobind" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $CARRY/nanobind-*.whl
  MPI4JAX_BUILD_MPICC=$(which mpicc) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
      --no-cache-dir $CARRY/mpi4jax-*.tar.gz 2>&1 | tail -3
  python3 -c "import mpi4jax; print('mpi4jax', mpi4jax.__version__)"
}
ex() {  # tag, then env assignments: mpi4jax host-staging variants
  local tag=$1; shift
  env "$@" $MPI 2 $PY experiments/exchange_bench.py --backend mpi --tag "$tag" --reps 20 --repeats 3 \
      ${EXSIZES:+--sizes $EXSIZES} --out $RES/exchange_mpi_$tag.json
}
export -f install ex
export RES PY MPI CARRY
S="$PY experiments/scaling.py --order $ORDER --repeats 2"
D="$PY experiments/dg_scaling.py --order $ORDER --repeats 2"

if [[ $PART == bp5_8 ]]; then  # nvidia-h200-x8: P = 1 and 8 on one machine (P = 2, 4 came from PART=bp5)
  stage install 120 install
  STRONG=${STRONG:-16x16x16,32x32x16,64x32x32}; W1=${W1:-32x30x30}; W8=${W8:-128x60x30}
  stage shard_18 260 $S --transport shard --devices 1,8 --sizes $STRONG,$W8 --out $RES/bp5_shard_P18.json
  stage shard_weak1 60 $S --transport shard --devices 1 --sizes $W1 --out $RES/bp5_shard_weak1.json
  stage mpi8 200 $MPI 8 $S --transport mpi --sizes $STRONG,$W8 --out $RES/bp5_mpi_P8.json
  stage shard_4 120 $S --transport shard --devices 4 --sizes $STRONG --out $RES/bp5_shard_P4.json
fi

if [[ $PART == dg_8 ]]; then  # nvidia-h200-x8: Maxwell N = 7 at P = 1 and 8 (weak: 125*15^3 points per GPU)
  stage install 120 install
  MX=${MX:-10x10x8,40x20x8,40x20x20,40x40x20,40x40x40}
  stage mx_shard18 200 $D --model maxwell --transport shard --devices 1,8 --steps 20 --sizes $MX --out $RES/mx_shard_P18.json
  stage mx_mpi8 150 $MPI 8 $D --model maxwell --transport mpi --steps 20 --sizes $MX --out $RES/mx_mpi_P8.json
  stage adv_8 120 $D --model advection --transport shard --devices 1,8 --steps 10 --schedules bulk,overlap \
      --sizes 40x40x40,80x40x40 --out $RES/adv_shard_P18.json
fi

if [[ $PART == bp5 ]]; then
  stage install 120 install
  STRONG=${STRONG:-16x16x16,32x32x16,64x32x32}; W1=${W1:-32x30x30}; W2=${W2:-64x30x30}; W4=${W4:-64x60x30}
  stage shard_strong 200 $S --transport shard --devices 1,2,4 --sizes $STRONG --out $RES/bp5_shard_strong.json
  stage shard_weak1 60 $S --transport shard --devices 1 --sizes $W1 --out $RES/bp5_shard_weak1.json
  stage shard_weak2 70 $S --transport shard --devices 2 --sizes $W2 --out $RES/bp5_shard_weak2.json
  stage shard_weak4 110 $S --transport shard --devices 4 --sizes $W4 --out $RES/bp5_shard_weak4.json
  stage mpi4 150 $MPI 4 $S --transport mpi --sizes $STRONG,$W4 --out $RES/bp5_mpi_P4.json
  stage mpi2 120 $MPI 2 $S --transport mpi --sizes $STRONG,$W2 --out $RES/bp5_mpi_P2.json
  stage shard_fused 150 $S --transport shard --backend auto --devices 1,2,4 --sizes $STRONG --out $RES/bp5_shard_fused.json
fi

if [[ $PART == cuda ]]; then  # nvidia-h200-x2: BP5 p = 7 with the CUDA kernels, shard and MPI, and the MPI tests on GPUs
  stage install 120 install
  # the kernels: $JAXSEM_CUDA_LIB (prebuilt, carried) or built here once, before the ranks start
  stage build 400 $PY -c "'from jaxsem.backends import cuda as ck; print(ck.build())'"
  stage mpi_tests 200 $MPI 2 bash -c "'$PY -m pytest -q -x -p no:cacheprovider tests/mpi/test_distributed.py \
      > $RES/mpi_tests_rank\$OMPI_COMM_WORLD_RANK.txt 2>&1'"
  stage cli_mpi2 90 $MPI 2 $PY -m jaxsem solve poisson --order 7 --elements 16 16 16 --json \> $RES/cli_mpi2.json
  STRONG=${STRONG:-32x32x16}; W1=${W1:-32x30x30}; W2=${W2:-64x30x30}
  stage shard_12 150 $S --backend cuda --transport shard --devices 1,2 --sizes $W1,$STRONG,$W2 --out $RES/bp5_cuda_shard_P12.json
  stage mpi2 120 $MPI 2 $S --backend cuda --transport mpi --sizes $STRONG,$W2 --out $RES/bp5_cuda_mpi_P2.json
fi

if [[ $PART == dg ]]; then
  stage install 120 install
  ADV=${ADV:-40x40x40}
  stage adv_shard 150 $D --model advection --transport shard --devices 1,2 --steps 10 --schedules bulk,overlap \
      --sizes $ADV --out $RES/adv_shard.json
  stage adv_shard_lhs 90 env XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true $D --model advection \
      --transport shard --devices 2 --steps 10 --schedules bulk,overlap --sizes $ADV --out $RES/adv_shard_lhs.json
  stage adv_mpi2 120 $MPI 2 $D --model advection --transport mpi --steps 10 --schedules bulk,overlap \
      --sizes $ADV --out $RES/adv_mpi_P2.json
  MX=${MX:-10x10x8,20x10x8,20x20x8,40x20x20,40x40x20}
  stage mx_shard 150 $D --model maxwell --transport shard --devices 1,2,4 --steps 20 --sizes $MX --out $RES/mx_shard.json
  stage mx_mpi4 100 $MPI 4 $D --model maxwell --transport mpi --steps 20 --sizes $MX --out $RES/mx_mpi_P4.json
  stage ex_default 40 ex default
  stage ex_glibc_env 40 ex glibc_env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824
  stage ex_mallopt 40 ex mallopt JAXSEM_MALLOPT=1
  stage ex_split 40 ex split8M JAXSEM_MAX_MESSAGE_BYTES=8388608
  stage ex_mallopt_split 40 ex mallopt_split8M JAXSEM_MALLOPT=1 JAXSEM_MAX_MESSAGE_BYTES=8388608
fi
