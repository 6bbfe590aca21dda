#!/usr/bin/env bash
# Encode throughput: dsv4::text::Tokenizer vs HF tokenizers, single-threaded,
# on the tokenizer test corpus (tests/text/data/corpus.bin).
# Usage: tools/text/bench_tokenizer.sh [build-dir]   (default: build-text)
# Needs: cmake, g++, nlohmann-json3-dev, libgtest-dev; python3 with tokenizers.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-text}
cmake -S "$root/tools/text/standalone" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target bench_tokenizer >/dev/null
"$build/bench_tokenizer" "$root/tests/text/data/corpus.bin" "$root/assets/tokenizer/tokenizer.json" 5
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 "$root/tools/text/bench_hf_tokenizer.py" \
  "$root/tests/text/data/corpus.bin" "$root/assets/tokenizer/tokenizer.json" 5
