#include "backend/cpu/sparse_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/linear.h"

namespace dsv4::cpu {

void sparse_attention(const float* q, int H, int d, const float* const* keys, int64_t n, const float* sink,
                      float scale, float* out) {
  std::vector<float> logit(static_cast<size_t>(n));
  for (int h = 0; h < H; ++h) {
    const float* qh = q + static_cast<int64_t>(h) * d;
    float* oh = out + static_cast<int64_t>(h) * d;
    float m = sink[h];  // the sink takes part in the max, so an empty row is finite by construction
    for (int64_t i = 0; i < n; ++i) {
      if (!keys[i]) continue;
      logit[i] = dot(qh, keys[i], d) * scale;
      m = std::max(m, logit[i]);
    }
    // A -inf sink (padding heads) with no valid key leaves m = -inf: treat as an empty row, not exp(nan).
    float den = sink[h] == -INFINITY ? 0.0f : std::exp(sink[h] - m);
    std::memset(oh, 0, sizeof(float) * d);
    for (int64_t i = 0; i < n; ++i) {
      if (!keys[i]) continue;
      const float p = std::exp(logit[i] - m);
      den += p;
      const float* k = keys[i];
      for (int c = 0; c < d; ++c) oh[c] += p * k[c];
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    for (int c = 0; c < d; ++c) oh[c] *= inv;
  }
}

}  // namespace dsv4::cpu
