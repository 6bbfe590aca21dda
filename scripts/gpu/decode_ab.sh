#!/usr/bin/env bash
# Batch-1 decode detail, after scripts/gpu/bench_flash.sh has written the checkpoint and built the bench:
#   1. the same decode with programmatic dependent launch off (--no-pdl), to compare with bench_flash's run,
#      (NO_OVERLAP_AB=1) on one stream, and (MOE_KS_SWEEP="2 4 8") with the MoE decode kernels' K splits
#      forced, (BF16_ACT_AB=1) with the FP8 GEMVs on bf16 activations, (MOE_WARPS_AB=1) with 8-warp MoE blocks;
#   2. (unless NO_NCU=1) each kernel's own duration (Nsight Compute, gpu__time_duration, caches left as the previous kernel left
#      them, as in a real step) over the steps of a 2-layer run, summed per kernel name and divided by the
#      steps (scripts/gpu/ncu_summary.py);
#   3. NCU_DETAIL="regex": Nsight Compute sections (speed of light, memory, warp stalls, occupancy) for a few
#      launches of the kernels matching regex, into $OUT/ncu-detail.txt.
# Usage on the GPU machine: bash scripts/gpu/decode_ab.sh [bench flags for step 1, e.g. --repeat-layers 21]
set -uo pipefail
B=${BENCH_BUILD:-build-flash}
CK=${FLASH_DIR:-/tmp/dsv4-flash2}
R=${OUT:-build-flash/out}
BIN=$B/bench/cuda_engine/bench_gpu_forward
if [ -z "${SKIP_NO_PDL:-}" ]; then
  echo "== batch-1 decode without PDL"
  $BIN --model "$CK" --batches 1 --prompt 256 --decode 16 --prefill 0 --no-pdl "$@" 2> "$R/no-pdl.err" |
    grep -E "^\| 1 |batch-1 decode|extrapolated"
fi
if [ -n "${NO_OVERLAP_AB:-}" ]; then
  echo "== batch-1 decode on one stream (--no-overlap)"
  $BIN --model "$CK" --batches 1 --prompt 256 --decode 16 --prefill 0 --no-overlap "$@" 2> "$R/no-overlap.err" |
    grep -E "^\| 1 |batch-1 decode"
fi
if [ -n "${BF16_ACT_AB:-}" ]; then
  echo "== batch-1 decode with bf16 activations in the FP8 GEMVs (--bf16-act)"
  $BIN --model "$CK" --batches 1 --prompt 256 --decode 16 --prefill 0 --bf16-act "$@" 2> "$R/bf16-act.err" |
    grep -E "^\| 1 |batch-1 decode"
fi
if [ -n "${MOE_WARPS_AB:-}" ]; then
  echo "== batch-1 decode with 8-warp MoE blocks (--moe-warps 8)"
  $BIN --model "$CK" --batches 1 --prompt 256 --decode 16 --prefill 0 --moe-warps 8 "$@" 2> "$R/moe-warps8.err" |
    grep -E "^\| 1 |batch-1 decode"
fi
# MOE_KS_SWEEP="2 4 8": the same decode with the MoE decode kernels' K splits forced (default: heuristic).
for ks in ${MOE_KS_SWEEP:-}; do
  echo "== batch-1 decode with --moe-ks $ks"
  $BIN --model "$CK" --batches 1 --prompt 256 --decode 16 --prefill 0 --moe-ks "$ks" "$@" 2> "$R/moe-ks$ks.err" |
    grep -E "^\| 1 |batch-1 decode"
done
[ -n "${NO_NCU:-}" ] && exit 0
echo "== per-kernel durations (ncu), 2 layers, batch 1"
if command -v ncu > /dev/null; then
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$R/ncu.csv" \
    $BIN --model "$CK" --batches 1 --prompt 4 --decode 2 --prefill 0 > "$R/ncu-bench.log" 2>&1
  echo "ncu rc=$?"
  python3 scripts/gpu/ncu_summary.py "$R/ncu.csv"
  if [ -n "${NCU_DETAIL:-}" ]; then
    timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --cache-control none -k "regex:${NCU_DETAIL}" \
      --launch-skip 30 --launch-count ${NCU_DETAIL_COUNT:-6} --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      $BIN --model "$CK" --batches 1 --prompt 4 --decode 2 --prefill 0 > "$R/ncu-detail.txt" 2>&1
    echo "ncu detail rc=$? ($(grep -c "Section: GPU Speed Of Light" "$R/ncu-detail.txt") kernels in ncu-detail.txt)"
    grep -E "Context [0-9]+, Stream|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per" \
      "$R/ncu-detail.txt" | head -60
  fi
else
  echo "ncu not on PATH"
fi
