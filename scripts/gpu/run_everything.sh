#!/usr/bin/env bash
# One device call for the whole tree: build everything with CUDA for sm_90a and run every test with ctest
# (CPU and GPU), then the GPU engine check. Usage on the GPU machine, repository root, with carry
# [".gpu-deps"] (made here by scripts/gpu/stage_deps.sh): JOBS=16 scripts/gpu/run_everything.sh
set -uo pipefail
FINAL=${OUT:-build-all/out}
mkdir -p "$FINAL"
FINAL=$(cd "$FINAL" && pwd)
JOBS=${JOBS:-$(nproc)}
B=build-all
DEPS_LOG="$FINAL/deps.log"
source scripts/gpu/deps_prefix.sh
rm -f $B/CMakeCache.txt
{ cmake -S . -B $B -DDSV4_CUDA=ON -DDSV4_BENCH=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} && cmake --build $B -j "$JOBS"; } > "$FINAL/build.log" 2>&1 \
  || { echo "BUILD FAILED"; grep -E "error" -A3 "$FINAL/build.log" | head -40; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$FINAL/gpu.txt" 2>&1
(cd $B && DSV4_HOME=$PWD/dsv4-home OMP_NUM_THREADS=4 ctest -j4 --timeout 400 > "$FINAL/ctest.log" 2>&1)
rc=$?
echo "== $(date -u +%F) $(cat "$FINAL/gpu.txt")"
grep -E "vs CPU|greedy|max rel|decode \(" $B/Testing/Temporary/LastTest.log | head -30
grep -E "Skipped|Failed|Not Run|tests passed|failed out" "$FINAL/ctest.log" | head -40
exit $rc
