#!/usr/bin/env bash
# Configures and builds dsv4 into build/ (Release). Extra arguments go to cmake's configure step.
# The CUDA backend is compiled too when nvcc is present (compile and link only; see docs/ARCHITECTURE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs"
