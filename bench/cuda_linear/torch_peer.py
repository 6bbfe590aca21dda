"""Peers for bench_cuda_linear, same machine and run: torch's copy bandwidth, bf16 matmul at the decode and
prefill shapes, and torch._scaled_mm with DeepSeek-style block scales (1x128 activations, 128x128 weights)
when this torch accepts them. Weights rotated through more than L2. Prints a markdown table."""
import sys
import torch

quick = "--quick" in sys.argv
dev = "cuda"


def median_us(fn, inner, reps):
    fn(0)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(inner):
            fn(i)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    ts.sort()
    return ts[len(ts) // 2]


rows = []
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, device=dev).random_()
dst = torch.empty_like(src)
us = median_us(lambda i: dst.copy_(src), 1, 10)
bw = 2 * n / (us * 1e-6)
print(f"torch copy bandwidth: {bw * 1e-9:.0f} GB/s")
del src, dst
reps = 5 if quick else 15


def pick_scales(x8, w8, sa):
    """(scale_a, scale_b) for 1x128 activation and 128x128 weight fp32 scales in the layout this torch
    accepts (it has moved between releases); a: [M, K] row-major e4m3, b = w8.t(): [K, N] column-major."""
    M, K = x8.shape
    N = w8.shape[0]
    d = x8.device
    cands = [
        ("b (K/128,N/128)", torch.ones(K // 128, N // 128, device=d)),
        ("b (N/128,K/128)", torch.ones(N // 128, K // 128, device=d)),
        ("b (N/128,K/128).t()", torch.ones(N // 128, K // 128, device=d).t()),
        ("b (K/128,N/128) col-major", torch.ones(N // 128, K // 128, device=d).t().contiguous().t()),
    ]
    err = None
    for name, sb in cands:
        try:
            torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            return sa, sb, name
        except Exception as e:  # noqa: BLE001
            err = e
    raise err


for (N, K, Ts) in [(4096, 4096, [1, 4, 16, 64]), (1024, 4096, [1, 4, 16, 64]), (2048, 4096, [1, 16, 64]), (4096, 2048, [1, 16, 64])]:
    R = max(2, min(32, (400 << 20) // (N * K * 2)))
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(R)]
    w8 = [w.to(torch.float8_e4m3fn) for w in ws]
    sw = torch.ones(N // 128, K // 128, device=dev, dtype=torch.float32)
    for T in Ts:
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        us = median_us(lambda i: x @ ws[i].t(), R, reps)
        rows.append((f"torch bf16 matmul [{N} x {K}] T={T}", us, N * K * 2 / us * 1e-3))
        x8 = x.to(torch.float8_e4m3fn)
        sa = torch.ones(K // 128, T, device=dev, dtype=torch.float32).t()  # outer-dim-major
        try:
            sa_, sb_, how = pick_scales(x8, w8[0], sa)
            us = median_us(lambda i: torch._scaled_mm(x8, w8[i].t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16), R, reps)
            rows.append((f"torch._scaled_mm FP8 block [{N} x {K}] T={T} ({how})", us, (N * K + N * K // 16384 * 4) / us * 1e-3))
        except Exception as e:  # noqa: BLE001
            rows.append((f"torch._scaled_mm FP8 block [{N} x {K}] T={T}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:60]}", 0, 0))
    del ws, w8
    torch.cuda.empty_cache()

for (M, N, K) in [(4096, 4096, 4096), (8192, 4096, 8192), (4096, 2048, 4096)]:
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    us = median_us(lambda i: x @ w.t(), 5, 10)
    rows.append((f"torch bf16 matmul M={M} [{N} x {K}] ({2 * M * N * K / us * 1e-6:.0f} TFLOP/s)", us, 0))
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sa = torch.ones(K // 128, M, device=dev, dtype=torch.float32).t()
    sw = torch.ones(N // 128, K // 128, device=dev, dtype=torch.float32)
    try:
        sa_, sb_, how = pick_scales(x8, w8, sa)
        us = median_us(lambda i: torch._scaled_mm(x8, w8.t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16), 5, 10)
        rows.append((f"torch._scaled_mm FP8 block M={M} [{N} x {K}] ({2 * M * N * K / us * 1e-6:.0f} TFLOP/s)", us, 0))
    except Exception as e:  # noqa: BLE001
        rows.append((f"torch._scaled_mm FP8 block M={M}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:60]}", 0, 0))

print("\n| torch peer | time (us) | GB/s of weights |\n|---|---|---|")
for name, us, gbs in rows:
    print(f"| {name} | {us:.2f} | {gbs:.0f} |")
