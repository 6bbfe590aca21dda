// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, with a seeded RNG.
// Order (as vLLM and llama.cpp): temperature, then top-k, top-p and min-p filters, then a draw.
// Non-finite logits are an error, never silently sampled as token 0.
#pragma once
#include <cstdint>
#include <random>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// Throws dsv4::Error naming the parameter when out of range.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Greedy choice: the largest logit, lowest id among ties. Throws on a NaN logit.
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace dsv4
