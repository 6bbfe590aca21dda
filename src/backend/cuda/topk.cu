// Exact top-k per row (reference: cpu::topk_row; design notes in docs/KERNELS.md "Exact top-k"): argument
// checks and the choice among four kernels, all exact, all with the selection rule of topk_common.cuh:
//   - rows no longer than k: topk_short_kernel below (every valid entry is selected: a compaction);
//   - rows of at most 4096 entries: topk_small.cu (one CTA per row, the row in registers, 8-bit radix digits);
//   - few rows of 16K-64K entries: topk_resident.cu (a cluster of up to 8 CTAs per row, the row in registers);
//   - everything else: topk_stream.cu (the row read once as a stream, candidates kept in shared memory).
// The choice depends on the shapes only, so eager and graph launches agree. select_all_rows (at the end) gives
// the compaction's result for finite rows without reading them: every index below the length.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/topk_common.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using namespace topk_detail;

static_assert(2048 <= 8 * kThreads, "topk_short_kernel: 8 entries per thread cover k <= 2048");

// Rows no longer than k (host-known: cols <= k): every valid entry is selected, so the selection is a
// compaction in index order - entries below the row's length whose key is not 0 (NaN and -inf never are),
// then -1. One block per row, each thread a contiguous run of <= 8 entries, one block scan for the slots.
// (The cluster kernel takes ~15 us for such a row: at short contexts the indexer's row is this short.)
constexpr int kShortPer = 8;  // k <= 2048 = kShortPer * kThreads
__global__ void __launch_bounds__(kThreads) topk_short_kernel(const float* __restrict__ scores, int64_t row_stride,
                                                             int cols, const int32_t* __restrict__ lengths, int k,
                                                             OutMap out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ typename ScanInt::TempStorage scan;
  const int r = blockIdx.x, tid = threadIdx.x;
  const auto [row, n] = cta_row(scores, row_stride, cols, lengths);
  const int32_t shift = out.shift(r);
  const int b = tid * kShortPer;
  uint32_t key[kShortPer];
  const int cnt = load_run(row, n, b, key);
  int at, total;
  ScanInt(scan).ExclusiveSum(cnt, at, total);
  const OutRow orow = out.row(r, shift);
#pragma unroll
  for (int e = 0; e < kShortPer; ++e)
    if (key[e] != 0u) orow.put(at++, b + e);
  for (int i = total + tid; i < k; i += kThreads) orow.none(i);
}

// select_all_rows: thread i of row blockIdx.y's block blockIdx.x writes entry i (index i below the length, else
// -1); no scores read.
__global__ void __launch_bounds__(kThreads) select_all_kernel(int cols, const int32_t* __restrict__ lengths, int k,
                                                             OutMap out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int r = blockIdx.y, i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= k) return;
  const int n = row_length(lengths, r, cols);
  const OutRow orow = out.row(r, out.shift(r));
  if (i < n) orow.put(i, i);
  else orow.none(i);
}

// Issue #4: parts with less than 128 KB of shared memory per block (SM12x: ~99 KB; vLLM's persistent top-k had to
// force one CTA per row there, failure-modes spec 2.3) run one CTA per row for every shape: rows of up to 4096
// entries on topk_small as everywhere, longer ones on the streaming kernel without a cluster (it reads the whole
// row; the resident kernel needs a cluster above 8K entries and is not used). DSV4_TOPK_ONE_CTA=1 applies the same
// policy anywhere (a test and benchmark knob, read per call).
bool one_cta_per_row() {
  if (device_config().smem_optin < size_t{128} * 1024) return true;
  const char* e = std::getenv("DSV4_TOPK_ONE_CTA");
  return e && std::strcmp(e, "1") == 0;
}

// The register-resident kernel for rows of 32K-64K entries, or of 16K-32K from 16 rows, when all of its CTAs
// fit two per SM (rows x ceil(cols / 8K) <= 2 x SMs); the streaming kernel otherwise. Measured on the H200
// (docs/KERNELS.md, runs 75-80, 131):
// - Alone (bench, back-to-back launches) resident is faster for every few-row shape up to 64K: 1-8 x 64K 14.7-15.5
//   us against 26.5-31.4 streamed, 64 x 32K 26.9 against 49.1, 1 x 16K 10.8 against 13.8, 1-64 x 4K-8K 9.2-11.7
//   against 10.8-14.4 (at 512 rows streamed 21.5-80 us against 25-326).
// - In the engine's decode step (the indexer's top-k: one row per sequence, context bucket / 4 columns, about half
//   of them valid, on the side stream next to the main stream's kernels) runs 77-78 found streamed faster at 4K
//   and 32K columns and resident at 64K, but those rows timed a graph capture inside their loop (bench_gpu_forward's
//   single warm-up step, fixed in run 126), which moved them by 0.2-0.8 ms. 4K columns take topk_small (run 126).
//   The bench's rows had fewer columns than their contexts suggest: its max_model_len (longest row + 24) caps the
//   bucket, so context 65,539 has 16,390 columns, all but 6 valid. There (run 132, two processes each) resident
//   takes 7.268-7.300 ms per step against 7.326-7.340 streamed, but at context 32,771 (16,384 columns, half of
//   them valid) 7.266-7.268 against 7.163-7.175: the resident kernel's cost follows the columns, the streaming
//   kernel's the valid length, which is 1/2 to 1 of a power-of-two bucket in a server. So 16K columns stay
//   streamed; 32K columns (contexts 64K-128K under a larger max_model_len) take the resident kernel: with
//   --max-model-len 262144 (run 134, two processes each) 7.345-7.349 ms against 7.391-7.417 streamed at context
//   65,539 (32,768 columns, half valid) and 7.356-7.358 against 7.422-7.478 at 98,307 (three quarters valid).
// - A one-CTA kernel for 8K-16K columns (topk_small in CTAs of 1024 threads) was slower than both (run 134: 1 x 8K
//   13.0 us, 1 x 16K 14.7) and was removed.
// - From 16 rows of 16K-32K the resident kernel is about 2x faster alone (64 x 16K 12.9 against 28.0 us, 64 x 32K
//   26.9 against 49.1; run 80), so it keeps those shapes (not yet measured in the engine: batch 16-64 decode at
//   64K-128K context).
// DSV4_TOPK_KERNEL=resident / stream forces one (a benchmarking and test knob; resident only where it applies),
// read per call.
bool use_resident(int64_t cols, int rows) {
  if (cols > kMaxCluster * kResidentTile || one_cta_per_row()) return false;
  const char* e = std::getenv("DSV4_TOPK_KERNEL");
  if (e && std::strcmp(e, "resident") == 0) return true;
  if (e && std::strcmp(e, "stream") == 0) return false;
  const int64_t ctas = static_cast<int64_t>(rows) * ((cols + kResidentTile - 1) / kResidentTile);
  const bool long_rows = cols >= 4 * kResidentTile || (rows >= 16 && cols > kResidentTile);
  return long_rows && ctas <= 2 * static_cast<int64_t>(device_config().sm_count);
}

// topk_small.cu's kernel for every row of k < cols <= 4096 entries (the decode step's indexer row at contexts up
// to 16K, and prefill chunks' rows there). Measured on the H200 (run 125, bench_cuda_kernels --topk, k = 512):
// 6.2-6.9 us for 1-64 rows of 2K-4K entries against 7.8-12.4 streamed and 9.2-10.6 resident; in the engine
// (run 126) the batch-1 step at context 8,195 takes 7.063-7.085 ms against 7.138-7.152 streamed, and prefill at
// 8K-16K moved by less than its noise.
// DSV4_TOPK_KERNEL=stream / resident forces those (read per call), =small keeps this choice.
bool use_small(int64_t cols) {
  if (cols > kSmallCols) return false;
  const char* e = std::getenv("DSV4_TOPK_KERNEL");
  return !(e && (std::strcmp(e, "stream") == 0 || std::strcmp(e, "resident") == 0));
}

// The argument checks shared by topk_rows and select_all_rows (`what` names the caller in the message).
void check_rows(const char* what, int64_t cols, int rows, int k, const TopkOutput& placement) {
  if (k < 1 || k > 2048) fail(what, ": k = ", k, " is not supported (1 <= k <= 2048)");
  if (cols < 0 || cols > (int64_t{1} << 24)) fail(what, ": row length ", cols, " is not supported (at most 2^24)");
  if (rows < 0 || rows >= (1 << 28)) fail(what, ": ", rows, " rows is not supported (below 2^28)");
  if (placement.stride != 0 && placement.stride < k)
    fail(what, ": output stride ", placement.stride, " is below k = ", k);
}

OutMap out_map(int32_t* out, int k, const TopkOutput& placement) {
  return {out, placement.stride ? placement.stride : k, placement.add, placement.row_add};
}

}  // namespace

void topk_rows(const float* scores, int64_t row_stride, int64_t cols, const int32_t* lengths, int rows, int k,
               int32_t* out_ptr, cudaStream_t stream, const TopkOutput& placement) {
  device_config();
  check_rows("cuda::topk_rows", cols, rows, k, placement);
  if (row_stride < cols) fail("cuda::topk_rows: row stride ", row_stride, " is below the row length ", cols);
  if (rows == 0) return;
  const OutMap out = out_map(out_ptr, k, placement);
  if (cols <= k) {  // every valid entry is selected (topk_short_kernel)
    check(launch(topk_short_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, scores, row_stride,
                 static_cast<int>(cols), lengths, k, out),
          "topk_short_kernel launch");
    return;
  }
  if (use_small(cols))
    check(launch_topk_small(scores, row_stride, static_cast<int>(cols), lengths, rows, k, out, stream),
          "topk_small_kernel launch");
  else if (use_resident(cols, rows))
    check(launch_topk_resident(scores, row_stride, static_cast<int>(cols), lengths, rows, k, out, stream),
          "topk_resident_kernel launch");
  else
    check(launch_topk_stream(scores, row_stride, static_cast<int>(cols), lengths, rows, k, out, stream,
                             one_cta_per_row()),
          "topk_stream_kernel launch");
}

int topk_ctas_per_row(int64_t cols, int rows, int k) {
  device_config();
  check_rows("cuda::topk_ctas_per_row", cols, rows, k, {});
  if (cols <= k || use_small(cols)) return 1;
  if (use_resident(cols, rows)) return static_cast<int>((cols + kResidentTile - 1) / kResidentTile);
  return stream_ctas_per_row(static_cast<int>(cols), std::max(rows, 1), one_cta_per_row());
}

void select_all_rows(int64_t cols, const int32_t* lengths, int rows, int k, int32_t* out_ptr, cudaStream_t stream,
                     const TopkOutput& placement) {
  device_config();
  check_rows("cuda::select_all_rows", cols, rows, k, placement);
  if (cols > k) fail("cuda::select_all_rows: rows of ", cols, " entries are longer than k = ", k);
  if (rows == 0) return;
  if (rows > 65535) fail("cuda::select_all_rows: ", rows, " rows in one call (at most 65535)");
  const dim3 grid(static_cast<unsigned>((k + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  check(launch(select_all_kernel, grid, dim3(kThreads), 0, stream, static_cast<int>(cols), lengths, k,
               out_map(out_ptr, k, placement)),
        "select_all_kernel launch");
}

}  // namespace dsv4::cuda
