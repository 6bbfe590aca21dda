// What the sparse-attention kernels share (sparse_attention.cu: the mma.sync and fp32 kernels, the combine and
// the epilogue; sparse_attention_wgmma.cu: the sm_90a warpgroup-MMA kernel): the launch parameters, the small device
// helpers, and the per-thread softmax and result store of the two tensor-core kernels. Internal to backend/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"

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

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

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

// ---- the tensor-core kernels' per-thread softmax and result (mma.sync and wgmma share one accumulator layout) ----
// A thread holds two rows of its warp's 16 heads (g and g + 8, g = lane / 4, t = lane % 4) and, of every n8 tile,
// columns 2t and 2t + 1 (the m16n8 / wgmma accumulator layout).

// The running max and this lane's share of the sum of heads h and h + 8 before the first tile. Without a split
// the sink takes part directly (m = sink, l = exp(sink - m) = 1, held by lane t = 0); a split starts empty and
// the combine kernel adds the sink.
__device__ __forceinline__ void init_rows(const Params& p, int h, int t, float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    if (p.splits == 1) {
      const float sk = p.a.sink[h + 8 * ri];
      m[ri] = sk == -INFINITY ? -INFINITY : sk * kLog2e;
      l[ri] = (sk != -INFINITY && t == 0) ? 1.f : 0.f;
    } else {
      m[ri] = -INFINITY;
      l[ri] = 0.f;
    }
  }
}

// The slot range [begin, end) of split `split` of query qi: valid_len (when given) and the split's chunk applied.
__device__ __forceinline__ void slot_range(const Params& p, int qi, int split, int& begin, int& end) {
  const SparseAttentionArgs& a = p.a;
  end = a.valid_len ? min(a.valid_len[qi], a.n_slots) : a.n_slots;
  begin = split * p.chunk;
  end = min(end, begin + p.chunk);
}

// One 32-key tile of the online softmax (base 2): s[j][c] is row g (c < 2) or g + 8, key 8 j + 2 t + (c & 1); keys
// not in `mask` get p = 0. Updates the running max m and this lane's share of l, turns s into p, and returns
// whether the max moved in some row of the warp (then alpha holds the rescale factors of o; the same answer in
// every lane, so the caller's rescale branch is uniform). alpha = exp2(m_old - m_new) only against a finite m_new.
__device__ __forceinline__ bool softmax_tile(float (&s)[4][4], uint32_t mask, int t, float (&m)[2], float (&l)[2],
                                             float (&alpha)[2]) {
  float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if ((mask >> (8 * j + 2 * t + (c & 1))) & 1u) mt[c >> 1] = fmaxf(mt[c >> 1], s[j][c]);
  float mn[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    mt[ri] = fmaxf(mt[ri], __shfl_xor_sync(0xffffffffu, mt[ri], 1));
    mt[ri] = fmaxf(mt[ri], __shfl_xor_sync(0xffffffffu, mt[ri], 2));
    mn[ri] = fmaxf(m[ri], mt[ri]);
    alpha[ri] = mn[ri] == -INFINITY ? 1.f : fast_exp2(m[ri] - mn[ri]);
    m[ri] = mn[ri];
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const bool v = ((mask >> (8 * j + 2 * t + (c & 1))) & 1u) && mn[c >> 1] != -INFINITY;
      s[j][c] = v ? fast_exp2(s[j][c] - mn[c >> 1]) : 0.f;
      rs[c >> 1] += s[j][c];
    }
  l[0] = l[0] * alpha[0] + rs[0];
  l[1] = l[1] * alpha[1] + rs[1];
  return !__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f);  // x 1 is a no-op: skip the rescale
}

// P as bf16 A fragments of keys 16 kk .. 16 kk + 15 (two n8 tiles of the accumulator are one k16 fragment, the
// FA2 register reuse); kSplit: hi + lo.
template <bool kSplit>
__device__ __forceinline__ void p_frags(const float (&s)[4][4], uint32_t (&ph)[2][4],
                                        uint32_t (&pl)[kSplit ? 2 : 1][4]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t dummy;
    to_frag<kSplit>(s[2 * kk][0], s[2 * kk][1], ph[kk][0], kSplit ? pl[kk % (kSplit ? 2 : 1)][0] : dummy);
    to_frag<kSplit>(s[2 * kk][2], s[2 * kk][3], ph[kk][1], kSplit ? pl[kk % (kSplit ? 2 : 1)][1] : dummy);
    to_frag<kSplit>(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[kk][2], kSplit ? pl[kk % (kSplit ? 2 : 1)][2] : dummy);
    to_frag<kSplit>(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[kk][3], kSplit ? pl[kk % (kSplit ? 2 : 1)][3] : dummy);
  }
}

// The thread's result: heads h and h + 8 of query qi, dims d + 8 n and d + 8 n + 1 for n < NT, o(n, c) its
// accumulators (c as in softmax_tile). Without a split, o / l to out; else the partial (acc, and m, l where
// write_ml) of this split for the combine kernel. l is summed over the quad first.
template <int NT, typename Acc>
__device__ __forceinline__ void store_result(const Params& p, int qi, int split, int h, int d, const float (&m)[2],
                                             float (&l)[2], bool write_ml, Acc o) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 1);
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 2);
  }
  if (p.splits == 1) {
    float* o0 = p.a.out + (static_cast<int64_t>(qi) * kH + h) * kD + d;
    float* o1 = o0 + 8 * kD;
    const float i0 = l[0] > 0.f ? 1.f / l[0] : 0.f, i1 = l[1] > 0.f ? 1.f / l[1] : 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      *reinterpret_cast<float2*>(o0 + 8 * n) = make_float2(o(n, 0) * i0, o(n, 1) * i0);
      *reinterpret_cast<float2*>(o1 + 8 * n) = make_float2(o(n, 2) * i1, o(n, 3) * i1);
    }
  } else {
    const int64_t pi = (static_cast<int64_t>(qi) * p.splits + split) * kH + h;
    float* o0 = p.part_acc + pi * kD + d;
    float* o1 = o0 + 8 * kD;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      *reinterpret_cast<float2*>(o0 + 8 * n) = make_float2(o(n, 0), o(n, 1));
      *reinterpret_cast<float2*>(o1 + 8 * n) = make_float2(o(n, 2), o(n, 3));
    }
    if (write_ml) {
      p.part_ml[2 * pi] = m[0];
      p.part_ml[2 * pi + 1] = l[0];
      p.part_ml[2 * (pi + 8)] = m[1];
      p.part_ml[2 * (pi + 8) + 1] = l[1];
    }
  }
}

// The warpgroup-MMA kernel (sparse_attention_wgmma.cu): whether it runs on this device (compute capability 9.0,
// fp8 rows), and its launch (split: AttnPrecision::kSplitBf16, else kBf16). Throws elsewhere.
bool wgmma_supported();
void launch_wgmma(const Params& p, bool split, cudaStream_t stream);

}  // namespace dsv4::cuda::attn
