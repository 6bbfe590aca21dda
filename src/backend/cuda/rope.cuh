// cpu::rope's rotation of one pair (a, b) by the angle p * inv_freq, or by its negative (inverse), with every
// multiply and add spelled out as the CPU build computes them (each product rounded, no FMA contraction), so
// that each kernel rotating a pair gets the same bits (glue's heads_norm_rope and rmsnorm_rope_encode,
// sparse_attention's output epilogue) and only cosf / sinf separate them from the CPU.
#pragma once
#include <cstdint>

namespace dsv4::cuda {

// (cos, sin) of the angle p * inv_freq, or (cos, -sin) for the inverse rotation: the factors rope_rotate uses,
// for kernels that compute them once per position and rotate many heads' pairs with rope_apply.
__device__ __forceinline__ float2 rope_cos_sin(int64_t p, float inv_freq, bool inverse) {
  const float angle = __fmul_rn(static_cast<float>(p), inv_freq);
  return make_float2(cosf(angle), inverse ? -sinf(angle) : sinf(angle));
}

__device__ __forceinline__ float2 rope_apply(float a, float b, float2 cs) {
  return make_float2(__fsub_rn(__fmul_rn(a, cs.x), __fmul_rn(b, cs.y)), __fadd_rn(__fmul_rn(b, cs.x), __fmul_rn(a, cs.y)));
}

__device__ __forceinline__ float2 rope_rotate(float a, float b, int64_t p, float inv_freq, bool inverse) {
  return rope_apply(a, b, rope_cos_sin(p, inv_freq, inverse));
}

}  // namespace dsv4::cuda
