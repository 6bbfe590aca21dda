// Lightning-indexer scores over FP8 keys (reference: cpu::indexer_scores_fp8; formula spec dsv4-model.md 2.4):
//   I(s,t) = sum_h w[s,h] * ReLU(q[s,h] . k[t]) * d^-0.5,   k[t] = e4m3(t) * 2^(e(t) - 127)
// The per-key scale is a positive power of two, so ReLU(q . (e4m3 * s)) = s * ReLU(q . e4m3): the dot runs on
// the raw e4m3 values and the scale is applied once per (key, head) after it.
//
// Work layout (CUDA cores, fp32): a CTA of 256 threads keeps one query's q (64 x 128 fp32, 32 KB) and w in
// shared memory and walks key tiles of 64 keys (grid-stride over tiles). Thread t owns key t % 64 and
// heads 16 * (t / 64) .. +15; the raw key bytes sit in shared memory with the cache's own 136-byte row
// stride (8-byte reads by 16 lanes hit distinct banks), q is read as broadcast float4. The four head groups'
// partial sums are added in a fixed order, so results do not depend on timing.
#include <cuda_fp8.h>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kH = kIndexerHeads;  // 64
constexpr int kD = kIndexerDim;    // 128
constexpr int kThreads = 256;
constexpr int kKeys = 64;                       // keys per tile
constexpr int kGroups = kThreads / kKeys;       // 4 head groups
constexpr int kHeadsPerThread = kH / kGroups;   // 16
constexpr int kRow = 136;                       // shared-memory row stride (bytes)

__device__ __forceinline__ float e8m0(uint8_t e) {
  if (e == 0xff) return __int_as_float(0x7fc00000);
  if (e == 0) return __int_as_float(0x00400000);
  return __int_as_float(static_cast<int>(e) << 23);
}

__global__ void __launch_bounds__(kThreads) indexer_fp8_kernel(IndexerArgs a) {
  __shared__ __align__(16) float sq[kH][kD];
  __shared__ float sw[kH];
  __shared__ __align__(16) uint8_t sk[kKeys * kRow];
  __shared__ float red[kGroups - 1][kKeys];
  const int tid = threadIdx.x;
  const int s = blockIdx.y;
  const float* q = a.q + static_cast<int64_t>(s) * kH * kD;
  for (int i = tid; i < kH * kD / 4; i += kThreads)
    reinterpret_cast<float4*>(&sq[0][0])[i] = reinterpret_cast<const float4*>(q)[i];
  if (tid < kH) sw[tid] = a.w[static_cast<int64_t>(s) * kH + tid];
  const int64_t n_vis = a.n_visible ? min(static_cast<int64_t>(a.n_visible[s]), a.n_keys) : a.n_keys;
  float* out = a.scores + static_cast<int64_t>(s) * a.score_stride;
  const float softmax_scale = rsqrtf(static_cast<float>(kD));
  const int j = tid % kKeys, g = tid / kKeys;
  const int64_t n_tiles = (a.n_keys + kKeys - 1) / kKeys;
  __syncthreads();

  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t t0 = tile * kKeys;
    if (t0 >= n_vis) {  // nothing visible in this tile
      const int64_t t = t0 + tid;
      if (tid < kKeys && t < a.n_keys) out[t] = -INFINITY;
      continue;
    }
    // Stage the tile's raw rows (128 e4m3 bytes + the scale byte) with 8-byte loads.
    for (int i = tid; i < kKeys * 17; i += kThreads) {
      const int r = i / 17, c = i % 17;
      const int64_t t = t0 + r;
      uint2 v = make_uint2(0u, 0u);
      if (t < n_vis) v = *reinterpret_cast<const uint2*>(a.keys + t * a.row_bytes + 8 * c);
      *reinterpret_cast<uint2*>(&sk[r * kRow + 8 * c]) = v;
    }
    __syncthreads();
    float acc[kHeadsPerThread];
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) acc[h] = 0.f;
    const uint8_t* krow = &sk[j * kRow];
#pragma unroll 2
    for (int d = 0; d < kD; d += 8) {
      const uint2 raw = *reinterpret_cast<const uint2*>(krow + d);
      float kf[8];
      const uint32_t w4[2] = {raw.x, raw.y};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        __nv_fp8x2_e4m3 lo, hi;
        lo.__x = static_cast<__nv_fp8x2_storage_t>(w4[u] & 0xffffu);
        hi.__x = static_cast<__nv_fp8x2_storage_t>(w4[u] >> 16);
        const float2 x = static_cast<float2>(lo), y = static_cast<float2>(hi);
        kf[4 * u] = x.x; kf[4 * u + 1] = x.y; kf[4 * u + 2] = y.x; kf[4 * u + 3] = y.y;
      }
#pragma unroll
      for (int h = 0; h < kHeadsPerThread; ++h) {
        const float* qh = &sq[g * kHeadsPerThread + h][d];
        const float4 a0 = *reinterpret_cast<const float4*>(qh);
        const float4 a1 = *reinterpret_cast<const float4*>(qh + 4);
        acc[h] += a0.x * kf[0] + a0.y * kf[1] + a0.z * kf[2] + a0.w * kf[3] + a1.x * kf[4] + a1.y * kf[5] +
                  a1.z * kf[6] + a1.w * kf[7];
      }
    }
    const float kscale = e8m0(krow[kD]);
    float part = 0.f;
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) part += fmaxf(acc[h] * kscale, 0.f) * sw[g * kHeadsPerThread + h];
    if (g > 0) red[g - 1][j] = part;
    __syncthreads();
    if (g == 0) {
      const int64_t t = t0 + j;
      const float total = ((part + red[0][j]) + red[1][j]) + red[2][j];
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
  // Enough CTAs to fill the device twice over, each reusing its staged q over many tiles.
  int64_t per_query = (4LL * dev.sm_count + a.n_queries - 1) / a.n_queries;
  per_query = std::max<int64_t>(1, std::min<int64_t>(per_query, n_tiles));
  indexer_fp8_kernel<<<dim3(static_cast<unsigned>(per_query), a.n_queries), kThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "indexer_fp8_kernel launch");
}

}  // namespace dsv4::cuda
