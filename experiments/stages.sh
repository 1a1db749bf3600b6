# Stage helpers shared by run_h100.sh and run_h200.sh, sourced after RES (results folder), OUT (where the
# archive goes), ARCHIVE (its file name) and BUDGET (seconds for all stages) are set:
#   stage NAME SECONDS COMMAND...   runs COMMAND under `timeout`, its limit cut to the budget left;
#                                   skipped when under 20 s are left. Output and "rc NAME STATUS" go to
#                                   $RES/log.txt. COMMAND runs in `bash -c`: export the functions it calls.
# Whatever RES holds is packed into $OUT/$ARCHIVE on exit (a slow or failed stage costs only itself).
START=$(date +%s)
pack() { tar -czf $OUT/$ARCHIVE -C $RES . ; ls -la $RES; }
trap pack EXIT
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
stage() {  # name, seconds, command...
  local name=$1 lim=$2; shift 2
  local l=$(left); (( l < 20 )) && { echo "SKIP $name (budget)" | tee -a $RES/log.txt; return; }
  (( lim > l )) && lim=$l
  echo "== $name (limit ${lim}s, $(date +%T))" | tee -a $RES/log.txt
  timeout $lim bash -c "$*" 2>&1 | tee -a $RES/log.txt; echo "rc $name ${PIPESTATUS[0]}" | tee -a $RES/log.txt
}
