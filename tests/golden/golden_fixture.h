// Loads a golden fixture written by tools/golden/make_golden.py (transformers' DeepseekV4ForCausalLM).
#pragma once
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::testing {

struct GoldenFixture {
  std::string dir;
  nlohmann::json meta;
  std::vector<int32_t> ids;
  int64_t vocab = 0, seq_len = 0, prefill = 0;
  std::vector<float> logits_full;    // [seq_len, vocab]
  std::vector<float> logits_decode;  // [seq_len - prefill, vocab]: positions prefill-1 .. seq_len-2
  // The same with the reference's K=V rows, compressed entries and indexer keys stored in bf16.
  std::vector<float> logits_full_bf16kv, logits_decode_bf16kv;

  const std::vector<float>& full(bool bf16kv) const { return bf16kv ? logits_full_bf16kv : logits_full; }
  const std::vector<float>& decode(bool bf16kv) const { return bf16kv ? logits_decode_bf16kv : logits_decode; }

  static std::vector<float> read_f32(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    return v;
  }

  static GoldenFixture load(const std::string& name) {
    GoldenFixture f;
    f.dir = std::string(DSV4_FIXTURES_DIR) + "/golden/" + name;
    std::ifstream in(f.dir + "/golden.json");
    f.meta = nlohmann::json::parse(in);
    f.ids = f.meta["input_ids"].get<std::vector<int32_t>>();
    f.vocab = f.meta["vocab_size"];
    f.seq_len = f.meta["seq_len"];
    f.prefill = f.meta["prefill"];
    f.logits_full = read_f32(f.dir + "/logits_full.f32");
    f.logits_decode = read_f32(f.dir + "/logits_decode.f32");
    f.logits_full_bf16kv = read_f32(f.dir + "/logits_full_bf16kv.f32");
    f.logits_decode_bf16kv = read_f32(f.dir + "/logits_decode_bf16kv.f32");
    return f;
  }
};

inline int32_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace dsv4::testing
