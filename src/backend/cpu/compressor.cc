#include "backend/cpu/compressor.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace dsv4::cpu {

void CompressorState::init(int r, int h) {
  ratio = r;
  head = h;
  overlap = (r == 4);
  filled = 0;
  have_prev = false;
  kv.assign(static_cast<size_t>(ratio) * width(), 0.0f);
  score.assign(kv.size(), 0.0f);
  if (overlap) {
    prev_kv.assign(static_cast<size_t>(ratio) * head, 0.0f);
    prev_score.assign(prev_kv.size(), 0.0f);
  }
}

bool compressor_push(CompressorState& s, int64_t pos, const float* kv_row, const float* gate_row, const float* ape,
                     float* pooled) {
  const int row = static_cast<int>(pos % s.ratio);
  if (row != s.filled) fail("compressor: token at position ", pos, " arrives out of order (block row ", s.filled, ")");
  const int W = s.width();
  std::memcpy(&s.kv[static_cast<size_t>(row) * W], kv_row, W * sizeof(float));
  for (int c = 0; c < W; ++c) s.score[static_cast<size_t>(row) * W + c] = gate_row[c] + ape[row * W + c];
  s.filled = row + 1;
  if (s.filled < s.ratio) return false;

  const int H = s.head, R = s.ratio;
  for (int c = 0; c < H; ++c) {
    // Rows pooled for channel c: (overlap) previous block's Ca channel c, then this block's channel (H + c).
    float mx = -INFINITY;
    const int cur = s.overlap ? H + c : c;
    if (s.overlap && s.have_prev)
      for (int r = 0; r < R; ++r) mx = std::max(mx, s.prev_score[r * H + c]);
    for (int r = 0; r < R; ++r) mx = std::max(mx, s.score[r * W + cur]);
    float den = 0.0f, num = 0.0f;
    if (s.overlap && s.have_prev)
      for (int r = 0; r < R; ++r) {
        const float e = std::exp(s.prev_score[r * H + c] - mx);
        den += e;
        num += e * s.prev_kv[r * H + c];
      }
    for (int r = 0; r < R; ++r) {
      const float e = std::exp(s.score[r * W + cur] - mx);
      den += e;
      num += e * s.kv[r * W + cur];
    }
    pooled[c] = num / den;
  }
  if (s.overlap) {  // this block's Ca half pairs with the next block
    for (int r = 0; r < R; ++r) {
      std::memcpy(&s.prev_kv[r * H], &s.kv[r * W], H * sizeof(float));
      std::memcpy(&s.prev_score[r * H], &s.score[r * W], H * sizeof(float));
    }
    s.have_prev = true;
  }
  s.filled = 0;
  return true;
}

}  // namespace dsv4::cpu
