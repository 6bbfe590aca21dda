// Pieces shared by the mHC kernels (mhc.cu: decode and hc_post; mhc_prefill.cu: the tensor-core path for more
// than kHcFusedPostTokens tokens): the sigmoid, the 16-lane Sinkhorn, the store of one float4 of x with the
// optional RMSNorm and 16-bit copies, and the prefill path's host entry points.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels_compressor_mhc.h"

namespace dsv4::cuda::mhc {

constexpr int kN = 4;                   // hc_mult
constexpr int kMaxMix = (2 + kN) * kN;  // 24: hc_pre's mixes (pre, post, comb); hc_head has kN
constexpr int kMaxKs = 128;             // split-K partials per token, at most

#ifdef __CUDACC__
__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sinkhorn of one 4x4 matrix held by 16 consecutive lanes (lane l holds c[l/4][l%4]); every lane of the warp
// must call it. The steps are cpu::sinkhorn's; only the 4-term sums are pairwise, (a + b) + (c + d) over the
// lanes l, l^1, l^2, l^3 (rows) or l, l^4, l^8, l^12 (columns), instead of sequential, so results differ from the
// CPU in the last bits. 40 dependent divisions instead of 640 serial ones in one thread. A 4-term sum takes
// its three other terms with three independent shuffles (one shuffle latency), not two dependent butterfly
// rounds (two): the same additions in the same order, so the same bits as the butterfly it replaced
// (eighteenth session, tools/check/sinkhorn_sum_order.cc; the chain is ~40 x (shuffle + 3 adds + division), the
// longest path of hc_pre's finish).
__device__ __forceinline__ float sum4_lanes(float v, int m1, int m2) {
  constexpr unsigned kAll = 0xffffffffu;
  const float a = __shfl_xor_sync(kAll, v, m1), b = __shfl_xor_sync(kAll, v, m2),
              c = __shfl_xor_sync(kAll, v, m1 ^ m2);
  return (v + a) + (b + c);
}
__device__ __forceinline__ float sinkhorn_lane(float c, int iters, float eps) {
  constexpr unsigned kAll = 0xffffffffu;
  const float m1 = __shfl_xor_sync(kAll, c, 1), m2 = __shfl_xor_sync(kAll, c, 2), m3 = __shfl_xor_sync(kAll, c, 3);
  const float mx = fmaxf(fmaxf(c, m1), fmaxf(m2, m3));
  const float e = expf(c - mx);
  c = e / sum4_lanes(e, 1, 2) + eps;
  auto col = [&] { c /= (sum4_lanes(c, 4, 8) + eps); };
  auto row = [&] { c /= (sum4_lanes(c, 1, 2) + eps); };
  col();
  for (int it = 0; it < iters - 1; ++it) {
    row();
    col();
  }
  return c;
}

// Output stream k of hc_post at four elements: post_k y + Σ_j comb[j][k] res_j, summed in j order (cpu::hc_post's
// order), with w[j] = comb[j][k]. hc_post_kernel and the decode mix's fused hc_post (mhc.cu) both use it, so
// their h agree bit for bit.
__device__ __forceinline__ float4 post_stream(float p, float4 y, const float (&w)[kN], const float4 (&r)[kN]) {
  float4 s = make_float4(p * y.x, p * y.y, p * y.z, p * y.w);
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    s.x = fmaf(w[j], r[j].x, s.x); s.y = fmaf(w[j], r[j].y, s.y);
    s.z = fmaf(w[j], r[j].z, s.z); s.w = fmaf(w[j], r[j].w, s.w);
  }
  return s;
}

// x's float4 from the four streams' float4s at the same elements: Σ_j p_j v_j in stream order (cpu::hc_pre's).
__device__ __forceinline__ float4 combine_streams(const float (&p)[kN], const float4 (&v)[kN]) {
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    s.x += p[j] * v[j].x; s.y += p[j] * v[j].y; s.z += p[j] * v[j].z; s.w += p[j] * v[j].w;
  }
  return s;
}

// The squares of v's elements summed in double (the RMSNorm's sum, cpu::rmsnorm).
__device__ __forceinline__ double sum_squares(float4 v) {
  return static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
         static_cast<double>(v.w) * v.w;
}

// Elements 4 d4 .. 4 d4 + 3 of token t's x: v, or w v rn with the RMSNorm weight (HcArgs::norm_w; rn is the
// row's 1 / rms), stored to x and to the bf16 / f16 copies when they are set (round to nearest even).
// nw: norm_w's float4 at d4 (read by the caller, e.g. long before the reduction that gives rn).
__device__ __forceinline__ void store_x(const HcArgs& a, int t, int64_t d4, float4 v, float rn, float4 nw) {
  const int64_t D = a.dim;
  if (a.norm_w) v = make_float4(nw.x * (v.x * rn), nw.y * (v.y * rn), nw.z * (v.z * rn), nw.w * (v.w * rn));
  reinterpret_cast<float4*>(a.x + t * D)[d4] = v;
  if (a.xb) {
    __nv_bfloat162* xb = reinterpret_cast<__nv_bfloat162*>(a.xb + t * D + 4 * d4);
    xb[0] = __floats2bfloat162_rn(v.x, v.y);
    xb[1] = __floats2bfloat162_rn(v.z, v.w);
  }
  if (a.xh) {
    __half2* xh = reinterpret_cast<__half2*>(a.xh + t * D + 4 * d4);
    xh[0] = __floats2half2_rn(v.x, v.y);
    xh[1] = __floats2half2_rn(v.z, v.w);
  }
}
__device__ __forceinline__ void store_x(const HcArgs& a, int t, int64_t d4, float4 v, float rn) {
  store_x(a, t, d4, v, rn, a.norm_w ? __ldg(reinterpret_cast<const float4*>(a.norm_w) + d4) : float4{});
}
#endif

// The tensor-core path (mhc_prefill.cu) for n_tokens > kHcFusedPostTokens: validated arguments, M = kMaxMix
// (hc_pre) or kN (hc_head); the previous hc_post (HcArgs::prev_*) must already be applied to h.
void prefill_pre(const HcArgs& a, cudaStream_t stream);
void prefill_head(const HcArgs& a, cudaStream_t stream);
// Workspace bytes of one such launch of n_tokens tokens.
size_t prefill_workspace_bytes(int n_tokens, int64_t dim);

}  // namespace dsv4::cuda::mhc
