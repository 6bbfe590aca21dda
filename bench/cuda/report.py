"""Merges bench_cuda_kernels' CSV and torch_topk_peer.py's CSV into the markdown tables of docs/KERNELS.md."""
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) >= 3 and not line.startswith("#"):
                rows.append(parts)
    return rows


ours = read(sys.argv[1])
torch = {r[1]: float(r[2]) for r in read(sys.argv[2]) if r[0] == "torch_topk"} if len(sys.argv) > 2 else {}
copy = [r for r in ours if r[0] == "copy"]
if copy:
    print(f"copy bandwidth (read + write): {float(copy[0][6]):.0f} GB/s\n")
print("| top-k case | ours (us) | torch.topk (us) | torch / ours | ours / read floor |")
print("| --- | ---: | ---: | ---: | ---: |")
for r in ours:
    if r[0] != "topk":
        continue
    # "rows=.. len=.. k=.." (ours adds the kernel's name, and "narrow" for the other distribution: no peer)
    t = None if "narrow" in r[1] else torch.get(" ".join(r[1].split()[:3]))
    tt = f"{t:.1f}" if t else "-"
    sp = f"{t / float(r[2]):.1f}x" if t else "-"
    print(f"| {r[1]} | {float(r[2]):.1f} | {tt} | {sp} | {float(r[6]):.2f}x |")
print()
print("| kernel | case | us | metric | value |")
print("| --- | --- | ---: | --- | ---: |")
for r in ours:
    if r[0] in ("topk", "copy") or r[0].startswith("attn_"):
        continue
    print(f"| {r[0]} | {r[1]} | {float(r[2]):.1f} | {r[5]} | {float(r[6]):.3f} |")
attn = [r for r in ours if r[0].startswith("attn_")]
if attn:
    bw = float(copy[0][6]) if copy else 0.0
    print()
    print("| sparse attention case | us | GB/s | of copy BW | TFLOP/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in attn:
        us, by, fl = float(r[2]), float(r[3]), float(r[4])
        gbs = by / us / 1e3
        frac = f"{100 * gbs / bw:.1f}%" if bw else "-"
        print(f"| {r[1]} | {us:.1f} | {gbs:.0f} | {frac} | {fl / us / 1e6:.1f} |")
