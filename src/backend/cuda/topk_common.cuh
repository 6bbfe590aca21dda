// Pieces shared by the top-k kernels (topk.cu, topk_resident.cu, topk_stream.cu; docs/KERNELS.md "Exact top-k").
//
// Keys. Every float maps to a 32-bit key whose unsigned order is the float order (sign flip; -0 is folded into
// +0 so that equal floats have equal keys); NaN and -inf map to key 0 and are never selected. Every selection
// is an MSD radix select on keys (the first digit, the top 11 bits = sign, exponent and 2 mantissa bits, is the
// "coarse bin"), and every kernel applies the same rule to its result: x is selected iff key(x) > T, or key(x)
// == T and x is among the first `ties` such elements in index order. Output indices come out ascending and
// exact ties are taken lowest index first, bit-identical to cpu::topk_row.
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace dsv4::cuda::topk_detail {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;                      // the coarse histogram (11 bits)
constexpr int kBinsPerThread = kBins / kThreads; // 8
constexpr int kBinShift = 21;                    // bin = key >> 21
constexpr int kMaxCluster = 8;                   // the portable cluster size (sm_90, sm_12x)
constexpr int kResidentTile = 8192;              // topk_resident: elements per CTA, held in registers
constexpr int kSmallCols = 4096;                 // topk_small: the longest row (16 keys per thread)

__device__ __forceinline__ uint32_t to_key(float x) {
  if (x != x || x == -INFINITY) return 0u;
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

using ScanInt = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

// Where a kernel writes its rows (cuda::TopkOutput resolved by topk_rows: stride >= k). A kernel reads its row's
// shift early (shift(r): one load, off the emission's path) and writes through row(r, shift). The shift is int32:
// the caller guarantees that every shifted index fits int32, and an index is below 2^24.
struct OutRow {
  int32_t* p;
  int32_t shift;
  __device__ __forceinline__ void put(int at, int index) const { p[at] = index + shift; }
  __device__ __forceinline__ void none(int at) const { p[at] = -1; }
};
struct OutMap {
  int32_t* out;
  int64_t stride, add;
  const int64_t* row_add;
  __device__ __forceinline__ int32_t shift(int r) const {
    return static_cast<int32_t>(add + (row_add ? __ldg(row_add + r) : 0));
  }
  __device__ __forceinline__ OutRow row(int r, int32_t sh) const { return {out + static_cast<int64_t>(r) * stride, sh}; }
};

// Row r's valid length: lengths[r] clamped to [0, cols], or cols without lengths.
__device__ __forceinline__ int row_length(const int32_t* lengths, int r, int cols) {
  return lengths ? max(0, min(lengths[r], cols)) : cols;
}

// One CTA per row (topk_short_kernel, topk_small_kernel): row blockIdx.x and its valid length.
struct CtaRow {
  const float* row;
  int n;
};
__device__ __forceinline__ CtaRow cta_row(const float* scores, int64_t row_stride, int cols, const int32_t* lengths) {
  const int r = blockIdx.x;
  return {scores + static_cast<int64_t>(r) * row_stride, row_length(lengths, r, cols)};
}

// One CTA per row: thread `tid`'s contiguous run of Per keys from b = tid * Per (key 0 past the row's length n,
// and for NaN / -inf); returns how many are valid (non-zero).
template <int Per>
__device__ __forceinline__ int load_run(const float* row, int n, int b, uint32_t (&key)[Per]) {
  int valid = 0;
#pragma unroll
  for (int e = 0; e < Per; ++e) {
    key[e] = b + e < n ? to_key(__ldg(row + b + e)) : 0u;
    valid += key[e] != 0u;
  }
  return valid;
}

// This CTA's share of its row: the grid is rows x C CTAs in clusters of C, CTA `rank` of a cluster owns elements
// [cb, ce) of row r (chunks are multiples of 4 so that float4 loads stay aligned inside an aligned row).
struct RowChunk {
  int C, rank, r;
  const float* row;
  int n, cb, ce;  // the row's valid length and this CTA's chunk
  bool aligned;   // row start 16-byte aligned
};
__device__ __forceinline__ RowChunk row_chunk(const cg::cluster_group& cluster, const float* scores,
                                              int64_t row_stride, int cols, const int32_t* lengths) {
  RowChunk c;
  c.C = static_cast<int>(cluster.num_blocks());
  c.rank = static_cast<int>(cluster.block_rank());
  c.r = blockIdx.x / c.C;
  c.row = scores + static_cast<int64_t>(c.r) * row_stride;
  c.n = row_length(lengths, c.r, cols);
  const int chunk = ((c.n + c.C - 1) / c.C + 3) & ~3;
  c.cb = min(c.n, c.rank * chunk);
  c.ce = min(c.n, c.cb + chunk);
  c.aligned = (reinterpret_cast<uintptr_t>(c.row) & 15u) == 0;
  return c;
}

// Launchers (same arguments as cuda::topk_rows, already validated; cols > k). Each picks its cluster size from
// the shapes only, so eager and graph launches agree.
// Register-resident rows: cols <= kMaxCluster * kResidentTile.
cudaError_t launch_topk_resident(const float* scores, int64_t row_stride, int cols, const int32_t* lengths,
                                 int rows, int k, OutMap out, cudaStream_t stream);
// One CTA per row, no cluster: cols <= kSmallCols.
cudaError_t launch_topk_small(const float* scores, int64_t row_stride, int cols, const int32_t* lengths, int rows,
                              int k, OutMap out, cudaStream_t stream);
// Any row length; one_cta: one CTA per row (no cluster), whatever the shape.
cudaError_t launch_topk_stream(const float* scores, int64_t row_stride, int cols, const int32_t* lengths,
                               int rows, int k, OutMap out, cudaStream_t stream, bool one_cta);
// The streaming kernel's CTAs per row (its cluster size) for this shape, as launch_topk_stream picks it.
int stream_ctas_per_row(int cols, int rows, bool one_cta);

}  // namespace dsv4::cuda::topk_detail
