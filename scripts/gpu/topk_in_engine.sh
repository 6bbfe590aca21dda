#!/usr/bin/env bash
# The indexer's top-k inside the engine's decode step (docs/NOTES.md "Top-k: what the next step needs"; the engine
# A/Bs behind the kernel choice are in topk.cu's comments). Builds and writes the V4-Flash-width checkpoint
# as bench_flash.sh does, then for each kernel choice (default, DSV4_TOPK_KERNEL=stream, =resident, =small; small
# applies to rows of <= 4096 entries, i.e. CTX <= 16385):
#   - Nsight Compute on every top-k launch of a short bench_gpu_forward run (prefill CTX - 1 tokens in chunks of
#     2048, then batch-1 decode at context CTX; two layers): the decode launches' durations on the engine's own
#     score rows, serialized (no side-stream concurrency, no PDL overlap);
#   - with nsys present, a timeline of the same run (kernels of graph nodes included): each decode top-k's
#     duration in place and the kernels that overlap it.
# Usage on the GPU machine, repository root, carry [".gpu-deps"]: CTX=8193 JOBS=16 bash scripts/gpu/topk_in_engine.sh
# Results in $OUT (default build-flash/out): topk_engine.txt (the summary), ncu_topk_*.csv, trace_*.csv.
set -uo pipefail
RES=${OUT:-build-flash/out}
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
CTX=${CTX:-8193}
OUT="$RES" FLASH_BUILD_ONLY=1 bash scripts/gpu/bench_flash.sh || exit 1
F=build-flash/bench/cuda_engine/bench_gpu_forward
CK=${FLASH_DIR:-/tmp/dsv4-flash2}
A=(--model "$CK" --batches 1 --prompt 256 --decode 4 --prefill $((CTX - 1)) --prefill-chunk 2048)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
for k in default stream resident small; do
  envk=()
  [ "$k" != default ] && envk=("DSV4_TOPK_KERNEL=$k")
  if [ -n "$NCU" ]; then
    timeout 300 env "${envk[@]}" "$NCU" -k regex:topk_ \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size --csv --page raw "$F" "${A[@]}" \
      > "$RES/ncu_topk_$k.csv" 2> "$RES/ncu_topk_$k.err"
    echo "ncu $k rc=$?"
  fi
  if [ -n "$NSYS" ]; then
    timeout 200 env "${envk[@]}" "$NSYS" profile --cuda-graph-trace=node --force-overwrite true -o "$RES/trace_$k" \
      "$F" "${A[@]}" > "$RES/nsys_$k.log" 2>&1 &&
      "$NSYS" stats --report cuda_gpu_trace --format csv --force-export true -o "$RES/trace_$k" \
        "$RES/trace_$k.nsys-rep" >> "$RES/nsys_$k.log" 2>&1
    echo "nsys $k rc=$?"
    rm -f "$RES/trace_$k.nsys-rep" "$RES/trace_$k.sqlite"
  fi
done
python3 scripts/gpu/topk_in_engine.py "$RES" | tee "$RES/topk_engine.txt"
