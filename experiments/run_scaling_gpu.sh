#!/usr/bin/env bash
# The 2-GPU measurements of the distributed issue, as run on the device machine
# (nvidia-h200-x2: Open MPI 4.1.6, not CUDA-aware; jax 0.11.2 with CUDA):
#   run with carry [".carry"] where .carry/ holds the mpi4jax sdist (and a nanobind wheel):
#   bash experiments/run_scaling_gpu.sh            -> $OUT/scaling_results.tar.gz
# Sizes: SIZES (strong sweep) and WEAK1/WEAK2 (10 M DOFs per GPU at p = 7).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RES=/tmp/res; mkdir -p $RES
ORDER=${ORDER:-7}
SIZES=${SIZES:-8x8x8,16x8x8,16x16x8,16x16x16,32x16x16,32x32x16}
WEAK1=${WEAK1:-32x30x30}
WEAK2=${WEAK2:-64x30x30}
STAGES=${STAGES:-install,exchange,mpi1,mpi2,shard1,shard2}
# run 1 (2026-11-22): STAGES=install,exchange,mpi1,mpi2; run 2: STAGES=install,mallopt,mpi2,shard2

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ $STAGES == *install* ]]; then
  python3 -c "import nanobind" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .carry/nanobind-*.whl
  MPI4JAX_BUILD_MPICC=$(which mpicc) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
      --no-cache-dir .carry/mpi4jax-*.tar.gz 2>&1 | tail -3
  python3 -c "import mpi4jax; print('mpi4jax', mpi4jax.__version__)"
  ompi_info 2>/dev/null | grep -E "MCA (btl|pml)" | head -12
fi

ex() {  # tag, then env assignments
  local tag=$1; shift
  env "$@" mpirun -n 2 python3 experiments/exchange_bench.py --backend mpi --tag "$tag" --reps 20 --repeats 3 \
      --out $RES/exchange_mpi_$tag.json || echo "exchange variant $tag failed"
}
if [[ $STAGES == *mallopt* ]]; then  # run 2: host-staging fix (jaxsem.parallel.comm mallopt + message splitting) on/off
  ex mallopt_on
  ex mallopt_off JAXSEM_MALLOPT=0
fi
if [[ $STAGES == *exchange* ]]; then
  ex default
  ex ob1_vader OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
  ex ob1_vader_nocma OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  ex ob1_tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp
  ex ucx_sm OMPI_MCA_pml=ucx UCX_TLS=sm,self
  ex host_only_cpu JAX_PLATFORMS=cpu
  python3 experiments/exchange_bench.py --backend shard --reps 20 --repeats 3 --out $RES/exchange_shard.json
fi

if [[ $STAGES == *mpi1* ]]; then
  mpirun -n 1 python3 experiments/scaling.py --backend mpi --order $ORDER --sizes $SIZES,$WEAK1 --out $RES/scaling_mpi_P1.json
fi
if [[ $STAGES == *mpi2* ]]; then
  mpirun -n 2 python3 experiments/scaling.py --backend mpi --order $ORDER --sizes $SIZES,$WEAK1,$WEAK2 --out $RES/scaling_mpi_P2.json
fi
if [[ $STAGES == *shard1* ]]; then
  python3 experiments/scaling.py --backend shard --devices 1 --order $ORDER --sizes $SIZES,$WEAK1 --out $RES/scaling_shard_P1.json
fi
if [[ $STAGES == *shard2* ]]; then
  python3 experiments/scaling.py --backend shard --devices 2 --order $ORDER --sizes $SIZES,$WEAK1,$WEAK2 --out $RES/scaling_shard_P2.json
fi
tar -czf $OUT/scaling_results.tar.gz -C $RES .
ls -la $RES
