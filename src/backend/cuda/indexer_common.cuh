// Device pieces shared by the lightning-indexer kernels (indexer.cu: the streaming and exact_q kernels;
// indexer_wgmma.cu: the FP8 tensor-core kernel): key-row addressing (the wgmma kernel inlines a 32-bit,
// branch-free form of it: a branch inside its MMA pipeline would serialize the MMAs).
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"

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

using ptx::cp_async;  // the wgmma kernel and the streaming kernel copy with it

}  // namespace dsv4::cuda::idx
