#!/usr/bin/env bash
# Same-machine before/after of an uncommitted kernel change: builds the tree as carried ("new") and the tree with
# PATCH reversed ("base", in /tmp/base), runs the new build's TESTS, then BENCH with BENCH_ARGS on both, alternating
# ROUNDS times. PATCH is a file in the tree made here with `git diff PATHS > PATCH` (the device's copy of .git may
# lack the session's commits, so a base revision cannot be named). Usage (GPU machine, repository root):
#   PATCH=kernel.patch TESTS="test_cuda_moe_decode test_cuda_gemv" BENCH=bench_cuda_linear BENCH_ARGS=--diag \
#     OUT=$PWD/r bash scripts/gpu/ab_kernel_patch.sh
# Files in $OUT: apply.txt, build_{new,base}.txt, TEST.txt, bench_{base,new}_ROUND.txt (twenty-fourth session, run 148).
set -uo pipefail
: "${PATCH:?PATCH=file made by git diff}" "${BENCH:?BENCH=benchmark target}"
R=${OUT:-ab-patch-out}
mkdir -p "$R"
JOBS=${JOBS:-8}
rm -rf /tmp/base && cp -r . /tmp/base
(cd /tmp/base && git apply -R "$PATCH" && git diff --stat) > "$R/apply.txt" 2>&1 || { echo "patch does not reverse"; cat "$R/apply.txt"; exit 1; }
DEPS_LOG="$R/deps.log"
source scripts/gpu/deps_prefix.sh
conf=(-DDSV4_CUDA=ON -DDSV4_BENCH=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${DSV4_CUDA_ARCHS:-90a}")
[ -n "${PREFIX:-}" ] && conf+=(-DCMAKE_PREFIX_PATH="$PREFIX")
(cmake -S . -B build-ab-new "${conf[@]}" && cmake --build build-ab-new -j "$JOBS" --target ${TESTS:-} "$BENCH") > "$R/build_new.txt" 2>&1 &
(cmake -S /tmp/base -B /tmp/build-ab-base "${conf[@]}" && cmake --build /tmp/build-ab-base -j "$JOBS" --target "$BENCH") > "$R/build_base.txt" 2>&1 &
wait
status=0
for t in ${TESTS:-}; do
  exe=$(find build-ab-new -name "$t" -type f -perm -u+x | head -1)
  timeout "${TEST_S:-150}" "$exe" > "$R/$t.txt" 2>&1
  rc=$?; echo "$t: $(grep -E '^\[  PASSED|^\[  FAILED' "$R/$t.txt" | tr '\n' ' ') rc=$rc"; [ $rc -ne 0 ] && status=1
done
new=$(find build-ab-new -name "$BENCH" -type f -perm -u+x | head -1)
base=$(find /tmp/build-ab-base -name "$BENCH" -type f -perm -u+x | head -1)
for i in $(seq 1 "${ROUNDS:-2}"); do
  timeout "${BENCH_S:-90}" "$base" ${BENCH_ARGS:-} > "$R/bench_base_$i.txt" 2>&1
  timeout "${BENCH_S:-90}" "$new" ${BENCH_ARGS:-} > "$R/bench_new_$i.txt" 2>&1
done
exit $status
