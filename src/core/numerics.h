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

}  // namespace dsv4
