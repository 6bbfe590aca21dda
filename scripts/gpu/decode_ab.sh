#!/usr/bin/env bash
# Batch-1 decode detail, after scripts/gpu/bench_flash.sh has written the checkpoint and built the bench:
#   1. the same decode with programmatic dependent launch off (--no-pdl), to compare with bench_flash's run,
#      (NO_OVERLAP_AB=1) on one stream, and (MOE_KS_SWEEP="2 4 8") with the MoE decode kernels' K splits
#      forced, (BF16_ACT_AB=1) with the FP8 GEMVs on bf16 activations, (MOE_WARPS_AB=1) with 8-warp MoE blocks, (GEMV_WARPS_AB=1) with 4-warp GEMV blocks,
#      (MOE_LEAN_AB=1) without the lean MoE kernels and with lean w2 only (the default: lean w1/w3 and w2 at one token),
#      (HC_AB=1) with hc_pre / hc_head as two launches (--hc-two-kernels), (MOE_NT_AB="1 4") at batch 16 and 64
#      with the MoE decode's n-tiles capped otherwise, (MOE_LEAN4_AB=1) at batch 2 and 4 with the lean MoE
#      kernels up to 4 tokens, (WAVE_DIV_AB="2 4") with the decode grids at 1/N of a wave, (MOE_SPLIT_AB="1 2")
#      at batch 4 / 16 / 64 with the MoE kernels chosen per expert load, (KV_SIDE_AB=1) with the window KV row
#      encoded on the compressor's stream, (SLOTS_AB=1) with the slot
#      lists on the main stream, (SHARED_JOIN_AB=1) with the shared expert joined before the routed w1/w3, (PRIO_AB=1) with
#      every stream at the default priority and with the main stream at the greatest,
#      (PREFILL_AB="2048 8192") prefill of 8,192 tokens in those chunks: the default, --glue-f32-linears,
#      --moe-prefill-bf16 and --moe-prefill-kernel 2;
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
# abb FILE TITLE BATCHES FLAGS...: the decode at BATCHES (e.g. 16,64) with FLAGS (and this script's bench
# flags), stderr in $R/FILE.err; ab FILE TITLE FLAGS...: the same at batch 1.
abb() {
  local name=$1 title=$2 batches=$3
  shift 3
  echo "== batch $batches decode $title"
  $BIN --model "$CK" --batches "$batches" --prompt 256 --decode 16 --prefill 0 "$@" "${BENCH_FLAGS[@]}" \
    2> "$R/$name.err" | grep -E "^\| [0-9]+ \| [0-9]+ \||batch-1 decode|extrapolated"
}
ab() {
  local name=$1 title=$2
  shift 2
  abb "$name" "$title" 1 "$@"
}
BENCH_FLAGS=("$@")
[ -z "${SKIP_NO_PDL:-}" ] && ab no-pdl "without PDL" --no-pdl
[ -n "${NO_OVERLAP_AB:-}" ] && ab no-overlap "on one stream (--no-overlap)" --no-overlap
[ -n "${BF16_ACT_AB:-}" ] && ab bf16-act "with bf16 activations in the FP8 GEMVs (--bf16-act)" --bf16-act
[ -n "${MOE_WARPS_AB:-}" ] && ab moe-warps8 "with 8-warp MoE blocks (--moe-warps 8)" --moe-warps 8
[ -n "${GEMV_WARPS_AB:-}" ] && ab gemv-warps4 "with 4-warp GEMV blocks (--gemv-warps 4)" --gemv-warps 4
# WAVE_DIV_AB="2 4": the GEMV / MoE decode grids sized to 1/N of the resident slots (--wave-div N).
for d in ${WAVE_DIV_AB:-}; do ab "wave-div$d" "with --wave-div $d" --wave-div "$d"; done
[ -n "${KV_MAIN_AB:-}" ] && ab kv-row-on-main "with the window KV row on the main stream (--kv-row-on-main)" --kv-row-on-main
[ -n "${SLOTS_AB:-}" ] && ab slots-on-main "with the slot lists on the main stream (--slots-on-main)" --slots-on-main
[ -n "${SHARED_JOIN_AB:-}" ] && ab shared-join-before-moe "with the shared expert joined before the routed w1/w3 (--shared-join-before-moe)" --shared-join-before-moe
[ -n "${PRIO_AB:-}" ] && ab no-priority "with every stream at the default priority (--no-priority)" --no-priority
[ -n "${PRIO_AB:-}" ] && ab main-priority "with the main stream at the greatest priority (--main-priority)" --main-priority
[ -n "${HC_AB:-}" ] && ab hc-two-kernels "with hc_pre / hc_head as two launches (--hc-two-kernels)" --hc-two-kernels
# PREFILL_AB="2048 8192": prefill of 8,192 tokens in chunks of each size, with the router's and weights_proj's
# fp32 cuBLAS GEMMs (the default), with the glue linears (--glue-f32-linears), with the routed experts in bf16 (--moe-prefill-bf16) and on MoE
# prefill GEMM kernel 2 (the default before kernel 3): tok/s, the memory line, the chunk profile's router and
# expert rows.
for c in ${PREFILL_AB:-}; do
  for f in "" --glue-f32-linears --moe-prefill-bf16 "--moe-prefill-kernel 2"; do
    echo "== prefill 8192 in chunks of $c ${f:-(default)}"
    $BIN --model "$CK" --batches 1 --prompt 16 --decode 4 --prefill 8192 --prefill-chunk "$c" $f "${BENCH_FLAGS[@]}" \
      2> "$R/prefill$c${f// /}.err" | grep -E "^prefill [0-9]+ tokens, chunks|^prefill chunk profile|^  router |^  routed_experts|^memory"
  done
done
if [ -n "${MOE_LEAN_AB:-}" ]; then
  ab moe-lean-off "without the lean MoE kernels (--moe-lean off)" --moe-lean off
  ab moe-lean-w2 "with the lean MoE w2 kernel only (--moe-lean w2)" --moe-lean w2
fi
# MOE_NT_AB="1 4": decode at batch 16 and 64 with the MoE decode's n-tiles capped (--moe-max-nt N; default 2).
for nt in ${MOE_NT_AB:-}; do abb "moe-nt$nt" "with --moe-max-nt $nt" 16,64 --moe-max-nt "$nt"; done
# MOE_SPLIT_AB="off 2:64:8:16:64": decode at batch 4, 16 and 64 with the MoE kernels chosen per expert load
# otherwise (--moe-split off|LIGHT[:TOKENS[:WIDE[:WIDER[:LEAN]]]]; default 2:64:8:16:64); MOE_SPLIT_BATCHES to
# choose the batches.
for l in ${MOE_SPLIT_AB:-}; do
  abb "moe-split$l" "with --moe-split $l" "${MOE_SPLIT_BATCHES:-4,16,64}" --moe-split "$l"
done
# MOE_LEAN4_AB=1: decode at batch 2 and 4 with the lean MoE kernels up to 4 tokens (default: 1; the split's
# light experts take them up to 8 tokens).
[ -n "${MOE_LEAN4_AB:-}" ] && abb moe-lean4 "with --moe-lean all:4" 2,4 --moe-lean all:4
# MOE_KS_SWEEP="2 4 8": the same decode with the MoE decode kernels' K splits forced (default: heuristic).
for ks in ${MOE_KS_SWEEP:-}; do ab "moe-ks$ks" "with --moe-ks $ks" --moe-ks "$ks"; done
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
