// What the sparse-attention kernels share (sparse_attention.cu: the mma.sync and fp32 kernels, the combine and
// the epilogue; sparse_attention_wgmma.cu: the sm_90a warpgroup-MMA kernel): the launch parameters, the output
// epilogue, and the small device helpers. Internal to backend/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rope.cuh"

namespace dsv4::cuda::attn {
using namespace ptx;

constexpr int kH = kAttnHeads;     // 64
constexpr int kD = kAttnDim;       // 512
constexpr int kNope = 448;         // fp8 layout: e4m3 dims, then 64 bf16 RoPE dims, then scales
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  SparseAttentionArgs a;
  int splits;
  int chunk;  // slots per split (a multiple of 32, the tensor-core kernels' tile)
  float* part_acc;  // [nq, splits, 64, 512]
  float* part_ml;   // [nq, splits, 64, 2]
};

// The output epilogue (SparseAttentionArgs::rope_pos / out16) on dims 4 * tid .. 4 * tid + 3 of head h of
// query qi, final values v: the RoPE dims hold two whole pairs per thread (the rotated block starts at a
// multiple of 4: rope_n_freq is even), rotated as glue's heads_norm_rope(inverse) does, then written.
__device__ __forceinline__ void write_out(const SparseAttentionArgs& a, int qi, int h, int tid, float4 v) {
  const int r0 = kD - 2 * a.rope_n_freq;
  if (a.rope_pos && 4 * tid >= r0) {
    const int64_t pos = a.rope_pos[qi];
    const int i = (4 * tid - r0) / 2;
    const float2 x = rope_rotate(v.x, v.y, pos, a.rope_inv_freq[i], true);
    const float2 y = rope_rotate(v.z, v.w, pos, a.rope_inv_freq[i + 1], true);
    v = make_float4(x.x, x.y, y.x, y.y);
  }
  const int64_t o = (static_cast<int64_t>(qi) * kH + h) * kD + 4 * tid;
  *reinterpret_cast<float4*>(a.out + o) = v;
  if (a.out16) {
    uint2 b;
    if (a.out16_f16) {
      const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
      b = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
      b = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
    *reinterpret_cast<uint2*>(a.out16 + o) = b;
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 2^x (ex2.approx: relative error ~2^-22; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return bf16x2_bits(__floats2bfloat162_rn(lo, hi)); }
template <bool kSplit>
__device__ __forceinline__ void to_frag(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if (kSplit) split_bf16x2(x0, x1, hi, lo);
  else hi = pack_bf16(x0, x1);
}

// Two e4m3 codes (low byte first) times the block scale s, as bf16x2 (exact: 4 significant bits).
__device__ __forceinline__ uint32_t e4m3x2_bf16(uint32_t pair, float s) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(hr));
  return pack_bf16(f.x * s, f.y * s);
}

// The warpgroup-MMA kernel (sparse_attention_wgmma.cu): whether it runs on this device (compute capability 9.0,
// fp8 rows), and its launch (split: AttnPrecision::kSplitBf16, else kBf16). Throws elsewhere.
bool wgmma_supported();
void launch_wgmma(const Params& p, bool split, cudaStream_t stream);

}  // namespace dsv4::cuda::attn
