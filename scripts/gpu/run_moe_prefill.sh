#!/usr/bin/env bash
# Builds and runs the MXFP4 MoE prefill test and benchmark (src/backend/cuda/linear/moe_prefill.cu) on the
# GPU machine, from the repository root. Prints the test summary and the benchmark table last.
# Usage: scripts/gpu/run_moe_prefill.sh [--quick]   (carry [".gpu-deps"]; logs under $OUT)
# MOEP_NCU=2048: also Nsight Compute sections (speed of light, warp stalls, occupancy, scheduler) of the GEMM
# kernels of one bf16 and one f16 call per GEMM kernel at that T (bench --profile), into ncu.txt; a summary prints.
set -uo pipefail
FINAL=${OUT:-build-gpu-moep/out}
mkdir -p "$FINAL"
JOBS=${JOBS:-16}
QUICK=${1:-}
B=${MOEP_BUILD:-build-gpu-moep}  # MOEP_BUILD=build-gpu reuses run_lead.sh's build on a warm machine
DEPS_LOG="$FINAL/deps.log"
source scripts/gpu/deps_prefix.sh

TARGETS="test_cuda_moe_prefill bench_cuda_moe_prefill"
t0=$(date +%s)
# The real top level (tests and benchmarks on); only the two targets and their libraries are built.
{ cmake -S . -B $B -DDSV4_CUDA=ON -DDSV4_BENCH=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS" --target $TARGETS; } > "$FINAL/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" -A3 "$FINAL/build.log" | head -40; tail -20 "$FINAL/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1

status=0
exe=$(find $B -name test_cuda_moe_prefill -type f -perm -u+x | head -1)
t0=$(date +%s)
OMP_NUM_THREADS=$JOBS timeout 150 "$exe" > "$FINAL/test.log" 2>&1
rc=$?
echo "test: $(( $(date +%s) - t0 )) s rc=$rc"
if [ $rc -ne 0 ]; then
  status=1
  grep -E "Failure|FAILED|Expected|Which is|which is|error|Error|differs|tile " "$FINAL/test.log" | head -40
  tail -5 "$FINAL/test.log"
fi

bench=$(find $B -name bench_cuda_moe_prefill -type f -perm -u+x | head -1)
timeout ${MOEP_BENCH_TIMEOUT:-150} "$bench" $QUICK > "$FINAL/bench.log" 2>&1 || { echo "bench failed"; tail -8 "$FINAL/bench.log"; status=1; }
if [ -n "${MOEP_NCU:-}" ] && command -v ncu > /dev/null; then
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k "regex:moe_gemm_(v2_|wgmma_)?kernel" --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --metrics "regex:smsp__average_warps_issue_stalled_(barrier|long_scoreboard|short_scoreboard|wait|math_pipe_throttle|mio_throttle)_per_issue_active\.ratio" \
    "$bench" --profile "$MOEP_NCU" > "$FINAL/ncu.txt" 2>&1
  echo "ncu rc=$?"
fi

# MOEP_NCU_SOURCE=T: Nsight Compute's per-instruction counts and stall samples (source page, SASS) of kernel 3's
# f16 w1/w3 launch at T tokens (the bench's --profile T makes one bf16 then one f16 call: the third wgmma launch),
# packed into $FINAL/ncu_source.tar.xz; `python3 scripts/gpu/ncu_stalls.py source.csv` reads it (twenty-sixth session).
if [ -n "${MOEP_NCU_SOURCE:-}" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  SRC=$(mktemp -d)
  timeout ${NCU_TIMEOUT:-150} "$NCU" --kernel-name-base demangled -k regex:moe_gemm_wgmma_kernel --launch-skip 2 \
    --launch-count 1 --section SourceCounters --section WarpStateStats --section InstructionStats \
    --section SpeedOfLight --section Occupancy --import-source no -f -o "$SRC/p" "$bench" --profile "$MOEP_NCU_SOURCE" \
    > "$FINAL/ncu_source.log" 2>&1 || echo "ncu source rc=$?"
  if [ -f "$SRC/p.ncu-rep" ]; then
    "$NCU" -i "$SRC/p.ncu-rep" --page details > "$FINAL/ncu_source.txt" 2>&1
    "$NCU" -i "$SRC/p.ncu-rep" --page source --csv --print-source sass > "$SRC/source.csv" 2>&1
    tar -C "$SRC" -cJf "$FINAL/ncu_source.tar.xz" source.csv && ls -la "$FINAL/ncu_source.tar.xz"
  fi
  rm -rf "$SRC"
fi

echo "== test lines (worst first by model error)"
grep -E "^moe_prefill(_f16)? hidden" "$FINAL/test.log" | awk -F'model ' '{split($2, a, ","); print a[1], $0}' | sort -g | tail -4 | cut -d' ' -f2- | sed 's/moe_prefill //'
grep -E "^moe_prefill(_f16)? hidden" "$FINAL/test.log" | awk -F'moe_forward ' '{split($2, a, ","); print a[1]}' | sort -g | tail -1 | sed 's/^/worst vs cpu::moe_forward: /'
echo "cases run: $(grep -cE '^moe_prefill(_f16)? hidden' "$FINAL/test.log")"
grep -E "^moe_prefill(_f16)? (kernel [123] vs moe_decode|graph|misaligned)" "$FINAL/test.log"
grep -c "bit-identical to the default: yes" "$FINAL/test.log" | sed 's/^/tile widths and pipelines bit-identical: /'
grep -c "bit-identical to the default: no" "$FINAL/test.log" | sed 's/^/tile widths and pipelines differing: /'
grep -c "bit-identical to its kernel: yes" "$FINAL/test.log" | sed 's/^/default kernel choice matching its kernel: /'
grep -c "bit-identical to its kernel: no" "$FINAL/test.log" | sed 's/^/default kernel choice differing: /'
grep -E "^\[  (PASSED|FAILED|SKIPPED)|^\[  FAILED|DSV4_TEST_SEED" "$FINAL/test.log"
if [ -f "$FINAL/ncu.txt" ]; then
  echo "== ncu (T=$MOEP_NCU)"
  grep -E "moe_gemm_(v2_|wgmma_)?kernel<|Duration|Issued Warp|Achieved Occupancy|Registers Per|Block Limit|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|stalled_" "$FINAL/ncu.txt" |
    sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g' | head -260
fi
echo "== bench"
grep -E "copy bandwidth" "$FINAL/bench.log"
sed -n '/^MoE prefill/,$p' "$FINAL/bench.log"
exit $status
