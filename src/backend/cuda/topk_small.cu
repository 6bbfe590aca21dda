// Exact top-k for rows of k < cols <= kSmallCols (4096) entries: one CTA per row, no cluster, the row in
// registers (16 keys per thread, each thread a contiguous run, so thread order is index order), an MSD radix
// select in 8-bit digits over a 256-bin shared-memory histogram, then one block scan for the output slots.
// The selection rule is topk_common.cuh's (key > T, or key == T among the first `ties` in index order), so the
// output equals cpu::topk_row bit for bit.
//
// Why: in decode the CSA indexer's row has context / 4 entries, 2K-4K at 8K-16K context. The streaming kernel
// serves such a row with one CTA too, but with 11/11/10-bit rounds over 2048-bin histograms and a candidate
// buffer built for rows of any length (9.5-13 us in the engine, run 81, against a launch floor of ~3.5 us).
// The default for such rows since run 125 (topk.cu, use_small).
// The selection logic's CPU model: tools/check/topk_small_model.py.
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/topk_common.cuh"

namespace dsv4::cuda::topk_detail {
namespace {

constexpr int kSmallPer = kSmallCols / kThreads;  // 16 keys per thread
static_assert(kSmallPer * kThreads == kSmallCols, "whole runs per thread");
constexpr int kDigitBits = 8, kDigits = 1 << kDigitBits;
static_assert(kDigits == kThreads, "one histogram bin per thread");
using ScanU32 = cub::BlockScan<uint32_t, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

__global__ void __launch_bounds__(kThreads) topk_small_kernel(const float* __restrict__ scores, int64_t row_stride,
                                                             int cols, const int32_t* __restrict__ lengths, int k,
                                                             OutMap out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ union {
    typename ScanInt::TempStorage i;
    typename ScanU32::TempStorage u;
  } scan;
  __shared__ int hist[kDigits];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need, s_count;
  const int r = blockIdx.x, tid = threadIdx.x;
  const auto [row, n] = cta_row(scores, row_stride, cols, lengths);
  const int32_t shift = out.shift(r);
  const int b = tid * kSmallPer;
  uint32_t key[kSmallPer];
  const int valid = load_run(row, n, b, key);  // key 0: invalid (NaN, -inf, past the length)
  int unused, n_valid;
  ScanInt(scan.i).ExclusiveSum(valid, unused, n_valid);

  // x is selected iff key(x) > T, or key(x) == T and fewer than `ties` equal keys precede it. With at most k
  // valid entries every one is selected (T = 0, ties = 0: key 0 is never selected).
  uint32_t T = 0;
  int ties = 0;
  if (n_valid > k) {
    uint32_t prefix = 0, mask = 0;  // the digits fixed so far
    int need = k;                   // entries still to take among those matching prefix under mask
    for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
      hist[tid] = 0;
      __syncthreads();  // also orders this round's scan after the previous one
#pragma unroll
      for (int e = 0; e < kSmallPer; ++e)
        if (key[e] != 0u && (key[e] & mask) == prefix) atomicAdd(&hist[(key[e] >> shift) & (kDigits - 1)], 1);
      __syncthreads();
      // Thread t holds digit 255 - t, so the exclusive sum counts the entries of higher digits: the digit
      // where it first reaches `need` holds the k-th largest key. Exactly one thread sees that.
      const int digit = kDigits - 1 - tid, h = hist[digit];
      int above, in_all_digits;
      ScanInt(scan.i).ExclusiveSum(h, above, in_all_digits);
      if (above < need && need <= above + h) {
        s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        s_need = need - above;
        s_count = h;
      }
      __syncthreads();
      prefix = s_prefix;
      need = s_need;
      mask |= static_cast<uint32_t>(kDigits - 1) << shift;
      if (s_count == need) {  // every entry of this digit is taken: key >= prefix (prefix 0: every valid key)
        T = prefix > 0u ? prefix - 1u : 0u;
        break;
      }
      if (shift == 0) T = prefix, ties = need;  // the k-th largest key itself, `need` of its copies
    }
  }

  // Output slots: the entries > T before this thread's run plus the first `ties` equal ones, counted together
  // in one scan (both counts <= 4096 fit 16 bits).
  int gt = 0, eq = 0;
#pragma unroll
  for (int e = 0; e < kSmallPer; ++e) {
    gt += key[e] > T;
    eq += key[e] == T && key[e] != 0u;
  }
  uint32_t before, all;
  __syncthreads();  // the scan storage is reused
  ScanU32(scan.u).ExclusiveSum((static_cast<uint32_t>(eq) << 16) | static_cast<uint32_t>(gt), before, all);
  int eq_seen = static_cast<int>(before >> 16);
  int at = static_cast<int>(before & 0xffffu) + min(eq_seen, ties);
  const int total = static_cast<int>(all & 0xffffu) + min(static_cast<int>(all >> 16), ties);
  const OutRow orow = out.row(r, shift);
#pragma unroll
  for (int e = 0; e < kSmallPer; ++e) {
    if (key[e] > T) {
      orow.put(at++, b + e);
    } else if (key[e] == T && key[e] != 0u) {
      if (eq_seen < ties) orow.put(at++, b + e);
      ++eq_seen;
    }
  }
  for (int i = total + tid; i < k; i += kThreads) orow.none(i);
}

}  // namespace

cudaError_t launch_topk_small(const float* scores, int64_t row_stride, int cols, const int32_t* lengths, int rows,
                              int k, OutMap out, cudaStream_t stream) {
  return launch(topk_small_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, scores, row_stride,
                cols, lengths, k, out);
}

}  // namespace dsv4::cuda::topk_detail
