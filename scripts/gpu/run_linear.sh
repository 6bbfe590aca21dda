#!/usr/bin/env bash
# Builds src/backend/cuda/linear with its tests and benchmarks, runs them all, prints a short table last.
# Usage (on the GPU machine, from the repository root): scripts/gpu/run_linear.sh [--quick]
# Logs go to $OUT (default build-gpu-linear/out). Architectures: DSV4_CUDA_ARCHS (default 90a).
# Dependencies the device image may lack (GTest, nlohmann_json): carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
# Prebuilt binaries: carry "build-lin-bin" (test_cuda_gemv, test_cuda_moe_decode, test_cuda_prefill,
# bench_cuda_linear built here for 90a) to skip the device build; they are used when all their libraries load.
# Step time limits: LIN_TEST_S (default 90 s per test binary), LIN_BENCH_S (120), LIN_TORCH_S (60); the torch
# peer is skipped once LIN_SKIP_TORCH_AFTER seconds (default 100000) have passed. LIN_TESTS: the test binaries
# (none: no tests).
set -uo pipefail
FINAL=${OUT:-build-gpu-linear/out}
mkdir -p "$FINAL"
RESULTS=$(mktemp -d)  # every log; packed into $FINAL/logs.tgz, the main ones also copied (at most 8 files back)
pack() {
  # (not the binaries, ~45 MB, nor the ncu source CSVs, packed apart: a returned file may have at most 16 MiB)
  tar -czf "$FINAL/logs.tgz" --exclude=./bin --exclude=./ncu_source -C "$RESULTS" .
  cp "$RESULTS"/bench.log "$RESULTS"/torch_peer.log "$RESULTS"/test_cuda_*.log "$FINAL"/ 2>/dev/null
}
trap pack EXIT
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
QUICK=${1:-}
B=build-gpu-linear
TESTS=${LIN_TESTS:-test_cuda_gemv test_cuda_moe_decode test_cuda_prefill}
TARGETS="test_cuda_gemv test_cuda_moe_decode test_cuda_prefill bench_cuda_linear"

BIN=""
if [ -d build-lin-bin ]; then
  BIN=build-lin-bin
  for t in $TARGETS; do
    if [ ! -x "$BIN/$t" ] || ldd "$BIN/$t" | grep -q "not found"; then
      echo "prebuilt $t unusable: $(ldd "$BIN/$t" 2>&1 | grep 'not found' | head -2)"; BIN=""; break
    fi
  done
fi
if [ -z "$BIN" ]; then
  DEPS_LOG="$RESULTS/deps.log"
  source scripts/gpu/deps_prefix.sh
  { cmake -S . -B $B -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
      ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS" --target $TARGETS; } > "$RESULTS/build.log" 2>&1 ||
    { echo "BUILD FAILED"; grep -E "error" -A3 "$RESULTS/build.log" | head -40; tail -20 "$RESULTS/build.log"; exit 1; }
  BIN=$RESULTS/bin
  mkdir -p "$BIN"
  for t in $TARGETS; do cp "$(find $B -name "$t" -type f -perm -u+x | head -1)" "$BIN/"; done
else
  echo "using prebuilt binaries in $BIN"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$RESULTS/gpu.txt" 2>&1

status=0
summary=""
for t in $TESTS; do
  [ "$t" = none ] && continue  # LIN_TESTS=none: benchmarks only
  OMP_NUM_THREADS=$JOBS timeout "${LIN_TEST_S:-90}" "$BIN/$t" > "$RESULTS/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && { echo "== $t rc=$rc"; grep -E "Failure|FAILED|Expected|Which is|rel_norm|error|not deterministic|Value of|Actual" "$RESULTS/$t.log" | head -40; tail -3 "$RESULTS/$t.log"; }
  summary+="$t: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$RESULTS/$t.log" | tr '\n' ' ') rc=$rc"$'\n'
done

timeout "${LIN_BENCH_S:-120}" "$BIN/bench_cuda_linear" $QUICK > "$RESULTS/bench.log" 2>&1 || { echo "bench failed rc=$?"; tail -8 "$RESULTS/bench.log"; status=1; }
[ "$SECONDS" -lt "${LIN_SKIP_TORCH_AFTER:-100000}" ] && PYTHONUNBUFFERED=1 timeout "${LIN_TORCH_S:-60}" python3 bench/cuda_linear/torch_peer.py $QUICK > "$RESULTS/torch_peer.log" 2>&1 || { echo "torch peer failed"; tail -5 "$RESULTS/torch_peer.log"; }

# LIN_NCU=1: Nsight Compute on a few launches of the v2 kernels (file ncu.txt in $OUT); LIN_NCU_KERNELS (regexes,
# space-separated) and LIN_NCU_ARGS (the bench's arguments, default --profile) choose what is profiled.
if [ "${LIN_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    : > "$FINAL/ncu.txt"
    for k in ${LIN_NCU_KERNELS:-"gemv2_kernel<false" "gemv2_kernel<true" "_v2_kernel<"}; do
      timeout "${LIN_NCU_S:-45}" "$NCU" --kernel-name-base demangled -k regex:"$k" -c 2 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
        --section SchedulerStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" "$BIN/bench_cuda_linear" ${LIN_NCU_ARGS:---profile} >> "$FINAL/ncu.txt" 2>&1 || echo "ncu $k rc=$?"
    done
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Issued Ipc|Stall|Registers Per|Waves Per SM|No Eligible|L2 Hit|stalled_[a-z_]+_per_issue_active\.ratio +[a-z]* +[0-9.]*[1-9]" "$FINAL/ncu.txt" | \
      sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active\.ratio//; s/  +/ /g' | head -${LIN_NCU_LINES:-120}
  else
    echo "ncu not found"
  fi
fi
# LIN_NCU_SOURCE="REGEX ...": per matching kernel (its third launch in `bench_cuda_linear --profile`, f16 activations
# as in the engine), Nsight Compute's per-instruction executed counts and stall samples (`--page source --csv`),
# all packed into $OUT/ncu_source.tar.xz (one CSV of ~3,500 lines per MoE kernel: uncompressed, two of them with
# the logs exceeded the 16 MiB a returned file may have in run 147), and the details page into ncu_source.txt.
if [ -n "${LIN_NCU_SOURCE:-}" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  SRC=$RESULTS/ncu_source
  mkdir -p "$SRC"
  : > "$FINAL/ncu_source.txt"
  i=0
  for k in $LIN_NCU_SOURCE; do
    i=$((i + 1))
    timeout "${LIN_NCU_S:-90}" "$NCU" --kernel-name-base demangled -k regex:"$k" --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight \
      --section Occupancy --import-source no -f -o "$SRC/p$i" "$BIN/bench_cuda_linear" --profile > "$SRC/ncu_$i.log" 2>&1 ||
      echo "ncu source $k rc=$?"
    if [ -f "$SRC/p$i.ncu-rep" ]; then
      { echo "== $k"; "$NCU" -i "$SRC/p$i.ncu-rep" --page details; } >> "$FINAL/ncu_source.txt" 2>&1
      "$NCU" -i "$SRC/p$i.ncu-rep" --page source --csv --print-source sass > "$SRC/source_$i.csv" 2>&1
      rm -f "$SRC/p$i.ncu-rep"
    fi
  done
  tar -C "$SRC" -cJf "$FINAL/ncu_source.tar.xz" . && ls -la "$FINAL/ncu_source.tar.xz"
fi
# LIN_SASS="regex": static SASS instruction counts of the matching kernels (scripts/gpu/sass_count.py) from the
# freshly built library (needs the build above, not prebuilt binaries).
if [ -n "${LIN_SASS:-}" ]; then
  LIB=$(find $B -name libdsv4_cuda_linear.a | head -1)
  if [ -n "$LIB" ] && command -v cuobjdump > /dev/null; then
    cuobjdump -sass -arch sm_90a "$LIB" > "$RESULTS/sass.txt" 2>&1
    python3 scripts/gpu/sass_count.py "$LIN_SASS" < "$RESULTS/sass.txt" | tee "$FINAL/sass_counts.txt" | head -60
  else
    echo "no library or no cuobjdump for LIN_SASS"
  fi
fi
echo "== $(date -u +%F) $(tail -1 "$RESULTS/gpu.txt")"
grep -hE "^(gemv|moe|prefill) " "$RESULTS"/test_cuda_*.log | sort | uniq > "$RESULTS/errors.txt"
echo "== worst test errors (gemv by rel_norm, moe by float64-model error)"
grep "^gemv" "$RESULTS/errors.txt" | sort -g -t= -k4 | tail -2
grep "^moe" "$RESULTS/errors.txt" | awk -F'float64 model ' '{split($2, a, ","); print a[1], $0}' | sort -g | tail -2
grep -E "copy bandwidth" "$RESULTS/bench.log" "$RESULTS/torch_peer.log"
sed -n '/^| torch peer/,$p' "$RESULTS/torch_peer.log"
sed -n '/^| case/,$p' "$RESULTS/bench.log"
echo "== tests"
printf "%s" "$summary"
exit $status
