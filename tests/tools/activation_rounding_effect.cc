// activation_rounding_effect SEED [STEPS]: replays the GPU engine test's continuous model (tests/cuda_engine/
// test_gpu_model.cc: the same config, checkpoint seed SEED, the same two prompts) on the CPU alone, greedy with
// f32 KV and fp32 activations, then again teacher-forced with bf16-rounded activations
// (EngineOptions::bf16_activations), and prints the largest logits row error between the two per sequence:
// d_a, the bf16-activation format's own effect that KernelsBf16ActivationsF32KvMatchCpu adds to its bound.
// Not a test (no assertion); built with the tests. Figures in docs/GPU_ENGINE.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_engine/attention_width_model.h"
#include "engine/model.h"

using namespace dsv4;

int main(int argc, char** argv) {
  testing::ReplayModel r;
  if (!testing::replay_model_from_args(argc, argv, "activation_rounding_effect", false, r)) return 2;
  const auto& prompts = r.prompts;
  const int steps = r.steps;
  EngineOptions f32, bf16;
  f32.kv_dtype = bf16.kv_dtype = KvDtype::kF32;
  bf16.bf16_activations = true;
  auto ref = Model::load(r.dir, f32), rounded = Model::load(r.dir, bf16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto sr = ref->new_sequence(), sb = rounded->new_sequence();
    std::vector<SeqChunk> br(1), bb(1);
    br[0] = {sr.get(), prompts[i]};
    bb[0] = {sb.get(), prompts[i]};
    double worst = 0;
    int worst_k = 0;
    for (int k = 0; k < steps; ++k) {
      const auto lr = ref->forward(br)[0].logits, lb = rounded->forward(bb)[0].logits;
      const double e = testing::row_error(lb, lr);
      if (!(e <= worst)) worst = e, worst_k = k;
      const int32_t t = static_cast<int32_t>(std::max_element(lr.begin(), lr.end()) - lr.begin());
      br[0].tokens = bb[0].tokens = {t};  // both follow the fp32 run's greedy tokens
    }
    std::printf("seq %zu (prompt %zu): d_a = %.3e (step %d)\n", i, prompts[i].size(), worst, worst_k);
  }
  std::filesystem::remove_all(r.dir);
  return 0;
}
