#include "model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/numerics.h"
#include "model/config.h"
#include "model/manifest.h"
#include "model/safetensors.h"

namespace dsv4 {

namespace fs = std::filesystem;

namespace {

// splitmix64: a small, portable, deterministic generator.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  float normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Random float values for a tensor, scaled by its role so that activations stay O(1).
std::vector<float> values_for(const std::string& name, const Shape& shape, Rng& rng) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  const int64_t fan_in = shape.size() == 2 ? shape[1] : 1;
  float mean = 0.0f, std = 1.0f / std::sqrt(static_cast<float>(fan_in));
  if (ends_with(name, "norm.weight")) { mean = 1.0f; std = 0.1f; }
  else if (name == "embed.weight") std = 1.0f;
  else if (ends_with(name, "_fn")) std = 0.5f / std::sqrt(static_cast<float>(fan_in));
  else if (ends_with(name, "_base")) std = 0.5f;
  else if (ends_with(name, "_scale") && shape.size() == 1) { mean = 1.0f; std = 0.2f; }
  else if (ends_with(name, "attn_sink")) std = 1.0f;
  else if (ends_with(name, "ape")) std = 0.5f;
  else if (ends_with(name, "gate.bias")) std = 0.1f;
  for (auto& x : v) x = mean + std * rng.normal();
  return v;
}

TensorBlob encode_plain(const std::string& name, DType dt, const Shape& shape, const std::vector<float>& v) {
  TensorBlob b{name, dt, shape, {}};
  b.bytes.resize(static_cast<size_t>(shape_numel(shape)) * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kF32) std::memcpy(&b.bytes[4 * i], &v[i], 4);
    else { uint16_t h = f32_to_bf16(v[i]); std::memcpy(&b.bytes[2 * i], &h, 2); }
  }
  return b;
}

int pow2_exponent_for(float amax, float qmax) {  // smallest e with amax / 2^e <= qmax
  if (amax < 1e-30f) return -126;
  return static_cast<int>(std::ceil(std::log2(amax / qmax)));
}

// FP8 e4m3 weight with one UE8M0 scale per BxB tile.
void encode_fp8(const std::string& base, int64_t rows, int64_t cols, int B, const std::vector<float>& v,
                std::vector<TensorBlob>& out) {
  const int64_t sr = (rows + B - 1) / B, sc = (cols + B - 1) / B;
  TensorBlob w{base + ".weight", DType::kF8_E4M3, {rows, cols}, std::vector<uint8_t>(rows * cols)};
  TensorBlob s{base + ".scale", DType::kF8_E8M0, {sr, sc}, std::vector<uint8_t>(sr * sc)};
  for (int64_t br = 0; br < sr; ++br)
    for (int64_t bc = 0; bc < sc; ++bc) {
      float amax = 0.0f;
      for (int64_t r = br * B; r < std::min(rows, (br + 1) * B); ++r)
        for (int64_t c = bc * B; c < std::min(cols, (bc + 1) * B); ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
      const int e = pow2_exponent_for(amax, 448.0f);
      s.bytes[br * sc + bc] = static_cast<uint8_t>(e + 127);
      const float inv = std::ldexp(1.0f, -e);
      for (int64_t r = br * B; r < std::min(rows, (br + 1) * B); ++r)
        for (int64_t c = bc * B; c < std::min(cols, (bc + 1) * B); ++c)
          w.bytes[r * cols + c] = f32_to_fp8_e4m3(v[r * cols + c] * inv);
    }
  out.push_back(std::move(w));
  out.push_back(std::move(s));
}

// MXFP4: e2m1 codes packed two per byte along K (element 2j low nibble), one UE8M0 scale per 32.
void encode_fp4(const std::string& base, int64_t rows, int64_t cols, const std::vector<float>& v,
                std::vector<TensorBlob>& out) {
  TensorBlob w{base + ".weight", DType::kI8, {rows, cols / 2}, std::vector<uint8_t>(rows * cols / 2)};
  TensorBlob s{base + ".scale", DType::kF8_E8M0, {rows, cols / 32}, std::vector<uint8_t>(rows * cols / 32)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 32; ++g) {
      float amax = 0.0f;
      for (int64_t c = g * 32; c < (g + 1) * 32; ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
      const int e = pow2_exponent_for(amax, 6.0f);
      s.bytes[r * (cols / 32) + g] = static_cast<uint8_t>(e + 127);
      const float inv = std::ldexp(1.0f, -e);
      for (int64_t c = g * 32; c < (g + 1) * 32; c += 2) {
        const uint8_t lo = f32_to_fp4_e2m1(v[r * cols + c] * inv), hi = f32_to_fp4_e2m1(v[r * cols + c + 1] * inv);
        w.bytes[(r * cols + c) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  out.push_back(std::move(w));
  out.push_back(std::move(s));
}

}  // namespace

void write_random_checkpoint(const std::string& config_json, const std::string& dir,
                             const RandomCheckpointOptions& opt) {
  fs::create_directories(dir);
  std::string text = config_json;
  if (opt.layers_limit >= 0) {  // keep layers [0, N), drop MTP: a full-width slice of a big model
    nlohmann::json j = nlohmann::json::parse(config_json);
    const int n = opt.layers_limit;
    j["num_hidden_layers"] = n;
    j["num_nextn_predict_layers"] = 0;
    if (j.contains("compress_ratios")) {
      auto r = j["compress_ratios"].get<std::vector<int>>();
      r.resize(std::min<size_t>(r.size(), static_cast<size_t>(n)));
      j["compress_ratios"] = r;
    }
    if (j.contains("num_hash_layers")) j["num_hash_layers"] = std::min(n, j["num_hash_layers"].get<int>());
    text = j.dump(2);
  }
  ModelConfig c = parse_config(text, dir + "/config.json");
  {
    std::ofstream f(fs::path(dir) / "config.json");
    f << text;
  }
  std::vector<ExpectedTensor> manifest = expected_tensors(c);
  const int shards = std::max(1, opt.shards);
  std::vector<std::vector<TensorBlob>> shard_blobs(shards);
  nlohmann::json weight_map = nlohmann::json::object();
  auto shard_name = [&](int s) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", s + 1, shards);
    return std::string(buf);
  };
  auto layer_of = [&](const std::string& name) -> int {  // main layer index, or -1
    if (name.rfind("layers.", 0) != 0) return -1;
    return std::stoi(name.substr(7));
  };

  // Every tensor has its own generator (seeded by its name), so tensors are made in parallel and the
  // bytes do not depend on the thread count.
  std::vector<std::vector<TensorBlob>> made(manifest.size());
  std::vector<int> shard_of(manifest.size(), -1);
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < manifest.size(); ++i) {
    const ExpectedTensor& e = manifest[i];
    const int layer = layer_of(e.name);
    if (ends_with(e.name, ".scale") && e.shape.size() == 2) continue;  // written with its weight
    // Spread layers over shards; globals go to the first, MTP to the last (as in the official files).
    shard_of[i] = layer >= 0 ? layer * shards / std::max(1, c.num_hidden_layers)
                             : (e.name.rfind("mtp.", 0) == 0 ? shards - 1 : 0);
    std::vector<TensorBlob>& blobs = made[i];
    Rng rng{name_seed(opt.seed, e.name)};
    const std::string base = ends_with(e.name, ".weight") ? e.name.substr(0, e.name.size() - 7) : e.name;
    const bool has_scale = i + 1 < manifest.size() && manifest[i + 1].name == base + ".scale";
    if (e.dtypes[0] == DType::kI64) {  // tid2eid: distinct experts per token
      const int64_t V = e.shape[0], K = e.shape[1];
      TensorBlob b{e.name, DType::kI64, e.shape, std::vector<uint8_t>(V * K * 8)};
      for (int64_t t = 0; t < V; ++t) {
        std::vector<int64_t> chosen;
        while (static_cast<int64_t>(chosen.size()) < K) {
          int64_t x = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(c.n_routed_experts));
          if (std::find(chosen.begin(), chosen.end(), x) == chosen.end()) chosen.push_back(x);
        }
        std::memcpy(&b.bytes[t * K * 8], chosen.data(), K * 8);
      }
      blobs.push_back(std::move(b));
    } else if (has_scale && e.dtypes[0] == DType::kF8_E4M3) {
      encode_fp8(base, e.shape[0], e.shape[1], c.weight_block, values_for(e.name, e.shape, rng), blobs);
    } else if (has_scale) {  // FP4: shape holds packed bytes
      const Shape logical{e.shape[0], e.shape[1] * 2};
      encode_fp4(base, logical[0], logical[1], values_for(e.name, logical, rng), blobs);
    } else {
      blobs.push_back(encode_plain(e.name, e.dtypes[0], e.shape, values_for(e.name, e.shape, rng)));
    }
  }
  for (size_t i = 0; i < manifest.size(); ++i)
    for (TensorBlob& b : made[i]) {
      weight_map[b.name] = shard_name(shard_of[i]);
      shard_blobs[shard_of[i]].push_back(std::move(b));
    }
  for (int s = 0; s < shards; ++s) {
    std::vector<const TensorBlob*> ptrs;
    for (const TensorBlob& b : shard_blobs[s]) ptrs.push_back(&b);
    write_safetensors((fs::path(dir) / shard_name(s)).string(), ptrs);
  }
  nlohmann::json index = {{"metadata", {{"generator", "dsv4 write_random_checkpoint"}}}, {"weight_map", weight_map}};
  std::ofstream f(fs::path(dir) / "model.safetensors.index.json");
  f << index.dump(1);
}

const std::string& default_model_config_json() {
  static const std::string kJson = R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "vocab_size": 129280,
  "hidden_size": 128,
  "num_hidden_layers": 4,
  "num_nextn_predict_layers": 1,
  "num_attention_heads": 4,
  "num_key_value_heads": 1,
  "head_dim": 128,
  "qk_rope_head_dim": 64,
  "q_lora_rank": 64,
  "o_groups": 2,
  "o_lora_rank": 64,
  "n_routed_experts": 8,
  "n_shared_experts": 1,
  "num_experts_per_tok": 2,
  "moe_intermediate_size": 64,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "num_hash_layers": 1,
  "swiglu_limit": 10.0,
  "hidden_act": "silu",
  "index_n_heads": 16,
  "index_head_dim": 128,
  "index_topk": 8,
  "sliding_window": 32,
  "compress_ratios": [0, 4, 128, 4, 0],
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6,
  "rope_theta": 10000,
  "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576,
  "rms_norm_eps": 1e-6,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "expert_dtype": "fp4",
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
}
)";
  return kJson;
}

}  // namespace dsv4
