#include "model/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using json = nlohmann::json;

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::kWindow: return "window";
    case AttnKind::kCSA: return "CSA";
    case AttnKind::kHCA: return "HCA";
  }
  return "?";
}

AttnKind ModelConfig::attn_kind(int layer) const {
  const int r = compress_ratio(layer);
  if (r == 0) return AttnKind::kWindow;
  return r == 4 ? AttnKind::kCSA : AttnKind::kHCA;
}

bool ModelConfig::has_csa() const {
  for (int i = 0; i < num_hidden_layers; ++i)
    if (attn_kind(i) == AttnKind::kCSA) return true;
  return false;
}

namespace {

// Field access with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    fail(source_, ": config field '", field, "' ", why);
  }

  int64_t integer(const char* key) const {
    if (!has(key)) bad(key, "is missing");
    return as_int(j_.at(key), key);
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? as_int(j_.at(key), key) : dflt; }

  double number(const char* key) const {
    if (!has(key)) bad(key, "is missing");
    return as_num(j_.at(key), key);
  }
  double number(const char* key, double dflt) const { return has(key) ? as_num(j_.at(key), key) : dflt; }

  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j_.at(key).is_string()) bad(key, "must be a string");
    return j_.at(key).get<std::string>();
  }

  int64_t as_int(const json& v, const std::string& field) const {
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (d == std::floor(d)) return static_cast<int64_t>(d);
    }
    bad(field, "must be an integer, got " + v.dump());
  }
  double as_num(const json& v, const std::string& field) const {
    if (!v.is_number()) bad(field, "must be a number, got " + v.dump());
    return v.get<double>();
  }

  const json& j_;
  const std::string& source_;
};

void parse_yarn(const Fields& f, const json& rs, const std::string& field, ModelConfig& c) {
  if (!rs.is_object()) f.bad(field, "must be an object");
  std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
  if (type == "default" || type == "none") return;
  if (type != "yarn") f.bad(field + ".type", "must be 'yarn' (got '" + type + "')");
  Fields r(rs, f.source_);
  c.yarn.enabled = true;
  c.yarn.original_max_position_embeddings = r.integer("original_max_position_embeddings");
  if (r.has("factor")) {
    c.yarn.factor = r.number("factor");
  } else {
    c.yarn.factor = static_cast<double>(c.max_position_embeddings) / c.yarn.original_max_position_embeddings;
  }
  c.yarn.beta_fast = r.number("beta_fast", 32.0);
  c.yarn.beta_slow = r.number("beta_slow", 1.0);
  if (r.has("mscale") && r.number("mscale") != 0 && r.number("mscale") != 1)
    f.bad(field + ".mscale", "is not supported: DeepSeek-V4 applies no YaRN attention scaling");
  if (c.yarn.factor < 1.0) f.bad(field + ".factor", "must be >= 1");
  if (c.yarn.original_max_position_embeddings <= 0)
    f.bad(field + ".original_max_position_embeddings", "must be positive");
  // transformers derives the factor from max_position_embeddings / original_max_position_embeddings in some
  // paths and reads `factor` in others; a config where the two disagree would run differently in each.
  if (c.max_position_embeddings > 0) {
    double implied = static_cast<double>(c.max_position_embeddings) / c.yarn.original_max_position_embeddings;
    if (std::fabs(implied - c.yarn.factor) > 1e-9 * c.yarn.factor)
      f.bad(field + ".factor", "(" + std::to_string(c.yarn.factor) +
                                   ") disagrees with max_position_embeddings / original_max_position_embeddings (" +
                                   std::to_string(implied) + ")");
  }
}

}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(source, ": config is not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail(source, ": config must be a JSON object");
  Fields f(j, source);
  ModelConfig c;
  c.source = source;

  std::string model_type = f.string("model_type", "deepseek_v4");
  if (model_type != "deepseek_v4") f.bad("model_type", "must be 'deepseek_v4' (got '" + model_type + "')");

  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.num_hidden_layers = static_cast<int>(f.integer("num_hidden_layers"));
  c.num_nextn_predict_layers = static_cast<int>(f.integer("num_nextn_predict_layers", 0));
  c.num_attention_heads = static_cast<int>(f.integer("num_attention_heads"));
  if (f.integer("num_key_value_heads", 1) != 1) f.bad("num_key_value_heads", "must be 1 (shared-KV MQA)");
  c.head_dim = static_cast<int>(f.integer("head_dim"));
  if (f.has("qk_rope_head_dim")) {
    c.rope_head_dim = static_cast<int>(f.integer("qk_rope_head_dim"));
  } else if (f.has("partial_rotary_factor")) {  // transformers spelling
    c.rope_head_dim = static_cast<int>(std::lround(f.number("partial_rotary_factor") * c.head_dim));
  } else {
    c.rope_head_dim = 64;
  }
  c.q_lora_rank = static_cast<int>(f.integer("q_lora_rank"));
  c.o_groups = static_cast<int>(f.integer("o_groups"));
  c.o_lora_rank = static_cast<int>(f.integer("o_lora_rank"));

  c.n_routed_experts = static_cast<int>(f.integer("n_routed_experts"));
  c.n_shared_experts = static_cast<int>(f.integer("n_shared_experts", 1));
  c.num_experts_per_tok = static_cast<int>(f.integer("num_experts_per_tok"));
  c.moe_intermediate_size = static_cast<int>(f.integer("moe_intermediate_size"));
  std::string score = f.string("scoring_func", "sqrtsoftplus");
  if (score == "sqrtsoftplus") c.scoring_func = ScoreFunc::kSqrtSoftplus;
  else if (score == "sigmoid") c.scoring_func = ScoreFunc::kSigmoid;
  else if (score == "softmax") c.scoring_func = ScoreFunc::kSoftmax;
  else f.bad("scoring_func", "must be sqrtsoftplus, sigmoid or softmax (got '" + score + "')");
  std::string topk_method = f.string("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc" && topk_method != "greedy")
    f.bad("topk_method", "must be 'noaux_tc' (got '" + topk_method + "')");
  if (f.integer("n_group", 1) > 1 || f.integer("topk_group", 1) > 1)
    f.bad("n_group", "group-limited routing is not part of DeepSeek-V4");
  if (j.contains("norm_topk_prob")) {
    if (!j["norm_topk_prob"].is_boolean()) f.bad("norm_topk_prob", "must be a boolean");
    c.norm_topk_prob = j["norm_topk_prob"].get<bool>();
  }
  c.routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
  c.swiglu_limit = f.number("swiglu_limit", 0.0);
  std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.bad("hidden_act", "must be 'silu' (got '" + act + "')");

  c.index_n_heads = static_cast<int>(f.integer("index_n_heads"));
  c.index_head_dim = static_cast<int>(f.integer("index_head_dim"));
  c.index_topk = static_cast<int>(f.integer("index_topk"));
  c.sliding_window = static_cast<int>(f.integer("sliding_window"));

  // Layer schedule: official `compress_ratios` (main layers + MTP layers) or transformers `layer_types`.
  const int total = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (f.has("compress_ratios")) {
    const json& cr = j["compress_ratios"];
    if (!cr.is_array()) f.bad("compress_ratios", "must be an array");
    for (size_t i = 0; i < cr.size(); ++i)
      c.compress_ratios.push_back(static_cast<int>(f.as_int(cr[i], "compress_ratios[" + std::to_string(i) + "]")));
    if (static_cast<int>(c.compress_ratios.size()) != total)
      f.bad("compress_ratios", "has " + std::to_string(cr.size()) + " entries; num_hidden_layers + " +
                                   "num_nextn_predict_layers = " + std::to_string(total));
  } else if (f.has("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != c.num_hidden_layers)
      f.bad("layer_types", "must be an array of num_hidden_layers strings");
    int csa = 4, hca = 128;
    if (f.has("compress_rates")) {
      Fields r(j["compress_rates"], source);
      csa = static_cast<int>(r.integer("compressed_sparse_attention", 4));
      hca = static_cast<int>(r.integer("heavily_compressed_attention", 128));
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "sliding_attention") c.compress_ratios.push_back(0);
      else if (t == "compressed_sparse_attention") c.compress_ratios.push_back(csa);
      else if (t == "heavily_compressed_attention") c.compress_ratios.push_back(hca);
      else f.bad("layer_types[" + std::to_string(i) + "]", "is not a DeepSeek-V4 layer type: " + lt[i].dump());
    }
    for (int i = 0; i < c.num_nextn_predict_layers; ++i) c.compress_ratios.push_back(0);  // MTP: window only
  } else {
    f.bad("compress_ratios", "is missing (neither compress_ratios nor layer_types given)");
  }
  for (int i = 0; i < total; ++i) {
    int r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128)
      f.bad("compress_ratios[" + std::to_string(i) + "]", "must be 0, 4 or 128 (got " + std::to_string(r) + ")");
  }

  if (f.has("num_hash_layers")) {
    c.num_hash_layers = static_cast<int>(f.integer("num_hash_layers"));
  } else if (f.has("mlp_layer_types")) {  // transformers spelling: a prefix of "hash_moe"
    const json& mt = j["mlp_layer_types"];
    if (!mt.is_array()) f.bad("mlp_layer_types", "must be an array");
    bool in_prefix = true;
    for (size_t i = 0; i < mt.size(); ++i) {
      std::string t = mt[i].is_string() ? mt[i].get<std::string>() : "";
      if (t == "hash_moe") {
        if (!in_prefix) f.bad("mlp_layer_types[" + std::to_string(i) + "]", "hash_moe layers must come first");
        ++c.num_hash_layers;
      } else if (t == "moe") {
        in_prefix = false;
      } else {
        f.bad("mlp_layer_types[" + std::to_string(i) + "]", "must be 'hash_moe' or 'moe'");
      }
    }
  } else {
    c.num_hash_layers = 3;
  }

  c.hc_mult = static_cast<int>(f.integer("hc_mult"));
  c.hc_sinkhorn_iters = static_cast<int>(f.integer("hc_sinkhorn_iters"));
  c.hc_eps = f.number("hc_eps");

  c.max_position_embeddings = f.integer("max_position_embeddings", 1 << 20);
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.compress_rope_theta = f.number("compress_rope_theta", 160000.0);
  if (f.has("rope_scaling")) {
    parse_yarn(f, j["rope_scaling"], "rope_scaling", c);
  } else if (f.has("rope_parameters")) {  // transformers spelling: flat, or {"main": {...}, "compress": {...}}
    const json& rp = j["rope_parameters"];
    if (rp.contains("compress") && rp["compress"].is_object()) {
      Fields cf(rp["compress"], source);
      c.compress_rope_theta = cf.number("rope_theta", c.compress_rope_theta);
      parse_yarn(f, rp["compress"], "rope_parameters.compress", c);
      if (rp.contains("main") && rp["main"].is_object())
        c.rope_theta = Fields(rp["main"], source).number("rope_theta", c.rope_theta);
    } else {
      parse_yarn(f, rp, "rope_parameters", c);
    }
  }
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);

  if (f.has("bos_token_id")) c.bos_token_id = static_cast<int>(f.integer("bos_token_id"));
  if (f.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    c.eos_token_id = static_cast<int>(f.as_int(e.is_array() && !e.empty() ? e[0] : e, "eos_token_id"));
  }
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
      j["tie_word_embeddings"].get<bool>())
    f.bad("tie_word_embeddings", "must be false: DeepSeek-V4 ships a separate head.weight");

  // Weight formats.
  if (f.has("quantization_config")) {
    const json& q = j["quantization_config"];
    Fields qf(q, source);
    std::string method = qf.string("quant_method", "");
    if (method != "fp8") f.bad("quantization_config.quant_method", "must be 'fp8' (got '" + method + "')");
    std::string fmt = qf.string("fmt", "e4m3");
    if (fmt != "e4m3") f.bad("quantization_config.fmt", "must be 'e4m3' (got '" + fmt + "')");
    std::string sf = qf.string("scale_fmt", "ue8m0");
    if (sf != "ue8m0") f.bad("quantization_config.scale_fmt", "must be 'ue8m0' (got '" + sf + "')");
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || b[0] != b[1] || b[0].get<int>() <= 0)
        f.bad("quantization_config.weight_block_size", "must be [N, N] (got " + b.dump() + ")");
      c.weight_block = b[0].get<int>();
    }
    c.linear_format = WeightFormat::kFP8Block;
    std::string ed = f.string("expert_dtype", "fp4");
    if (ed == "fp4") c.expert_format = WeightFormat::kFP4;
    else if (ed == "fp8") c.expert_format = WeightFormat::kFP8Block;
    else f.bad("expert_dtype", "must be 'fp4' or 'fp8' (got '" + ed + "')");
  } else {
    c.linear_format = WeightFormat::kBF16;
    std::string ed = f.string("expert_dtype", "bf16");
    if (ed != "bf16") f.bad("expert_dtype", "is '" + ed + "' but there is no quantization_config");
    c.expert_format = WeightFormat::kBF16;
  }

  // Consistency.
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) f.bad(name, "must be positive (got " + std::to_string(v) + ")");
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("head_dim", c.head_dim);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_groups", c.o_groups);
  positive("o_lora_rank", c.o_lora_rank);
  positive("n_routed_experts", c.n_routed_experts);
  positive("num_experts_per_tok", c.num_experts_per_tok);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("sliding_window", c.sliding_window);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  if (c.num_nextn_predict_layers < 0) f.bad("num_nextn_predict_layers", "must be >= 0");
  if (c.rope_head_dim <= 0 || c.rope_head_dim % 2 || c.rope_head_dim > c.head_dim)
    f.bad("qk_rope_head_dim", "must be even and in (0, head_dim]");
  if (c.num_attention_heads % c.o_groups)
    f.bad("o_groups", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  if (c.num_experts_per_tok > c.n_routed_experts)
    f.bad("num_experts_per_tok", "exceeds n_routed_experts");
  if (c.n_shared_experts != 0 && c.n_shared_experts != 1)
    f.bad("n_shared_experts", "must be 0 or 1 (got " + std::to_string(c.n_shared_experts) + ")");
  if (c.num_hash_layers < 0 || c.num_hash_layers > c.num_hidden_layers)
    f.bad("num_hash_layers", "must be in [0, num_hidden_layers]");
  bool any_csa = false;
  for (int r : c.compress_ratios) any_csa |= (r == 4);
  if (any_csa) {
    positive("index_n_heads", c.index_n_heads);
    positive("index_topk", c.index_topk);
    if (c.index_head_dim < c.rope_head_dim || c.index_head_dim % 2)
      f.bad("index_head_dim", "must be even and at least qk_rope_head_dim");
  }
  if (c.hc_eps < 0) f.bad("hc_eps", "must be >= 0");
  if (c.rope_theta <= 0) f.bad("rope_theta", "must be positive");
  if (c.compress_rope_theta <= 0) f.bad("compress_rope_theta", "must be positive");
  if (c.weight_block % 32) f.bad("quantization_config.weight_block_size", "must be a multiple of 32");
  if (c.expert_format == WeightFormat::kFP4 && c.hidden_size % 32)
    f.bad("hidden_size", "must be a multiple of 32 for FP4 experts");
  if (c.expert_format == WeightFormat::kFP4 && c.moe_intermediate_size % 32)
    f.bad("moe_intermediate_size", "must be a multiple of 32 for FP4 experts");
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open config");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path);
}

}  // namespace dsv4
