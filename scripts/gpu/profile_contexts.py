#!/usr/bin/env python3
"""Where a batch-1 decode step's time goes as the context grows.

Reads bench_gpu_forward outputs (one per context, each run with --batches 1 --prompt CTX), takes each one's
eager profile (operations serialized, one stream, events between them: launch gaps included) and prints, per
layer kind (CSA / HCA), the mean milliseconds of every operation at each context, then the graph step of each
run. An operation that occurs twice in a layer (hc_pre+norm, hc_post) is numbered by its order.
Usage: profile_contexts.py FILE...   (each FILE the stdout of one bench run)
"""
import re
import sys
from collections import OrderedDict, defaultdict


def parse(path):
    ops = []          # (layer, op) in launch order
    vals = []
    kinds = {}
    step = None
    ctx = None
    in_prof = False
    with open(path) as f:
        for line in f:
            m = re.match(r"eager profile, batch 1, context (\d+)", line)
            if m:
                in_prof, ctx = True, int(m.group(1))
                continue
            m = re.match(r"\| 1 \| (\d+) \| ([\d.]+) \|", line)
            if m and step is None:
                step = (int(m.group(1)), float(m.group(2)))
            if not in_prof:
                continue
            m = re.match(r"\s+L(\d+)\.(\S+)\s+([\d.]+)$", line)
            if m:
                ops.append((int(m.group(1)), m.group(2)))
                vals.append(float(m.group(3)))
                continue
            m = re.match(r"\s+layer (\d+) \((\w+)\) total", line)
            if m:
                kinds[int(m.group(1))] = m.group(2)
    # per kind: (op, occurrence) -> list of values over the layers of that kind
    per = defaultdict(lambda: defaultdict(list))
    order = defaultdict(list)
    seen = defaultdict(int)
    for (layer, op), v in zip(ops, vals):
        n = seen[(layer, op)]
        seen[(layer, op)] += 1
        key = op if n == 0 else f"{op}#{n + 1}"
        kind = kinds.get(layer, "?")
        if key not in order[kind]:
            order[kind].append(key)
        per[kind][key].append(v)
    return ctx, step, per, order


def main(paths):
    runs = [parse(p) for p in paths]
    runs = [r for r in runs if r[0] is not None]
    if not runs:
        sys.exit("profile_contexts.py: no eager profile found in " + " ".join(paths))
    ctxs = [r[0] for r in runs]
    for kind in ("CSA", "HCA", "window"):
        keys = []
        for r in runs:
            for k in r[3].get(kind, []):
                if k not in keys:
                    keys.append(k)
        if not keys:
            continue
        print(f"\n{kind} layers, mean us per layer (eager, serialized)\n")
        print("| operation | " + " | ".join(f"context {c}" for c in ctxs) + " | last - first |")
        print("| --- |" + " ---: |" * (len(ctxs) + 1))
        totals = [0.0] * len(runs)
        for k in keys:
            cells = []
            for i, r in enumerate(runs):
                v = r[2][kind].get(k)
                us = 1e3 * sum(v) / len(v) if v else 0.0
                totals[i] += us
                cells.append(us)
            print(f"| {k} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {cells[-1] - cells[0]:+.1f} |")
        print("| total | " + " | ".join(f"{t:.1f}" for t in totals) + f" | {totals[-1] - totals[0]:+.1f} |")
    print("\n| context | batch-1 step in graphs, ms (branches overlapped) |\n| ---: | ---: |")
    for r in runs:
        if r[1]:
            print(f"| {r[1][0]} | {r[1][1]:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
