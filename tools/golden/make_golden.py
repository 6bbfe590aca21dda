#!/usr/bin/env python3
"""Golden fixtures for dsv4, made by an implementation nobody here wrote: transformers' DeepseekV4ForCausalLM.

For each tiny config below this script
  1. draws random weights and writes them in the *official* DeepSeek-V4 checkpoint layout (names without
     `model.`, FP8 e4m3 linears with 128x128 UE8M0 scales, MXFP4 experts with per-32 UE8M0 scales, BF16 and
     F32 elsewhere, sharded safetensors + index) -- transformers' save_pretrained would not write these names;
  2. dequantizes exactly those bytes and loads the values into transformers' model (fp32, CPU);
  3. runs a full prefill and a prefill followed by cached decode steps, asserts that the two agree (the
     reference's own consistency) and that no indexer row has an exact tie at the k-th score (with ties the
     reference's top-k is arbitrary, see shared/spec/reference-notes.md section 1);
  4. stores input ids, logits, and the reference's YaRN inverse frequencies.

Usage: python3 tools/golden/make_golden.py [--out fixtures/golden]
Needs: torch, transformers==5.17.0, safetensors, numpy (tools/requirements-golden.txt).
"""
import argparse
import json
import math
import os
import shutil

import numpy as np
import torch

torch.set_grad_enabled(False)

# The fields every fixture shares (mHC, RoPE/YaRN, tokens ids, dtypes, the official quantization block),
# appended after each config's own fields so config.json keeps its key order.
COMMON_TAIL = dict(
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1),
    max_position_embeddings=1048576, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
    tie_word_embeddings=False, torch_dtype="bfloat16", expert_dtype="fp4",
    quantization_config=dict(quant_method="fp8", fmt="e4m3", scale_fmt="ue8m0",
                             weight_block_size=[128, 128], activation_scheme="dynamic"),
)

CONFIGS = {
    # Every layer kind, hash layers, top-k smaller than the number of compressed entries, several HCA
    # windows (520 tokens -> 4 windows of 128), hc_mult 4 with 20 Sinkhorn iterations.
    "mixed": dict(
        seq_len=520, prefill=500, decode=20,
        config=dict(
            vocab_size=512, hidden_size=128, num_hidden_layers=6, num_nextn_predict_layers=1,
            num_attention_heads=4, num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64,
            q_lora_rank=96, o_groups=2, o_lora_rank=64,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
            scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5,
            num_hash_layers=2, swiglu_limit=10.0, hidden_act="silu",
            index_n_heads=16, index_head_dim=128, index_topk=8, sliding_window=128,
            compress_ratios=[0, 4, 128, 4, 128, 4, 0],
            **COMMON_TAIL,
        )),
    # A short window so the ring wraps many times, CSA first, HCA with a small ratio count, top-k 16.
    "small_window": dict(
        seq_len=300, prefill=280, decode=20,
        config=dict(
            vocab_size=384, hidden_size=64, num_hidden_layers=4, num_nextn_predict_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64,
            q_lora_rank=64, o_groups=1, o_lora_rank=32,
            n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=3, moe_intermediate_size=32,
            scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=2.5,
            num_hash_layers=1, swiglu_limit=10.0, hidden_act="silu",
            index_n_heads=16, index_head_dim=64, index_topk=16, sliding_window=16,
            compress_ratios=[4, 128, 4, 0, 0],
            **COMMON_TAIL,
        )),
    # The attention widths the CUDA kernels are built for (64 heads x 512 with 64 RoPE dims, indexer 64 x 128,
    # expert and hidden sizes multiples of 128), so the GPU engine can run this fixture too; 64 indexer heads
    # make exact ties unlikely. The 256 tokens after the prompt are the reference's own greedy continuation
    # (argmax, first maximum, cached decode): dsv4's greedy decode must reproduce them.
    "kernel_width": dict(
        seq_len=556, prefill=300, decode=256, greedy=True,
        config=dict(
            vocab_size=512, hidden_size=256, num_hidden_layers=2, num_nextn_predict_layers=0,
            num_attention_heads=64, num_key_value_heads=1, head_dim=512, qk_rope_head_dim=64,
            q_lora_rank=128, o_groups=8, o_lora_rank=128,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=128,
            scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5,
            num_hash_layers=1, swiglu_limit=10.0, hidden_act="silu",
            index_n_heads=64, index_head_dim=128, index_topk=16, sliding_window=64,
            compress_ratios=[4, 128],
            **COMMON_TAIL,
        )),
}

FP4_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


# ---------------------------------------------------------------- official layout and quantization

def expected_tensors(c):
    """(name, kind, shape) in the official naming; kind in bf16, f32, i64, fp8 (linear), fp4 (expert)."""
    D, V, H, hd = c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["head_dim"]
    n, mix = c["hc_mult"], (2 + c["hc_mult"]) * c["hc_mult"]
    I, E, K = c["moe_intermediate_size"], c["n_routed_experts"], c["num_experts_per_tok"]
    out = [("embed.weight", "bf16", (V, D)), ("head.weight", "bf16", (V, D)), ("norm.weight", "bf16", (D,)),
           ("hc_head_fn", "f32", (n, n * D)), ("hc_head_base", "f32", (n,)), ("hc_head_scale", "f32", (1,))]
    L = c["num_hidden_layers"]
    for i, ratio in enumerate(c["compress_ratios"]):
        p = f"layers.{i}." if i < L else f"mtp.{i - L}."
        out += [(p + "attn_norm.weight", "bf16", (D,)), (p + "ffn_norm.weight", "bf16", (D,))]
        for site in ("attn", "ffn"):
            out += [(p + f"hc_{site}_fn", "f32", (mix, n * D)), (p + f"hc_{site}_base", "f32", (mix,)),
                    (p + f"hc_{site}_scale", "f32", (3,))]
        a = p + "attn."
        G, olr = c["o_groups"], c["o_lora_rank"]
        out += [(a + "attn_sink", "f32", (H,)), (a + "wq_a", "fp8", (c["q_lora_rank"], D)),
                (a + "q_norm.weight", "bf16", (c["q_lora_rank"],)), (a + "wq_b", "fp8", (H * hd, c["q_lora_rank"])),
                (a + "wkv", "fp8", (hd, D)), (a + "kv_norm.weight", "bf16", (hd,)),
                (a + "wo_a", "fp8", (G * olr, H * hd // G)), (a + "wo_b", "fp8", (D, G * olr))]
        if ratio:
            cc = 2 if ratio == 4 else 1
            out += [(a + "compressor.wkv.weight", "bf16", (cc * hd, D)), (a + "compressor.wgate.weight", "bf16", (cc * hd, D)),
                    (a + "compressor.ape", "f32", (ratio, cc * hd)), (a + "compressor.norm.weight", "bf16", (hd,))]
        if ratio == 4:
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            out += [(a + "indexer.wq_b", "fp8", (ih * idim, c["q_lora_rank"])),
                    (a + "indexer.weights_proj.weight", "bf16", (ih, D)),
                    (a + "indexer.compressor.wkv.weight", "bf16", (2 * idim, D)),
                    (a + "indexer.compressor.wgate.weight", "bf16", (2 * idim, D)),
                    (a + "indexer.compressor.ape", "f32", (4, 2 * idim)),
                    (a + "indexer.compressor.norm.weight", "bf16", (idim,))]
        f = p + "ffn."
        out += [(f + "gate.weight", "bf16", (E, D))]
        out += [(f + "gate.tid2eid", "i64", (V, K))] if i < c["num_hash_layers"] else [(f + "gate.bias", "f32", (E,))]
        out += [(f + "shared_experts.w1", "fp8", (I, D)), (f + "shared_experts.w3", "fp8", (I, D)),
                (f + "shared_experts.w2", "fp8", (D, I))]
        for e in range(E):
            x = f + f"experts.{e}."
            out += [(x + "w1", "fp4", (I, D)), (x + "w3", "fp4", (I, D)), (x + "w2", "fp4", (D, I))]
        if i >= L:
            out += [(p + "e_proj", "fp8", (D, D)), (p + "h_proj", "fp8", (D, D)), (p + "enorm.weight", "bf16", (D,)),
                    (p + "hnorm.weight", "bf16", (D,)), (p + "norm.weight", "bf16", (D,)),
                    (p + "hc_head_fn", "f32", (n, n * D)), (p + "hc_head_base", "f32", (n,)),
                    (p + "hc_head_scale", "f32", (1,))]
    return out


def random_values(name, shape, gen):
    fan_in = shape[1] if len(shape) == 2 else 1
    mean, std = 0.0, 1.0 / math.sqrt(fan_in)
    if name.endswith("norm.weight"):
        mean, std = 1.0, 0.1
    elif name == "embed.weight":
        std = 1.0
    elif name.endswith("_fn"):
        std = 0.5 / math.sqrt(fan_in)
    elif name.endswith("_base"):
        std = 0.5
    elif name.endswith("_scale"):
        mean, std = 1.0, 0.2
    elif name.endswith("attn_sink"):
        std = 1.0
    elif name.endswith("ape"):
        std = 0.5
    elif name.endswith("gate.bias"):
        std = 0.1
    return mean + std * torch.randn(shape, generator=gen, dtype=torch.float32)


def pow2_exp(amax, qmax):
    return torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / qmax))


def quant_fp8(w, block):
    """e4m3 weight + one UE8M0 scale per block x block tile; returns (codes, scale_bytes, dequantized)."""
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(sr * block, sc * block)
    padded[:rows, :cols] = w
    tiles = padded.view(sr, block, sc, block).abs().amax(dim=(1, 3))
    e = pow2_exp(tiles, 448.0)
    scale = torch.pow(2.0, e)
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    q = (w / full).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * full
    return q, (e + 127).to(torch.uint8), deq


def quant_fp4(w):
    """MXFP4: e2m1 codes packed two per byte along K (element 2j in the low nibble), UE8M0 per 32."""
    rows, cols = w.shape
    g = w.view(rows, cols // 32, 32)
    e = pow2_exp(g.abs().amax(dim=2), 6.0)
    scale = torch.pow(2.0, e)
    x = g / scale.unsqueeze(-1)
    # nearest code (ties to the even code index, as dsv4's encoder does; either is a valid encoding)
    mags = FP4_VALUES[:8]
    dist = (x.abs().unsqueeze(-1) - mags).abs()
    idx = torch.argmin(dist, dim=-1)  # first minimum = lower (even) code on exact ties
    codes = idx | ((x < 0) | ((x == 0) & torch.signbit(x))).to(torch.int64) * 8
    codes = codes.view(rows, cols).to(torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    deq = FP4_VALUES[codes.long()] * scale.repeat_interleave(32, 1)
    return packed.view(torch.int8), (e + 127).to(torch.uint8), deq


def build_checkpoint(c, seed, out_dir):
    """Writes the official layout; returns {official name: dequantized fp32 tensor}."""
    from safetensors.torch import save_file
    gen = torch.Generator().manual_seed(seed)
    block = c["quantization_config"]["weight_block_size"][0]
    tensors, values = {}, {}
    for name, kind, shape in expected_tensors(c):
        if kind == "i64":
            V, K = shape
            t = torch.stack([torch.randperm(c["n_routed_experts"], generator=gen)[:K] for _ in range(V)]).to(torch.int64)
            tensors[name], values[name] = t, t
            continue
        logical = shape
        v = random_values(name, logical, gen)
        if kind == "bf16":
            t = v.to(torch.bfloat16)
            tensors[name], values[name] = t, t.to(torch.float32)
        elif kind == "f32":
            tensors[name], values[name] = v, v
        elif kind == "fp8":
            q, s, deq = quant_fp8(v, block)
            tensors[name + ".weight"] = q
            tensors[name + ".scale"] = s.view(torch.float8_e8m0fnu)
            values[name + ".weight"] = deq
        elif kind == "fp4":
            packed, s, deq = quant_fp4(v)
            tensors[name + ".weight"] = packed
            tensors[name + ".scale"] = s.view(torch.float8_e8m0fnu)
            values[name + ".weight"] = deq
    # Two shards + index: globals and the first half of the layers, then the rest (MTP last).
    names = list(tensors)
    half = [n for n in names if n.startswith("layers.") and int(n.split(".")[1]) >= c["num_hidden_layers"] // 2
            or n.startswith("mtp.")]
    shards = {"model-00001-of-00002.safetensors": [n for n in names if n not in set(half)],
              "model-00002-of-00002.safetensors": half}
    weight_map = {}
    for fname, members in shards.items():
        save_file({n: tensors[n].contiguous() for n in members}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in members})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"generator": "tools/golden/make_golden.py"}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    return values


# ---------------------------------------------------------------- transformers model

def hf_model(c, values):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    L = c["num_hidden_layers"]
    rs = c["rope_scaling"]
    hf_cfg = DeepseekV4Config(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], moe_intermediate_size=c["moe_intermediate_size"],
        num_hidden_layers=L, num_attention_heads=c["num_attention_heads"], num_key_value_heads=1,
        head_dim=c["head_dim"], q_lora_rank=c["q_lora_rank"], num_experts_per_tok=c["num_experts_per_tok"],
        n_routed_experts=c["n_routed_experts"], n_shared_experts=c["n_shared_experts"],
        scoring_func=c["scoring_func"], norm_topk_prob=c["norm_topk_prob"],
        routed_scaling_factor=c["routed_scaling_factor"], max_position_embeddings=c["max_position_embeddings"],
        rope_theta=c["rope_theta"], compress_rope_theta=c["compress_rope_theta"],
        compress_ratios=c["compress_ratios"][:L], num_hash_layers=c["num_hash_layers"],
        qk_rope_head_dim=c["qk_rope_head_dim"],
        rope_parameters=dict(rope_type="yarn", factor=rs["factor"], beta_fast=rs["beta_fast"], beta_slow=rs["beta_slow"],
                             original_max_position_embeddings=rs["original_max_position_embeddings"]),
        hc_mult=c["hc_mult"], hc_sinkhorn_iters=c["hc_sinkhorn_iters"], hc_eps=c["hc_eps"],
        swiglu_limit=c["swiglu_limit"], sliding_window=c["sliding_window"], o_groups=c["o_groups"],
        o_lora_rank=c["o_lora_rank"], index_n_heads=c["index_n_heads"], index_head_dim=c["index_head_dim"],
        index_topk=c["index_topk"], num_nextn_predict_layers=c["num_nextn_predict_layers"],
        rms_norm_eps=c["rms_norm_eps"], bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    hf_cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(hf_cfg).to(torch.float32).eval()

    # official name -> transformers parameter name
    m = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight", "norm.weight": "model.norm.weight",
         "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
    for i in range(L):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        m.update({p + "attn_norm.weight": q + "input_layernorm.weight", p + "ffn_norm.weight": q + "post_attention_layernorm.weight"})
        for site, mod in (("attn", "attn_hc"), ("ffn", "ffn_hc")):
            for part in ("fn", "base", "scale"):
                m[p + f"hc_{site}_{part}"] = q + f"{mod}.{part}"
        a, sa = p + "attn.", q + "self_attn."
        m.update({a + "attn_sink": sa + "sinks", a + "wq_a.weight": sa + "q_a_proj.weight",
                  a + "q_norm.weight": sa + "q_a_norm.weight", a + "wq_b.weight": sa + "q_b_proj.weight",
                  a + "wkv.weight": sa + "kv_proj.weight", a + "kv_norm.weight": sa + "kv_norm.weight",
                  a + "wo_a.weight": sa + "o_a_proj.weight", a + "wo_b.weight": sa + "o_b_proj.weight"})
        ratio = c["compress_ratios"][i]
        if ratio:
            m.update({a + "compressor.wkv.weight": sa + "compressor.kv_proj.weight",
                      a + "compressor.wgate.weight": sa + "compressor.gate_proj.weight",
                      a + "compressor.ape": sa + "compressor.position_bias",
                      a + "compressor.norm.weight": sa + "compressor.kv_norm.weight"})
        if ratio == 4:
            ix = sa + "compressor.indexer."
            m.update({a + "indexer.wq_b.weight": ix + "q_b_proj.weight",
                      a + "indexer.weights_proj.weight": ix + "scorer.weights_proj.weight",
                      a + "indexer.compressor.wkv.weight": ix + "kv_proj.weight",
                      a + "indexer.compressor.wgate.weight": ix + "gate_proj.weight",
                      a + "indexer.compressor.ape": ix + "position_bias",
                      a + "indexer.compressor.norm.weight": ix + "kv_norm.weight"})
        f, mlp = p + "ffn.", q + "mlp."
        m[f + "gate.weight"] = mlp + "gate.weight"
        if i < c["num_hash_layers"]:
            m[f + "gate.tid2eid"] = mlp + "gate.tid2eid"
        else:
            m[f + "gate.bias"] = mlp + "gate.e_score_correction_bias"
        m.update({f + "shared_experts.w1.weight": mlp + "shared_experts.gate_proj.weight",
                  f + "shared_experts.w3.weight": mlp + "shared_experts.up_proj.weight",
                  f + "shared_experts.w2.weight": mlp + "shared_experts.down_proj.weight"})

    sd = model.state_dict()
    assigned = set()
    for off, hf in m.items():
        assert hf in sd, hf
        assert tuple(sd[hf].shape) == tuple(values[off].shape), (off, hf, sd[hf].shape, values[off].shape)
        sd[hf].copy_(values[off])
        assigned.add(hf)
    E = c["n_routed_experts"]
    for i in range(L):
        f, mlp = f"layers.{i}.ffn.", f"model.layers.{i}.mlp."
        gu = torch.stack([torch.cat([values[f + f"experts.{e}.w1.weight"], values[f + f"experts.{e}.w3.weight"]]) for e in range(E)])
        dn = torch.stack([values[f + f"experts.{e}.w2.weight"] for e in range(E)])
        sd[mlp + "experts.gate_up_proj"].copy_(gu)
        sd[mlp + "experts.down_proj"].copy_(dn)
        assigned |= {mlp + "experts.gate_up_proj", mlp + "experts.down_proj"}
    missing = [k for k in sd if k not in assigned]
    assert not missing, f"transformers parameters not set from the checkpoint: {missing}"
    return model


# ---------------------------------------------------------------- bf16 KV storage in the reference

class Bf16KvStorage:
    """Context manager: makes transformers' DeepSeek-V4 store its K=V rows, compressed entries and indexer
    keys in bf16, as a bf16 KV cache does (DeepSeek's own reference likewise simulates its fp8 KV storage).

    transformers keeps every cached value in the model dtype (fp32 here). A bf16 cache rounds each stored
    row once, after RMSNorm and RoPE; every reader then sees the rounded row. Without this, routing and
    indexer top-k choices that sit within rounding distance of a tie flip between the two implementations
    and logits differ by 1e-1, which says nothing about either. We wrap the module's
    `apply_rotary_pos_emb` and round its result only at those three call sites, found from the caller:
    the `kv` row in DeepseekV4Attention.forward, and the one-head `compressed` entries in the compressors
    and the indexer. The computation itself is untouched."""

    def __enter__(self):
        import sys
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mod
        self.mod, self.orig = mod, mod.apply_rotary_pos_emb
        orig = self.orig

        def wrapped(x, cos, sin, unsqueeze_dim=1):
            out = orig(x, cos, sin, unsqueeze_dim)
            caller = sys._getframe(1)
            owner = type(caller.f_locals.get("self")).__name__
            store = (owner == "DeepseekV4Attention" and x is caller.f_locals.get("kv")) or (
                owner in ("DeepseekV4CSACompressor", "DeepseekV4HCACompressor", "DeepseekV4Indexer")
                and x._base is not None and x._base is caller.f_locals.get("compressed"))
            return out.to(torch.bfloat16).to(out.dtype) if store else out

        mod.apply_rotary_pos_emb = wrapped
        return self

    def __exit__(self, *exc):
        self.mod.apply_rotary_pos_emb = self.orig


# ---------------------------------------------------------------- run

def check_no_ties(model, c, ids):
    """Asserts that no indexer row has an exact tie at the k-th visible score."""
    captured = []
    hooks = [mod.register_forward_hook(lambda m, i, o: captured.append(o.detach().clone()))
             for name, mod in model.named_modules() if name.endswith("indexer.scorer")]
    model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    k = c["index_topk"]
    worst = 0
    for scores in captured:
        s = scores[0]
        S, T = s.shape
        for p in range(S):
            vis = (p + 1) // 4
            if vis <= k:
                continue
            row = torch.sort(s[p, :vis], descending=True).values
            assert row[k - 1] != row[k], f"exact tie at the k-th indexer score, query {p}"
            worst += 1
    return worst


def run_config(name, spec, out_root, seed):
    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    c = spec["config"]
    values = build_checkpoint(c, seed, out_dir)
    model = hf_model(c, values)
    gen = torch.Generator().manual_seed(seed + 1)
    S, P, D = spec["seq_len"], spec["prefill"], spec["decode"]
    assert P + D == S
    ids = torch.randint(2, c["vocab_size"], (1, S), generator=gen)
    ids[0, 0] = 0  # BOS
    if spec.get("greedy"):
        # Positions P .. S-1: the reference's greedy continuation of the prompt (cached decode, first maximum).
        out = model(input_ids=ids[:, :P], use_cache=True)
        past = out.past_key_values
        for t in range(P, S):
            ids[0, t] = int(torch.argmax(out.logits[0, -1]))
            if t + 1 < S:
                out = model(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
                past = out.past_key_values
    checked_rows = check_no_ties(model, c, ids)

    def full_and_decode():
        full = model(input_ids=ids, use_cache=False).logits[0].float()
        out = model(input_ids=ids[:, :P], use_cache=True)
        past = out.past_key_values
        dec = [out.logits[0, -1].float()]
        for t in range(P, S - 1):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            dec.append(out.logits[0, -1].float())
        dec = torch.stack(dec)  # logits at positions P-1 .. S-2
        rel = ((dec - full[P - 1:S - 1]).abs().max() / full.abs().max()).item()
        assert rel < 1e-4, f"transformers' cached decode disagrees with its full forward: {rel}"
        return full, dec, rel

    full, dec, ref_rel = full_and_decode()
    full.numpy().astype("<f4").tofile(os.path.join(out_dir, "logits_full.f32"))
    dec.numpy().astype("<f4").tofile(os.path.join(out_dir, "logits_decode.f32"))
    with Bf16KvStorage():
        full16, dec16, ref_rel16 = full_and_decode()
    full16.numpy().astype("<f4").tofile(os.path.join(out_dir, "logits_full_bf16kv.f32"))
    dec16.numpy().astype("<f4").tofile(os.path.join(out_dir, "logits_decode_bf16kv.f32"))
    bf16_effect = ((full16 - full).abs().max() / full.abs().max()).item()
    rot = model.model.rotary_emb
    import transformers
    meta = dict(
        input_ids=ids[0].tolist(), seq_len=S, prefill=P, vocab_size=c["vocab_size"],
        decode_positions=[P - 1, S - 2],
        reference=f"transformers {transformers.__version__} DeepseekV4ForCausalLM, torch {torch.__version__}, fp32, CPU, eager",
        reference_cached_vs_full_rel=ref_rel, reference_cached_vs_full_rel_bf16kv=ref_rel16,
        bf16kv_vs_f32kv_reference_rel=bf16_effect, indexer_rows_checked_for_ties=checked_rows,
        inv_freq_main=rot.main_inv_freq.tolist(), inv_freq_compress=rot.compress_inv_freq.tolist(),
        seed=seed, greedy_continuation=bool(spec.get("greedy", False)),
    )
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: {S} tokens, cached-vs-full {ref_rel:.2e} (bf16 KV {ref_rel16:.2e}), bf16-KV effect "
          f"{bf16_effect:.2e}, {checked_rows} indexer rows tie-free, "
          f"logits |max| {full.abs().max().item():.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "golden"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", help="write only this fixture (others are left as they are)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    for i, (name, spec) in enumerate(CONFIGS.items()):
        if args.only and name != args.only:
            continue
        run_config(name, spec, args.out, args.seed + 100 * i)


if __name__ == "__main__":
    main()
