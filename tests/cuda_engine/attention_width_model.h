// The GPU engine tests' random models and prompts: attention at the widths the CUDA kernels are built for (64
// heads x 512, indexer 64 x 128), everything else small (hidden 512, vocab 1024, 128-wide experts), window 64 so
// the rings wrap. Layer schedule, expert count and indexer top-k vary per test.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/random_checkpoint.h"

namespace dsv4::testing {

// compress_ratios: the main layers' then the MTP layers' (nextn of them, the last entries).
inline std::string attention_width_config(const std::vector<int>& compress_ratios, int n_experts, int index_topk,
                                          int nextn = 0) {
  nlohmann::json j = {
      {"vocab_size", 1024}, {"hidden_size", 512},
      {"num_hidden_layers", static_cast<int>(compress_ratios.size()) - nextn}, {"num_nextn_predict_layers", nextn},
      {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512}, {"qk_rope_head_dim", 64},
      {"q_lora_rank", 256}, {"o_groups", 8}, {"o_lora_rank", 128},
      {"n_routed_experts", n_experts}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
      {"moe_intermediate_size", 128}, {"scoring_func", "sqrtsoftplus"}, {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true}, {"routed_scaling_factor", 1.5}, {"num_hash_layers", 1}, {"swiglu_limit", 10.0},
      {"hidden_act", "silu"}, {"index_n_heads", 64}, {"index_head_dim", 128}, {"index_topk", index_topk},
      {"sliding_window", 64}, {"compress_ratios", compress_ratios}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6}, {"rope_theta", 10000}, {"compress_rope_theta", 160000},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                        {"beta_fast", 32}, {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576}, {"rms_norm_eps", 1e-6}, {"bos_token_id", 0}, {"eos_token_id", 1},
      {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"expert_dtype", "fp4"},
      {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                               {"weight_block_size", {128, 128}}, {"activation_scheme", "dynamic"}}}};
  return j.dump(1);
}

// test_gpu_model's two models. Layers: 0 window + hash routing, 1 CSA, 2 HCA, 3 CSA. Window 64 so rings wrap;
// index_topk 16 so the indexer selects among up to ~100 entries; 128-token HCA blocks close three times in
// the longer sequence. "continuous": 2 experts top-2 and index_topk 128 (every selection keeps everything).
inline std::string gpu_engine_test_config(bool selective) {
  return attention_width_config({0, 4, 128, 4}, selective ? 16 : 2, selective ? 16 : 128);
}

// test_gpu_model's prompts: len token ids in 2 .. 1001 from a linear congruential generator.
inline std::vector<int32_t> lcg_prompt(int len, uint32_t seed) {
  std::vector<int32_t> p;
  uint32_t x = seed;
  for (int i = 0; i < len; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(2 + static_cast<int32_t>((x >> 8) % 1000));
  }
  return p;
}

// test_gpu_model's two prompts for a run seed (300 and 137 tokens).
inline std::vector<std::vector<int32_t>> gpu_engine_test_prompts(uint64_t seed) {
  return {lcg_prompt(300, static_cast<uint32_t>(seed)), lcg_prompt(137, static_cast<uint32_t>(seed >> 20) + 7)};
}

// Writes test_gpu_model's continuous (selective = false) or selective model of a run seed into dir (checkpoint
// seed: seed + selective).
inline void write_gpu_engine_test_model(uint64_t seed, bool selective, const std::string& dir) {
  RandomCheckpointOptions o;
  o.seed = seed + (selective ? 1 : 0);
  write_random_checkpoint(gpu_engine_test_config(selective), dir, o);
}

// The CPU replay tools' common start (tests/tools): `tool SEED [STEPS]` parsed, test_gpu_model's continuous or
// selective model of that run seed written into a temporary directory (the caller removes it), and the seed's
// two prompts. False (after printing the usage) without a seed.
struct ReplayModel {
  uint64_t seed = 0;
  int steps = 256;
  std::string dir;
  std::vector<std::vector<int32_t>> prompts;
};
inline bool replay_model_from_args(int argc, char** argv, const char* tool, bool selective, ReplayModel& r) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SEED [STEPS (default 256)]\n", tool);
    return false;
  }
  r.seed = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) r.steps = std::atoi(argv[2]);
  r.dir = (std::filesystem::temp_directory_path() / (std::string("dsv4_") + tool + "_" + std::to_string(r.seed))).string();
  write_gpu_engine_test_model(r.seed, selective, r.dir);
  r.prompts = gpu_engine_test_prompts(r.seed);
  return true;
}

// The error of logits row a against the reference row b: max |a - b| / max |b|; NaN or inf in a gives inf
// (std::max would drop a NaN).
inline double row_error(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, err = 0;
  for (size_t v = 0; v < b.size(); ++v) {
    mx = std::max(mx, std::fabs(static_cast<double>(b[v])));
    const double d = std::fabs(static_cast<double>(a[v]) - b[v]);
    err = std::isfinite(d) ? std::max(err, d) : INFINITY;
  }
  return err / std::max(mx, 1e-30);
}

}  // namespace dsv4::testing
