#!/usr/bin/env python3
"""Peer benchmark: transformers' DeepseekV4ForCausalLM (fp32, eager, CPU) against dsv4 on the same golden
fixture weights, same thread count: full prefill of the fixture's tokens and cached decode steps."""
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools", "golden"))
import make_golden  # noqa: E402

torch.set_grad_enabled(False)
root = os.path.join(os.path.dirname(__file__), "..")
name = "mixed"
spec = make_golden.CONFIGS[name]
c = spec["config"]
# Rebuild the fixture (same seed, same bytes) in a temp dir to get the dequantized values for transformers.
import tempfile  # noqa: E402
tmp = tempfile.mkdtemp()
meta = json.load(open(os.path.join(root, "fixtures", "golden", name, "golden.json")))
values = make_golden.build_checkpoint(c, meta["seed"], tmp)
model = make_golden.hf_model(c, values)
ids = torch.tensor([meta["input_ids"]])
decode_steps = 32

def best(f, n=3):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return min(ts)

S = ids.shape[1]
t_prefill = best(lambda: model(input_ids=ids, use_cache=False))
def dec():
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(decode_steps):
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
    return time.perf_counter() - t0
t_decode = min(dec() for _ in range(2))
hf_pf, hf_dc = S / t_prefill, decode_steps / t_decode

out = subprocess.run([os.path.join(root, "build", "bench", "bench_cpu_forward"), "--model", tmp, "--prompt-len", str(S),
                      "--decode", str(decode_steps), "--repeat", "3", "--kv-cache-dtype", "f32"],
                     capture_output=True, text=True, check=True).stdout
pf = float([l for l in out.splitlines() if l.startswith("| prefill")][0].split("|")[2])
dc = float([l for l in out.splitlines() if l.startswith("| decode")][0].split("|")[2])
print(f"torch threads {torch.get_num_threads()}")
print("| engine | prefill tok/s ({} tokens) | decode tok/s |".format(S))
print("|---|---|---|")
print(f"| transformers {__import__('transformers').__version__} fp32 eager | {hf_pf:.1f} | {hf_dc:.1f} |")
print(f"| dsv4 CPU (f32 KV) | {pf:.1f} | {dc:.1f} |")
print(f"| ratio dsv4 / transformers | {pf / hf_pf:.2f}x | {dc / hf_dc:.2f}x |")
