// selection_margins SEED [STEPS]: replays the GPU engine test's selective model (tests/cuda_engine/
// test_gpu_model.cc: the same config, checkpoint seed SEED + 1, the same two prompts) on the CPU alone, greedy
// with f32 KV, and prints for every step of both sequences the smallest selection gap of the CPU reference's
// top-k choices (cpu/selection_margin.h), so an exact-mode GPU failure of a seed can be told from a near tie
// without a GPU. Not a test (no assertion); built with the tests. Figures in docs/GPU_ENGINE.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/selection_margin.h"
#include "cuda_engine/attention_width_model.h"
#include "engine/model.h"

using namespace dsv4;

int main(int argc, char** argv) {
  testing::ReplayModel r;
  if (!testing::replay_model_from_args(argc, argv, "selection_margins", true, r)) return 2;
  const auto& prompts = r.prompts;
  EngineOptions eo;
  eo.kv_dtype = KvDtype::kF32;
  auto m = Model::load(r.dir, eo);
  cpu::selection_margin_track(true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = m->new_sequence();
    std::vector<SeqChunk> b(1);
    b[0].seq = s.get();
    b[0].tokens = prompts[i];
    for (int k = 0; k < r.steps; ++k) {
      cpu::selection_margin_reset();
      const auto out = m->forward(b);
      const auto& l = out[0].logits;
      const int32_t t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      std::printf("seq %zu step %d gap %.3e token %d\n", i, k, cpu::selection_margin(), t);
      b[0].tokens = {t};
    }
  }
  std::filesystem::remove_all(r.dir);
  return 0;
}
