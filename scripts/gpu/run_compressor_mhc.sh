#!/usr/bin/env bash
# Builds the compressor and mHC kernels, runs their GPU tests and benchmark, prints a short table last.
# Usage (on the GPU machine, from the repository root): scripts/gpu/run_compressor_mhc.sh
# Logs go to $OUT (default: build-cmhc-gpu/out). Architectures: DSV4_CUDA_ARCHS (default 90a).
# GTest / nlohmann_json for an image that lacks them: carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
set -uo pipefail
RESULTS=${OUT:-build-cmhc-gpu/out}
mkdir -p "$RESULTS"
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
BUILD=build-cmhc-gpu

DEPS_LOG="$RESULTS/deps.log"
source scripts/gpu/deps_prefix.sh

TESTS="test_cuda_compressor test_cuda_mhc"
{ cmake -S . -B "$BUILD" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build "$BUILD" -j "$JOBS" --target $TESTS bench_cuda_compressor_mhc; } > "$RESULTS/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -40 "$RESULTS/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$RESULTS/gpu.txt" 2>&1

status=0
summary=""
for t in $TESTS; do
  "$BUILD/tests/cuda/$t" --gtest_brief=1 > "$RESULTS/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -E "Failure|FAILED|Expected|Which is|error|trace|channel|seq " "$RESULTS/$t.log" | head -30
  summary+="$t: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|SEED|sinkhorn' "$RESULTS/$t.log" | tr '\n' ' ') rc=$rc"$'\n'
done
"$BUILD/bench/cuda/bench_cuda_compressor_mhc" > "$RESULTS/bench.log" 2>&1 || { echo "bench failed"; tail "$RESULTS/bench.log"; status=1; }
cat "$RESULTS/gpu.txt"; date -u
printf '%s' "$summary"
sed -n '/^copy bandwidth/,$p' "$RESULTS/bench.log" | tail -n +2 | sed -n '/^copy bandwidth/,$p'
exit $status
