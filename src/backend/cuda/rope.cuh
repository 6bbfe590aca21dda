// cpu::rope's rotation of one pair (a, b) by the angle p * inv_freq, or by its negative (inverse), with every
// multiply and add spelled out as the CPU build computes them (each product rounded, no FMA contraction), so
// that each kernel rotating a pair gets the same bits (glue's heads_norm_rope and rmsnorm_rope_encode,
// sparse_attention's output epilogue) and only cosf / sinf separate them from the CPU.
#pragma once
#include <cstdint>

namespace dsv4::cuda {

__device__ __forceinline__ float2 rope_rotate(float a, float b, int64_t p, float inv_freq, bool inverse) {
  const float angle = __fmul_rn(static_cast<float>(p), inv_freq);
  const float c = cosf(angle);
  const float s = inverse ? -sinf(angle) : sinf(angle);
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

}  // namespace dsv4::cuda
