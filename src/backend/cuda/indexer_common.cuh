// Device pieces shared by the lightning-indexer kernels (indexer.cu: the streaming and exact_q kernels;
// indexer_wgmma.cu: the FP8 tensor-core kernel): key-row addressing (the wgmma kernel inlines a 32-bit,
// branch-free form of it: a branch inside its MMA pipeline would serialize the MMAs).
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rope.cuh"

namespace dsv4::cuda::idx {

// Row of key t of query s (kernels.h): paged, per-query offset, or shared.
__device__ __forceinline__ const uint8_t* key_row(const IndexerArgs& a, int s, int64_t t) {
  int64_t r;
  if (a.block_table != nullptr) {
    const int64_t b = t / a.block_size;
    r = static_cast<int64_t>(__ldg(a.block_table + static_cast<int64_t>(s) * a.max_blocks + b)) * a.block_size +
        (t - b * a.block_size);
  } else {
    r = (a.key_offset != nullptr ? __ldg(a.key_offset + s) : 0) + t;
  }
  return a.keys + r * a.row_bytes;
}

// IndexerArgs::rope_cs: dims d .. d + 3 (d % 4 == 0) of one head of query s's q, rotated where they fall in the
// RoPE block (dims r0 .. 127, r0 = 128 - 2 n_freq, even) with rope.cuh's rope_apply: the bits of rope_rotate.
// r0 = 128 (no rope_cs) leaves v as it is. rope_q4_at takes cs_d, the factor pair of dims d, d + 1 (row of query
// s + (d - r0) / 2; only read where d >= r0), for callers that address the row once (the streaming kernel).
__device__ __forceinline__ float4 rope_q4_at(const float2* cs_d, float4 v, int d, int r0) {
  if (d >= r0) {
    const float2 lo = rope_apply(v.x, v.y, __ldg(cs_d));
    v.x = lo.x;
    v.y = lo.y;
  }
  if (d + 2 >= r0) {
    const float2 hi = rope_apply(v.z, v.w, __ldg(cs_d + 1));
    v.z = hi.x;
    v.w = hi.y;
  }
  return v;
}
__device__ __forceinline__ float4 rope_q4(const IndexerArgs& a, int s, float4 v, int d, int r0) {
  return rope_q4_at(a.rope_cs + static_cast<int64_t>(s) * a.rope_n_freq + ((d - r0) >> 1), v, d, r0);
}

// The first rotated dim: 128 - 2 rope_n_freq with rope_cs, else 128 (nothing rotated).
__device__ __forceinline__ int rope_r0(const IndexerArgs& a) {
  return a.rope_cs != nullptr ? kIndexerDim - 2 * a.rope_n_freq : kIndexerDim;
}

using ptx::cp_async;  // the wgmma kernel and the streaming kernel copy with it

}  // namespace dsv4::cuda::idx
