#!/usr/bin/env bash
# Regenerates every generated file of the text layer (deterministic; the
# outputs are committed and the C++ tests need no Python):
#   src/text/unicode_classes.inc  tests/text/data/*.bin  tests/text/data/*.json
# Needs: python3 with tokenizers==0.23.3 (pip install tokenizers==0.23.3).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
python3 tools/text/gen_unicode_classes.py > src/text/unicode_classes.inc
python3 tools/text/gen_tokenizer_corpus.py
python3 tools/text/gen_chat_goldens.py
