#!/usr/bin/env bash
# Builds the GPU engine test (tests/cuda_engine), runs it (GPU vs CPU logits and greedy continuations,
# decode throughput of the small test model). Usage (GPU machine, repository root): scripts/gpu/run_engine.sh
# Logs go to $OUT (default build-gpu/out). Architectures: DSV4_CUDA_ARCHS (default 90a).
# GTest / nlohmann_json the device image may lack: carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
set -uo pipefail
FINAL=${OUT:-build-gpu/out}
mkdir -p "$FINAL"
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
B=build-gpu

DEPS_LOG="$FINAL/deps.log"
source scripts/gpu/deps_prefix.sh

rm -f $B/CMakeCache.txt  # the carried tree may hold a cache from another machine
{ cmake -S . -B $B -DDSV4_CUDA=ON -DDSV4_BENCH=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS" --target test_gpu_model test_gpu_mtp test_gpu_kernel_views test_gpu_sample test_glue_linear test_glue_route test_gpu_golden test_gpu_memory_plan; } \
  > "$FINAL/build.log" 2>&1 || { echo "BUILD FAILED"; grep -E "error" -A3 "$FINAL/build.log" | head -40; tail -20 "$FINAL/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$FINAL/gpu.txt" 2>&1

# run_test BINARY TITLE PATTERN LINES [args...]: runs one test binary (log in $FINAL), prints TITLE with its
# exit code and the first LINES log lines matching PATTERN; a failure fails the script.
status=0
run_test() {
  local name=$1 title=$2 pattern=$3 lines=$4
  shift 4
  local exe
  exe=$(find $B -name "$name" -type f -perm -u+x | head -1)
  OMP_NUM_THREADS=$JOBS "$exe" "$@" > "$FINAL/$name.log" 2>&1
  local rc=$?
  echo "== $title (rc=$rc)"
  grep -E "$pattern" "$FINAL/$name.log" | head -"$lines"
  [ $rc -ne 0 ] && status=1
}
echo "== $(date -u +%F) $(tail -1 "$FINAL/gpu.txt")"
run_test test_gpu_model "GPU engine vs CPU" \
  "DSV4_TEST_SEED|vs CPU|vs eager|decode \(|Failure|Expected|Which is|error|exception|what\(\)|^\[  |^\[ RUN|OK \]|FAILED" 80 \
  ${ENGINE_FILTER:+--gtest_filter="$ENGINE_FILTER"}
run_test test_gpu_mtp "GPU MTP block vs CPU" "DSV4_TEST_SEED|vs CPU|Failure|Expected|Which is|exception|what\(\)|^\[  " 20
run_test test_gpu_kernel_views "kernel views" "vs|Failure|^\[  " 60
run_test test_gpu_golden "GPU vs transformers golden fixture" "kernel_width|Failure|Expected|Which is|exception|^\[  " 14
run_test test_glue_linear "glue linear" "rows|Failure|^\[  " 14
run_test test_glue_route "glue router vs CPU" "cases|rows|Failure|Expected|Which is|^\[  " 14
run_test test_gpu_sample "GPU sampler" "checked|chi|Failure|Expected|Which is|exception|^\[  " 30
run_test test_gpu_memory_plan "memory plan vs device" "the device gave|Failure|Expected|Which is|exception|^\[  " 20
echo "rc=$status"
exit $status
