#!/usr/bin/env bash
# Where the batch-1 decode step's time goes as the context grows (docs/NOTES.md, "First thing next session"):
# one bench_gpu_forward process per context in CTXS, each with its eager per-operation profile at that context
# (serialized, one stream) and its graph step (branches overlapped); scripts/gpu/profile_contexts.py prints the
# per-operation table for CSA and HCA layers. Needs bench_flash.sh's build and checkpoint first:
#   FLASH_BUILD_ONLY=1 JOBS=16 OUT=... bash scripts/gpu/bench_flash.sh
# Usage on the GPU machine: CTXS="256 8192 65536" OUT=dir bash scripts/gpu/profile_contexts.sh [extra bench flags]
set -uo pipefail
B=${BENCH_BUILD:-build-flash}
CK=${FLASH_DIR:-/tmp/dsv4-flash2}
R=${OUT:-build-flash/out}
mkdir -p "$R"
files=()
for ctx in ${CTXS:-256 8192 65536}; do
  f="$R/profile-ctx$ctx.txt"
  timeout "${CTX_TIMEOUT:-120}" "$B/bench/cuda_engine/bench_gpu_forward" --model "$CK" --batches 1 --prompt "$ctx" \
    --decode 16 --prefill 0 --prefill-chunk 2048 --repeat-layers 21 "$@" > "$f" 2> "$R/profile-ctx$ctx.err"
  echo "context $ctx rc=$?"
  files+=("$f")
done
python3 scripts/gpu/profile_contexts.py "${files[@]}"
