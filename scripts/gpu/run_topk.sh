#!/usr/bin/env bash
# Builds and checks the CUDA top-k only: test_cuda_topk (twice, two fresh seeds), the top-k rows of
# bench_cuda_kernels (--topk: the default choice and each kernel, DSV4_TOPK_KERNEL) next to torch.topk,
# Nsight Compute on two shapes, a compact table last. Usage (GPU machine, repository root): scripts/gpu/run_topk.sh
# Results in $OUT (default build-gpu-topk/out): table.md, bench.csv, torch_topk.csv, test*.log, ncu*.txt.
# TOPK_NCU="ROWS,LEN,K ..." picks the profiled shapes (default "1,65536,512 512,262144,512"; "none": no ncu);
# TOPK_NCU_KERNELS="topk_stream topk_resident" profiles each kernel (default: the first top-k launch, i.e. the
# default choice); TOPK_SASS=1 adds per-instruction counts and stall samples (sass_*.csv), TOPK_SAMPLING=0 samples
# every 32 cycles (for the short few-row launches); TOPK_TESTS=N test runs (default 2);
# TOPK_BENCH=0 skips the bench and torch.topk.
set -uo pipefail
RES=${OUT:-build-gpu-topk/out}
BDIR=build-gpu-topk
TARGETS="test_cuda_topk bench_cuda_kernels"
source scripts/gpu/build_kernel_targets.sh
exe=$(find build-gpu-topk -name test_cuda_topk -type f -perm -u+x | head -1)
# Two fresh seeds (each log prints its DSV4_TEST_SEED); every case runs on each kernel (DSV4_TOPK_KERNEL).
for run in $(seq 1 "${TOPK_TESTS:-2}"); do run_test "$RES/test_$run.log" 200 "test run $run" "$exe"; done
bench=$(find build-gpu-topk -name bench_cuda_kernels -type f -perm -u+x | head -1)
if [ "${TOPK_BENCH:-1}" != 0 ]; then
  timeout 120 "$bench" --topk > "$RES/bench.csv" 2> "$RES/bench.err" ||
    { echo "bench failed"; tail "$RES/bench.err"; status=1; }
  stamp "bench done"
  timeout 120 python3 bench/cuda/torch_topk_peer.py > "$RES/torch_topk.csv" 2> "$RES/torch.err" || tail "$RES/torch.err"
  stamp "torch done"
  python3 bench/cuda/report.py "$RES/bench.csv" "$RES/torch_topk.csv" > "$RES/table.md" 2>&1
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SHAPES=${TOPK_NCU:-"1,65536,512 512,262144,512"}
if [ -n "$NCU" ] && [ "$SHAPES" != none ]; then
  for shape in $SHAPES; do
    for kern in ${TOPK_NCU_KERNELS:-topk_}; do
      # The first matching kernel after 3 warm-up launches (--topk-case runs default, stream, resident in turn).
      tag="${shape//,/_}${TOPK_NCU_KERNELS:+_$kern}"
      if [ -n "${TOPK_SASS:-}" ]; then
        # Per-instruction executed counts and stall samples, exported as CSV (sass_$tag.csv).
        timeout 90 "$NCU" -k "regex:$kern" --launch-skip 3 --launch-count 1 \
          --warp-sampling-interval "${TOPK_SAMPLING:-auto}" --section SourceCounters --section WarpStateStats \
          --section InstructionStats --section SpeedOfLight --section LaunchStats --section Occupancy \
          --import-source no -f -o "$RES/p_$tag" "$bench" --topk-case="$shape" \
          > "$RES/ncu_$tag.txt" 2>&1
        "$NCU" -i "$RES/p_$tag.ncu-rep" --page details >> "$RES/ncu_$tag.txt" 2>&1
        "$NCU" -i "$RES/p_$tag.ncu-rep" --page source --csv --print-source sass > "$RES/sass_$tag.csv" 2>&1
        rm -f "$RES/p_$tag.ncu-rep"
      else
        timeout 60 "$NCU" -k "regex:$kern" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \
          --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
          "$bench" --topk-case="$shape" > "$RES/ncu_$tag.txt" 2>&1
      fi
      stamp "ncu $tag rc=$?"
    done
  done
fi
echo "== $(cat "$RES/gpu.txt")"
for f in "$RES"/ncu_*.txt; do
  [ -f "$f" ] || continue
  echo "== ncu $(basename "$f" .txt) (the default kernel, one launch)"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|stalled_[a-z_]+_per_issue_active\.ratio +[a-z]* +[0-9.]*[1-9]|==ERR|ERR_|rror" "$f" | \
    sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active\.ratio//; s/  +/ /g' | head -24
done
[ -f "$RES/table.md" ] && cat "$RES/table.md"
for run in $(seq 1 "${TOPK_TESTS:-2}"); do
  log="$RES/test_$run.log"
  echo "== tests run $run ($(grep -m1 DSV4_TEST_SEED "$log")): $(grep -E '^\[  PASSED|^\[  FAILED|FAILED  \]' "$log" | tr '\n' ' ')"
done
exit $status
