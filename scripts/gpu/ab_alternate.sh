#!/usr/bin/env bash
# An engine A/B in alternating processes: builds bench_gpu_forward and writes the V4-Flash-width checkpoint
# (bench_flash.sh with FLASH_BUILD_ONLY=1), then runs each variant once per round, in turn, ROUNDS times (default
# 2), and prints the decode rows (batch | context | ms ...) of each process under its variant's name.
# A variant is one word list: words like NAME=value go to the environment, the rest are extra bench flags; ""
# is the default; BIN=path runs another bench_gpu_forward binary (e.g. one built at the base revision and
# carried, run 140). Since bench_gpu_forward warms each graph key up twice (run 126) a row repeats within ~0.04 ms
# between processes, so two rounds separate changes of ~0.05 ms.
# Usage on the GPU machine, repository root, carry [".gpu-deps"]:
#   AB_ARGS="--batches 1 --prompt 256 --decode 16 --prefill 32768 --prefill-chunk 2048 --repeat-layers 21" \
#     JOBS=16 bash scripts/gpu/ab_alternate.sh "" "DSV4_TOPK_KERNEL=resident" "--indexer-fp8-q"
# Results: $OUT/ab.txt (default build-flash/out); each process's stderr in $OUT/ab_<round>_<n>.err.
set -uo pipefail
RES=${OUT:-build-flash/out}
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
[ -z "${AB_SKIP_BUILD:-}" ] && { OUT="$RES" FLASH_BUILD_ONLY=1 bash scripts/gpu/bench_flash.sh || exit 1; }
BIN=${AB_BIN:-build-flash/bench/cuda_engine/bench_gpu_forward}
CK=${FLASH_DIR:-/tmp/dsv4-flash2}
read -r -a ARGS <<< "${AB_ARGS:---batches 1,16 --prompt 256 --decode 16 --prefill 8192,65536 --prefill-chunk 2048 --repeat-layers 21}"
[ $# -eq 0 ] && set -- ""
for round in $(seq 1 "${ROUNDS:-2}"); do
  n=0
  for v in "$@"; do
    n=$((n + 1))
    envs=()
    flags=()
    bin=$BIN
    for w in $v; do
      if [[ $w =~ ^BIN= ]]; then bin=${w#BIN=}
      elif [[ $w =~ ^[A-Za-z_][A-Za-z_0-9]*= ]]; then envs+=("$w"); else flags+=("$w"); fi
    done
    echo "== round $round, variant ${v:-default}"
    timeout "${AB_TIMEOUT:-120}" env "${envs[@]}" "$bin" --model "$CK" "${ARGS[@]}" "${flags[@]}" \
      2> "$RES/ab_${round}_$n.err" | grep -E "^\| [0-9]+ \| [0-9]+ \||^prefill [0-9]+ tokens,"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && { echo "rc=$rc"; tail -3 "$RES/ab_${round}_$n.err"; }
  done
done 2>&1 | tee "$RES/ab.txt"
