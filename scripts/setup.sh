#!/usr/bin/env bash
# Fresh machine: install what is missing, build, and run the main job (generate from a prompt) on the
# embedded default model, written on first use under $DSV4_HOME (default ~/.cache/dsv4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/src/dsv4 inspect --context 4096
./build/src/dsv4 run --prompt "${DSV4_PROMPT:-The capital of France is}" --max-tokens 32
