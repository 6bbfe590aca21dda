// Mixture of experts (spec 2.5): router, routed SwiGLU experts with the clamp, shared expert.
//   s = score_fn(gate · x)                       sqrtsoftplus(l) = sqrt(softplus(l)) by default
//   selection: top-k of (s + bias) (bias affects selection only), or tid2eid[token] on hash layers
//   weights  = s[sel] / (Σ s[sel] + 1e-20) · routed_scaling_factor   (norm_topk_prob)
//   expert   = w2 · ((silu(min(w1·x, L)) ⊙ clamp(w3·x, -L, L)) · weight)   (weight applied before w2, as the
//              DeepSeek reference does)
//   out      = Σ experts + shared expert (weight 1)
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace dsv4::cpu {

// x: [T, D]; token_ids: [T] (used by hash layers); idx, weights: [T, top_k]. Ties in the top-k go to the
// lower expert id.
void moe_route(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, const int32_t* token_ids,
               int32_t* idx, float* weights);

// out: [T, D] = routed experts + shared expert.
void moe_forward(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, const int32_t* idx,
                 const float* weights, float* out);

// One SwiGLU expert over T rows: out[t] += weight[t] applied inside, see above. `limit` 0 = no clamp.
void swiglu_expert(const ExpertWeights& e, const float* x, int64_t T, const float* row_weight, float limit,
                   float* out);

}  // namespace dsv4::cpu
