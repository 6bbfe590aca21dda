#!/usr/bin/env bash
# CPU benchmarks for docs/PERFORMANCE.md (not tests). Builds, then measures:
#   1. the embedded default model: prefill and decode tok/s;
#   2. V4-Flash-width layers (hidden 4096, 64 heads x 512, 256 MXFP4 experts, indexer 64 x 128, top-k 512):
#      one CSA and one HCA layer with a 1024-token vocabulary (bench/configs/flash_width_2layers.json),
#      random weights in the official formats written once to $DSV4_BENCH_DIR (default /tmp/dsv4-bench);
#   3. the peer: transformers' DeepseekV4ForCausalLM on the same golden fixture, same process count.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
dir=${DSV4_BENCH_DIR:-/tmp/dsv4-bench}
mkdir -p "$dir"
echo "## machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%F)"
echo "### default model"
./build/bench/bench_cpu_forward --prompt-len 512 --decode 32
if [ ! -f "$dir/flash2/model.safetensors.index.json" ]; then
  ./build/src/dsv4 random-checkpoint --config bench/configs/flash_width_2layers.json --out "$dir/flash2" --shards 4 >/dev/null
fi
echo "### V4-Flash width, layers 2 (CSA) + 3 (HCA) of the schedule"
./build/bench/bench_cpu_forward --model "$dir/flash2" --prompt-len 256 --decode 8 --repeat 1
echo "### peer: transformers vs dsv4 on fixtures/golden/mixed (520 tokens)"
python3 bench/peer_transformers.py
