#!/usr/bin/env bash
# V4-Flash-width GPU forward benchmark (issue #5): writes a random checkpoint in the official formats
# (bench/configs/flash_width_gpu.json: hidden 4096, 64 x 512 attention, 256 MXFP4 experts, indexer
# 64 x 128 top-512, vocab 129280, one CSA and one HCA layer, ~9 GB; writing it takes most of the time, so
# per-layer figures come from two layers), then runs build/bench_gpu_forward. Usage on the GPU machine, repository root, with carry
# [".gpu-deps"]: JOBS=16 bash scripts/gpu/bench_flash.sh [extra bench flags]; FLASH_BUILD_ONLY=1 stops after the
# build and the checkpoint.
set -uo pipefail
FINAL=${OUT:-build-flash/out}
mkdir -p "$FINAL"
FINAL=$(cd "$FINAL" && pwd)
JOBS=${JOBS:-$(nproc)}
B=${BENCH_BUILD:-build-flash}
DEPS_LOG="$FINAL/deps.log"
source scripts/gpu/deps_prefix.sh
# Always (re)build: incremental on a warm machine, and a stale binary would measure old code.
{ cmake -S . -B $B -DDSV4_CUDA=ON -DDSV4_BENCH=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build $B -j "$JOBS" --target dsv4 bench_gpu_forward; } > "$FINAL/build-flash.log" 2>&1 \
  || { echo "BUILD FAILED"; grep -E "error" -A3 "$FINAL/build-flash.log" | head -30; exit 1; }
CK=${FLASH_DIR:-/tmp/dsv4-flash2}
if [ ! -f "$CK/model.safetensors.index.json" ]; then
  t0=$(date +%s)
  OMP_NUM_THREADS=$JOBS $B/src/dsv4 random-checkpoint --config bench/configs/flash_width_gpu.json \
    --out "$CK" --shards 8 > "$FINAL/ckpt.log" 2>&1 || { echo "checkpoint failed"; tail "$FINAL/ckpt.log"; exit 1; }
  echo "random checkpoint: $(du -sh "$CK" | cut -f1) in $(( $(date +%s) - t0 )) s"
fi
[ -n "${FLASH_BUILD_ONLY:-}" ] && exit 0  # the build and the checkpoint only (scripts/gpu/topk_in_engine.sh)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OMP_NUM_THREADS=$JOBS $B/bench/cuda_engine/bench_gpu_forward --model "$CK" "$@" 2> "$FINAL/bench-flash.err" \
  | tee "$FINAL/bench-flash.md"
rc=${PIPESTATUS[0]}
[ $rc -ne 0 ] && tail -5 "$FINAL/bench-flash.err"
exit $rc
