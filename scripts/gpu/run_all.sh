#!/usr/bin/env bash
# Builds the CUDA backend, runs every GPU test and benchmark, prints a short table last.
# Usage (on the GPU machine, from the repository root): scripts/gpu/run_all.sh [--quick]
# Results go to $OUT (default: build-gpu/out): table.md, bench.csv, torch_topk.csv and logs.tgz (every log).
# Architectures: DSV4_CUDA_ARCHS (default 90a).
set -uo pipefail
RESULTS=${OUT:-build-gpu/out}
OUT=$(mktemp -d)  # logs are collected here and packed into $RESULTS/logs.tgz at the end
mkdir -p "$RESULTS"
pack() { tar -czf "$RESULTS/logs.tgz" -C "$OUT" . ; cp "$OUT"/table.md "$OUT"/bench.csv "$OUT"/torch_topk.csv "$RESULTS"/ 2>/dev/null; }
trap pack EXIT
ARCHS=${DSV4_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
QUICK=${1:-}

# Dependencies the device image may lack (GTest, nlohmann_json): carry [".gpu-deps"] (scripts/gpu/stage_deps.sh).
DEPS_LOG="$OUT/deps.log"
source scripts/gpu/deps_prefix.sh

# Use the top level once it includes the CUDA backend; until then the stand-alone project.
SRC=.
grep -q "cuda.cmake" CMakeLists.txt || SRC=scripts/gpu/standalone
TARGETS="test_cuda_topk test_cuda_sparse_attention test_cuda_indexer bench_cuda_kernels"
{ cmake -S "$SRC" -B build-gpu -DDSV4_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} &&
  cmake --build build-gpu -j "$JOBS" --target $TARGETS; } > "$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1

status=0
summary=""
for t in test_cuda_topk test_cuda_sparse_attention test_cuda_indexer; do
  exe=$(find build-gpu -name "$t" -type f -perm -u+x | head -1)
  "$exe" --gtest_brief=1 > "$OUT/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -E "Failure|FAILED|error|Expected|Which is|gpu|cpu|max" "$OUT/$t.log" | head -20
  summary+="$t: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$OUT/$t.log" | tr '\n' ' ') rc=$rc"$'\n'
done

bench=$(find build-gpu -name bench_cuda_kernels -type f -perm -u+x | head -1)
"$bench" $QUICK > "$OUT/bench.csv" 2> "$OUT/bench.err" || { echo "bench failed"; tail "$OUT/bench.err"; status=1; }
python3 bench/cuda/torch_topk_peer.py $QUICK > "$OUT/torch_topk.csv" 2> "$OUT/torch.err" || tail "$OUT/torch.err"
python3 bench/cuda/report.py "$OUT/bench.csv" "$OUT/torch_topk.csv" > "$OUT/table.md"

echo "== $(date -u +%F) $(head -2 "$OUT/gpu.txt" | tail -1)"
cat "$OUT/table.md"
echo "== tests"
printf "%s" "$summary"
exit $status
