// Shared pieces of the MoE kernel tests (test_moe_decode.cc, test_moe_prefill.cc): random MXFP4 experts on
// host and device (with their CPU dequantization), the float64 model of the GPU numerics, and routings with
// chosen expert loads.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/moe.h"
#include "linear_test_util.h"
#include "model/config.h"

namespace dsv4::lintest {

struct Experts {
  std::vector<HostWeight> w1, w2, w3;
  std::vector<ExpertWeights> views;
  std::vector<std::vector<float>> W1, W2, W3;  // dequantized by the CPU's dequant_row
  std::vector<std::unique_ptr<DevBuf<uint8_t>>> bufs;
  std::unique_ptr<DevBuf<cudalin::DevExpert>> dev;
};

// Device copy of v starting `offset` bytes into its allocation (offset 1: a misaligned pointer).
inline const uint8_t* up(Experts& X, const std::vector<uint8_t>& v, int offset = 0) {
  std::vector<uint8_t> padded(offset, 0);
  padded.insert(padded.end(), v.begin(), v.end());
  X.bufs.push_back(std::make_unique<DevBuf<uint8_t>>(padded));
  return X.bufs.back()->p + offset;
}

// Scale bytes in [e_lo, e_hi]; the default 2^-8 .. 2^-7 (|W| <= 0.05) gives g, u ~ O(1) for unit activations
// (clamp exercised by x * 12). scale_offset 1 puts every scale array at an odd address.
inline Experts make_experts(std::mt19937_64& rng, const cudalin::MoeShape& s, int e_lo = 119, int e_hi = 120,
                            int scale_offset = 0) {
  Experts X;
  for (int e = 0; e < s.n_experts; ++e) {
    X.w1.push_back(random_fp4(rng, s.inter, s.hidden, e_lo, e_hi));
    X.w3.push_back(random_fp4(rng, s.inter, s.hidden, e_lo, e_hi));
    X.w2.push_back(random_fp4(rng, s.hidden, s.inter, e_lo, e_hi));
  }
  std::vector<cudalin::DevExpert> d(s.n_experts);
  for (int e = 0; e < s.n_experts; ++e) {
    bind(X.w1[e]), bind(X.w2[e]), bind(X.w3[e]);
    X.views.push_back({X.w1[e].view, X.w2[e].view, X.w3[e].view});
    X.W1.push_back(dequant(X.w1[e].view)), X.W2.push_back(dequant(X.w2[e].view)), X.W3.push_back(dequant(X.w3[e].view));
    const int so = scale_offset;
    d[e] = {up(X, X.w1[e].w), up(X, X.w1[e].s, so), up(X, X.w3[e].w), up(X, X.w3[e].s, so), up(X, X.w2[e].w),
            up(X, X.w2[e].s, so)};
  }
  X.dev = std::make_unique<DevBuf<cudalin::DevExpert>>(d);
  return X;
}

// float64 model of the GPU numerics (h rounded to bf16 before w2, or to f16 when h16), parallel over tokens.
// The GPU computes h in fp32, so where the exact h lies within the fp32 error of a 16-bit rounding boundary
// either neighbour is right, and one such flip moves a token's output by ~1e-4 of its norm in bf16. Given the
// GPU's h (gpu_h: [T * top_k, inter] 16-bit bits in pair order, gpu_h_by_pair), the model takes the GPU's
// value at exactly those ambiguous elements where it lies among the 16-bit values the error bound allows, so
// flips cost nothing and everything else is compared as before; `hs` counts what it saw. The fp32 error of g
// and u is taken as 2^-19 of sum |x w| (the worst case is K 2^-24 of it; the observed one is far below
// 2^-19), of the SwiGLU products 2^-21 of |h|.
struct HStats {
  int64_t ambiguous = 0;  // h elements within the error bound of a rounding boundary
  int64_t flipped = 0;    // of those, where the GPU rounded to the other neighbour
  int64_t off = 0;        // elements where the GPU's h is neither the model's nor (where ambiguous) an allowed one
};
inline std::vector<double> model_moe(const cudalin::MoeShape& s, const Experts& X, const std::vector<float>& x, int T,
                              const std::vector<int32_t>& idx, const std::vector<float>& wts, bool h16 = false,
                              const std::vector<uint16_t>* gpu_h = nullptr, HStats* hs = nullptr) {
  std::vector<double> out(size_t(T) * s.hidden, 0.0);
  auto to16 = [h16](double v) { return h16 ? f32_to_f16(float(v)) : f32_to_bf16(float(v)); };
  auto from16 = [h16](uint16_t b) { return h16 ? f16_to_f32(b) : bf16_to_f32(b); };
  int64_t n_amb = 0, n_flip = 0, n_off = 0;
#pragma omp parallel for schedule(dynamic) reduction(+ : n_amb, n_flip, n_off)
  for (int t = 0; t < T; ++t) {
    std::vector<float> h(s.inter);
    const float* xt = x.data() + size_t(t) * s.hidden;
    for (int k = 0; k < s.top_k; ++k) {
      const int e = idx[t * s.top_k + k];
      const double wt = wts[t * s.top_k + k];
      const uint16_t* gh = gpu_h ? gpu_h->data() + (size_t(t) * s.top_k + k) * s.inter : nullptr;
      for (int i = 0; i < s.inter; ++i) {
        double g = 0, u = 0, ag = 0, au = 0;
        const float* w1 = X.W1[e].data() + size_t(i) * s.hidden;
        const float* w3 = X.W3[e].data() + size_t(i) * s.hidden;
        for (int d = 0; d < s.hidden; ++d) {
          g += double(xt[d]) * w1[d], u += double(xt[d]) * w3[d];
          ag += std::fabs(double(xt[d]) * w1[d]), au += std::fabs(double(xt[d]) * w3[d]);
        }
        const double L = s.swiglu_limit;
        const bool g_clamped = L > 0 && g > L, u_clamped = L > 0 && std::fabs(u) > L;
        if (L > 0) g = std::min(g, L), u = std::clamp(u, -L, L);
        const double silu = g / (1.0 + std::exp(-g)), hd = silu * u * wt;
        const uint16_t mine = to16(float(hd));
        h[i] = from16(mine);
        if (!gh) continue;
        // |d silu / dg| <= 1.1; a clamped input is exact (the bound L itself).
        const double tol = 0x1p-19 * ((g_clamped ? 0.0 : 1.1 * std::fabs(u * wt) * ag) +
                                      (u_clamped ? 0.0 : std::fabs(silu * wt) * au)) +
                           0x1p-21 * std::fabs(hd);
        const uint16_t lo = to16(hd - tol), hi = to16(hd + tol);
        if (lo != hi) {  // every 16-bit value in [lo, hi] is a right rounding (more than two where tol > ulp)
          ++n_amb;
          const float v = from16(gh[i]);
          if (gh[i] != mine && v >= from16(lo) && v <= from16(hi)) h[i] = v, ++n_flip;
          else if (gh[i] != mine) ++n_off;
        } else if (gh[i] != mine) {
          ++n_off;
        }
      }
      for (int d = 0; d < s.hidden; ++d) {
        double y = 0;
        const float* w2 = X.W2[e].data() + size_t(d) * s.inter;
        for (int i = 0; i < s.inter; ++i) y += double(h[i]) * w2[i];
        out[size_t(t) * s.hidden + d] += y;
      }
    }
  }
  if (hs) hs->ambiguous = n_amb, hs->flipped = n_flip, hs->off = n_off;
  return out;
}

// moe_decode's h (MoeWorkspace::h: one row per valid pair, experts in id order, each expert's pairs in
// increasing pair id: find_slot) reordered to pair order [T * top_k, inter]; rows of invalid pairs stay 0.
inline std::vector<uint16_t> gpu_h_by_pair(const uint16_t* dev_h, const cudalin::MoeShape& s,
                                           const std::vector<int32_t>& idx) {
  const size_t P = idx.size();
  std::vector<int> row(P, -1);
  int next = 0;
  for (int e = 0; e < s.n_experts; ++e)
    for (size_t p = 0; p < P; ++p)
      if (idx[p] == e) row[p] = next++;
  std::vector<uint16_t> dev(size_t(next) * s.inter), h(P * s.inter, 0);
  if (next > 0 && cudaMemcpy(dev.data(), dev_h, dev.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost) != cudaSuccess)
    return {};
  for (size_t p = 0; p < P; ++p)
    if (row[p] >= 0) std::copy_n(dev.begin() + size_t(row[p]) * s.inter, s.inter, h.begin() + p * s.inter);
  return h;
}

// The engine's CPU MoE (cpu::moe_forward, routed experts only) on the same experts and routes, in double.
inline std::vector<double> cpu_moe(const cudalin::MoeShape& s, const Experts& X, const std::vector<float>& x, int T,
                                   const std::vector<int32_t>& idx, const std::vector<float>& wts) {
  ModelConfig c;
  c.hidden_size = s.hidden, c.n_routed_experts = s.n_experts, c.num_experts_per_tok = s.top_k;
  c.moe_intermediate_size = s.inter, c.swiglu_limit = s.swiglu_limit;
  LayerWeights L;
  L.experts = X.views;
  L.has_shared = false;
  std::vector<float> out(size_t(T) * s.hidden);
  cpu::moe_forward(c, L, x.data(), T, idx.data(), wts.data(), out.data());
  return std::vector<double>(out.begin(), out.end());
}

// The small MoE shape both tests use besides V4-Flash width (every tile path, quick float64 model).
inline cudalin::MoeShape small_shape() {
  cudalin::MoeShape s;
  s.hidden = 1024, s.inter = 512, s.n_experts = 16, s.top_k = 6, s.swiglu_limit = 10.f;
  return s;
}

enum class Route { kRandom, kLoads01All, kDuplicate };

inline std::vector<int32_t> make_routes(std::mt19937_64& rng, Route r, int T, const cudalin::MoeShape& s) {
  std::vector<int32_t> idx(size_t(T) * s.top_k);
  std::vector<int32_t> perm(s.n_experts);
  if (s.n_experts - (r == Route::kLoads01All ? 3 : 0) < s.top_k) {
    std::fprintf(stderr, "make_routes: %d experts cannot fill top_k %d distinct slots\n", s.n_experts, s.top_k);
    std::abort();
  }
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    auto first = perm.begin() + (r == Route::kLoads01All ? 3 : 0);
    for (int k = 0; k < s.top_k; ++k) {  // partial Fisher-Yates: top_k distinct experts
      std::uniform_int_distribution<int> pick(0, int(perm.end() - first) - 1 - k);
      std::iter_swap(first + k, first + k + pick(rng));
      idx[t * s.top_k + k] = first[k];
    }
    if (r == Route::kLoads01All) {
      idx[t * s.top_k + 0] = 0;                  // expert 0: every token
      if (t == T / 2) idx[t * s.top_k + 1] = 1;  // expert 1: exactly one token; expert 2: none
    }
    if (r == Route::kDuplicate) idx[t * s.top_k + 0] = idx[t * s.top_k + 1] = 5;  // listed twice per token
  }
  return idx;
}

}  // namespace dsv4::lintest
