#include "model/manifest.h"

namespace dsv4 {

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string layer_prefix(const ModelConfig& c, int layer) {
  if (layer < c.num_hidden_layers) return "layers." + std::to_string(layer) + ".";
  return "mtp." + std::to_string(layer - c.num_hidden_layers) + ".";
}

void expect_linear(std::vector<ExpectedTensor>& out, const std::string& base, WeightFormat fmt, int64_t rows,
                   int64_t cols, int block) {
  switch (fmt) {
    case WeightFormat::kBF16:
      out.push_back({base + ".weight", {DType::kBF16}, {rows, cols}});
      break;
    case WeightFormat::kFP8Block:
      // Scales are UE8M0 in the released checkpoints; the Flash-Base checkpoint stores float32 scales.
      out.push_back({base + ".weight", {DType::kF8_E4M3}, {rows, cols}});
      out.push_back({base + ".scale", {DType::kF8_E8M0, DType::kF32}, {ceil_div(rows, block), ceil_div(cols, block)}});
      break;
    case WeightFormat::kFP4:
      // e2m1 packed two per byte along K, one UE8M0 scale per 32 K elements.
      out.push_back({base + ".weight", {DType::kI8, DType::kU8}, {rows, cols / 2}});
      out.push_back({base + ".scale", {DType::kF8_E8M0}, {rows, cols / 32}});
      break;
  }
}

static void expect_hc(std::vector<ExpectedTensor>& out, const std::string& p, const std::string& site,
                      const ModelConfig& c) {
  const int64_t D = c.hidden_size, n = c.hc_mult;
  out.push_back({p + "hc_" + site + "_fn", {DType::kF32}, {c.hc_mix(), n * D}});
  out.push_back({p + "hc_" + site + "_base", {DType::kF32}, {c.hc_mix()}});
  out.push_back({p + "hc_" + site + "_scale", {DType::kF32}, {3}});
}

static void expect_compressor(std::vector<ExpectedTensor>& out, const std::string& p, int ratio, int64_t head,
                              int64_t D) {
  const int64_t c = ratio == 4 ? 2 : 1;  // ratio 4 carries two overlapping series
  out.push_back({p + "wkv.weight", {DType::kBF16}, {c * head, D}});
  out.push_back({p + "wgate.weight", {DType::kBF16}, {c * head, D}});
  out.push_back({p + "ape", {DType::kF32}, {ratio, c * head}});
  out.push_back({p + "norm.weight", {DType::kBF16}, {head}});
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  const int64_t D = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads, hd = c.head_dim;
  const int B = c.weight_block;
  const WeightFormat lf = c.linear_format;
  out.push_back({"embed.weight", {DType::kBF16}, {V, D}});
  out.push_back({"head.weight", {DType::kBF16}, {V, D}});
  out.push_back({"norm.weight", {DType::kBF16}, {D}});
  out.push_back({"hc_head_fn", {DType::kF32}, {c.hc_mult, c.hc_mult * D}});
  out.push_back({"hc_head_base", {DType::kF32}, {c.hc_mult}});
  out.push_back({"hc_head_scale", {DType::kF32}, {1}});

  for (int i = 0; i < c.num_layers_total(); ++i) {
    const std::string p = layer_prefix(c, i);
    const int ratio = c.compress_ratio(i);
    out.push_back({p + "attn_norm.weight", {DType::kBF16}, {D}});
    out.push_back({p + "ffn_norm.weight", {DType::kBF16}, {D}});
    expect_hc(out, p, "attn", c);
    expect_hc(out, p, "ffn", c);

    const std::string a = p + "attn.";
    out.push_back({a + "attn_sink", {DType::kF32}, {H}});
    expect_linear(out, a + "wq_a", lf, c.q_lora_rank, D, B);
    out.push_back({a + "q_norm.weight", {DType::kBF16}, {c.q_lora_rank}});
    expect_linear(out, a + "wq_b", lf, H * hd, c.q_lora_rank, B);
    expect_linear(out, a + "wkv", lf, hd, D, B);
    out.push_back({a + "kv_norm.weight", {DType::kBF16}, {hd}});
    expect_linear(out, a + "wo_a", lf, int64_t(c.o_groups) * c.o_lora_rank, H * hd / c.o_groups, B);
    expect_linear(out, a + "wo_b", lf, D, int64_t(c.o_groups) * c.o_lora_rank, B);
    if (ratio) expect_compressor(out, a + "compressor.", ratio, hd, D);
    if (ratio == 4) {
      const std::string ix = a + "indexer.";
      expect_linear(out, ix + "wq_b", lf, int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank, B);
      out.push_back({ix + "weights_proj.weight", {DType::kBF16}, {c.index_n_heads, D}});
      expect_compressor(out, ix + "compressor.", 4, c.index_head_dim, D);
    }

    const std::string f = p + "ffn.";
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
    out.push_back({f + "gate.weight", {DType::kBF16}, {E, D}});
    if (c.is_hash_layer(i)) out.push_back({f + "gate.tid2eid", {DType::kI64, DType::kI32}, {V, c.num_experts_per_tok}});
    else out.push_back({f + "gate.bias", {DType::kF32}, {E}});
    if (c.n_shared_experts) {
      expect_linear(out, f + "shared_experts.w1", lf, I, D, B);
      expect_linear(out, f + "shared_experts.w3", lf, I, D, B);
      expect_linear(out, f + "shared_experts.w2", lf, D, I, B);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      expect_linear(out, x + "w1", c.expert_format, I, D, B);
      expect_linear(out, x + "w3", c.expert_format, I, D, B);
      expect_linear(out, x + "w2", c.expert_format, D, I, B);
    }

    if (i >= c.num_hidden_layers) {  // MTP block extras
      expect_linear(out, p + "e_proj", lf, D, D, B);
      expect_linear(out, p + "h_proj", lf, D, D, B);
      out.push_back({p + "enorm.weight", {DType::kBF16}, {D}});
      out.push_back({p + "hnorm.weight", {DType::kBF16}, {D}});
      out.push_back({p + "norm.weight", {DType::kBF16}, {D}});
      out.push_back({p + "hc_head_fn", {DType::kF32}, {c.hc_mult, c.hc_mult * D}});
      out.push_back({p + "hc_head_base", {DType::kF32}, {c.hc_mult}});
      out.push_back({p + "hc_head_scale", {DType::kF32}, {1}});
    }
  }
  return out;
}

}  // namespace dsv4
