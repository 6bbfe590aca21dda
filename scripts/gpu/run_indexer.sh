#!/usr/bin/env bash
# Builds test_cuda_indexer and bench_cuda_kernels, runs the indexer test and the indexer benchmark rows only,
# prints a compact table last. Usage (on the GPU machine, repository root): scripts/gpu/run_indexer.sh [--quick]
# Results go to $OUT (default: build-gpu-idx/out): bench.csv, test.log, build.log, ptxas.txt.
set -uo pipefail
RESULTS=${OUT:-build-gpu-idx/out}
mkdir -p "$RESULTS"
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-16}
QUICK=${1:-}
DEPS_LOG="$RESULTS/deps.log"
source scripts/gpu/deps_prefix.sh

SRC=.
grep -q "cuda.cmake" CMakeLists.txt || SRC=scripts/gpu/standalone
t0=$(date +%s)
{ cmake -S "$SRC" -B build-gpu-idx -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build build-gpu-idx -j "$JOBS" --target test_cuda_indexer bench_cuda_kernels; } > "$RESULTS/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" -A3 "$RESULTS/build.log" | head -60; tail -20 "$RESULTS/build.log"; exit 1; }
echo "== build $(( $(date +%s) - t0 )) s"
grep -iE "spill" "$RESULTS/build.log" | grep -i indexer | head -5
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1

status=0
exe=$(find build-gpu-idx -name test_cuda_indexer -type f -perm -u+x | head -1)
t0=$(date +%s)
timeout 100 "$exe" > "$RESULTS/test.log" 2>&1
rc=$?
echo "== test rc=$rc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |DSV4_TEST_SEED" "$RESULTS/test.log" | head -30
if [ $rc -ne 0 ]; then
  status=1
  grep -E "Failure|error|Expected|Which is|got|want|must be|bound" "$RESULTS/test.log" | head -40
fi
grep "^\[stats\]" "$RESULTS/test.log" | sort -t' ' -k1,1 | awk '{print}' | head -70 > "$RESULTS/stats.txt"
echo "== worst err/bound over all cases:"
grep -o "max err/bound [0-9.e+-]*" "$RESULTS/stats.txt" | awk '{print $3}' | sort -g | tail -1
grep -E "exact_q|mxfp4" "$RESULTS/stats.txt" | head -6

bench=$(find build-gpu-idx -name bench_cuda_kernels -type f -perm -u+x | head -1)
timeout 100 "$bench" --indexer $QUICK > "$RESULTS/bench.csv" 2> "$RESULTS/bench.err" ||
  { echo "bench failed rc=$?"; tail -20 "$RESULTS/bench.err"; status=1; }
echo "== indexer bench (us median; ratio = frac of copy BW or TFLOP/s)"
awk -F, '{printf "%-24s %-34s %10s us  %s %s\n", $1, $2, $3, $6, $7}' "$RESULTS/bench.csv"
# IDX_NCU="NAME:SKIP ...": Nsight Compute on one launch of the kernel matching regex NAME after SKIP launches of it
# in `bench --indexer` (each bench row makes 303 launches: 3 warm-up + 30 x 10), e.g. "wgmma_kernel<.int.4:1"
# (the fp8_q prefill row) or "wgmma_kernel<.int.1,:1518" (fp8_q decode q=8 x 256K; demangled names, no spaces).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for spec in ${IDX_NCU:-}; do
  [ -z "$NCU" ] && { echo "no ncu"; break; }
  name=${spec%:*}; skip=${spec##*:}; tag=$(echo "$name" | tr -c 'A-Za-z0-9_\n' '_')
  timeout 200 "$NCU" --kernel-name-base demangled -k "regex:$name" --launch-skip "$skip" --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section LaunchStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$bench" --indexer > "$RESULTS/ncu_$tag.txt" 2>&1
  echo "== ncu $name (launch $skip) rc=$?"
  grep -E "Duration|Throughput|Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc|Pipe Utilization|stalled_[a-z_]+_per_issue_active\.ratio +[a-z]* +[0-9.]*[1-9]|==ERR|ERR_|rror" \
    "$RESULTS/ncu_$tag.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active\.ratio//; s/  +/ /g' | head -45
done
exit $status
