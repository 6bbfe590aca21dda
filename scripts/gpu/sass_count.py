#!/usr/bin/env python3
"""Instruction counts per kernel from `cuobjdump -sass` output (static counts: every instruction of the kernel's
code once, loops not unrolled further). Usage on the device machine:
  cuobjdump -sass -arch sm_90a LIBRARY_OR_BINARY | python3 scripts/gpu/sass_count.py [REGEX] [--ops N]
Prints, for each function whose (mangled) name matches REGEX, the instruction total, the count inside its
loops (instructions between a backward branch target and the branch), the count before its first block barrier
(the set-up), the most frequent opcodes, and its main loop (the smallest loop holding MMAs) with
its own opcode counts."""
import re
import signal
import sys
from collections import Counter


signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a reader such as `head` may stop early


def parse(lines):
    funcs, cur = {}, None
    for line in lines:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
        if m and cur is not None:
            funcs[cur].append((int(m.group(1), 16), m.group(3), m.group(4)))
    return funcs


def loops(ins):
    """[lo, hi] address ranges of every backward BRA (target <= branch)."""
    out = []
    for addr, op, args in ins:
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", args)
            if t and int(t.group(1), 16) <= addr:
                out.append((int(t.group(1), 16), addr))
    return out


def loop_instructions(ins):
    """Instructions inside [target, branch] of every backward BRA (union of the ranges)."""
    covered = set()
    for lo, hi in loops(ins):
        covered.update(a for a, _, _ in ins if lo <= a <= hi)
    return len(covered)


def main_loop(ins):
    """The smallest loop holding tensor-core instructions (HMMA / HGMMA / IMMA): (instructions, MMAs, opcodes)."""
    best = None
    for lo, hi in loops(ins):
        body = [op for a, op, _ in ins if lo <= a <= hi]
        mmas = sum(1 for op in body if op.startswith(("HMMA", "HGMMA", "IMMA", "QMMA")))
        if mmas and (best is None or len(body) < len(best[0])):
            best = (body, mmas)
    if best is None:
        return None
    return len(best[0]), best[1], Counter(op.split(".")[0] for op in best[0])


def prologue(ins):
    """Instructions before the first block barrier (BAR.SYNC; all of them without one): at decode a kernel
    launched as one or a few CTAs runs its set-up once per warp with little latency hiding, so this count is much
    of its time (docs/NOTES.md, "Things learned"). Static: skipped branches and loops count once."""
    bars = [a for a, op, _ in ins if op.startswith("BAR")]
    return sum(1 for a, _, _ in ins if not bars or a < min(bars))


def main():
    pat = re.compile(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else None
    n_ops = int(sys.argv[sys.argv.index("--ops") + 1]) if "--ops" in sys.argv else 12
    funcs = parse(sys.stdin)
    for name, ins in sorted(funcs.items()):
        if pat and not pat.search(name):
            continue
        ops = Counter(op.split(".")[0] for _, op, _ in ins)
        top = ", ".join(f"{o} {c}" for o, c in ops.most_common(n_ops))
        print(f"{name[:110]}\n  {len(ins)} instructions, {loop_instructions(ins)} inside loops, {prologue(ins)} before the "
              f"first barrier; {top}")
        ml = main_loop(ins)
        if ml:
            n, mmas, c = ml
            print(f"  main loop: {n} instructions, {mmas} MMAs; " + ", ".join(f"{o} {k}" for o, k in c.most_common(n_ops)))


if __name__ == "__main__":
    main()
