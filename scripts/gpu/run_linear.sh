#!/usr/bin/env bash
# Builds src/backend/cuda/linear with its tests and benchmarks, runs them all, prints a short table last.
# Usage (on the GPU machine, from the repository root): scripts/gpu/run_linear.sh [--quick]
# Logs go to $OUT (default build-gpu-linear/out). Architectures: DSV4_CUDA_ARCHS (default 90a).
# Dependencies the device image may lack (GTest, nlohmann_json): carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
set -uo pipefail
FINAL=${OUT:-build-gpu-linear/out}
mkdir -p "$FINAL"
RESULTS=$(mktemp -d)  # every log; packed into $FINAL/logs.tgz, the main ones also copied (at most 8 files back)
pack() {
  tar -czf "$FINAL/logs.tgz" -C "$RESULTS" .
  cp "$RESULTS"/bench.log "$RESULTS"/torch_peer.log "$RESULTS"/test_cuda_*.log "$FINAL"/ 2>/dev/null
}
trap pack EXIT
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
QUICK=${1:-}
B=build-gpu-linear

DEPS_LOG="$RESULTS/deps.log"
source scripts/gpu/deps_prefix.sh

# A throwaway top level until the lead adds the add_subdirectory lines (docs/GEMM_MOE.md).
W=$PWD/$B/wrapper  # fixed path: a warm machine keeps $B, and CMake refuses a cache made from another source dir
mkdir -p "$W"
cat > "$W/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(dsv4_linear LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(OpenMP REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(Threads REQUIRED)
add_compile_options(-Wall -Wextra -Wno-unused-parameter)
include($PWD/cmake/cuda.cmake)
add_subdirectory($PWD/src src)
add_subdirectory($PWD/src/backend/cuda/linear cuda_linear)
enable_testing()
find_package(GTest REQUIRED)
add_subdirectory($PWD/tests/cuda_linear tests_cuda_linear)
add_subdirectory($PWD/bench/cuda_linear bench_cuda_linear)
CM
TARGETS="test_cuda_gemv test_cuda_moe_decode test_cuda_prefill bench_cuda_linear"
{ cmake -S "$W" -B $B -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS" --target $TARGETS; } > "$RESULTS/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" -A3 "$RESULTS/build.log" | head -40; tail -20 "$RESULTS/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$RESULTS/gpu.txt" 2>&1

status=0
summary=""
for t in test_cuda_gemv test_cuda_moe_decode test_cuda_prefill; do
  exe=$(find $B -name "$t" -type f -perm -u+x | head -1)
  OMP_NUM_THREADS=$JOBS "$exe" > "$RESULTS/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -E "Failure|FAILED|Expected|Which is|rel_norm|error" "$RESULTS/$t.log" | head -30
  summary+="$t: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$RESULTS/$t.log" | tr '\n' ' ') rc=$rc"$'\n'
done

bench=$(find $B -name bench_cuda_linear -type f -perm -u+x | head -1)
"$bench" $QUICK > "$RESULTS/bench.log" 2>&1 || { echo "bench failed"; tail -5 "$RESULTS/bench.log"; status=1; }
PYTHONUNBUFFERED=1 python3 bench/cuda_linear/torch_peer.py $QUICK > "$RESULTS/torch_peer.log" 2>&1 || { echo "torch peer failed"; tail -5 "$RESULTS/torch_peer.log"; }

echo "== $(date -u +%F) $(tail -1 "$RESULTS/gpu.txt")"
grep -E "^(gemv|moe|prefill) " "$RESULTS"/test_cuda_*.log | sed 's/^.*log://' | sort | uniq | awk '{print}' | head -80 > "$RESULTS/errors.txt"
echo "== worst test errors"; sort -t= -k5 "$RESULTS/errors.txt" | tail -3
grep -E "copy bandwidth" "$RESULTS/bench.log" "$RESULTS/torch_peer.log"
sed -n '/^| torch peer/,$p' "$RESULTS/torch_peer.log"
sed -n '/^| case/,$p' "$RESULTS/bench.log"
echo "== tests"
printf "%s" "$summary"
exit $status
