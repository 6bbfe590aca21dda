#!/usr/bin/env bash
# Builds the compressor and mHC kernels, runs their GPU tests and benchmark, prints a short table last.
# Usage (on the GPU machine, from the repository root): scripts/gpu/run_compressor_mhc.sh
# Logs go to $OUT (default: build-cmhc-gpu/out). Architectures: DSV4_CUDA_ARCHS (default 90a).
# MHC_BASE=REV also builds the benchmark at git revision REV (a worktree; needs the repository's .git) and runs
# it right after this tree's, so both tables come from the same machine and run; MHC_BASE_ROWS (a regex, default
# hc_) picks the base rows printed.
# GTest / nlohmann_json for an image that lacks them: carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
set -uo pipefail
RESULTS=${OUT:-build-cmhc-gpu/out}
mkdir -p "$RESULTS"
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
BUILD=build-cmhc-gpu

DEPS_LOG="$RESULTS/deps.log"
source scripts/gpu/deps_prefix.sh

TESTS="test_cuda_compressor test_cuda_mhc"
{ cmake -S . -B "$BUILD" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build "$BUILD" -j "$JOBS" --target $TESTS bench_cuda_compressor_mhc; } > "$RESULTS/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -40 "$RESULTS/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$RESULTS/gpu.txt" 2>&1

status=0
summary=""
for t in $TESTS; do
  "$BUILD/tests/cuda/$t" --gtest_brief=1 > "$RESULTS/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -E "Failure|FAILED|Expected|Which is|error|trace|channel|seq " "$RESULTS/$t.log" | head -30
  summary+="$t: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|SEED|sinkhorn' "$RESULTS/$t.log" | tr '\n' ' ') rc=$rc"$'\n'
done
"$BUILD/bench/cuda/bench_cuda_compressor_mhc" > "$RESULTS/bench.log" 2>&1 || { echo "bench failed"; tail "$RESULTS/bench.log"; status=1; }
# MHC_NCU="T:D ...": Nsight Compute on the second hc_pre call (its kernels) of `bench --hc-only T D`.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for spec in ${MHC_NCU:-}; do
  T=${spec%:*}; D=${spec#*:}
  timeout 200 "$NCU" --kernel-name-base demangled -k "regex:hc_(mix_tc|collapse)" --launch-skip 2 \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section LaunchStats \
    "$BUILD/bench/cuda/bench_cuda_compressor_mhc" --hc-only "$T" "$D" > "$RESULTS/ncu_hc_${T}_$D.txt" 2>&1
  echo "== ncu hc_pre T=$T D=$D rc=$?"
  grep -E "^  [a-z_ ]+<|^  void|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Issue Slots Busy|highest-utilized|ERR|rror" \
    "$RESULTS/ncu_hc_${T}_$D.txt" | sed -E 's/  +/ /g; s/\(const float \*.*//; s/dsv4::cuda::mhc::<unnamed>:://' | cut -c1-120 | head -24
done
# CMP_NCU="RATIO:HEAD:T ...": Nsight Compute on the compressor's entries kernel in `bench --compressor-only`.
for spec in ${CMP_NCU:-}; do
  IFS=: read -r R H T <<< "$spec"
  timeout 200 "$NCU" --kernel-name-base demangled -k "regex:compressor_entries" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    "$BUILD/bench/cuda/bench_cuda_compressor_mhc" --compressor-only "$R" "$H" "$T" > "$RESULTS/ncu_cmp_${R}_${H}_$T.txt" 2>&1
  echo "== ncu compressor ratio=$R head=$H T=$T rc=$?"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Issue Slots Busy|Stall|ERR|rror" \
    "$RESULTS/ncu_cmp_${R}_${H}_$T.txt" | sed -E 's/  +/ /g' | cut -c1-120 | head -20
done
if [ -n "${MHC_BASE:-}" ]; then
  base_tree=/tmp/dsv4-base-$MHC_BASE
  { git worktree add -f "$base_tree" "$MHC_BASE" &&
    cmake -S "$base_tree" -B "$base_tree/build" -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
    cmake --build "$base_tree/build" -j "$JOBS" --target bench_cuda_compressor_mhc; } > "$RESULTS/base_build.log" 2>&1 &&
    "$base_tree/build/bench/cuda/bench_cuda_compressor_mhc" > "$RESULTS/bench_base.log" 2>&1 ||
    { echo "base bench ($MHC_BASE) failed"; tail -5 "$RESULTS/base_build.log"; }
fi
cat "$RESULTS/gpu.txt"; date -u
printf '%s' "$summary"
sed -n '/^copy bandwidth/,$p' "$RESULTS/bench.log" | tail -n +2 | sed -n '/^copy bandwidth/,$p'
if [ -s "$RESULTS/bench_base.log" ]; then
  echo "base $MHC_BASE:"
  sed -n '/^copy bandwidth/,$p' "$RESULTS/bench_base.log" | grep -E "copy bandwidth|${MHC_BASE_ROWS:-hc_}" | sort -u
fi
exit $status
