#include "backend/cpu/linear.h"

#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/numerics.h"

namespace dsv4::cpu {

// Eight fixed partial sums: the summation order depends only on n, never on pointer alignment or on how
// a batch was split, so chunked prefill, decode and batched forwards are bit-identical.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void dequant_row(const LinearWeight& w, int64_t row, float* out) {
  const int64_t K = w.cols;
  switch (w.fmt) {
    case WeightFormat::kBF16: {
      const uint8_t* p = w.w + row * K * 2;
      for (int64_t k = 0; k < K; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = bf16_to_f32(h);
      }
      return;
    }
    case WeightFormat::kFP8Block: {
      // W[o, i] = e4m3(W[o, i]) * scale[o / B, i / B]
      const float* lut = fp8_e4m3_table();
      const uint8_t* p = w.w + row * K;
      const int64_t B = w.block, sc = (K + B - 1) / B;
      const int64_t srow = (row / B) * sc;
      for (int64_t kb = 0; kb < sc; ++kb) {
        float s;
        if (w.scale_is_f32) std::memcpy(&s, w.scale + 4 * (srow + kb), 4);
        else s = e8m0_to_f32(w.scale[srow + kb]);
        const int64_t end = std::min(K, (kb + 1) * B);
        for (int64_t k = kb * B; k < end; ++k) out[k] = lut[p[k]] * s;
      }
      return;
    }
    case WeightFormat::kFP4: {
      // Two e2m1 codes per byte along K, element 2j in the low nibble; one UE8M0 scale per 32 elements.
      static const auto pairs = [] {  // byte -> (low, high) values
        std::array<std::array<float, 2>, 256> t{};
        for (int b = 0; b < 256; ++b) t[b] = {fp4_e2m1_to_f32(b & 0xf), fp4_e2m1_to_f32(b >> 4)};
        return t;
      }();
      const uint8_t* p = w.w + row * (K / 2);
      const uint8_t* s = w.scale + row * (K / 32);
      for (int64_t g = 0; g < K / 32; ++g) {
        const float sc = e8m0_to_f32(s[g]);
        for (int64_t j = 0; j < 16; ++j) {
          const auto& v = pairs[p[g * 16 + j]];
          out[g * 32 + 2 * j] = v[0] * sc;
          out[g * 32 + 2 * j + 1] = v[1] * sc;
        }
      }
      return;
    }
  }
}

namespace {
std::atomic<float> g_act_quant_nudge{0.f};
}
void set_act_quant_nudge(float rel) { g_act_quant_nudge.store(rel, std::memory_order_relaxed); }

void linear_rows(const LinearWeight& w, int64_t row_begin, int64_t rows, const float* x, int64_t T,
                 int64_t x_stride, float* y, int64_t y_stride) {
  if (row_begin < 0 || row_begin + rows > w.rows) fail("linear ", w.name, ": row range out of bounds");
  std::vector<float> xq;  // the activations as LinearWeight::act leaves them
  if (w.act != LinearWeight::ActInput::kF32 && w.fmt != WeightFormat::kBF16) {
    xq.resize(static_cast<size_t>(T * w.cols));
    for (int64_t t = 0; t < T; ++t) {
      float* q = xq.data() + t * w.cols;
      if (w.act == LinearWeight::ActInput::kE4m3) {
        const float nudge = g_act_quant_nudge.load(std::memory_order_relaxed);
        if (nudge != 0.f) {
          for (int64_t k = 0; k < w.cols; ++k) q[k] = x[t * x_stride + k] * (1.f + nudge);
          act_quant_e4m3(q, w.cols, 128, q);  // in place: each block's amax is taken before it is written
        } else {
          act_quant_e4m3(x + t * x_stride, w.cols, 128, q);
        }
      } else
        for (int64_t k = 0; k < w.cols; ++k) q[k] = round_bf16(x[t * x_stride + k]);
    }
    x = xq.data(), x_stride = w.cols;
  }
  constexpr int64_t kRowBlock = 8;  // rows dequantized together, then reused across all T inputs
  const int64_t K = w.cols;
  const int64_t nblocks = (rows + kRowBlock - 1) / kRowBlock;
  // Small products run on the calling thread: a fork/join costs more than they do.
  const bool big = rows * K * T >= (int64_t(1) << 18);
#pragma omp parallel if (big)
  {
    std::vector<float> buf(static_cast<size_t>(kRowBlock * K));
#pragma omp for schedule(dynamic, 4)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t r0 = b * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      for (int64_t r = r0; r < r1; ++r) dequant_row(w, row_begin + r, buf.data() + (r - r0) * K);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * x_stride;
        float* yt = y + t * y_stride;
        for (int64_t r = r0; r < r1; ++r) yt[r] = dot(xt, buf.data() + (r - r0) * K, K);
      }
    }
  }
}

}  // namespace dsv4::cpu
