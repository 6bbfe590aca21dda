#!/usr/bin/env bash
# Configures and builds dsv4 into build/ (Release). Extra arguments go to cmake's configure step.
# When nvcc is present the CUDA backend is compiled too, for sm_90a, sm_120a and sm_121a (compile and link
# only on a machine without a GPU, so the kernels never rot; the GPU tests then skip). DSV4_CUDA=OFF opts out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cuda=${DSV4_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; else cuda=OFF; fi
fi
if [ "$cuda" = ON ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA="$cuda" "$@" >/dev/null
cmake --build build -j"$jobs"
