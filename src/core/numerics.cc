#include "core/numerics.h"

#include <algorithm>
#include <array>

namespace dsv4 {

const float kFp4E2M1Values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float fp8_e4m3_to_f32(uint8_t b) {
  const int sign = b >> 7;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  else v = std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -v : v;
}

static std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
  return t;
}

const float* fp8_e4m3_table() {
  static const std::array<float, 256> table = make_fp8_table();
  return table.data();
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate
  // Search the 127 non-negative finite codes for the nearest value; ties go to the even code.
  const float* t = fp8_e4m3_table();
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code with value >= a
    int mid = (lo + hi) / 2;
    if (t[mid] < a) lo = mid + 1;
    else hi = mid;
  }
  int best = lo;
  if (lo > 0) {
    const float dlo = a - t[lo - 1], dhi = t[lo] - a;
    if (dlo < dhi || (dlo == dhi && ((lo - 1) & 1) == 0)) best = lo - 1;
  }
  return sign | static_cast<uint8_t>(best);
}

uint8_t f32_to_fp4_e2m1(float f) {
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(a)) return sign | 7;
  int best = 0;
  float bd = INFINITY;
  for (int c = 0; c < 8; ++c) {
    float d = std::fabs(kFp4E2M1Values[c] - a);
    if (d < bd || (d == bd && (c & 1) == 0)) { bd = d; best = c; }
  }
  return sign | static_cast<uint8_t>(best);
}

int e4m3_block_exponent(const float* x, int64_t n) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return static_cast<int>(std::ceil(std::log2(amax / 448.0f)));
}

void act_quant_e4m3(const float* x, int64_t n, int block, float* out) {
  const float* table = fp8_e4m3_table();
  for (int64_t b = 0; b < n; b += block) {
    const int64_t m = std::min<int64_t>(block, n - b);
    const float scale = std::ldexp(1.0f, e4m3_block_exponent(x + b, m));
    for (int64_t i = b; i < b + m; ++i) out[i] = table[f32_to_fp8_e4m3(x[i] / scale)] * scale;
  }
}

}  // namespace dsv4
