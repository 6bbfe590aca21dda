// Scalar formats of the official DeepSeek-V4 checkpoint and their exact decoders.
//   BF16        : top 16 bits of an IEEE float32 (round-to-nearest-even when encoding).
//   F8_E4M3     : e4m3fn (OCP): bias 7, no infinities, 0x7F/0xFF are NaN, max 448.
//   F8_E8M0     : UE8M0 power-of-two scale 2^(e-127); 0xFF is NaN.
//   FP4 e2m1    : sign bit 3, values {0, .5, 1, 1.5, 2, 3, 4, 6}; two per byte, element 2k in the LOW nibble.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dsv4 {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN stays NaN (matches torch's float->bfloat16 cast).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE binary16 (the GPU GEMVs' f16 activations): exact decode, and round-to-nearest-even encode with
// overflow to inf (as CUDA's __float2half_rn); NaN stays NaN.
inline float f16_to_f32(uint16_t h) {
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  const float mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp(static_cast<float>(m), -24)
                                                             : std::ldexp(static_cast<float>(m | 1024u), static_cast<int>(e) - 25);
  return (h & 0x8000u) ? -mag : mag;
}
inline uint16_t f32_to_f16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7E00u;
  if (a >= 65520.0f) return sign | 0x7C00u;  // rounds past the largest finite f16 (65504)
  // Quantum of a's binade (subnormal quantum 2^-24 below 2^-14); rint rounds ties to even.
  int ex;
  std::frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1)
  const int q = ex - 1 < -14 ? -24 : ex - 11;
  const float r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);
  if (r == 0.0f) return sign;
  int er;
  std::frexp(r, &er);
  if (er - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(r, 24));  // subnormal
  const uint32_t mant = static_cast<uint32_t>(std::ldexp(r, 11 - er)) - 1024u;
  return sign | static_cast<uint16_t>(((er - 1 + 15) << 10) | mant);
}

float fp8_e4m3_to_f32(uint8_t b);
// Saturating round-to-nearest-even cast to e4m3fn (as torch's `.to(float8_e4m3fn)` after clamping to 448).
uint8_t f32_to_fp8_e4m3(float f);

inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return NAN;
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

extern const float kFp4E2M1Values[16];
inline float fp4_e2m1_to_f32(uint8_t nibble) { return kFp4E2M1Values[nibble & 0xf]; }
// Nearest e2m1 code (ties to even code), for writing random checkpoints and for QAT simulation.
uint8_t f32_to_fp4_e2m1(float f);

// Lookup table for all 256 e4m3 codes.
const float* fp8_e4m3_table();

// DeepSeek's act_quant scale of one block: the exponent e of 2^e = 2^ceil(log2(amax / 448)), amax = max |x[i]|
// floored at 1e-4 (spec dsv4-model.md 3.3; also the fp8 KV rows' scales). The block's codes are
// f32_to_fp8_e4m3(x[i] / 2^e).
int e4m3_block_exponent(const float* x, int64_t n);
// out = x quantized per token as the reference's act_quant does before an FP8 / FP4 GEMM and dequantized again:
// blocks of `block` consecutive elements (the last may be shorter), each to e4m3 codes times its 2^e.
void act_quant_e4m3(const float* x, int64_t n, int block, float* out);

}  // namespace dsv4
