#!/usr/bin/env python3
"""HF tokenizers encode throughput on corpus.bin, one document at a time on
one thread (RAYON_NUM_THREADS=1), for comparison with bench/bench_tokenizer.cc.
Usage: bench_hf_tokenizer.py corpus.bin tokenizer.json [passes]"""
import struct
import sys
import time

import tokenizers
from tokenizers import Tokenizer


def read_corpus(path):
    data = open(path, "rb").read()
    assert data[:8] == b"DSV4CORP"
    (n,) = struct.unpack_from("<I", data, 8)
    p, docs = 12, []
    for _ in range(n):
        (k,) = struct.unpack_from("<I", data, p)
        docs.append(data[p + 4:p + 4 + k])
        p += 4 + k
    return docs


def main():
    raw = read_corpus(sys.argv[1])
    passes = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    nbytes = sum(len(d) for d in raw)
    docs = [d.decode("utf-8", "replace") for d in raw]
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(sys.argv[2])
    load = time.perf_counter() - t0
    best, first, n_ids = 1e30, 0.0, 0
    for i in range(passes):
        t = time.perf_counter()
        n_ids = 0
        for d in docs:
            n_ids += len(tok.encode(d).ids)
        s = time.perf_counter() - t
        first = s if i == 0 else first
        best = min(best, s)
    print("hf tokenizers %s load: %.3f s" % (tokenizers.__version__, load))
    print("hf encode: %d docs, %.2f MB, %d ids; first pass %.3f s (%.2f MB/s), best of %d %.3f s (%.2f MB/s)"
          % (len(docs), nbytes / 1e6, n_ids, first, nbytes / 1e6 / first, passes, best, nbytes / 1e6 / best))


if __name__ == "__main__":
    main()
