"""Summarizes scripts/gpu/topk_in_engine.sh: the decode step's top-k launches (one row: at most 8 CTAs) per kernel
choice, from Nsight Compute (serialized durations) and Nsight Systems (durations in place, and what overlaps them).
Usage: python3 scripts/gpu/topk_in_engine.py RESULTS_DIR"""
import csv
import glob
import os
import statistics
import sys

res = sys.argv[1]


def table(path, key):
    """Rows of a CSV whose header contains `key` (tools print banners before the header)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, r in enumerate(rows):
        if key in r:
            return [dict(zip(r, x)) for x in rows[i + 1:] if len(x) == len(r)]
    return []


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def stats(xs):
    return f"n={len(xs)} median={statistics.median(xs):.2f} min={min(xs):.2f} max={max(xs):.2f}" if xs else "n=0"


for path in sorted(glob.glob(os.path.join(res, "ncu_topk_*.csv"))):
    choice = os.path.basename(path)[len("ncu_topk_"):-4]
    by_kernel = {}
    for r in table(path, "Kernel Name"):
        grid, dur = num(r.get("launch__grid_size")), num(r.get("gpu__time_duration.sum"))
        if grid is None or dur is None or grid > 8:  # prefill chunks: 2048 rows
            continue
        name = r["Kernel Name"].split("(")[0].split("::")[-1]
        by_kernel.setdefault((name, int(num(r.get("launch__block_size")) or 0)), []).append(dur / 1e3)  # ns -> us
    for (name, block), xs in sorted(by_kernel.items()):
        print(f"ncu  {choice:8s} {name} (block {block}): decode launches, us: {stats(xs)}")

for path in sorted(glob.glob(os.path.join(res, "trace_*_cuda_gpu_trace.csv"))):
    choice = os.path.basename(path)[len("trace_"):-len("_cuda_gpu_trace.csv")]
    rows = table(path, "Start (ns)")
    ev = []
    for r in rows:
        start, dur = num(r.get("Start (ns)")), num(r.get("Duration (ns)"))
        name = r.get("Name", "")
        if start is None or dur is None:
            continue
        grid = [num(r.get(g)) or 0 for g in ("GrdX", "GrdY", "GrdZ")]
        ev.append((start, start + dur, name, grid[0] * max(1, grid[1]) * max(1, grid[2]), r.get("Strm", "")))
    ev.sort()
    topk = [e for e in ev if "topk_" in e[2] and e[3] <= 8]
    print(f"nsys {choice:8s} decode top-k in place, us: {stats([(e[1] - e[0]) / 1e3 for e in topk])}")
    for t in topk[-2:]:  # the last two (timed graph replays), with what overlaps them
        print(f"  {t[2][:60]} stream {t[4]}: {(t[1] - t[0]) / 1e3:.2f} us; overlapping:")
        for e in ev:
            if e[0] < t[1] and e[1] > t[0] and e is not t:
                print(f"    {e[2][:70]} stream {e[4]}: {(e[1] - e[0]) / 1e3:.2f} us, "
                      f"starts {(e[0] - t[0]) / 1e3:+.2f} us from the top-k")

    # One whole decode step, from the second-to-last decode top-k to the last (one CSA layer per step): the step's
    # kernels by total duration, so the trace also says where a batch-1 step's time goes.
    if len(topk) >= 2:
        t0, t1 = topk[-2][0], topk[-1][0]
        step = [e for e in ev if t0 <= e[0] < t1]
        by_name = {}
        for e in step:
            name = e[2].split("(")[0].split("<")[0].split("::")[-1][:48]
            n, d = by_name.get(name, (0, 0.0))
            by_name[name] = (n + 1, d + (e[1] - e[0]) / 1e3)
        busy = sum(d for _, d in by_name.values())
        print(f"nsys {choice:8s} one decode step: {(t1 - t0) / 1e3:.1f} us wall, {len(step)} kernels, "
              f"{busy:.1f} us of kernel time; by kernel (count, us):")
        for name, (n, d) in sorted(by_name.items(), key=lambda x: -x[1][1])[:30]:
            print(f"    {d:8.1f} {n:4d}  {name}")
