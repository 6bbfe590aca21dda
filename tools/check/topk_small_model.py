#!/usr/bin/env python3
"""The record behind topk_small.cu (twentieth session, written before it ever ran on a device): a model of the
kernel's selection logic (16 keys per thread as contiguous runs, four 8-bit MSD digits over a 256-bin histogram,
the early stop when the k-th key's digit is taken whole, the packed (equal, greater) scan for the output slots)
against a plain sort by (value desc, index asc), on the patterns of CudaTopk.SmallRows: random, ties, all
equal, signed zeros, one fp16 bin, huge negative values (keys whose top digit is 0), -inf and NaN, ascending,
descending, and a k-th value shared by half the row, at lengths k+1 .. 4096 and six row lengths each.
It checks the algorithm only; CudaTopk.SmallRows checks the kernel on the GPU.
Run: python3 tools/check/topk_small_model.py   (2026-12-01, this machine: "1320 rows, 0 differ", ~7 s)
"""
import math
import random
import struct


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def to_key(x):  # topk_common.cuh's to_key
    if math.isnan(x) or x == -math.inf:
        return 0
    if x == 0.0:
        x = 0.0
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000


def kernel_model(row, n, k, threads=256, per=16):
    keys = [to_key(row[i]) if i < n else 0 for i in range(threads * per)]
    T, ties = 0, 0
    if sum(1 for x in keys if x) > k:
        prefix, mask, need = 0, 0, k
        for shift in (24, 16, 8, 0):
            hist = [0] * 256
            for x in keys:
                if x and (x & mask) == prefix:
                    hist[(x >> shift) & 255] += 1
            above, found = 0, None
            for t in range(256):  # thread t holds digit 255 - t; exclusive sum = entries of higher digits
                d = 255 - t
                if above < need <= above + hist[d]:
                    found = (prefix | (d << shift), need - above, hist[d])
                above += hist[d]
            prefix, need, count = found
            mask |= 255 << shift
            if count == need:
                T = prefix - 1 if prefix > 0 else 0
                break
            if shift == 0:
                T, ties = prefix, need
    out, eq_seen = [], 0
    for i, x in enumerate(keys):  # thread order is index order
        if x > T:
            out.append(i)
        elif x == T and x != 0:
            if eq_seen < ties:
                out.append(i)
            eq_seen += 1
    assert len(out) <= k
    return out + [-1] * (k - len(out))


def reference(row, n, k):  # cpu::topk_row's rule
    items = [(row[i], i) for i in range(min(n, len(row))) if not (math.isnan(row[i]) or row[i] == -math.inf)]
    items.sort(key=lambda p: (-p[0], p[1]))
    sel = sorted(i for _, i in items[:k])
    return sel + [-1] * (k - len(sel))


def pattern(p, cols, k, rng):
    def one(i):
        if p == 0: return rng.gauss(0, 3)
        if p == 1: return float(rng.randrange(8))
        if p == 2: return 1.0
        if p == 3: return -0.0 if i % 2 else 0.0
        if p == 4: return 1.015625 if i % 5 == 0 else rng.uniform(1, 1.03125)
        if p == 5: return rng.uniform(-3.4e38, -1e37)
        if p == 6: return -math.inf if i % 3 else rng.uniform(-3.4e38, -1e37)
        if p == 7: return math.nan if i % 4 == 1 else rng.gauss(0, 3)
        if p == 8: return float(i)
        if p == 9: return float(cols - i)
        return 100.0 + i if i < k // 2 else (1.0 if i % 2 else -1.0)
    return [f32(one(i)) for i in range(cols)]


def main():
    rng = random.Random(1)
    rows = bad = 0
    for k in (512, 1024, 2048):
        for cols in (k + 1, 1000, 2047, 2048, 2049, 3000, 4095, 4096):
            if cols <= k:
                continue
            for p in range(11):
                row = pattern(p, cols, k, rng)
                for n in (cols, cols - 1, k + 1, k, 0, cols // 2):
                    rows += 1
                    if kernel_model(row, n, k) != reference(row, n, k):
                        bad += 1
                        print(f"differs: k {k} cols {cols} pattern {p} length {n}")
    print(f"{rows} rows, {bad} differ")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
