"""torch.topk peer for bench_cuda_kernels' top-k cases: same shapes, rotating inputs larger than L2, CUDA
events around batches of 10 calls, median of 30 batches. Prints CSV: torch_topk,<case>,<us>."""
import sys

import torch

ROTATE_BYTES = 256 << 20
quick = "--quick" in sys.argv


def time_us(fn, reps=30, per_batch=10):
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, c = [], 0
    for _ in range(reps):
        a.record()
        for _ in range(per_batch):
            fn(c)
            c += 1
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / per_batch)
    times.sort()
    return times[len(times) // 2]


for k in (512, 1024):
    for length in (4096, 8192, 16384, 32768, 65536, 262144):
        for rows in (1, 8, 64, 512):
            if quick and rows > 8:
                continue
            elems = rows * length
            sets = max(1, min(16, ROTATE_BYTES // (elems * 4)))
            xs = torch.randn(sets, rows, length, device="cuda", dtype=torch.float32)
            us = time_us(lambda i: torch.topk(xs[i % sets], k, dim=-1))
            print(f"torch_topk,rows={rows} len={length} k={k},{us:.2f}", flush=True)
            del xs
