"""CPU model of the streaming top-k's admission (src/backend/cuda/topk_stream.cu), to weigh threshold schemes
before spending device time: one CTA streams a row of N normal scores in 2048-element tiles into a 4,608-entry
buffer, compacting to the top k (lo = k-th key + 1) when the next tile might not fit. With --bins B, lo is also
raised between compactions (one tile late, as a kernel would publish it) to the lower edge of the B-bit key bin
holding the k-th buffered key. Prints the admitted elements, the compactions and the share of warp-tiles (256
elements: one warp's two float4 slots) holding an admitted element, which is what the kernel's loop pays for.
Usage: python3 bench/cuda/topk_admission_sim.py [--bins 12] (numpy)."""
import argparse

import numpy as np


def to_key(x):
    u = x.view(np.uint32).astype(np.uint64)
    return np.where(u & 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000).astype(np.uint64)


def simulate(n, k, bins, rows, rng, cap=4608, tile=2048):
    idx = np.arange(tile)
    warp = ((idx % 1024) // 4) // 32  # element 4 (u * 256 + t) + e belongs to warp t / 32
    out = []
    for _ in range(rows):
        key = to_key(rng.standard_normal(n).astype(np.float32))
        lo, pending, buf = 1, None, np.zeros(0, np.uint64)
        admitted = compactions = warp_tiles = 0
        for t0 in range(0, n, tile):
            if pending is not None:
                lo = max(lo, pending)
            kt = key[t0:t0 + tile]
            m = kt >= lo
            admitted += int(m.sum())
            warp_tiles += len(np.unique(warp[: len(kt)][m]))
            buf = np.concatenate([buf, kt[m]])
            if t0 + tile < n and len(buf) + tile > cap:
                b = np.sort(buf)[::-1]
                buf = b[:k]
                compactions += 1
                lo = max(lo, int(b[k - 1]) + 1)
            if bins and len(buf) >= k:
                shift = 32 - bins
                pending = int(np.sort(buf >> shift)[::-1][k - 1]) << shift
        out.append((admitted, compactions, warp_tiles / (8 * ((n + tile - 1) // tile))))
    return np.array(out).mean(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", type=int, default=0, help="running-histogram key bits (0: the kernel as it is)")
    ap.add_argument("--rows", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    for n in (65536, 262144):
        for k in (512, 1024):
            adm, comp, wt = simulate(n, k, a.bins, a.rows, rng)
            print(f"N={n} k={k} bins={a.bins}: admitted {adm:.0f}, compactions {comp:.1f}, "
                  f"warp-tiles with an admitted element {100 * wt:.1f}%")


if __name__ == "__main__":
    main()
