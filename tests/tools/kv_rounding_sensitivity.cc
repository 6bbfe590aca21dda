// kv_rounding_sensitivity SEED [STEPS]: replays the GPU engine test's continuous model (tests/cuda_engine/
// test_gpu_model.cc: the same config, checkpoint seed SEED, the same two prompts) on the CPU alone: greedy with
// f32 KV, then for bf16 and fp8 KV two runs teacher-forced with those tokens, one plain and one with every KV value
// nudged by a relative 2^-20 before it is rounded (set_kv_encode_nudge). Prints, per sequence, the largest logits
// row error of the plain run against f32 (d_q, the format's own effect, which ExactModeBf16Fp8KvMatchCpu's bound
// uses) and of the nudged run against the plain one (d_flip: what a few values rounded the other way do to the
// logits, as the GPU's slightly different fp32 values cause). Not a test (no assertion); built with the tests.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_engine/attention_width_model.h"
#include "engine/kv_state.h"
#include "engine/model.h"

using namespace dsv4;

namespace {

// One sequence, teacher-forced with `force` (empty: greedy); the logits of every step.
std::vector<std::vector<float>> run(Model& m, const std::vector<int32_t>& prompt, int steps,
                                    std::vector<int32_t>* tokens, const std::vector<int32_t>* force) {
  auto s = m.new_sequence();
  std::vector<SeqChunk> b(1);
  b[0] = {s.get(), prompt};
  std::vector<std::vector<float>> out;
  for (int k = 0; k < steps; ++k) {
    out.push_back(m.forward(b)[0].logits);
    const auto& l = out.back();
    const int32_t t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    if (tokens) tokens->push_back(t);
    b[0].tokens = {force ? (*force)[k] : t};
  }
  return out;
}

// Largest row error of a against b over the steps, and its step.
std::pair<double, int> worst(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double w = 0;
  int wk = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double e = testing::row_error(a[k], b[k]);
    if (!(e <= w)) w = e, wk = static_cast<int>(k);
  }
  return {w, wk};
}

}  // namespace

int main(int argc, char** argv) {
  testing::ReplayModel r;
  if (!testing::replay_model_from_args(argc, argv, "kv_rounding_sensitivity", false, r)) return 2;
  EngineOptions f32o;
  f32o.kv_dtype = KvDtype::kF32;
  auto f32 = Model::load(r.dir, f32o);
  for (KvDtype kv : {KvDtype::kBF16, KvDtype::kFP8}) {
    EngineOptions o;
    o.kv_dtype = kv;
    auto m = Model::load(r.dir, o);
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      std::vector<int32_t> tokens;
      const auto ref = run(*f32, r.prompts[i], r.steps, &tokens, nullptr);
      const auto plain = run(*m, r.prompts[i], r.steps, nullptr, &tokens);
      set_kv_encode_nudge(0x1p-20f);
      const auto nudged = run(*m, r.prompts[i], r.steps, nullptr, &tokens);
      set_kv_encode_nudge(0.f);
      const auto dq = worst(plain, ref), df = worst(nudged, plain);
      std::printf("%s KV, seq %zu (prompt %zu): d_q = %.3e (step %d), d_flip = %.3e (step %d)\n", kv_dtype_name(kv), i,
                  r.prompts[i].size(), dq.first, dq.second, df.first, df.second);
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(r.dir);
  return 0;
}
