#!/usr/bin/env bash
# The MoE prefill's mixed tile lists in one call (twenty-eighth session, run 167; on by default since): test_cuda_moe_prefill
# and its bench (built here), the bench again with DSV4_MOE_MIXED_TILES=0 (plain tiles), then the engine's prefill A/B on dsv4 and
# bench_gpu_forward built on the development machine and carried as build-lead/eng.tar.xz (tar of the two
# stripped binaries, xz -9: ~8.5 MB, fits beside the tree and .gpu-deps).
# Usage on the GPU machine, repository root, carry [".gpu-deps", "build-lead/eng.tar.xz"]:
#   OUT=$OUT bash scripts/gpu/mixed_tiles_ab.sh ["" "--moe-prefill-plain-tiles" ...]
set -uo pipefail
R=${OUT:?}
mkdir -p "$R/moep" "$R/ab"
X=/tmp/x
mkdir -p $X && tar -C $X -xJf build-lead/eng.tar.xz || { echo "no build-lead/eng.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# The checkpoint writer on the CPU while the kernel test builds and runs would slow both: in turn.
MOEP_BUILD=build-gpu-moep OUT="$R/moep" JOBS=${JOBS:-16} timeout -k 5 ${MOEP_TIMEOUT:-260} \
  bash scripts/gpu/run_moe_prefill.sh --quick > "$R/moep.txt" 2>&1
echo "run_moe_prefill rc=$?"; tail -40 "$R/moep.txt"
echo "== the bench with plain tiles"
DSV4_MOE_MIXED_TILES=0 timeout 120 build-gpu-moep/bench/cuda_linear/bench_cuda_moe_prefill --quick \
  > "$R/moep/bench_plain.log" 2>&1 || echo "mixed bench rc=$?"
sed -n '/^MoE prefill/,$p' "$R/moep/bench_plain.log"
CK=/tmp/dsv4-flash2
t0=$(date +%s)
OMP_NUM_THREADS=${JOBS:-16} $X/dsv4 random-checkpoint --config bench/configs/flash_width_gpu.json --out $CK --shards 8 \
  > "$R/ab/ckpt.log" 2>&1 || { echo "checkpoint failed"; tail "$R/ab/ckpt.log"; exit 1; }
echo "checkpoint: $(( $(date +%s) - t0 )) s"
[ $# -eq 0 ] && set -- "" "--moe-prefill-plain-tiles" "--moe-prefill-tile 32"
AB_SKIP_BUILD=1 AB_BIN=$X/bench_gpu_forward OUT="$R/ab" ROUNDS=${ROUNDS:-2} AB_TIMEOUT=${AB_TIMEOUT:-100} \
  AB_ARGS=${AB_ARGS:-"--batches 1 --prompt 256 --decode 4 --prefill 8192 --prefill-chunk 2048 --repeat-layers 21"} \
  bash scripts/gpu/ab_alternate.sh "$@"
