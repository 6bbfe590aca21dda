#!/usr/bin/env python3
"""Instruction counts per kernel from `cuobjdump -sass` output (static counts: every instruction of the kernel's
code once, loops not unrolled further). Usage on the device machine:
  cuobjdump -sass -arch sm_90a LIBRARY_OR_BINARY | python3 scripts/gpu/sass_count.py [REGEX] [--ops N]
Prints, for each function whose (mangled) name matches REGEX, the instruction total, the count inside its
loops (instructions between a backward branch target and the branch), and the most frequent opcodes."""
import re
import sys
from collections import Counter


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


def loop_instructions(ins):
    """Instructions inside [target, branch] of every backward BRA (union of the ranges)."""
    covered = set()
    for addr, op, args in ins:
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", args)
            if t and int(t.group(1), 16) <= addr:
                lo = int(t.group(1), 16)
                covered.update(a for a, _, _ in ins if lo <= a <= addr)
    return len(covered)


def main():
    pat = re.compile(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else None
    n_ops = int(sys.argv[sys.argv.index("--ops") + 1]) if "--ops" in sys.argv else 12
    funcs = parse(sys.stdin)
    for name, ins in sorted(funcs.items()):
        if pat and not pat.search(name):
            continue
        ops = Counter(op.split(".")[0] for _, op, _ in ins)
        top = ", ".join(f"{o} {c}" for o, c in ops.most_common(n_ops))
        print(f"{name[:110]}\n  {len(ins)} instructions, {loop_instructions(ins)} inside loops; {top}")


if __name__ == "__main__":
    main()
