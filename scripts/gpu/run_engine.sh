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
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS" --target test_gpu_model test_gpu_kernel_views test_gpu_sample test_glue_linear test_gpu_golden; } \
  > "$FINAL/build.log" 2>&1 || { echo "BUILD FAILED"; grep -E "error" -A3 "$FINAL/build.log" | head -40; tail -20 "$FINAL/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$FINAL/gpu.txt" 2>&1

views=$(find $B -name test_gpu_kernel_views -type f -perm -u+x | head -1)
"$views" > "$FINAL/test_gpu_kernel_views.log" 2>&1
rc_views=$?
exe=$(find $B -name test_gpu_model -type f -perm -u+x | head -1)
OMP_NUM_THREADS=$JOBS "$exe" ${ENGINE_FILTER:+--gtest_filter="$ENGINE_FILTER"} > "$FINAL/test_gpu_model.log" 2>&1
rc=$?
echo "== $(date -u +%F) $(tail -1 "$FINAL/gpu.txt")"
grep -E "DSV4_TEST_SEED|vs CPU|vs eager|decode \(|Failure|Expected|Which is|error|exception|what\(\)|^\[  |^\[ RUN|OK \]|FAILED" "$FINAL/test_gpu_model.log" | head -80
echo "== kernel views (rc=$rc_views)"
grep -E "vs|Failure|^\[  " "$FINAL/test_gpu_kernel_views.log" | head -40
gg=$(find $B -name test_gpu_golden -type f -perm -u+x | head -1)
"$gg" > "$FINAL/test_gpu_golden.log" 2>&1
rc_gg=$?
echo "== GPU vs transformers golden fixture (rc=$rc_gg)"
grep -E "kernel_width|Failure|Expected|Which is|exception|^\[  " "$FINAL/test_gpu_golden.log" | head -14
[ $rc_gg -ne 0 ] && rc_views=1
gl=$(find $B -name test_glue_linear -type f -perm -u+x | head -1)
"$gl" > "$FINAL/test_glue_linear.log" 2>&1
rc_gl=$?
echo "== glue linear (rc=$rc_gl)"
grep -E "rows|Failure|^\[  " "$FINAL/test_glue_linear.log" | head -14
[ $rc_gl -ne 0 ] && rc_views=1
sample=$(find $B -name test_gpu_sample -type f -perm -u+x | head -1)
"$sample" > "$FINAL/test_gpu_sample.log" 2>&1
rc_sample=$?
echo "== GPU sampler (rc=$rc_sample)"
grep -E "checked|chi|Failure|Expected|Which is|exception|^\[  " "$FINAL/test_gpu_sample.log" | head -30
echo "rc=$rc"
[ $rc_sample -ne 0 ] && rc=1
[ $rc_views -ne 0 ] && rc=1
exit $rc
