#!/usr/bin/env bash
# One device call for the GPU engine: engine tests (run_engine.sh: GPU vs CPU, graphs vs eager, sampler),
# the compressor and MoE prefill kernel tests, then the V4-Flash-width benchmark (bench_flash.sh). Every log goes into $OUT/logs.tgz; the summary prints.
# Usage on the GPU machine with carry [".gpu-deps"]: JOBS=16 bash scripts/gpu/run_lead.sh [bench flags]
set -uo pipefail
R=${OUT:-build-gpu/lead-out}
mkdir -p "$R"
R=$(cd "$R" && pwd)
export OUT=/tmp/lead-logs
rm -rf "$OUT" && mkdir -p "$OUT"
trap 'tar -czf "$R/logs.tgz" -C "$OUT" .' EXIT
export JOBS=${JOBS:-16}
bash scripts/gpu/run_engine.sh > "$OUT/engine.txt" 2>&1
echo "engine rc=$?" >> "$OUT/engine.txt"
# Kernel tests that changed last (same build dir, incremental): compressor graph replay, MoE prefill, the
# strided prefill GEMM, the grouped GEMV.
{ cmake --build build-gpu -j "$JOBS" --target test_cuda_compressor test_cuda_moe_prefill test_cuda_prefill \
    test_cuda_gemv > "$OUT/build-kernels.log" 2>&1 &&
  for t in test_cuda_compressor test_cuda_moe_prefill test_cuda_prefill test_cuda_gemv; do
    exe=$(find build-gpu -name "$t" -type f -perm -u+x | head -1)
    "$exe" > "$OUT/$t.log" 2>&1
    echo "$t rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|exception" "$OUT/$t.log" | head -10
  done; } > "$OUT/kernels.txt" 2>&1
BENCH_BUILD=build-gpu timeout ${BENCH_TIMEOUT:-300} bash scripts/gpu/bench_flash.sh "$@" > "$OUT/flash.txt" 2>&1
echo "flash rc=$?" >> "$OUT/flash.txt"
tr '\r' '\n' < "$OUT/bench-flash.err" 2>/dev/null | grep -v "loading weights" | tail -30
cat "$OUT/engine.txt"
cat "$OUT/kernels.txt"
cat "$OUT/flash.txt"
