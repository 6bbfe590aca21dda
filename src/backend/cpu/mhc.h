// Manifold-constrained hyper-connections (mHC), spec section 2.3. One token at a time; all fp32.
//   mixes = (X · fnᵀ) · rsqrt(mean(X²) + eps)        X = the hc_mult streams flattened, [n·D]
//   pre   = sigmoid(mixes[0:n]·scale0 + base) + hc_eps
//   post  = 2·sigmoid(mixes[n:2n]·scale1 + base)
//   comb  = Sinkhorn(mixes[2n:]·scale2 + base)       n×n, row softmax then alternating normalization
//   x     = Σ_j pre_j · h_j                         the sub-layer input
//   h'_k  = post_k · y + Σ_j comb[j,k] · res_j       after the sub-layer (note: comb transposed)
#pragma once
#include <cstdint>

#include "model/weights.h"

namespace dsv4::cpu {

struct HcParams {
  int n = 4;            // hc_mult
  int64_t dim = 0;      // hidden size D
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
};

// Row softmax + hc_eps, then column normalization, then (iters-1) x (row, column) normalizations.
void sinkhorn(float* comb, int n, int iters, float eps);

// h: [n, D] streams of one token -> x [D], post [n], comb [n*n].
void hc_pre(const HcWeights& w, const HcParams& p, const float* h, float* x, float* post, float* comb);
// out [n, D] = post ⊗ y + combᵀ · res; out may not alias res.
void hc_post(const HcParams& p, const float* y, const float* res, const float* post, const float* comb, float* out);
// Final collapse: y = Σ_j (sigmoid(mixes_j·scale + base_j) + hc_eps) · h_j (no Sinkhorn).
void hc_head(const HcWeights& w, const HcParams& p, const float* h, float* y);

}  // namespace dsv4::cpu
