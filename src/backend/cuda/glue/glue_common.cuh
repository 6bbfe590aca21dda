// Device helpers shared by the glue kernels: exact scalar decoders (core/numerics.h) and warp sums.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"

namespace dsv4::glue::detail {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
// The 16-bit copy a GEMV reads: bf16, or f16 for the FP8 GEMVs' f16 activations (backend/cuda/ptx.cuh).
using cuda::ptx::act16_bits_rn;
// bf16 bits of f, round to nearest even (as cudalin::cast_f32_to_bf16).
__device__ __forceinline__ uint16_t bf16_bits_rn(float f) { return act16_bits_rn(f, false); }

// UE8M0 2^(e-127); 0xFF is NaN; e = 0 is the float subnormal 2^-127 (backend/cuda/ptx.cuh).
__device__ __forceinline__ float e8m0_to_f32(uint8_t e) { return cuda::ptx::e8m0(e); }

// e4m3fn -> f32, exact (every e4m3 value, subnormals included, is a half value).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  __half_raw r = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(r));
}

__device__ __forceinline__ float e2m1_to_f32(uint8_t nib) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[nib & 7];
  return (nib & 8) ? -v : v;
}

// Element (r, k) of a weight, dequantized exactly as cpu::dequant_row does.
__device__ __forceinline__ float weight_at(const Weight& w, int64_t r, int64_t k) {
  switch (w.fmt) {
    case WFormat::kBF16:
      return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(w.w)[r * w.cols + k]);
    case WFormat::kFP8Block: {
      const int64_t nb = (w.cols + w.block - 1) / w.block;
      const int64_t si = (r / w.block) * nb + k / w.block;
      const float s = w.scale_f32 ? reinterpret_cast<const float*>(w.scale)[si] : e8m0_to_f32(w.scale[si]);
      return e4m3_to_f32(w.w[r * w.cols + k]) * s;
    }
    case WFormat::kFP4: {
      const uint8_t b = w.w[r * (w.cols / 2) + k / 2];
      return e2m1_to_f32((k & 1) ? (b >> 4) : (b & 15)) * e8m0_to_f32(w.scale[r * (w.cols / 32) + k / 32]);
    }
  }
  return 0.0f;
}

// Butterfly sum: every lane ends with the same value, the order is fixed.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of squares over x[0..n) by the whole block (blockDim.x a multiple of 32, <= 1024), in double like
// cpu::rmsnorm, returned to every thread.
__device__ __forceinline__ double block_sum_squares(const float* x, int64_t n) {
  __shared__ double part[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = warp_sum(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  if (lane == 0) part[warp] = s;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < nw; ++i) t += part[i];
  __syncthreads();  // part may be reused by the caller's next reduction
  return t;
}

inline unsigned blocks_for(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace dsv4::glue::detail
