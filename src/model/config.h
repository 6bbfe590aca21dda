// The model configuration: every config.json field that changes the computation, parsed from the official
// DeepSeek-V4 spelling (config.json as shipped) or the Hugging Face transformers spelling, validated, and
// with derived per-layer facts (attention kind, compress ratio, hash routing).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class AttnKind { kWindow, kCSA, kHCA };  // compress ratio 0, 4 (with indexer), 128
enum class ScoreFunc { kSqrtSoftplus, kSigmoid, kSoftmax };
enum class WeightFormat { kBF16, kFP8Block, kFP4 };  // as stored in the checkpoint

const char* attn_kind_name(AttnKind k);

struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  std::string source;  // file the config came from, for error messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_hidden_layers = 0;      // main layers, excluding MTP
  int num_nextn_predict_layers = 0;
  int num_attention_heads = 0;
  int head_dim = 0;
  int rope_head_dim = 0;          // qk_rope_head_dim: trailing dims of each head that carry RoPE
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;

  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int num_hash_layers = 0;
  ScoreFunc scoring_func = ScoreFunc::kSqrtSoftplus;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;      // 0 = no clamp

  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int sliding_window = 0;
  std::vector<int> compress_ratios;  // one per layer, main layers then MTP layers

  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;

  double rope_theta = 0.0;           // window-only layers
  double compress_rope_theta = 0.0;  // compressed layers (with YaRN)
  YarnConfig yarn;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;

  int bos_token_id = 0;
  int eos_token_id = 1;

  WeightFormat linear_format = WeightFormat::kFP8Block;  // attention, shared experts, indexer wq_b, MTP projections
  WeightFormat expert_format = WeightFormat::kFP4;       // routed experts
  int weight_block = 128;                                // FP8 scale tile edge

  // Derived.
  int num_layers_total() const { return num_hidden_layers + num_nextn_predict_layers; }
  int compress_ratio(int layer) const { return compress_ratios.at(layer); }
  AttnKind attn_kind(int layer) const;
  bool has_csa() const;  // any main layer with CSA attention (an indexer)
  bool is_hash_layer(int layer) const { return layer < num_hash_layers; }  // MTP layers are never hash layers
  int hc_mix() const { return (2 + hc_mult) * hc_mult; }
};

// Parses config.json text. Throws dsv4::Error naming `source` and the field on any unknown, missing or
// inconsistent value.
ModelConfig parse_config(const std::string& json_text, const std::string& source);
ModelConfig load_config(const std::string& path);

}  // namespace dsv4
