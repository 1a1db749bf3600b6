#!/usr/bin/env bash
# The GPU measurements of docs/ in stages, on whatever GPUs this host has (their count and model are
# measured, not named). From the repository root:
#   bash experiments/gpu_batch.sh STAGE [STAGE ...]        results under $OUT (default ./gpu_batch)
#   bash experiments/gpu_batch.sh --help                   this text
# Every stage runs under a time limit; $OUT/batch.json records the device, driver, jax, jaxlib,
# nvcc, each stage's command, wall seconds and exit status. Each driver's JSON has its own record.
#
# One GPU, the CUDA kernels (docs/kernels.md, docs/performance.md):
#   first      first use from an empty kernel cache, then warm: `jaxsem solve poisson --order 7
#              --elements 8 8 8` and the default `jaxsem solve poisson`, each from its own empty cache
#   roofline   the p = 7 FP64 table, BK1-BK6 and BP1-BP6 at ~16 M DOFs, RUNS (2) times
#   build      every kernel library from an empty cache (cuda.build())
#   tests      tests/test_cuda_kernels.py against that cache (only the tests -k TESTS_K selects, when set)
#   old        OLD_SOURCE (an earlier sem_kernels.cu) built one library per operator and dtype
#   targets    the speed targets: Maxwell and advection throughput (N = 7, 14), the gradient of
#              LSERK4 Maxwell (8^3, N = 7, 100 steps), BP3 and BP5 (p = 7, 11.2 M points)
#   bk5a, bp5a, stiffnessa, bp3a, bp4a
#              assembled storage: the fused assembled kernels' variants at p = 7 (bk5a, stiffnessa),
#              the BPs assembled and E-vector across ORDERS (3,5,7,9,11,15) or at p = 7 (bp4a)
# Several GPUs of one host (docs/multi-gpu.md; NGPU measured, DEVS = 1..NGPU unless set):
#   install    mpi4jax from .carry/ (its sdist and a nanobind wheel; the host has no network)
#   check      sharded and MPI runs equal serial, CUDA kernels inside (tests/shard_check.py, tests/mpi)
#   checkdg    the fused DG kernels distributed (shard and mpirun) equal serial
#   bp5, bp5mpi, bp5dist
#              BP5 p = 7 over the GPUs: shard (one process), mpi4jax and jax.distributed (one
#              process per GPU); sizes WEAK1 (32x30x30), WEAK2 (64x30x30), STRONG (64x32x32)
#   dg         Maxwell and advection LSERK4 steps over the GPUs, DG_BACKENDS (auto einsum)
#   pmg        p-multigrid time to solution over the GPUs
#   gs         one gather-scatter over the GPUs by how each device sums its own copies: XLA's scatter
#              (einsum backend) or the CUDA gather kernel (cuda backend), GS_ELEMENTS (32)^3, p = 7
#   tgv, tgvdist, tgvmpi
#              Taylor-Green step time: shard, jax.distributed and mpi4jax
#   tgvlong    Taylor-Green to t = 20 on every GPU
# One GPU, the flows and gradients still open (docs/flows.md, docs/gradients.md, docs/mosaic.md):
#   channel    the Re_tau = 180 channel, 8^3 elements of order 7, averaged over t = 60..200 (the CLI's
#              defaults; 9 minutes on an H200)
#   nsgrad     the gradient through 3,000 Taylor-Green steps at 18^3, p = 7 (binomial:14), FD along nu
#   nsgradfd   central differences along two random u0 directions at that size (needs nsgrad's JSON)
#   nsgradgpus the time per gradient over GPUs: NSGRAD_RUNS (default "1:18 2:18 2:23 4:18 4:29", DEVICES:ELEMENTS,
#              those with at most NGPU devices), NSGRAD_STEPS (1000) Taylor-Green steps, p = 7, NSGRAD_SCHEDULE
#              (sqrt: the binomial schedule is refused over several GPUs, docs/gradients.md)
#   tgv36      NekRS's Taylor-Green case (36^3 elements, p = 7, dt 3e-3): time per step and its parts at
#              the default tolerances and at NekRS's (pressure 1e-4, velocity 1e-6)
#   tgv36gpus  NekRS's case over the GPUs at its tolerances (pressure 1e-6 with the float32 cycle, velocity
#              1e-8): 36^3 on 1 and NGPU GPUs (strong), and 57^3 on 4 GPUs (weak, 4x the points) when NGPU = 4
#   tgv36run   NekRS's case end to end (6,667 steps of 3e-3 to t = 20.001, sampled every 0.06, pressure 1e-6,
#              velocity 1e-8, a checkpoint every 6.0 and at the stop), resumed from TGV36_CK (default
#              /tmp/tgv36_ckpt.npz) when it exists: run the stage in one call, then again in the next call
#              while the machine is warm (its files are kept), until the JSON's status is completed; each
#              call stops after TGV36_LIMIT (540) s and writes its checkpoint (3.4 GB) before it ends
#   horizon    Mosaic's rollout horizon at its last length, N = 20, 10,240 steps (tesseract-core: docs/mosaic.md)
set -uo pipefail
if [[ $# -eq 0 || $1 == -h || $1 == --help ]]; then sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu_batch}
STAGES=",$(IFS=,; echo "$*"),"
KNOWN=" first roofline build tests old targets bk5a bp5a stiffnessa bp3a bp4a install check checkdg bp5 bp5mpi bp5dist dg pmg tgv tgvdist tgvmpi tgvlong gs channel nsgrad nsgradfd nsgradgpus tgv36 tgv36gpus tgv36run horizon "
for s in "$@"; do [[ $KNOWN == *" $s "* ]] || { echo "gpu_batch.sh: unknown stage '$s' (one of:$KNOWN)" >&2; exit 2; }; done
mkdir -p "$OUT"
has() { [[ $STAGES == *",$1,"* ]]; }
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
DEVS=${DEVS:-$(seq -s, 1 "$NGPU")}
WEAK1=${WEAK1:-32x30x30} WEAK2=${WEAK2:-64x30x30} STRONG=${STRONG:-64x32x32}
ORDERS=${ORDERS:-3,5,7,9,11,15} RUNS=${RUNS:-2}
LOG=$(mktemp)   # stage <tab> what <tab> seconds <tab> rc <tab> command
now() { date +%s.%N; }
timed() {  # timed STAGE WHAT LIMIT CMD...: run CMD under a time limit, log its wall time and status
  local stage=$1 what=$2 limit=$3; shift 3
  local t0 rc; t0=$(now)
  timeout "$limit" bash -c "$*"; rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$stage" "$what" "$(awk "BEGIN{print $(now) - $t0}")" "$rc" "$*" >> "$LOG"
  echo "== $stage/$what: rc $rc, $(tail -1 "$LOG" | cut -f3) s" >&2
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi: no NVIDIA GPU here" >&2

if has first; then
  for case in "solve:--order 7 --elements 8 8 8" "default:"; do
    name=${case%%:*}; args=${case#*:}
    for run in cold warm; do
      [[ $run == cold ]] && export JAXSEM_CUDA_CACHE=$(mktemp -d)
      timed first "${name}_$run" 200 "$PY -m jaxsem solve poisson $args --json > $OUT/first_${name}_$run.json"
    done
  done
  unset JAXSEM_CUDA_CACHE
fi
if has roofline; then
  for i in $(seq 1 "$RUNS"); do
    timed roofline "roofline_p7_$i" 200 "$PY -m experiments.roofline --problems bk1,bk2,bk3,bk4,bk5,bk6,bp1,bp2,bp3,bp4,bp5,bp6 \
      --backends auto --orders 7 --sizes 1.6e7 --fit-sizes 1e4 --budget-seconds 140 --no-plot --out $OUT/roofline_p7_$i.json"
  done
fi
if has build; then
  export JAXSEM_CUDA_CACHE=${JAXSEM_CUDA_CACHE:-$(mktemp -d)}
  timed build build_all_empty_cache 400 "$PY -c 'from jaxsem.backends import cuda; cuda.build()'"
fi
has tests && timed tests test_cuda_kernels 400 "$PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py \
  ${TESTS_K:+-k '$TESTS_K'} > $OUT/gpu_tests.txt 2>&1"
if has old && [[ -n ${OLD_SOURCE:-} ]]; then
  INC=$($PY -c "import jax; print(jax.ffi.include_dir())")
  ARCH=$($PY -c "import jax; print(jax.devices('gpu')[0].compute_capability.replace('.', ''))")
  D=$(mktemp -d); cmds=""
  for op in BK5 MASS STIFFNESS GS; do for r in double float; do
    cmds+="nvcc -O3 -std=c++17 --shared -Xcompiler -fPIC -gencode=arch=compute_$ARCH,code=sm_$ARCH -I$INC \
      -DJAXSEM_OP_$op -DJAXSEM_REAL=$r $OLD_SOURCE -o $D/sem_${op}_$r.so 2>/dev/null & "
  done; done
  timed old build_old_source_8_parallel 500 "$cmds wait"
fi
if has targets; then
  for m in maxwell advection; do
    timed targets "${m}_throughput" 150 "$PY -m experiments.${m}_throughput --orders 7 14 --min-points 1.3e7 \
      --max-points 1.7e7 --steps 50 --repeats 3 --backend auto --out $OUT/${m}_throughput.json"
  done
  timed targets gradient_cost 120 "$PY -m experiments.gradient_cost --maxwell-elements 8 --maxwell-order 7 --steps 100 \
    --skip pcg memory --out $OUT/gradient_cost"
  timed targets bp3_bp5 150 "$PY -m experiments.bakeoff --problems bp3,bp5 --backend auto --storage auto,local --orders 7 \
    --target-points 1.12e7 --repeats 6 --out $OUT/bp3_bp5.json"
fi
bake() { timed "$1" "$1" 600 "$PY -m experiments.bakeoff --backend auto --target-points 1.12e7 --repeats 6 ${*:2}"; }
has bk5a && bake bk5a --problems bp5 --storage auto --orders 7 --assembled-variants "${VARIANTS:-2,4,5,6,7,2p,6p}" \
  --out "$OUT/bk5a_variants_p7.json"
has bp5a && bake bp5a --problems bp5 --storage auto,local --orders "$ORDERS" --out "$OUT/bp5_assembled.json"
has stiffnessa && bake stiffnessa --problems bp3 --storage auto --orders 7 \
  --assembled-variants "${VARIANTS_BK3:-8,9,11,8p,9p,11p}" --out "$OUT/stiffnessa_variants_p7.json"
has bp3a && bake bp3a --problems bp3 --storage auto,local --orders "$ORDERS" --out "$OUT/bp3_assembled.json"
has bp4a && bake bp4a --problems bp4 --storage auto,local --orders 7 --out "$OUT/bp4_assembled_p7.json"

if has install; then
  timed install mpi4jax 300 "$PY -c 'import nanobind' 2>/dev/null || $PY -m pip install -q --no-index --no-deps .carry/nanobind-*.whl; \
    MPI4JAX_BUILD_MPICC=\$(which mpicc) $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    .carry/mpi4jax-*.tar.gz && $PY -c 'import mpi4jax; print(\"mpi4jax\", mpi4jax.__version__)'"
fi
if has check; then
  timed check shard_check 300 "cd tests && JAX_PLATFORMS=cuda $PY shard_check.py $NGPU > $OUT/shard_check_gpu.txt 2>&1"
  timed check mpi_distributed 300 "mpirun -n $NGPU $PY -m pytest -q -p no:cacheprovider tests/mpi/test_distributed.py \
    -k 'pcg_solve or gradient or fixed' > $OUT/mpi_check_gpu.txt 2>&1"
fi
if has checkdg; then
  timed checkdg shard_check_dg 240 "cd tests && JAX_PLATFORMS=cuda $PY -c 'import json, shard_check as sc; sc.check_dg($NGPU); \
    print(\"RESULT\", json.dumps(sc.RESULTS)); print(\"FAILED\", sc.FAILED)' > $OUT/dg_check_gpu.txt 2>&1"
  timed checkdg mpi_maxwell 240 "mpirun -n $NGPU $PY -m pytest -q -p no:cacheprovider tests/mpi/test_maxwell_mpi.py -k fused_path \
    >> $OUT/dg_check_gpu.txt 2>&1"
fi
SC="$PY -m experiments.scaling --order 7 --repeats 3"
has bp5 && timed bp5 shard 600 "$SC --transport shard --devices $DEVS --sizes $WEAK1,$WEAK2,$STRONG --out $OUT/bp5_shard.json"
has bp5mpi && timed bp5mpi mpi 600 "mpirun -n $NGPU $SC --transport mpi --sizes $WEAK2,$STRONG --out $OUT/bp5_mpi.json"
has bp5dist && timed bp5dist dist 600 "mpirun -n $NGPU $SC --transport shard --devices $NGPU --sizes $WEAK2,$STRONG \
  --out $OUT/bp5_dist.json"
if has dg; then
  for m in ${DG_MODELS:-maxwell advection}; do for b in ${DG_BACKENDS:-auto einsum}; do
    timed dg "${m}_$b" 600 "$PY -m experiments.dg_scaling --model $m --transport shard --devices $DEVS --order 7 \
      --repeats 2 --steps 10 --sizes ${DG_SIZES:-32x32x32} --backend $b --out $OUT/dg_${m}_$b.json"
  done; done
fi
has pmg && timed pmg shard 600 "$PY -m experiments.pmg_scaling --devices $DEVS --order 7 --repeats 2 \
  --sizes ${PMG_SIZES:-$STRONG} --out $OUT/pmg_shard.json"
has gs && timed gs sharded 300 "$PY -m experiments.gs_sharded --elements ${GS_ELEMENTS:-32} --order 7 --devices $NGPU \
  --out $OUT/gs_sharded.json"
TGV="-m experiments.ns_step_time --order 7 --elements ${TGV_ELEMENTS:-32} --steps 20"
has tgv && timed tgv shard 600 "$PY $TGV --devices $DEVS --out $OUT/tgv_shard.json"
has tgvdist && timed tgvdist dist 600 "mpirun -n $NGPU $PY $TGV --devices $NGPU --out $OUT/tgv_dist.json"
has tgvmpi && timed tgvmpi mpi 600 "mpirun -n $NGPU $PY $TGV --transport mpi --out $OUT/tgv_mpi.json"
has tgvlong && timed tgvlong tgv32 3600 "$PY -m experiments.tgv_long --order 7 --elements 32 --t-final 20 --dt 2e-3 \
  --segment 1.0 --devices $NGPU --out $OUT/tgv32"

has channel && timed channel re180 590 "$PY -m jaxsem solve channel --order 7 --elements 8 8 8 --t-final 200 \
  --average-from 60 --out $OUT/chan --json > $OUT/channel.json"
has nsgrad && timed nsgrad 18p7 1200 "$PY -m experiments.ns_gradient_size --elements 18 --order 7 --steps 3000 \
  --schedule binomial:14 --skip check --fd 1 --out $OUT/ns_gradient_size_18p7.json"
has nsgradfd && timed nsgradfd 18p7 1200 "$PY -m experiments.ns_gradient_size --elements 18 --order 7 --steps 3000 \
  --schedule binomial:14 --skip check gradient --fd 3 --ad-from ${AD_FROM:-experiments/results/ns_gradient_size_18p7_b14_h200.json} \
  --out $OUT/ns_gradient_fd_18p7.json"
if has nsgradgpus; then
  for run in ${NSGRAD_RUNS:-1:18 2:18 2:23 4:18 4:29}; do
    d=${run%%:*} e=${run#*:}
    (( d <= NGPU )) || continue
    timed nsgradgpus "${e}p7_${d}gpu" 600 "$PY -m experiments.ns_gradient_size --elements $e --order 7 \
      --steps ${NSGRAD_STEPS:-1000} --schedule ${NSGRAD_SCHEDULE:-sqrt} --devices $d --skip check --fd 0 \
      --out $OUT/ns_gradient_${e}p7_${d}gpu.json"
  done
fi
for tols in "1e-8 1e-10" "1e-4 1e-6"; do
  read -r ptol vtol <<< "$tols"
  has tgv36 && timed tgv36 "p$ptol" 600 "$PY -m experiments.ns_step_time --order 7 --elements 36 --dt 3e-3 \
    --steps 50 --pressure-tol $ptol --velocity-tol $vtol --out $OUT/tgv36_step_p$ptol.json"
done
if has tgv36gpus; then
  T36="$PY -m experiments.ns_step_time --order 7 --dt 3e-3 --steps 20 --pressure-tol 1e-6 --velocity-tol 1e-8 --cycle-dtype float32"
  timed tgv36gpus strong 600 "$T36 --elements 36 --devices $( (( NGPU > 1 )) && echo 1,$NGPU || echo 1) --out $OUT/tgv36_strong.json"
  (( NGPU == 4 )) && timed tgv36gpus weak57 600 "$T36 --elements 57 --devices 4 --out $OUT/tgv57_weak.json"
fi
if has tgv36run; then
  CK=${TGV36_CK:-/tmp/tgv36_ckpt.npz}
  args="--order 7 --elements 36 --dt 3e-3 --sample 0.06 --t-final 20.001 --pressure-tol 1e-6 --velocity-tol 1e-8 \
    --checkpoint $CK --checkpoint-every 6"
  [[ -e $CK ]] && args+=" --resume $CK"
  # exec: timeout's SIGTERM must reach the run and timeout wait for its stop checkpoint (bash -c with a
  # redirection does not exec by itself, and dies at once)
  timed tgv36run run "${TGV36_LIMIT:-540}" "exec $PY -m jaxsem solve tgv $args --out $OUT/tgv36 --json > $OUT/tgv36_run.json"
fi
has horizon && timed horizon n20 900 "$PY -m experiments.mosaic_ns_grid --only horizon --horizon-steps 10240 \
  --time-limit 900 --out $OUT/mosaic_horizon_10240.json"

$PY - "$LOG" "$OUT/batch.json" "$@" <<'EOF'
import json, os, subprocess, sys
import jax, jaxlib


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError as e:
        return str(e)


rows = []
for line in open(sys.argv[1]):
    stage, what, sec, rc, cmd = line.rstrip("\n").split("\t")
    rows.append(dict(stage=stage, what=what, seconds=float(sec), rc=int(rc), command=" ".join(cmd.split())))
out = dict(experiment="gpu_batch", device=sh("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"),
           jax_version=jax.__version__, jaxlib_version=jaxlib.__version__,
           nvcc=" ".join(sh("nvcc", "--version").splitlines()[-2:]), cpus=os.cpu_count(),
           command="bash experiments/gpu_batch.sh " + " ".join(sys.argv[3:]),
           rows=rows)
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(rows, indent=0))
EOF
rm -f "$LOG"
