#!/usr/bin/env bash
# Builds and checks the CUDA sparse-attention kernel only: test_cuda_sparse_attention, then the attention rows
# of bench_cuda_kernels (--attn), a compact table last. Usage (GPU machine, repository root):
#   scripts/gpu/run_attn.sh [--quick]
# Results in $OUT (default build-gpu-attn/out): table.md, bench.csv, test.log, build.log, ptxas.txt.
set -uo pipefail
RES=${OUT:-build-gpu-attn/out}
BDIR=build-gpu-attn
TARGETS="test_cuda_sparse_attention bench_cuda_kernels"
source scripts/gpu/build_kernel_targets.sh
exe=$(find build-gpu-attn -name test_cuda_sparse_attention -type f -perm -u+x | head -1)
run_test "$RES/test.log" 110 "test" "$exe"
# The same tests with one 16-head tile per CTA forced (DSV4_ATTN_HEAD_TILES=1; by default only 1-2 queries use it).
# The test itself runs fp8 rows on every kernel of the device (DSV4_ATTN_KERNEL=mma, and wgmma on sm_90).
run_test "$RES/test_t1.log" 110 "test (head tiles 1)" env DSV4_ATTN_HEAD_TILES=1 "$exe"
bench=$(find build-gpu-attn -name bench_cuda_kernels -type f -perm -u+x | head -1)
timeout 60 "$bench" --attn > "$RES/bench.csv" 2> "$RES/bench.err" || { echo "bench failed"; tail "$RES/bench.err"; status=1; }
stamp "bench done"
python3 bench/cuda/report.py "$RES/bench.csv" > "$RES/table.md" 2>&1
# One profiled launch of the prefill kernel (4096 queries; ATTN_NCU_VARIANT, default the wgmma kernel in split-bf16,
# "split-bf16 t2" for the mma.sync one), when ncu is there and ATTN_NCU is not 0.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ "${ATTN_NCU:-1}" = 0 ] && NCU=
NCU_VARIANT=${ATTN_NCU_VARIANT:-split-bf16 wgmma}
if [ -n "$NCU" ]; then
  timeout 90 "$NCU" -k regex:attn_ --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
    "$bench" --attn-profile="$NCU_VARIANT" > "$RES/ncu.txt" 2>&1
  stamp "ncu rc=$?"
else
  echo "no ncu" > "$RES/ncu.txt"
fi
worst() {  # worst cases by ratio to the derived bound, per precision: worst LOG PRECISION N
  grep "^\[errors\]" "$1" | grep -E " $2 +max" | sed -E 's/^\[errors\] //; s/(.*bound ratio ([0-9.e+-]+).*)/\2 | \1/' | sort -g | tail -"$3"
}
echo "== errors (worst by ratio to the derived bound; all cases in test.log): ratio | case"
for pr in split-bf16 bf16 fp32; do worst "$RES/test.log" "$pr" 3; done
echo "== wgmma kernel (worst by ratio):"
grep "^\[errors\].* wgmma " "$RES/test.log" | sed -E 's/^\[errors\] //; s/(.*bound ratio ([0-9.e+-]+).*)/\2 | \1/' | sort -g | tail -4
echo "== head tiles 1:"
for pr in split-bf16 bf16; do worst "$RES/test_t1.log" "$pr" 2; done
echo "== ncu (prefill $NCU_VARIANT, one launch)"
grep -E "Duration|Throughput|Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc|Pipe Utilization|stalled_[a-z_]+_per_issue_active\.ratio +[a-z]* +[0-9.]*[1-9]|==ERR|ERR_|rror" "$RES/ncu.txt" | \
  sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active\.ratio//; s/  +/ /g' | head -45
echo "== $(cat "$RES/gpu.txt")"
cat "$RES/table.md"
echo "== tests: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|^\[       OK|FAILED  \]' "$RES/test.log" | tr '\n' ' ')"
echo "== tests (head tiles 1): $(grep -E '^\[  PASSED|^\[  FAILED|FAILED  \]' "$RES/test_t1.log" | tr '\n' ' ')"
exit $status
