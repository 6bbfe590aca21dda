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
# The summary and the tarball on every exit: also when a `timeout` around this script sends SIGTERM (bash
# then runs the EXIT trap), so a call cut short still shows what finished. (SIGKILL, e.g. the device budget
# running out, skips both.)
summary() {
  tr '\r' '\n' < "$OUT/bench-flash.err" 2>/dev/null | grep -v "loading weights" | tail -30
  grep -E "^\[ +(OK|FAILED|PASSED)|rc=|Failure|rror" "$OUT/engine.txt" 2>/dev/null
  cat "$OUT/kernels.txt" 2>/dev/null
  grep -v -E "^  L[0-9]+\.|^  layer ([2-9]|[1-9][0-9])" "$OUT/flash.txt" 2>/dev/null
  cat "$OUT/decode_ab.txt" 2>/dev/null
  grep -E "^\|" "$OUT/linbench.txt" 2>/dev/null; tail -2 "$OUT/linbench.txt" 2>/dev/null
  grep -v -E "^T=" "$OUT/moep.txt" 2>/dev/null
  true  # optional files may be missing; failures show in the logs
}
trap 'summary; tar -czf "$R/logs.tgz" -C "$OUT" .' EXIT
export JOBS=${JOBS:-16}
# SKIP_ENGINE=1: no engine tests (a benchmark-only call); KTESTS=none: no kernel tests.
if [ -z "${SKIP_ENGINE:-}" ]; then
  bash scripts/gpu/run_engine.sh > "$OUT/engine.txt" 2>&1
  echo "engine rc=$?" >> "$OUT/engine.txt"
fi
BENCH_BUILD=build-gpu timeout ${BENCH_TIMEOUT:-300} bash scripts/gpu/bench_flash.sh "$@" > "$OUT/flash.txt" 2>&1
echo "flash rc=$?" >> "$OUT/flash.txt"
# Kernel tests (same build dir, incremental; after the benchmark, which configures build-gpu also when
# SKIP_ENGINE=1 leaves out run_engine.sh), KTESTS="test_cuda_..." to choose; default: those that changed
# last (compressor graph replay, MoE prefill, the strided prefill GEMM, the grouped GEMV).
KTESTS=${KTESTS:-test_cuda_compressor test_cuda_moe_prefill test_cuda_prefill test_cuda_gemv}
[ "$KTESTS" != none ] && { if cmake --build build-gpu -j "$JOBS" --target $KTESTS > "$OUT/build-kernels.log" 2>&1; then
  for t in $KTESTS; do
    exe=$(find build-gpu -name "$t" -type f -perm -u+x | head -1)
    timeout ${KTEST_TIMEOUT:-120} "$exe" > "$OUT/$t.log" 2>&1
    echo "$t rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|exception" "$OUT/$t.log" | head -10
  done
else echo "KERNEL TEST BUILD FAILED:"; grep -E "error|Error" "$OUT/build-kernels.log" | head -10; fi; } > "$OUT/kernels.txt" 2>&1
# LINBENCH="--f16-ab": the linear kernels' benchmark (bench_cuda_linear) with that mode, same build dir (after bench_flash.sh
# configured it with the benchmarks on).
if [ -n "${LINBENCH:-}" ]; then
  { cmake --build build-gpu -j "$JOBS" --target bench_cuda_linear &&
    timeout ${LINBENCH_TIMEOUT:-150} "$(find build-gpu -name bench_cuda_linear -type f -perm -u+x | head -1)" $LINBENCH; } \
    > "$OUT/linbench.txt" 2>&1
  echo "linbench rc=$?" >> "$OUT/linbench.txt"
fi
# MOEP_BENCH=1: the MoE prefill benchmark (bench_cuda_moe_prefill: bf16 and f16, both GEMM kernels, against
# cuBLAS bf16 batched). Its Nsight Compute profile: scripts/gpu/run_moe_prefill.sh with MOEP_NCU=T.
if [ -n "${MOEP_BENCH:-}" ]; then
  { cmake --build build-gpu -j "$JOBS" --target bench_cuda_moe_prefill &&
    timeout ${MOEP_TIMEOUT:-150} "$(find build-gpu -name bench_cuda_moe_prefill -type f -perm -u+x | head -1)"; } \
    > "$OUT/moep.txt" 2>&1
  echo "moe prefill bench rc=$?" >> "$OUT/moep.txt"
fi
# DECODE_AB="--repeat-layers 21": batch-1 decode without PDL and the per-kernel ncu durations.
[ -n "${DECODE_AB:-}" ] && BENCH_BUILD=build-gpu timeout ${DECODE_AB_TIMEOUT:-300} bash scripts/gpu/decode_ab.sh $DECODE_AB > "$OUT/decode_ab.txt" 2>&1
true  # the exit status: the summary (EXIT trap) prints whatever finished
