#!/usr/bin/env bash
# GPU smoke test of the CLI (device machine, repository root, carry [".gpu-deps"]): build dsv4
# with CUDA, write a small attention-width random model (bench/configs/attention_width_small.json), and
# generate the same greedy tokens with --device cpu and --device cuda.
set -euo pipefail
JOBS=${JOBS:-$(nproc)}
DEPS_LOG=/tmp/cli-deps.log
source scripts/gpu/deps_prefix.sh
cmake -S . -B build-cli -DDSV4_CUDA=ON -DDSV4_TESTS=OFF -DDSV4_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} > /tmp/cli-cfg.log 2>&1 || { tail /tmp/cli-cfg.log; exit 1; }
cmake --build build-cli -j "$JOBS" --target dsv4 > /tmp/cli-build.log 2>&1 || { grep -A3 error /tmp/cli-build.log | head -30; exit 1; }
./build-cli/src/dsv4 random-checkpoint --config bench/configs/attention_width_small.json --out /tmp/awm > /dev/null
ids=0,17,400,33,900,5,77,301,12,64
for dev in cpu cuda; do
  echo "== $dev"
  ./build-cli/src/dsv4 run --model /tmp/awm --device $dev --ids --prompt-ids $ids --max-tokens 16 --kv-cache-dtype bf16 --max-model-len 256
done
