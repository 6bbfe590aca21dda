# Sourced by the single-kernel device scripts (run_attn.sh, run_topk.sh): creates $RES, readies the
# dependencies (deps_prefix.sh), configures build dir $BDIR for sm_90a and builds $TARGETS, stopping the script
# with the build log's errors on failure; writes $RES/gpu.txt. Defines stamp() (seconds since sourcing) and
# run_test(). Needs RES, BDIR, TARGETS; sets JOBS=16, DEPS_LOG, T0, status=0.
mkdir -p "$RES"
JOBS=16
DEPS_LOG="$RES/deps.log"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
status=0
# run_test LOG SECONDS LABEL CMD...: runs a test binary into LOG under a timeout, stamps its exit code and, on
# failure, prints the first lines of its failures and sets status=1 (prefix CMD with env VAR=value for knobs).
run_test() {
  local log=$1 secs=$2 label=$3
  shift 3
  timeout "$secs" "$@" > "$log" 2>&1
  local rc=$?
  stamp "$label rc=$rc"
  if [ $rc -ne 0 ]; then
    status=1
    echo "== test failures, $label (first 40 lines)"
    grep -E -A4 "Failure|FAILED|what\(\)|exception|error" "$log" | head -40
    tail -5 "$log"
  fi
}
source scripts/gpu/deps_prefix.sh
stamp "deps ready"
{ cmake -S . -B "$BDIR" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build "$BDIR" -j "$JOBS" --target $TARGETS; } > "$RES/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" "$RES/build.log" | head -30; tail -30 "$RES/build.log"; exit 1; }
stamp "built"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$RES/gpu.txt" 2>&1
