// Lightning-indexer scores over FP8 keys (reference: cpu::indexer_scores_fp8; formula spec dsv4-model.md 2.4):
//   I(s,t) = sum_h w[s,h] * ReLU(q[s,h] . k[t]) * d^-0.5,   k[t] = e4m3(t) * 2^(e(t) - 127)
// The per-key scale is a positive power of two, so ReLU(q . (e4m3 * s)) = s * ReLU(q . e4m3): the dot runs on
// the raw e4m3 values and the scale is applied once per (key, head) after it.
//
// Tensor cores (mma.sync m16n8k16 bf16 -> fp32, the path shared by sm_90a and sm_12x): M = 16 keys, N = 8 heads,
// K = 16 dims. Numerics: every e4m3 value is exact in bf16 (3 mantissa bits, exponents well inside bf16's
// range), and q is split once per CTA into q_hi + q_lo, both bf16, so q is carried to ~16 significant bits;
// the products are exact and accumulate in fp32, two mma per tile (hi and lo). The result matches the fp32
// reference to ~1e-5 of the row's largest score (the test allows 1e-4).
//
// Work layout: a CTA of 4 warps serves one query; warp w owns heads 16w .. 16w+15 and keeps their q_hi / q_lo
// B fragments in registers for the whole launch (64 registers). The CTA walks tiles of 64 keys (grid-stride);
// each warp handles the tile's 4 groups of 16 keys for its heads, reading the key bytes straight from global
// memory (the other three warps' reads of the same bytes hit L1). The dot is order-free over dims, so the K
// dimension is permuted: lane (g, c) takes the 8 contiguous bytes 32j + 8c .. +7 of its two rows (one 8-byte
// load) as the A elements of k-steps 2j and 2j+1, and the q fragments use the same permutation. Per key, the
// four warps' partial sums over their heads are added in a fixed order, so results do not depend on timing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kH = kIndexerHeads;  // 64
constexpr int kD = kIndexerDim;    // 128
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kHeadsPerWarp = kH / kWarps;  // 16 = two n-tiles of 8
constexpr int kKeys = 64;                   // keys per tile = 4 groups of 16 (the mma's M)
constexpr int kSteps = kD / 16;             // 8 k-steps of 16 dims

__device__ __forceinline__ float e8m0(uint8_t e) {
  if (e == 0xff) return __int_as_float(0x7fc00000);
  if (e == 0) return __int_as_float(0x00400000);
  return __int_as_float(static_cast<int>(e) << 23);
}

// Two e4m3 codes (low byte first) -> bf16x2, exactly (e4m3 -> f16 is exact, f16 -> f32 -> bf16 too).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads, 3) indexer_fp8_kernel(IndexerArgs a) {
  __shared__ float red[kWarps][kKeys];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;  // mma group (row / column) and thread-in-group
  const int s = blockIdx.y;
  const float* q = a.q + static_cast<int64_t>(s) * kH * kD;

  // B fragments (k x n = dims x heads) of this warp's 16 heads, permuted as described above: for k-step
  // ks = 2j + p, register r holds dims 32j + 8c + 4p + 2r + {0, 1} of head 16 warp + 8 nt + g.
  uint32_t qh[2][kSteps][2], ql[2][kSteps][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float* qr = q + (warp * kHeadsPerWarp + nt * 8 + g) * kD;
#pragma unroll
    for (int j = 0; j < kSteps / 2; ++j) {
      const float4 lo4 = *reinterpret_cast<const float4*>(qr + 32 * j + 8 * c);
      const float4 hi4 = *reinterpret_cast<const float4*>(qr + 32 * j + 8 * c + 4);
      split_bf16x2(lo4.x, lo4.y, qh[nt][2 * j][0], ql[nt][2 * j][0]);
      split_bf16x2(lo4.z, lo4.w, qh[nt][2 * j][1], ql[nt][2 * j][1]);
      split_bf16x2(hi4.x, hi4.y, qh[nt][2 * j + 1][0], ql[nt][2 * j + 1][0]);
      split_bf16x2(hi4.z, hi4.w, qh[nt][2 * j + 1][1], ql[nt][2 * j + 1][1]);
    }
  }
  // Head weights of this thread's accumulator columns: heads 16 warp + 8 nt + 2c + {0, 1}.
  float wv[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) wv[nt][e] = a.w[static_cast<int64_t>(s) * kH + warp * kHeadsPerWarp + nt * 8 + 2 * c + e];

  const int64_t n_vis = a.n_visible ? min(static_cast<int64_t>(a.n_visible[s]), a.n_keys) : a.n_keys;
  float* out = a.scores + static_cast<int64_t>(s) * a.score_stride;
  const float softmax_scale = rsqrtf(static_cast<float>(kD));
  const int64_t n_tiles = (a.n_keys + kKeys - 1) / kKeys;

  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t t0 = tile * kKeys;
    if (t0 >= n_vis) {  // nothing visible in this tile (uniform over the CTA)
      const int64_t t = t0 + tid;
      if (tid < kKeys && t < a.n_keys) out[t] = -INFINITY;
      continue;
    }
#pragma unroll 1
    for (int grp = 0; grp < kKeys / 16; ++grp) {
      // Rows g and g + 8 of this 16-key group; invisible rows read as zeros (their output is -inf anyway).
      const int64_t ta = t0 + 16 * grp + g, tb = ta + 8;
      uint2 ka[kSteps / 2], kb[kSteps / 2];
      float sa = 0.f, sb = 0.f;
      const uint8_t* ra = a.keys + ta * a.row_bytes;
      const uint8_t* rb = a.keys + tb * a.row_bytes;
#pragma unroll
      for (int j = 0; j < kSteps / 2; ++j) {
        ka[j] = ta < n_vis ? __ldg(reinterpret_cast<const uint2*>(ra + 32 * j + 8 * c)) : make_uint2(0u, 0u);
        kb[j] = tb < n_vis ? __ldg(reinterpret_cast<const uint2*>(rb + 32 * j + 8 * c)) : make_uint2(0u, 0u);
      }
      if (ta < n_vis) sa = e8m0(__ldg(ra + kD));
      if (tb < n_vis) sb = e8m0(__ldg(rb + kD));
      // A fragments: a0 / a2 = row g, a1 / a3 = row g + 8; low / high 16 bits of each 4-byte half.
      uint32_t af[kSteps][4];
#pragma unroll
      for (int j = 0; j < kSteps / 2; ++j) {
        af[2 * j][0] = e4m3x2_to_bf16x2(ka[j].x);
        af[2 * j][2] = e4m3x2_to_bf16x2(ka[j].x >> 16);
        af[2 * j][1] = e4m3x2_to_bf16x2(kb[j].x);
        af[2 * j][3] = e4m3x2_to_bf16x2(kb[j].x >> 16);
        af[2 * j + 1][0] = e4m3x2_to_bf16x2(ka[j].y);
        af[2 * j + 1][2] = e4m3x2_to_bf16x2(ka[j].y >> 16);
        af[2 * j + 1][1] = e4m3x2_to_bf16x2(kb[j].y);
        af[2 * j + 1][3] = e4m3x2_to_bf16x2(kb[j].y >> 16);
      }
      float pa = 0.f, pb = 0.f;  // this thread's sum over its 4 heads, rows g and g + 8
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          mma_bf16(acc, af[ks], qh[nt][ks][0], qh[nt][ks][1]);
          mma_bf16(acc, af[ks], ql[nt][ks][0], ql[nt][ks][1]);
        }
        pa += fmaxf(acc[0] * sa, 0.f) * wv[nt][0] + fmaxf(acc[1] * sa, 0.f) * wv[nt][1];
        pb += fmaxf(acc[2] * sb, 0.f) * wv[nt][0] + fmaxf(acc[3] * sb, 0.f) * wv[nt][1];
      }
      pa += __shfl_xor_sync(0xffffffffu, pa, 1);
      pa += __shfl_xor_sync(0xffffffffu, pa, 2);
      pb += __shfl_xor_sync(0xffffffffu, pb, 1);
      pb += __shfl_xor_sync(0xffffffffu, pb, 2);
      if (c == 0) {
        red[warp][16 * grp + g] = pa;
        red[warp][16 * grp + g + 8] = pb;
      }
    }
    __syncthreads();
    if (tid < kKeys) {
      const int64_t t = t0 + tid;
      const float total = ((red[0][tid] + red[1][tid]) + red[2][tid]) + red[3][tid];
      if (t < a.n_keys) out[t] = t < n_vis ? total * softmax_scale : -INFINITY;
    }
    __syncthreads();
  }
}

}  // namespace

void indexer_scores_fp8(const IndexerArgs& a, cudaStream_t stream) {
  const DeviceConfig& dev = device_config();
  if (a.n_queries < 0 || a.n_keys < 0) fail("cuda::indexer_scores_fp8: negative shape");
  if (a.n_queries == 0 || a.n_keys == 0) return;
  if (a.n_queries > 65535) fail("cuda::indexer_scores_fp8: ", a.n_queries, " queries in one call (at most 65535)");
  if (a.row_bytes < kD + 1 || a.row_bytes % 8 || reinterpret_cast<uintptr_t>(a.keys) % 8)
    fail("cuda::indexer_scores_fp8: key rows of ", a.row_bytes,
         " B are not supported (need >= 129 B, 8-byte aligned, scale byte at offset 128)");
  if (a.score_stride < a.n_keys) fail("cuda::indexer_scores_fp8: score stride ", a.score_stride, " < ", a.n_keys);
  if (reinterpret_cast<uintptr_t>(a.q) % 16) fail("cuda::indexer_scores_fp8: q must be 16-byte aligned");
  const int64_t n_tiles = (a.n_keys + kKeys - 1) / kKeys;
  // Enough CTAs for ~8 resident per SM in total, each reusing its q fragments over many tiles.
  int64_t per_query = (8LL * dev.sm_count + a.n_queries - 1) / a.n_queries;
  per_query = std::max<int64_t>(1, std::min<int64_t>(per_query, n_tiles));
  indexer_fp8_kernel<<<dim3(static_cast<unsigned>(per_query), a.n_queries), kThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "indexer_fp8_kernel launch");
}

}  // namespace dsv4::cuda
