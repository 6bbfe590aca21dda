#include "backend/cpu/indexer.h"

#include <cmath>

#include "backend/cpu/linear.h"

namespace dsv4::cpu {

void indexer_scores(const float* q, const float* w, int H, int d, const float* keys, int64_t n,
                    int64_t key_stride, float* scores) {
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t t = 0; t < n; ++t) {
    const float* k = keys + t * key_stride;
    float s = 0.0f;
    for (int h = 0; h < H; ++h) {
      const float qk = dot(q + static_cast<int64_t>(h) * d, k, d);
      s += (qk > 0.0f ? qk : 0.0f) * softmax_scale * w[h];
    }
    scores[t] = s;
  }
}

}  // namespace dsv4::cpu
