#include "backend/cpu/indexer_fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/indexer.h"
#include "core/numerics.h"

namespace dsv4::cpu {

void indexer_scores_fp8(const float* q, const float* w, int H, int d, const uint8_t* keys, int64_t n,
                        int64_t row_bytes, int64_t n_visible, float* scores) {
  const int64_t vis = std::clamp<int64_t>(n_visible, 0, n);
  std::vector<float> decoded(static_cast<size_t>(vis) * d);
  const float* lut = fp8_e4m3_table();
  for (int64_t t = 0; t < vis; ++t) {
    const uint8_t* row = keys + t * row_bytes;
    const float s = e8m0_to_f32(row[d]);
    for (int i = 0; i < d; ++i) decoded[static_cast<size_t>(t) * d + i] = lut[row[i]] * s;
  }
  indexer_scores(q, w, H, d, decoded.data(), vis, d, scores);
  for (int64_t t = vis; t < n; ++t) scores[t] = -INFINITY;
}

void indexer_scores_mxfp4(const float* q, const float* w, int H, int d, const uint8_t* keys, int64_t n,
                          int64_t row_bytes, int64_t n_visible, float* scores) {
  const int64_t vis = std::clamp<int64_t>(n_visible, 0, n);
  std::vector<float> decoded(static_cast<size_t>(vis) * d);
  for (int64_t t = 0; t < vis; ++t) {
    const uint8_t* row = keys + t * row_bytes;
    for (int i = 0; i < d; ++i) {
      const uint8_t nibble = (i % 2 == 0) ? (row[i / 2] & 0xf) : (row[i / 2] >> 4);
      decoded[static_cast<size_t>(t) * d + i] = fp4_e2m1_to_f32(nibble) * e8m0_to_f32(row[d / 2 + i / 32]);
    }
  }
  indexer_scores(q, w, H, d, decoded.data(), vis, d, scores);
  for (int64_t t = vis; t < n; ++t) scores[t] = -INFINITY;
}

}  // namespace dsv4::cpu
