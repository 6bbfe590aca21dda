#!/usr/bin/env bash
# Twenty-eighth session experiment (runs 168-169, docs/PERFORMANCE.md): the streaming top-k's loads in flight and
# its launch bound. Needs topk_stream.cu with every variant compiled in and chosen by DSV4_TOPK_STREAM_VARIANT
# (aApPbB = A tiles ahead in registers, an L2 prefetch P tiles ahead, launch bound B CTAs per SM, default a1p0 =
# the kernel before the session): `git show 2bf2cae:src/backend/cuda/topk_stream.cu > src/backend/cuda/topk_stream.cu
# && git apply docs/patches/topk_stream_variants.patch`. The test runs once with the default and once per
# TEST_VARIANTS, then the bench rows of each of SHAPES for every one of VARIANTS, alternating, ROUNDS times.
# Usage (GPU machine, repository root, carry [".gpu-deps"]): OUT=$OUT bash scripts/gpu/topk_stream_variants.sh
set -uo pipefail
RES=${OUT:-build-gpu-topk/out}
BDIR=build-gpu-topk
TARGETS="test_cuda_topk bench_cuda_kernels"
source scripts/gpu/build_kernel_targets.sh
exe=$(find $BDIR -name test_cuda_topk -type f -perm -u+x | head -1)
bench=$(find $BDIR -name bench_cuda_kernels -type f -perm -u+x | head -1)
run_test "$RES/test_default.log" 200 "test default" "$exe"
for v in ${TEST_VARIANTS:-a1p8}; do
  run_test "$RES/test_$v.log" 200 "test $v" env DSV4_TOPK_STREAM_VARIANT=$v DSV4_TOPK_KERNEL=stream "$exe"
done
VARS=${VARIANTS:-"a1p0 a1p4 a1p8 a1p16 a2p0b3 a1p4b3"}
SHAPES=${SHAPES:-"512,262144,512 64,262144,512 512,65536,512"}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in $VARS; do
    for sh in $SHAPES; do
      DSV4_TOPK_STREAM_VARIANT=$v DSV4_TOPK_KERNEL=stream timeout 60 "$bench" --topk-case=$sh 2>/dev/null |
        grep -E "^topk.* stream" | sed "s/^/$v r$round /" >> "$RES/variants.txt"
    done
  done
done
stamp "variants done"
cat "$RES/gpu.txt"
sort -k3,3 -k1,1 "$RES/variants.txt" | awk '{print}' | cut -c1-160
exit $status
