// moe_rounding_model_check: checks, on the CPU alone, the MoE decode test's rule for h's 16-bit rounding
// (moe_test_util.h, model_moe with gpu_h). A stand-in for the GPU computes h in fp32 with 8 interleaved partial
// sums (as split-K does) and rounds it to bf16 / f16; the tool prints how many h elements model_moe finds
// ambiguous, how many the stand-in rounded the other way (flipped), how many lie outside the allowed values
// (off: must be 0), and the output error against the model with and without the GPU's h. Not a test (no
// assertion); built with the CUDA tests, needs no device. Figures in docs/GEMM_MOE.md.
#include <algorithm>
#include <cstdio>

#include "moe_test_util.h"

using namespace dsv4;
using namespace dsv4::lintest;

int main() {
  for (bool h16 : {false, true}) {
    cudalin::MoeShape s;
    s.hidden = 1024, s.inter = 512, s.n_experts = 16, s.top_k = 6, s.swiglu_limit = 10.f;
    std::mt19937_64 rng(7 + h16);
    // Weights: small multiples of 2^-8, as MXFP4 codes times a scale are.
    std::uniform_int_distribution<int> q(-6, 6);
    auto weights = [&](int r, int c) {
      std::vector<float> w(size_t(r) * c);
      for (auto& v : w) v = q(rng) * 0x1p-8f;
      return w;
    };
    Experts X;
    for (int e = 0; e < s.n_experts; ++e)
      X.W1.push_back(weights(s.inter, s.hidden)), X.W3.push_back(weights(s.inter, s.hidden)),
          X.W2.push_back(weights(s.hidden, s.inter));
    const int T = 64;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(size_t(T) * s.hidden);
    for (auto& v : x) v = h16 ? f16_to_f32(f32_to_f16(nd(rng))) : round_bf16(nd(rng));
    const std::vector<int32_t> idx = make_routes(rng, Route::kRandom, T, s);
    std::vector<float> wts(idx.size());
    std::uniform_real_distribution<float> wd(0.05f, 0.5f);
    for (auto& w : wts) w = wd(rng);
    // The stand-in GPU's h [pair, inter].
    std::vector<uint16_t> gh(idx.size() * s.inter);
    for (size_t p = 0; p < idx.size(); ++p) {
      const float* xt = x.data() + (p / s.top_k) * s.hidden;
      const int e = idx[p];
      for (int i = 0; i < s.inter; ++i) {
        float pg[8] = {}, pu[8] = {};
        for (int d = 0; d < s.hidden; ++d) {
          pg[d % 8] += xt[d] * X.W1[e][size_t(i) * s.hidden + d];
          pu[d % 8] += xt[d] * X.W3[e][size_t(i) * s.hidden + d];
        }
        float g = 0, u = 0;
        for (int k = 0; k < 8; ++k) g += pg[k], u += pu[k];
        g = std::min(g, s.swiglu_limit), u = std::clamp(u, -s.swiglu_limit, s.swiglu_limit);
        const float hv = g / (1.f + std::exp(-g)) * u * wts[p];
        gh[p * s.inter + i] = h16 ? f32_to_f16(hv) : f32_to_bf16(hv);
      }
    }
    HStats hs;
    const std::vector<double> with = model_moe(s, X, x, T, idx, wts, h16, &gh, &hs);
    const std::vector<double> without = model_moe(s, X, x, T, idx, wts, h16);
    // The stand-in's output: w2 applied to its own h in float64, rounded to float as the GPU's fp32 output is.
    std::vector<float> got(with.size());
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < s.hidden; ++d) {
        double y = 0;
        for (int k = 0; k < s.top_k; ++k) {
          const size_t p = size_t(t) * s.top_k + k;
          const float* w2 = X.W2[idx[p]].data() + size_t(d) * s.inter;
          for (int i = 0; i < s.inter; ++i) {
            const uint16_t b = gh[p * s.inter + i];
            y += double(h16 ? f16_to_f32(b) : bf16_to_f32(b)) * w2[i];
          }
        }
        got[size_t(t) * s.hidden + d] = float(y);
      }
    const std::vector<double> ones(with.size(), 1.0);
    std::printf("%s, %d x %d, T = %d: h %lld ambiguous, %lld flipped, %lld off; output error %.3g with the GPU's h, "
                "%.3g without\n", h16 ? "f16" : "bf16", s.hidden, s.inter, T, static_cast<long long>(hs.ambiguous),
                static_cast<long long>(hs.flipped), static_cast<long long>(hs.off),
                compare(got, with, ones).rel_norm, compare(got, without, ones).rel_norm);
  }
  return 0;
}
