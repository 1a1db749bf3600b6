#!/usr/bin/env bash
# Several-GPU measurements (issue: multi-GPU runs), as run on the device machine (one host,
# Open MPI 4.1.6 (not CUDA-aware), jax with CUDA). Run with carry [".carry"], .carry/ holding
# the mpi4jax sdist and a nanobind wheel:
#   STAGES=install,check,bp5 bash experiments/run_scaling_gpu.sh      -> JSON files under $OUT
# Stages: install (mpi4jax), check (sharded and MPI runs equal serial, CUDA kernels inside),
# bp5 (shard P = 1..NGPU), bp5mpi (mpi4jax, one process per GPU), bp5dist (jax.distributed, one
# process per GPU), collective (ppermute rounds against one all_to_all), pmg (time to solution), tgv
# (Taylor–Green step time), tgvdist and tgvmpi (the same under jax.distributed and mpi4jax, one
# process per GPU), tgvlong (Taylor–Green to t = 20 on all GPUs), checkdg (the fused DG kernels
# distributed, shard and mpirun, equal serial), dg (Maxwell and advection steps, P = DEVS, for
# each backend in DG_BACKENDS).
# Sizes at p = 7: WEAK1 ≈ 10 M DOFs (one GPU's share), WEAK2 its double, STRONG 22.5 M DOFs.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export JAX_COMPILATION_CACHE_DIR=/tmp/xla-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
OUT=${OUT:-/tmp/out}
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
DEVS=${DEVS:-$(seq -s, 1 "$NGPU")}
WEAK1=${WEAK1:-32x30x30} WEAK2=${WEAK2:-64x30x30} STRONG=${STRONG:-64x32x32}
STAGES=${STAGES:-install,check,bp5}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
stage() { [[ ",$STAGES," == *",$1,"* ]]; }

if stage install; then
  python3 -c "import nanobind" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .carry/nanobind-*.whl
  MPI4JAX_BUILD_MPICC=$(which mpicc) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
      --no-cache-dir .carry/mpi4jax-*.tar.gz 2>&1 | tail -3
  python3 -c "import mpi4jax; print('mpi4jax', mpi4jax.__version__)"
fi
if stage check; then  # the fused kernels inside shard_map and under mpirun: equal to serial
  (cd tests && JAX_PLATFORMS=cuda timeout 300 python3 shard_check.py "$NGPU" | tail -c 3000) \
      > "$OUT/shard_check_gpu.txt" 2>&1; tail -c 600 "$OUT/shard_check_gpu.txt"
  timeout 300 mpirun -n "$NGPU" python3 -m pytest -q -p no:cacheprovider tests/mpi/test_distributed.py \
      -k "pcg_solve or gradient or fixed" 2>&1 | tail -3
fi
if stage checka2a; then  # the all_to_all exchange through NCCL equals the rounds and serial
  (cd tests && JAX_PLATFORMS=cuda timeout 150 python3 -c "import json, shard_check as sc; sc.check_all_to_all($NGPU); \
      print('RESULT', json.dumps(sc.RESULTS)); print('FAILED', sc.FAILED)") > "$OUT/a2a_check_gpu.txt" 2>&1
  tail -c 400 "$OUT/a2a_check_gpu.txt"
fi
if stage checkdg; then  # the fused DG kernels distributed (shard and mpirun) equal serial
  (cd tests && JAX_PLATFORMS=cuda timeout 240 python3 -c "import json, shard_check as sc; sc.check_dg($NGPU); \
      print('RESULT', json.dumps(sc.RESULTS)); print('FAILED', sc.FAILED)") > "$OUT/dg_check_gpu.txt" 2>&1
  tail -c 900 "$OUT/dg_check_gpu.txt"
  timeout 240 mpirun -n "$NGPU" python3 -m pytest -q -p no:cacheprovider tests/mpi/test_maxwell_mpi.py -k fused_path \
      2>&1 | tail -3
fi
if stage dg; then  # Maxwell and advection LSERK4 steps over the GPUs, fused kernels and einsum
  for m in ${DG_MODELS:-maxwell advection}; do for b in ${DG_BACKENDS:-auto einsum}; do
    python3 experiments/dg_scaling.py --model "$m" --transport shard --devices "$DEVS" --order 7 --repeats 2 \
        --steps 10 --sizes "${DG_SIZES:-32x32x32}" --backend "$b" --out "$OUT/dg_${m}_${b}.json"
  done; done
fi
if stage bp5; then
  python3 experiments/scaling.py --transport shard --devices "$DEVS" --order 7 --repeats 3 \
      --sizes "$WEAK1,$WEAK2,$STRONG" --out "$OUT/bp5_shard.json"
fi
if stage bp5mpi; then
  mpirun -n "$NGPU" python3 experiments/scaling.py --transport mpi --order 7 --repeats 3 \
      --sizes "$WEAK2,$STRONG" --out "$OUT/bp5_mpi.json"
fi
if stage bp5dist; then
  mpirun -n "$NGPU" python3 experiments/scaling.py --transport shard --devices "$NGPU" --order 7 --repeats 3 \
      --sizes "$WEAK2,$STRONG" --out "$OUT/bp5_dist.json"
fi
if stage pmg; then
  python3 experiments/pmg_scaling.py --devices "$DEVS" --order 7 --repeats 2 --sizes "${PMG_SIZES:-$STRONG}" \
      --out "$OUT/pmg_shard.json"
fi
if stage collective; then  # the exchange as ppermute rounds against one all_to_all (same residual)
  python3 experiments/scaling.py --transport shard --devices "$DEVS" --collective ppermute,all_to_all --order 7 \
      --repeats 3 --sizes "${COLL_SIZES:-$STRONG,100x48x48}" --out "$OUT/bp5_collective.json"
fi
if stage tgvlong; then  # Taylor–Green to t = 20 on every GPU, the series written after each time unit
  python3 experiments/tgv_long.py --order 7 --elements 32 --t-final 20 --dt 2e-3 --segment 1.0 \
      --devices "$NGPU" --out "$OUT/tgv32"
fi
if stage tgv; then
  python3 experiments/ns_step_time.py --devices "$DEVS" --order 7 --elements ${TGV_ELEMENTS:-32} --steps 20 \
      --out "$OUT/tgv_shard.json"
fi
if stage tgvdist; then
  mpirun -n "$NGPU" python3 experiments/ns_step_time.py --devices "$NGPU" --order 7 --elements ${TGV_ELEMENTS:-32} \
      --steps 20 --out "$OUT/tgv_dist.json"
fi
if stage tgvmpi; then
  mpirun -n "$NGPU" python3 experiments/ns_step_time.py --transport mpi --order 7 --elements ${TGV_ELEMENTS:-32} \
      --steps 20 --out "$OUT/tgv_mpi.json"
fi
ls -la "$OUT"
