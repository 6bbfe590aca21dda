"""Per-kernel durations from an Nsight Compute CSV (--metrics gpu__time_duration.sum --csv): total and mean
per kernel name, and per decode step (steps = launches of embed_kernel, one per forward step)."""
import csv
import collections
import sys


def main(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prefixes its own log lines with ==PROF==
    rows = list(csv.DictReader(lines))
    tot = collections.OrderedDict()
    cnt = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0]
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
        tot[name] = tot.get(name, 0.0) + us
        cnt[name] += 1
    steps = max(1, sum(c for n, c in cnt.items() if n.startswith("void dsv4::glue::") and "embed_kernel" in n)
                or sum(c for n, c in cnt.items() if "embed_kernel" in n))
    print(f"{len(rows)} kernel launches, {steps} forward steps")
    print(f"{'kernel':80s} {'per step':>6s} {'us/launch':>10s} {'us/step':>9s}")
    total = 0.0
    for name, us in sorted(tot.items(), key=lambda kv: -kv[1]):
        total += us / steps
        print(f"{name[-80:]:80s} {cnt[name] / steps:6.1f} {us / cnt[name]:10.2f} {us / steps:9.1f}")
    print(f"sum of kernel time per step: {total:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
