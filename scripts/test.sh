#!/usr/bin/env bash
# The whole test suite: build everything, then run every test with ctest (CPU; GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export DSV4_HOME="$(mktemp -d)"  # the CLI tests write the default model here, not into ~
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # ctest -j runs several OpenMP programs at once
trap 'rm -rf "$DSV4_HOME"' EXIT
cd build
ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)"
