# Sourced by the single-kernel device scripts (run_attn.sh, run_topk.sh): creates $RES, readies the
# dependencies (deps_prefix.sh), configures build dir $BDIR for sm_90a and builds $TARGETS, stopping the script
# with the build log's errors on failure; writes $RES/gpu.txt. Defines stamp() (seconds since sourcing).
# Needs RES, BDIR, TARGETS; sets JOBS=16, DEPS_LOG, T0.
mkdir -p "$RES"
JOBS=16
DEPS_LOG="$RES/deps.log"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
source scripts/gpu/deps_prefix.sh
stamp "deps ready"
{ cmake -S . -B "$BDIR" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build "$BDIR" -j "$JOBS" --target $TARGETS; } > "$RES/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" "$RES/build.log" | head -30; tail -30 "$RES/build.log"; exit 1; }
stamp "built"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$RES/gpu.txt" 2>&1
