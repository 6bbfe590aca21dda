// Lightning indexer score of one query against n compressed keys (spec 2.4):
//   I(t) = Σ_h w[h] · ReLU(q[h] · k[t]) · d^-0.5,   w = weights_proj(x) · H^-0.5 (passed in already scaled)
#pragma once
#include <cstdint>

namespace dsv4::cpu {

// q: [H, d]; w: [H]; keys: [n, d] rows with stride key_stride; scores: [n].
void indexer_scores(const float* q, const float* w, int H, int d, const float* keys, int64_t n,
                    int64_t key_stride, float* scores);

}  // namespace dsv4::cpu
