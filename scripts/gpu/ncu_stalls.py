"""Warp-stall samples of one kernel from Nsight Compute's source page (run_linear.sh's LIN_NCU_SOURCE writes it:
`ncu -i REPORT --page source --csv --print-source sass > source.csv`): the samples per stall reason, per opcode
(with how many warp instructions each opcode executed) and the hottest instructions with their top reasons.
Usage: python3 scripts/gpu/ncu_stalls.py source.csv [how many instructions, default 30]
(twenty-fifth session; its output for the lean MoE kernels is in docs/GEMM_MOE.md)."""
import collections
import csv
import re
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    hdr, data = rows[1], rows[2:]  # row 0 names the kernel
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
    by_reason, by_op, executed = collections.Counter(), collections.Counter(), collections.Counter()
    total, hot = 0, []
    for r in data:
        if len(r) < len(hdr):
            continue
        src = r[ix['Source']].strip()
        op = re.sub(r'^@!?U?P\w+\s+', '', src).split(' ')[0].split('.')[0]
        n = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
        total += n
        by_op[op] += n
        executed[op] += int(r[ix['Instructions Executed']] or 0)
        per = {}
        for h in reasons:
            v = r[ix[h]]
            if v not in ('', '-', '0'):
                by_reason[h] += int(v)
                per[h[len('stall_'):]] = int(v)
        hot.append((n, r[ix['Address']][-5:], src[:70], per))
    print('samples', total)
    for h, v in by_reason.most_common():
        print(f'  {h:30s} {v:7d} {v / max(total, 1):.3f}')
    print('by opcode: samples, warp instructions executed')
    for op, v in by_op.most_common(20):
        print(f'  {op:12s} {v:7d} {executed[op]:9d}')
    print('hottest instructions')
    for n, addr, src, per in sorted(hot, reverse=True)[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
        top = ' '.join(f'{k}={v}' for k, v in sorted(per.items(), key=lambda x: -x[1])[:4])
        print(f'{n:6d} {addr} {src:70s} {top}')


if __name__ == '__main__':
    main()
