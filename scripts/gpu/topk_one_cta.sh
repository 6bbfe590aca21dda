#!/usr/bin/env bash
# The top-k's one-CTA-per-row policy (twenty-eighth session; parts with < 128 KB of shared memory per block use it
# by themselves, DSV4_TOPK_ONE_CTA=1 forces it on the H200): test_cuda_topk twice (every case also under the
# policy, CudaTopk.OneCtaPerRowPolicy), then bench_cuda_kernels' rows of a few shapes with and without it.
# Usage (GPU machine, repository root, carry [".gpu-deps"]): OUT=$OUT bash scripts/gpu/topk_one_cta.sh
set -uo pipefail
D=${OUT:?}
mkdir -p build-gpu-topk/out
R=$PWD/build-gpu-topk/out
OUT=$R TOPK_NCU=none TOPK_BENCH=0 timeout -k 5 200 bash scripts/gpu/run_topk.sh > "$D/topk.txt" 2>&1
echo "run_topk rc=$?" >> "$D/topk.txt"
b=$(find build-gpu-topk -name bench_cuda_kernels -type f -perm -u+x | head -1)
for one in 0 1; do
  for sh in ${SHAPES:-1,65536,512 8,65536,512 1,262144,512 64,65536,512 512,262144,512}; do
    DSV4_TOPK_ONE_CTA=$one timeout 60 "$b" --topk-case=$sh 2>/dev/null | grep -E "^topk" |
      sed "s/^/one_cta=$one /" >> "$D/onecta.txt"
  done
done
tar czf "$D/topk.tgz" -C build-gpu-topk/out .
tail -6 "$D/topk.txt"
grep -E "default" "$D/onecta.txt" | cut -d, -f1-3
