#!/usr/bin/env bash
# GPU smoke test of the CLI (device machine, repository root, carry [".gpu-deps"]): build dsv4
# with CUDA, write a small attention-width random model (bench/configs/attention_width_small.json), and
# generate the same greedy tokens with --device cpu and --device cuda.
set -euo pipefail
JOBS=${JOBS:-$(nproc)}
DEPS_LOG=/tmp/cli-deps.log
source scripts/gpu/deps_prefix.sh
# DSV4_BIN=path: a dsv4 built elsewhere (e.g. on the development machine, carried; needs LD_LIBRARY_PATH to the
# CUDA libraries), no build here.
D=${DSV4_BIN:-./build-cli/src/dsv4}
if [ -z "${DSV4_BIN:-}" ]; then
  cmake -S . -B build-cli -DDSV4_CUDA=ON -DDSV4_TESTS=OFF -DDSV4_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} > /tmp/cli-cfg.log 2>&1 || { tail /tmp/cli-cfg.log; exit 1; }
  cmake --build build-cli -j "$JOBS" --target dsv4 > /tmp/cli-build.log 2>&1 || { grep -A3 error /tmp/cli-build.log | head -30; exit 1; }
fi
$D random-checkpoint --config bench/configs/attention_width_small.json --out /tmp/awm > /dev/null
ids=0,17,400,33,900,5,77,301,12,64
for dev in cpu cuda; do
  echo "== $dev"
  $D run --model /tmp/awm --device $dev --ids --prompt-ids $ids --max-tokens 16 --kv-cache-dtype bf16 --max-model-len 256
done
# FP8Q=1: the fp8 KV cache with and without --indexer-fp8-q on both devices (a 700-token prompt, so the CSA
# indexer selects 128 of 175 entries), and the refusal of --indexer-fp8-q with bf16 KV on cuda.
if [ -n "${FP8Q:-}" ]; then
  long=$(seq -s, 1 700)
  for dev in cpu cuda; do
    for q in "" --indexer-fp8-q; do
      echo "== $dev fp8 KV ${q:-(fp32 q)}"
      $D run --model /tmp/awm --device $dev --ids --prompt-ids "$long" --max-tokens 16 \
        --kv-cache-dtype fp8 --max-model-len 1024 $q
    done
  done
  echo "== cuda bf16 KV --indexer-fp8-q (must be refused)"
  if $D run --model /tmp/awm --device cuda --ids --prompt-ids $ids --max-tokens 4 \
      --kv-cache-dtype bf16 --max-model-len 256 --indexer-fp8-q; then
    echo "NOT REFUSED"; exit 1
  fi
fi
# ACTQ=1: --act-quant (DeepSeek's FP8 activations) on both devices, the same prompt (twenty-seventh session).
if [ -n "${ACTQ:-}" ]; then
  for dev in cpu cuda; do
    echo "== $dev --act-quant"
    $D run --model /tmp/awm --device $dev --ids --prompt-ids $ids --max-tokens 16 \
      --kv-cache-dtype bf16 --max-model-len 256 --act-quant
  done
fi
