#!/usr/bin/env bash
# Same-machine before/after of uncommitted kernel changes, in one device call. Two forms (GPU machine, repository root):
# - PATCH=file: builds the tree as carried ("new") and the tree with PATCH reversed ("base", in /tmp/base), runs the
#   new build's TESTS, then BENCH with BENCH_ARGS on both, alternating ROUNDS times. PATCH is a file in the tree made
#   here with `git diff PATHS > PATCH` (the device's copy of .git may lack the session's commits, so a base revision
#   cannot be named).
#     PATCH=kernel.patch TESTS="test_cuda_moe_decode test_cuda_gemv" BENCH=bench_cuda_linear BENCH_ARGS=--diag \
#       OUT=$PWD/r bash scripts/gpu/ab_kernel_patch.sh
# - VARIANTS="name=file ...": the tree as carried is "base"; each variant is the tree with its patch applied forward
#   (in /tmp/variant-NAME), so several alternatives of one kernel compare in one call (each start of a device machine
#   costs ~1 min of the session's device time). TESTS run on every variant; BENCH on base and every variant in turn.
#     VARIANTS="early=a.patch late=b.patch" TESTS=test_cuda_moe_decode BENCH=bench_cuda_linear BENCH_ARGS=--diag \
#       OUT=$PWD/r bash scripts/gpu/ab_kernel_patch.sh
# Files: apply*.txt, build_*.txt, TEST[_NAME].txt, bench_NAME_ROUND.txt, ncu_NAME.txt with AB_NCU (below), all packed
# into $OUT/ab_files.tgz at the end (a device call returns at most 8 files: run 162 lost 19 of 22 loose ones).
# AB_GREP="REGEX" prints each bench file's matching lines (e.g. AB_GREP="lean w13\+w2:" or "^\| (512|2048) \|").
# (twenty-fourth session, run 148; VARIANTS twenty-fifth session; AB_NCU twenty-sixth, checked with a mock cmake/ncu).
set -uo pipefail
: "${BENCH:?BENCH=benchmark target}"
[ -n "${PATCH:-}" ] || [ -n "${VARIANTS:-}" ] || { echo "set PATCH=file or VARIANTS=\"name=file ...\""; exit 2; }
OUT_DIR=${OUT:-ab-patch-out}
R=/tmp/ab-files  # packed into $OUT_DIR/ab_files.tgz by pack_files on exit
rm -rf "$R"; mkdir -p "$R" "$OUT_DIR"
pack_files() { tar -C "$R" -czf "$OUT_DIR/ab_files.tgz" . ; }
trap pack_files EXIT
JOBS=${JOBS:-8}
DEPS_LOG="$R/deps.log"
source scripts/gpu/deps_prefix.sh
conf=(-DDSV4_CUDA=ON -DDSV4_BENCH=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${DSV4_CUDA_ARCHS:-90a}")
[ -n "${PREFIX:-}" ] && conf+=(-DCMAKE_PREFIX_PATH="$PREFIX")

# names[i], srcs[i] (source tree), builds[i] (build dir), tested[i] (1: run TESTS there)
names=() srcs=() builds=() tested=()
if [ -n "${PATCH:-}" ]; then
  rm -rf /tmp/base && cp -r . /tmp/base
  (cd /tmp/base && git apply -R "$PATCH" && git diff --stat) > "$R/apply.txt" 2>&1 ||
    { echo "patch does not reverse"; cat "$R/apply.txt"; exit 1; }
  names=(base new) srcs=(/tmp/base .) builds=(/tmp/build-ab-base build-ab-new) tested=(0 1)
else
  names=(base) srcs=(.) builds=(build-ab-base) tested=(0)
  for v in $VARIANTS; do
    n=${v%%=*} p=${v#*=}
    rm -rf "/tmp/variant-$n" && cp -r . "/tmp/variant-$n"
    (cd "/tmp/variant-$n" && git apply "$p" && git diff --stat) > "$R/apply_$n.txt" 2>&1 ||  # (p: relative to the root)
      { echo "patch $p does not apply"; cat "$R/apply_$n.txt"; exit 1; }
    names+=("$n") srcs+=("/tmp/variant-$n") builds+=("/tmp/build-ab-$n") tested+=(1)
  done
fi

# Builds run side by side, the jobs shared among them.
per=$(( JOBS / ${#names[@]} )); [ "$per" -lt 1 ] && per=1
for i in "${!names[@]}"; do
  targets="$BENCH"; [ "${tested[$i]}" = 1 ] && targets="${TESTS:-} $BENCH"
  (cmake -S "${srcs[$i]}" -B "${builds[$i]}" "${conf[@]}" && cmake --build "${builds[$i]}" -j "$per" --target $targets) \
    > "$R/build_${names[$i]}.txt" 2>&1 &
done
wait

status=0
for i in "${!names[@]}"; do
  [ "${tested[$i]}" = 1 ] || continue
  suffix=""; [ -n "${VARIANTS:-}" ] && suffix="_${names[$i]}"
  for t in ${TESTS:-}; do
    exe=$(find "${builds[$i]}" -name "$t" -type f -perm -u+x | head -1)
    [ -n "$exe" ] || { echo "$t${suffix}: not built (build_${names[$i]}.txt)"; status=1; continue; }
    timeout "${TEST_S:-150}" "$exe" > "$R/$t$suffix.txt" 2>&1
    rc=$?; echo "$t$suffix: $(grep -E '^\[  PASSED|^\[  FAILED' "$R/$t$suffix.txt" | tr '\n' ' ') rc=$rc"; [ $rc -ne 0 ] && status=1
  done
done
for i in $(seq 1 "${ROUNDS:-2}"); do
  for j in "${!names[@]}"; do
    exe=$(find "${builds[$j]}" -name "$BENCH" -type f -perm -u+x | head -1)
    [ -n "$exe" ] || { echo "$BENCH not built for ${names[$j]}"; status=1; continue; }
    timeout "${BENCH_S:-90}" "$exe" ${BENCH_ARGS:-} > "$R/bench_${names[$j]}_$i.txt" 2>&1
    [ -n "${AB_GREP:-}" ] && grep -E "$AB_GREP" "$R/bench_${names[$j]}_$i.txt" | sed "s/^/${names[$j]}_$i: /"
  done
done
# AB_NCU="REGEX": Nsight Compute's occupancy and launch sections of one launch per build (the first kernel matching
# REGEX after AB_NCU_SKIP launches of BENCH run with AB_NCU_ARGS, e.g. AB_NCU=moe_gemm_wgmma_kernel AB_NCU_SKIP=2
# AB_NCU_ARGS="--profile 2048" for kernel 3's f16 w1/w3), into ncu_NAME.txt; prints each build's block limits and
# shared-memory configuration (twenty-sixth session: does a variant keep its blocks per SM?).
if [ -n "${AB_NCU:-}" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for j in "${!names[@]}"; do
    exe=$(find "${builds[$j]}" -name "$BENCH" -type f -perm -u+x | head -1)
    [ -n "$exe" ] && [ -n "$NCU" ] || continue
    timeout "${NCU_S:-120}" "$NCU" -k regex:"$AB_NCU" --launch-skip "${AB_NCU_SKIP:-0}" --launch-count 1 \
      --section Occupancy --section LaunchStats --section SpeedOfLight "$exe" ${AB_NCU_ARGS:-} \
      > "$R/ncu_${names[$j]}.txt" 2>&1 || echo "ncu ${names[$j]} rc=$?"
    echo "== ncu ${names[$j]}: $(grep -E 'Duration|Block Limit (Registers|Shared Mem)|Shared Memory Configuration Size|Achieved Occupancy' \
      "$R/ncu_${names[$j]}.txt" | sed -E 's/ +/ /g' | tr '\n' ';')"
  done
fi
exit $status
