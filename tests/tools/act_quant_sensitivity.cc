// act_quant_sensitivity SEED: how far EngineOptions::act_quant's logits move when its inputs move by a hair.
// Replays the GPU engine test's continuous model (tests/cuda_engine/test_gpu_model.cc: the same config,
// checkpoint seed SEED) on the CPU alone and prints, for the first forward of eight single-token sequences, the
// logits row error (testing::row_error) of act_quant against fp32 activations, and of act_quant with every
// quantized activation nudged by 2^-20 and 2^-24 (cpu::set_act_quant_nudge) against act_quant itself. The nudges
// stand for another implementation's fp32 values (the GPU's differ from the CPU's by ~1e-7 relative): where they
// move the logits as far as quantizing at all does, no comparison of two act_quant implementations' logits can
// be sharper than that (ActQuantMatchesCpuActQuant). Not a test (no assertion); built with the tests.
#include <cstdio>
#include <filesystem>
#include <vector>

#include "backend/cpu/linear.h"
#include "cuda_engine/attention_width_model.h"
#include "engine/model.h"

using namespace dsv4;

int main(int argc, char** argv) {
  testing::ReplayModel r;
  if (!testing::replay_model_from_args(argc, argv, "act_quant_sensitivity", false, r)) return 2;
  EngineOptions f32, aq;
  f32.kv_dtype = aq.kv_dtype = KvDtype::kF32;
  aq.act_quant = true;
  auto mf = Model::load(r.dir, f32), ma = Model::load(r.dir, aq);
  auto first = [](const Model& m, int32_t token) {
    auto s = m.new_sequence();
    std::vector<SeqChunk> b(1);
    b[0] = {s.get(), {token}};
    return m.forward(b)[0].logits;
  };
  for (int32_t token : {3, 17, 64, 100, 250, 333, 401, 500}) {
    const std::vector<float> lf = first(*mf, token), la = first(*ma, token);
    double nudged[2];
    const float rel[2] = {0x1p-20f, 0x1p-24f};
    for (int j = 0; j < 2; ++j) {
      cpu::set_act_quant_nudge(rel[j]);
      nudged[j] = testing::row_error(first(*ma, token), la);
      cpu::set_act_quant_nudge(0.f);
    }
    std::printf("token %3d: act_quant vs fp32 %.3e; nudged 2^-20 %.3e, 2^-24 %.3e\n", token,
                testing::row_error(la, lf), nudged[0], nudged[1]);
  }
  std::filesystem::remove_all(r.dir);
  return 0;
}
