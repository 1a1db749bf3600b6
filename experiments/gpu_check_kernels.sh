#!/usr/bin/env bash
# The CUDA kernels on one GPU, in stages (STAGES, comma list; default all but "old"):
#   first     first use from an empty kernel cache, then warm: `jaxsem solve poisson --order 7
#             --elements 8 8 8`, and the default problem of `jaxsem` (`jaxsem solve poisson`: BP5,
#             order 6, 3x3x3), each from its own empty cache (wall time, the solve's compile_seconds)
#   roofline  the p = 7 FP64 table, BK1-BK6 and BP1-BP6 at ~16 M DOFs with the committed defaults,
#             copy bandwidth measured in the same run (experiments/roofline.py), RUNS times
#   build     every library ahead of time from an empty cache (cuda.build())
#   tests     tests/test_cuda_kernels.py against that cache
#   old       OLD_SOURCE (an earlier sem_kernels.cu) built as that source was: one library per
#             operator and dtype holding every order and variant, eight nvcc runs in parallel
# Writes $OUT/build_time.json, $OUT/roofline_p7_<i>.json, $OUT/gpu_tests.txt. As run on the device
# machine (nvidia-h100-x1, from the repository root):
#   STAGES=first,roofline bash experiments/gpu_check_kernels.sh
#   git show bb0d6ef:jaxsem/backends/csrc/sem_kernels.cu > /tmp/old.cu   # (here; carry it)
#   STAGES=build,tests,old OLD_SOURCE=/tmp/old.cu bash experiments/gpu_check_kernels.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
STAGES=${STAGES:-first,roofline,build,tests}
RUNS=${RUNS:-2}
TMP=$(mktemp -d)
: > "$TMP/build_time.tsv"
LOG=$TMP/build_time.tsv   # stage <tab> what <tab> seconds <tab> rc <tab> command
has() { [[ ",$STAGES," == *",$1,"* ]]; }
now() { date +%s.%N; }
timed() {  # timed STAGE WHAT LIMIT CMD...: run CMD under a time limit, log its wall time
  local stage=$1 what=$2 limit=$3; shift 3
  local t0 rc; t0=$(now)
  timeout "$limit" bash -c "$*"; rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$stage" "$what" "$(awk "BEGIN{print $(now) - $t0}")" "$rc" "$*" >> "$LOG"
  echo "== $stage/$what: rc $rc, $(tail -1 "$LOG" | cut -f3) s" >&2
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
nvcc --version | tail -2

if has first; then
  for case in "solve:--order 7 --elements 8 8 8" "default:"; do
    name=${case%%:*}; args=${case#*:}
    export JAXSEM_CUDA_CACHE=$(mktemp -d)
    for run in cold warm; do
      timed first "${name}_$run" $([[ $run == cold ]] && echo 200 || echo 100) "$PY -m jaxsem solve poisson $args --json > $TMP/${name}_$run.json"
    done
    ls -la "$JAXSEM_CUDA_CACHE" >&2
  done
fi

if has roofline; then
  for i in $(seq 1 "$RUNS"); do
    timed roofline "roofline_p7_$i" 200 "$PY experiments/roofline.py --problems bk1,bk2,bk3,bk4,bk5,bk6,bp1,bp2,bp3,bp4,bp5,bp6 \
      --backends auto --orders 7 --sizes 1.6e7 --fit-sizes 1e4 --budget-seconds 140 --no-plot --out $OUT/roofline_p7_$i.json"
  done
fi

if has build; then
  export JAXSEM_CUDA_CACHE=$(mktemp -d)
  timed build build_all_empty_cache 400 "$PY -c 'from jaxsem.backends import cuda; cuda.build()'"
  echo "cache: $(ls "$JAXSEM_CUDA_CACHE" | wc -l) files, $(du -sm "$JAXSEM_CUDA_CACHE" | cut -f1) MB" | tee -a "$OUT/gpu_tests.txt"
fi

if has tests; then
  timed tests test_cuda_kernels 400 "$PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py 2>&1 | tee -a $OUT/gpu_tests.txt"
fi

if has old && [[ -n ${OLD_SOURCE:-} ]]; then
  INC=$($PY -c "import jax; print(jax.ffi.include_dir())")
  ARCH=$($PY -c "import jax; print(jax.devices('gpu')[0].compute_capability.replace('.', ''))")
  D=$(mktemp -d)
  cmds=""
  for op in BK5 MASS STIFFNESS GS; do for r in double float; do
    cmds+="nvcc -O3 -std=c++17 --shared -Xcompiler -fPIC -gencode=arch=compute_$ARCH,code=sm_$ARCH -I$INC \
      -DJAXSEM_OP_$op -DJAXSEM_REAL=$r $OLD_SOURCE -o $D/sem_${op}_$r.so 2>/dev/null & "
  done; done
  timed old build_old_source_8_parallel 500 "$cmds wait"
  echo "old cache: $(ls "$D" | wc -l) files, $(du -sm "$D" | cut -f1) MB" >&2
fi

$PY - "$LOG" "$OUT/build_time.json" <<'EOF'
import json, subprocess, sys
rows = []
for line in open(sys.argv[1]):
    stage, what, sec, rc, cmd = line.rstrip("\n").split("\t")
    rows.append(dict(stage=stage, what=what, seconds=float(sec), rc=int(rc), command=" ".join(cmd.split())))
import jax, jaxlib


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError as e:
        return str(e)


out = dict(device=sh("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"),
           jax=jax.__version__, jaxlib=jaxlib.__version__, nvcc=" ".join(sh("nvcc", "--version").splitlines()[-2:]),
           cpus=__import__("os").cpu_count(), rows=rows)
for name in ("solve_cold", "solve_warm", "default_cold", "default_warm"):
    try:
        r = json.load(open(f"{sys.argv[1].rsplit('/', 1)[0]}/{name}.json"))
        out[name] = {k: r.get(k) for k in ("order", "elements", "backend", "iterations", "converged", "error_l2",
                                           "seconds", "compile_seconds", "dofs_per_second")}
    except (OSError, ValueError):
        pass
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(rows, indent=0))
EOF
