// Exact top-k per row, one CTA per row (reference: cpu::topk_row; design notes in docs/KERNELS.md).
//
// Keys. Every float maps to a 32-bit key whose unsigned order is the float order (sign flip; -0 is folded
// into +0 so that equal floats have equal keys); NaN and -inf map to key 0 and are never selected. A coarse
// 11-bit bin is taken from the same trick applied to the value rounded to fp16: rounding is monotone, so
// bin(a) > bin(b) implies a > b, and bins are finer than the top bits of the fp32 key where scores live.
//
// Passes over the row (all state in shared memory, nothing global, so graph replay is safe):
//   A. 2048-bin histogram of the coarse bins -> pivot bin P holding the k-th largest, `need` = how many of
//      P's members are still to take.
//   B. fast path, when P's population fits the 8192-key buffer: copy P's keys to shared memory and run
//      four 8-bit MSD radix rounds there. Exact fallback otherwise: the same rounds, each rescanning the row
//      from global memory and counting only P's members with the already fixed high bytes. No candidate is
//      ever dropped; the buffer size only decides which path runs.
//   C. emission in index order: a block-wide scan over (greater-than-threshold, equal-to-threshold) counts
//      writes the selected indices ascending, and takes exact ties lowest index first.
// Selection rule after B: x is selected iff bin(x) > P, or bin(x) == P and (key(x) > T, or key(x) == T and
// x is among the first `ties` such elements in index order).
#include <cub/block/block_scan.cuh>
#include <cuda_fp16.h>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // float4 loads in flight per thread in the streaming passes
constexpr int kBins = 2048;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kCap = 8192;  // pivot-bin keys kept in shared memory (32 KB); more -> streaming rounds
constexpr int kEmitVec = 4;                      // float4 per thread per emission step
constexpr int kChunk = 4 * kEmitVec * kThreads;  // elements per emission step (8192)

struct Classified {
  uint32_t key;  // 0 = never selected
  int bin;       // 0 for invalid, [31, 2047] for valid values
};

__device__ __forceinline__ Classified classify(float x) {
  if (x != x || x == -INFINITY) return {0u, 0};
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
  const uint32_t u = __float_as_uint(x);
  const uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  const uint16_t h = __half_as_ushort(__float2half_rn(x));
  const uint16_t o = (h & 0x8000u) ? static_cast<uint16_t>(~h) : static_cast<uint16_t>(h | 0x8000u);
  return {key, o >> 5};
}

// Calls f(index, value) for every element of the row; vectorised when the row is 16-byte aligned.
template <typename F>
__device__ __forceinline__ void for_each(const float* row, int n, F&& f) {
  const int tid = threadIdx.x;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    const int n4 = n >> 2;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    int i = tid;
    for (; i + (kUnroll - 1) * kThreads < n4; i += kUnroll * kThreads) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(r4 + i + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int b = 4 * (i + u * kThreads);
        f(b, v[u].x); f(b + 1, v[u].y); f(b + 2, v[u].z); f(b + 3, v[u].w);
      }
    }
    for (; i < n4; i += kThreads) {
      const float4 v = __ldg(r4 + i);
      f(4 * i, v.x); f(4 * i + 1, v.y); f(4 * i + 2, v.z); f(4 * i + 3, v.w);
    }
    for (int j = 4 * n4 + tid; j < n; j += kThreads) f(j, __ldg(row + j));
  } else {
    for (int j = tid; j < n; j += kThreads) f(j, __ldg(row + j));
  }
}

using ScanInt = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
using ScanU64 = cub::BlockScan<unsigned long long, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

struct Shared {
  int hist[kBins];
  uint32_t cand[kCap];
  union {
    typename ScanInt::TempStorage scan_int;
    typename ScanU64::TempStorage scan_u64;
  } tmp;
  int n_cand;
  int pivot, above;  // result of a pivot search
  unsigned long long carry;
};

// Over `nb` bins held in s.hist (nb <= kBins), finds the bin b (searching from the top) with
// above(b) < need <= above(b) + hist[b]. Requires 1 <= need <= total. Result in s.pivot / s.above.
__device__ void find_pivot(Shared& s, int nb, int need) {
  const int tid = threadIdx.x;
  int c[kBinsPerThread], ex[kBinsPerThread];
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    const int b = nb - 1 - (kBinsPerThread * tid + i);
    c[i] = b >= 0 ? s.hist[b] : 0;
  }
  ScanInt(s.tmp.scan_int).ExclusiveSum(c, ex);
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    const int b = nb - 1 - (kBinsPerThread * tid + i);
    if (b >= 0 && ex[i] < need && ex[i] + c[i] >= need) {
      s.pivot = b;
      s.above = ex[i];
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1)
    topk_rows_kernel(const float* __restrict__ scores, int64_t row_stride, int cols,
                     const int32_t* __restrict__ lengths, int k, int32_t* __restrict__ out) {
  __shared__ Shared s;
  const int tid = threadIdx.x;
  const int r = blockIdx.x;
  const float* row = scores + static_cast<int64_t>(r) * row_stride;
  int32_t* orow = out + static_cast<int64_t>(r) * k;
  int n = cols;
  if (lengths) n = max(0, min(lengths[r], cols));

  // Defaults: select every valid element (used when the row has at most k valid entries).
  int pivot = 0;             // bins above 0 are taken whole
  uint32_t thresh = 0xffffffffu;  // nothing inside the pivot bin beyond that
  int ties = 0;
  int k_eff = n < k ? n : k;

  if (n > k) {
    // ---- A: coarse histogram ----
    for (int i = tid; i < kBins; i += kThreads) s.hist[i] = 0;
    __syncthreads();
    for_each(row, n, [&](int, float x) {
      const Classified c = classify(x);
      if (c.key) atomicAdd(&s.hist[c.bin], 1);
    });
    __syncthreads();
    // Number of valid entries = sum of the histogram (bin 0 is never counted).
    int c2[kBinsPerThread];
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) c2[i] = s.hist[kBinsPerThread * tid + i];
    int n_valid = 0;
    {
      int ex[kBinsPerThread];
      ScanInt(s.tmp.scan_int).ExclusiveSum(c2, ex, n_valid);
    }
    __syncthreads();
    k_eff = n_valid < k ? n_valid : k;
    if (n_valid > k) {
      find_pivot(s, kBins, k);
      pivot = s.pivot;
      int need = k - s.above;
      const int pop = s.hist[pivot];
      __syncthreads();  // s.hist is reused below

      // ---- B: exact threshold inside the pivot bin ----
      const bool fast = pop <= kCap;
      if (fast) {
        if (tid == 0) s.n_cand = 0;
        __syncthreads();
        const int lane = tid & 31;
        for_each(row, n, [&](int, float x) {
          const Classified c = classify(x);
          const bool mine = c.key && c.bin == pivot;
          // Warp-aggregated append: one shared atomic per warp and call.
          const unsigned am = __activemask();
          const unsigned m = __ballot_sync(am, mine);
          if (m) {
            const int leader = __ffs(m) - 1;
            int base = 0;
            if (lane == leader) base = atomicAdd(&s.n_cand, __popc(m));
            base = __shfl_sync(am, base, leader);
            if (mine) s.cand[base + __popc(m & ((1u << lane) - 1))] = c.key;
          }
        });
        __syncthreads();
      }
      // Four MSD rounds of 8 bits over the pivot bin's fp32 keys (shared buffer or streamed row).
      uint32_t prefix = 0;
      thresh = 0;
      bool done = false;
      for (int shift = 24; shift >= 0 && !done; shift -= 8) {
        for (int i = tid; i < 256; i += kThreads) s.hist[i] = 0;
        __syncthreads();
        const int hs = shift + 8;
        auto count = [&](uint32_t key) {
          if (shift == 24 || (key >> hs) == prefix) atomicAdd(&s.hist[(key >> shift) & 0xffu], 1);
        };
        if (fast) {
          for (int i = tid; i < pop; i += kThreads) count(s.cand[i]);
        } else {
          for_each(row, n, [&](int, float x) {
            const Classified c = classify(x);
            if (c.key && c.bin == pivot) count(c.key);
          });
        }
        __syncthreads();
        find_pivot(s, 256, need);
        const int digit = s.pivot;
        const int cnt = s.hist[digit];
        need -= s.above;
        prefix = (prefix << 8) | static_cast<uint32_t>(digit);
        __syncthreads();
        if (cnt == need) {
          // Every pivot-bin key with this prefix is taken: threshold just below the prefix's range.
          const uint32_t lo = prefix << shift;
          thresh = lo == 0 ? 0u : lo - 1u;  // key 0 (invalid) is never selected anyway
          ties = 0;
          done = true;
        } else if (shift == 0) {
          thresh = prefix;  // the exact k-th key
          ties = need;      // how many keys equal to it to take, lowest index first
        }
      }
    }
  }

  // ---- C: ordered emission ----
  if (tid == 0) s.carry = 0;
  __syncthreads();
  // Each step covers kChunk elements, kEmitVec float4 per thread (contiguous, so the block scan runs in
  // index order); the next step's loads are issued before this step's scan so the row streams while the
  // block synchronises (one load in flight per step made this pass latency-bound: 80 us for a 64K row).
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
  auto load_step = [&](int base, float (&v)[4 * kEmitVec]) {
    const int j0 = base + 4 * kEmitVec * tid;
#pragma unroll
    for (int u = 0; u < kEmitVec; ++u) {
      const int j = j0 + 4 * u;
      if (aligned && j + 3 < n) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(row + j));
        v[4 * u] = f.x; v[4 * u + 1] = f.y; v[4 * u + 2] = f.z; v[4 * u + 3] = f.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[4 * u + e] = j + e < n ? __ldg(row + j + e) : NAN;
      }
    }
  };
  float cur[4 * kEmitVec], nxt[4 * kEmitVec];
  if (n > 0) load_step(0, cur);
  for (int base = 0; base < n; base += kChunk) {
    if (base + kChunk < n) load_step(base + kChunk, nxt);
    const int j0 = base + 4 * kEmitVec * tid;
    unsigned gt = 0, eq = 0;  // bit u: element j0 + u
    unsigned long long mine = 0;
#pragma unroll
    for (int u = 0; u < 4 * kEmitVec; ++u) {
      const Classified c = classify(cur[u]);
      const bool g = c.key && (c.bin > pivot || (c.bin == pivot && c.key > thresh));
      const bool e = c.key && c.bin == pivot && c.key == thresh && ties > 0;
      gt |= static_cast<unsigned>(g) << u;
      eq |= static_cast<unsigned>(e) << u;
    }
    mine = (static_cast<unsigned long long>(__popc(gt)) << 32) | static_cast<unsigned long long>(__popc(eq));
    unsigned long long ex, agg;
    ScanU64(s.tmp.scan_u64).ExclusiveSum(mine, ex, agg);
    const unsigned long long carry = s.carry;
    ex += carry;
    int gt_before = static_cast<int>(ex >> 32);
    int eq_before = static_cast<int>(ex & 0xffffffffu);
    if (gt | eq) {
#pragma unroll
      for (int u = 0; u < 4 * kEmitVec; ++u) {
        const bool g = (gt >> u) & 1u, e = (eq >> u) & 1u;
        if (g || (e && eq_before < ties)) orow[gt_before + min(eq_before, ties)] = j0 + u;
        gt_before += g;
        eq_before += e;
      }
    }
    const unsigned long long total = carry + agg;
    __syncthreads();  // everyone has read s.carry and the scan storage
    if (tid == 0) s.carry = total;
    __syncthreads();
    // Stop once all k_eff are written: every remaining element is below the threshold or a surplus tie.
    const int g = static_cast<int>(total >> 32), e = static_cast<int>(total & 0xffffffffu);
    if (g + min(e, ties) >= k_eff) break;
#pragma unroll
    for (int u = 0; u < 4 * kEmitVec; ++u) cur[u] = nxt[u];
  }
  const unsigned long long total = s.carry;  // final after the last step (read after its barrier)
  const int written = static_cast<int>(total >> 32) + min(static_cast<int>(total & 0xffffffffu), ties);
  for (int i = written + tid; i < k; i += kThreads) orow[i] = -1;
}

}  // namespace

void topk_rows(const float* scores, int64_t row_stride, int64_t cols, const int32_t* lengths, int rows, int k,
               int32_t* out, cudaStream_t stream) {
  device_config();
  if (k < 1 || k > 2048) fail("cuda::topk_rows: k = ", k, " is not supported (1 <= k <= 2048)");
  if (cols < 0 || cols > (int64_t{1} << 24))
    fail("cuda::topk_rows: row length ", cols, " is not supported (at most 2^24)");
  if (row_stride < cols) fail("cuda::topk_rows: row stride ", row_stride, " is below the row length ", cols);
  if (rows < 0 || rows > (1 << 30)) fail("cuda::topk_rows: ", rows, " rows is not supported");
  if (rows == 0) return;
  topk_rows_kernel<<<rows, kThreads, 0, stream>>>(scores, row_stride, static_cast<int>(cols), lengths, k, out);
  check(cudaGetLastError(), "topk_rows_kernel launch");
}

}  // namespace dsv4::cuda
