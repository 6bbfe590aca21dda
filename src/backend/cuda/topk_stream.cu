// Exact top-k, streaming (reference: cpu::topk_row; keys and selection rule in topk_common.cuh). Any row
// length and any number of rows: each row is read from memory exactly once.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/topk_common.cuh"

namespace dsv4::cuda::topk_detail {
namespace {

// A row is served by a thread-block cluster of C <= 8 CTAs (C from the shapes only); CTA c owns the contiguous
// chunk [c*chunk, (c+1)*chunk). The chunk is read as a stream of 2048-element tiles (the next one in flight in
// registers), and only *candidates* are kept: (key, index) pairs in a shared-memory buffer, in index order. An
// element is admitted iff key >= lo. lo starts at 1 (every valid key); whenever the buffer could not take
// another tile, the CTA compacts it to its own top k by (key desc, index asc) -- a radix select over the buffer,
// then an order-preserving in-place compaction -- and raises lo to the k-th key + 1. Everything dropped or refused ranks below k kept entries of the same chunk, so the
// buffer always holds the chunk's top k, and the row's top k is inside the union of the C buffers (an entry
// of the row's top k has fewer than k entries above it anywhere). With random data lo rises fast: a 256K chunk
// is compacted ~2 times at k = 512.
// The row's selection then runs on the buffers only (shared memory, no second pass over the row): a cluster-wide
// MSD radix select over the keys in rounds of 11, 11 and 10 bits (per-CTA 2048-bin histograms summed through
// distributed shared memory), then the ordered emission of the C buffers (rank order = index order).
// The same radix select, CTA-local, serves the compaction; the same emission, into the buffer, compacts.
constexpr int kSVec = 2;                          // float4 per thread per tile
constexpr int kSTile = 4 * kSVec * kThreads;      // 2048 elements per tile
constexpr int kSAhead = 1;                        // tiles loaded ahead of the one being filtered
constexpr int kSRing = kSAhead + 1;
// Tiles prefetched into L2 ahead of the one being filtered: more bytes in flight than the register ring holds, at
// no register cost (twenty-eighth session, runs 168-169: 512 x 256K 204.2 -> 201.9 us at 4 tiles, 201.2 at 2; 8 and 16
// tiles ahead lost, 228 / 253 us: the lines are evicted before use).
constexpr int kSPrefetch = 4;
constexpr int kSCap = 4608;                       // buffered candidates: k (<= 2048) + a tile + headroom
constexpr int kSWave = 4 * kThreads;              // entries per emission wave (4 contiguous per thread)
static_assert(kSCap - kSTile >= 2048, "a compacted buffer (k entries) must leave room for a tile");
static_assert(kSVec == 2, "the admitted-element loop picks between two float4 slots");
static_assert(kSWave <= 0xffff && kSTile / 2 <= 0xffff, "packed 16-bit counts");

struct StreamShared {
  uint32_t key[kSCap];   // candidates in index order
  int32_t idx[kSCap];    // their element indices in the row
  int hist[2][kBins];    // radix rounds alternate between the two (other CTAs read the previous one)
  int wsum[kSRing + 2][kWarps];  // block scans: a row per ring slot, then two alternating (block_exclusive_sum)
  unsigned long long tot;  // this CTA's (gt << 32) | eq at emission (read by the other CTAs)
  int pivot, above, pcnt;
};
constexpr size_t kStreamSmem = sizeof(StreamShared);
static_assert(kStreamSmem <= 99 * 1024, "SM12x allows ~99 KB of shared memory per block");

// Exclusive prefix sum of x over the block in thread order; `total` = the block's sum. One barrier: two
// consecutive scans never use the same wsum row (`buf`), so a scan never overwrites totals another thread may
// still be reading. The streaming loop's own per-tile warp totals use row `ring slot` (consecutive tiles differ);
// compaction and the final selection alternate rows kSRing and kSRing + 1 (next_buf). Compile-time rows keep
// the loop's state in registers.
constexpr int kScanA = kSRing, kScanB = kSRing + 1;
__device__ __forceinline__ int next_buf(int& phase) {
  const int b = phase;
  phase = kScanA + kScanB - phase;
  return b;
}
__device__ __forceinline__ int block_exclusive_sum(StreamShared& s, int buf, int x, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  int* ws = s.wsum[buf];
  if (lane == 31) ws[warp] = incl;
  __syncthreads();
  // Warp totals: a scan over lanes 0..kWarps-1 (fewer instructions than every thread summing all of them).
  int v = lane < kWarps ? ws[lane] : 0;
#pragma unroll
  for (int d = 1; d < kWarps; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += y;
  }
  total = __shfl_sync(0xffffffffu, v, kWarps - 1);
  const int before = __shfl_sync(0xffffffffu, v, (warp + kWarps - 1) % kWarps);  // lanes below warp
  return (warp ? before : 0) + incl - x;
}

// Selection rule for an ordered sequence: keep key > thresh, and the first `ties` entries with key == thresh.
struct Threshold {
  uint32_t thresh;
  int ties;
};

// MSD radix select of the k-th largest key over key[0, n) of every CTA of the cluster (kCluster) or of this CTA
// alone, in rounds of 11, 11 and 10 bits. Returns {0, 0} (keep every entry) when there are at most k entries.
// Callers: every thread, uniform arguments; key[0, n) complete (a barrier after the last write).
template <bool kCluster>
__device__ Threshold radix_select(StreamShared& s, int& phase, int n, int k) {
  cg::cluster_group cluster = cg::this_cluster();
  const int C = kCluster ? static_cast<int>(cluster.num_blocks()) : 1;
  const int tid = threadIdx.x;
  uint32_t prefix = 0;  // the digits chosen so far
  int consumed = 0, need = k;
  for (int r = 0; r < 3; ++r) {
    const int w = r < 2 ? 11 : 10, shift = 32 - consumed - w, nb = 1 << w;
    int* h = s.hist[r & 1];
    for (int i = tid; i < kBins; i += kThreads) h[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      const uint32_t key = s.key[i];
      if (consumed == 0 || (key >> (32 - consumed)) == prefix) atomicAdd(&h[(key >> shift) & (nb - 1)], 1);
    }
    if (kCluster) cluster.sync();
    else __syncthreads();
    // Thread t holds bins nb-1-(8t+i), i < 8: the scan runs from the top bin down.
    int c[kBinsPerThread], mine = 0;
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) c[i] = 0;
    if (kBinsPerThread * (tid + 1) <= nb) {
      for (int q = 0; q < C; ++q) {
        const int* hq = kCluster ? cluster.map_shared_rank(h, q) : h;
        const int4 a = *reinterpret_cast<const int4*>(hq + nb - kBinsPerThread * (tid + 1));
        const int4 b = *reinterpret_cast<const int4*>(hq + nb - kBinsPerThread * (tid + 1) + 4);
        c[0] += b.w; c[1] += b.z; c[2] += b.y; c[3] += b.x;
        c[4] += a.w; c[5] += a.z; c[6] += a.y; c[7] += a.x;
      }
    }
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) mine += c[i];
    int total;
    int run = block_exclusive_sum(s, next_buf(phase), mine, total);
    if (r == 0 && total <= k) return {0u, 0};  // uniform: every entry of every CTA is selected
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) {
      if (run < need && run + c[i] >= need) {
        s.pivot = nb - 1 - (kBinsPerThread * tid + i);
        s.above = run;
        s.pcnt = c[i];
      }
      run += c[i];
    }
    __syncthreads();
    const int digit = s.pivot, pcnt = s.pcnt;
    need -= s.above;
    prefix = (prefix << w) | static_cast<uint32_t>(digit);
    consumed += w;
    if (pcnt == need) {  // the whole bucket is taken: threshold just below its range
      const uint32_t lo = prefix << (32 - consumed);
      return {lo == 0 ? 0u : lo - 1u, 0};
    }
    if (consumed == 32) return {prefix, need};  // the exact k-th key; `need` of its copies, lowest index first
    // s.pivot is rewritten only after the next round's scan barrier, which every thread reaches after reading it.
  }
  return {0u, 0};  // unreachable
}

// Ordered pass over key/idx[0, n) in waves of 4 contiguous entries per thread: calls sink(position, index, key)
// for every selected entry, position = (gt before it) + min(eq before it, ties) counted from (gt0, eq0).
// Returns this CTA's (gt << 32) | eq. Every read of a wave precedes the wave's scan barrier and every write
// follows it, and positions never exceed the entry's own index, so the sink may write key/idx in place.
template <typename Sink>
__device__ unsigned long long emit_ordered(StreamShared& s, int& phase, int n, Threshold t, int gt0, int eq0,
                                           Sink&& sink) {
  const int tid = threadIdx.x;
  int gt = gt0, eq = eq0;
  for (int w0 = 0; w0 < n; w0 += kSWave) {
    uint32_t key[4];
    int32_t id[4];
    int c = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = w0 + 4 * tid + e;
      key[e] = i < n ? s.key[i] : 0u;
      id[e] = i < n ? s.idx[i] : 0;
      c += key[e] > t.thresh ? (1 << 16) : (t.ties > 0 && key[e] == t.thresh ? 1 : 0);
    }
    int total;
    const int ex = block_exclusive_sum(s, next_buf(phase), c, total);
    int g = gt + (ex >> 16), q = eq + (ex & 0xffff);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool isg = key[e] > t.thresh, isq = !isg && t.ties > 0 && key[e] == t.thresh;
      if (isg || (isq && q < t.ties)) sink(g + min(q, t.ties), id[e], key[e]);
      g += isg;
      q += isq;
    }
    gt += total >> 16;
    eq += total & 0xffff;
  }
  return (static_cast<unsigned long long>(gt - gt0) << 32) | static_cast<unsigned>(eq - eq0);
}

// Compacts key/idx[0, n), n > k, in place to its top k by (key desc, index asc); returns the admission bound
// for later elements: the k-th key + 1 (anything below ranks after the k kept entries). Not inlined: it runs
// a few times per chunk, and the streaming loop keeps its registers for the tiles in flight.
__device__ __noinline__ uint32_t compact(StreamShared& s, int n, int k) {
  __syncthreads();  // the last tile's entries are written
  int phase = kScanA;
  const Threshold th = radix_select<false>(s, phase, n, k);
  emit_ordered(s, phase, n, th, 0, 0, [&](int at, int32_t id, uint32_t key) {
    s.key[at] = key;
    s.idx[at] = id;
  });
  return th.thresh + 1u;
}

// The float whose key is `lo` (lo >= 1), for the admission test as one float compare: for every float x,
// to_key(x) >= lo iff x >= admit_bound(lo) (NaN compares false; -0 == +0 as their keys; keys 1..2^23 lie
// between -inf and -FLT_MAX, so every finite x passes and -inf does not).
__device__ __forceinline__ float admit_bound(uint32_t lo) {
  if (lo <= 0x00800000u) return -FLT_MAX;
  return __uint_as_float((lo & 0x80000000u) ? (lo & 0x7fffffffu) : ~lo);
}

// Tile layout as load_tile: float4 slot u of thread t covers elements tb + 4 (u * kThreads + t) + 0..3.
// A whole tile of an aligned row (every tile but the chunk's last) takes the unchecked loads.
__device__ __forceinline__ void load_stream_tile(const float* __restrict__ row, bool aligned, int tb, int ce,
                                                 float4 (&v)[kSVec]) {
  if (aligned && tb + kSTile <= ce) {
#pragma unroll
    for (int u = 0; u < kSVec; ++u)
      v[u] = __ldg(reinterpret_cast<const float4*>(row + tb + 4 * (u * kThreads + threadIdx.x)));
    return;
  }
#pragma unroll
  for (int u = 0; u < kSVec; ++u) {
    const int j = tb + 4 * (u * kThreads + threadIdx.x);
    if (aligned && j + 3 < ce) {
      v[u] = __ldg(reinterpret_cast<const float4*>(row + j));
    } else {
      v[u].x = j < ce ? __ldg(row + j) : -INFINITY;
      v[u].y = j + 1 < ce ? __ldg(row + j + 1) : -INFINITY;
      v[u].z = j + 2 < ce ? __ldg(row + j + 2) : -INFINITY;
      v[u].w = j + 3 < ce ? __ldg(row + j + 3) : -INFINITY;
    }
  }
}

// MINB: the launch bound, CTAs per SM. 4 (64 registers) keeps 512 rows of one CTA each resident in one wave; 3
// (80 registers) runs each CTA's loop faster where the grid fits at 3 per SM (runs 168-169: 64 x 64K 55.3 -> 48.7 us,
// 64 x 256K 87.3 -> 75.6; 512 x 256K at 3 per SM takes two waves, 270 us). launch_topk_stream picks one.
template <int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    topk_stream_kernel(const float* __restrict__ scores, int64_t row_stride, int cols,
                       const int32_t* __restrict__ lengths, int k, OutMap out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  StreamShared& s = *reinterpret_cast<StreamShared*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  const RowChunk rc = row_chunk(cluster, scores, row_stride, cols, lengths);
  const int32_t shift = out.shift(rc.r);  // issued early: off the emission's path
  const int C = rc.C, rank = rc.rank, cb = rc.cb, ce = rc.ce;
  const float* row = rc.row;
  const bool aligned = rc.aligned;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nt = (ce - cb + kSTile - 1) / kSTile;

  // ---- stream: admit key >= lo into the buffer, in index order ----
  uint32_t lo = 1u;  // key 0 (NaN, -inf, padding) is never admitted
  float bound = admit_bound(lo);
  int cnt = 0;       // buffered entries (uniform)
  float4 ring[kSRing][kSVec];
#pragma unroll
  for (int a = 0; a < kSAhead; ++a)
    if (a < nt) load_stream_tile(row, aligned, cb + a * kSTile, ce, ring[a]);
  for (int t0 = 0; t0 < nt; t0 += kSRing) {
#pragma unroll
    for (int slot = 0; slot < kSRing; ++slot) {
      const int t = t0 + slot;
      if (t < nt) {
        if (t + kSAhead < nt)
          load_stream_tile(row, aligned, cb + (t + kSAhead) * kSTile, ce, ring[(slot + kSAhead) % kSRing]);
        const int tb = cb + t * kSTile;
        if (t + kSPrefetch < nt && tid < kSTile / 32)  // one 128-byte line per thread of the first 64
          asm volatile("prefetch.global.L2 [%0];" ::"l"(row + min(tb + kSPrefetch * kSTile + 32 * tid, ce - 1)));
        // Admission is one float compare per element (admit_bound); once lo has risen most threads, warps and
        // often whole tiles admit nothing, so the work is shaped for that: a thread whose maximum is below the
        // bound builds no mask, a warp with nothing admitted scans nothing, and a tile with nothing admitted
        // ends after one barrier. Keys are formed for admitted elements only.
        const float4 f0 = ring[slot][0], f1 = ring[slot][1];
        const float mx =
            fmaxf(fmaxf(fmaxf(f0.x, f0.y), fmaxf(f0.z, f0.w)), fmaxf(fmaxf(f1.x, f1.y), fmaxf(f1.z, f1.w)));
        unsigned m = 0;  // bit 4u + e: element (u, e) of this thread is admitted (NaN never is; fmaxf skips it)
        if (mx >= bound) {
          m = (f0.x >= bound ? 1u : 0u) | (f0.y >= bound ? 2u : 0u) | (f0.z >= bound ? 4u : 0u) |
              (f0.w >= bound ? 8u : 0u) | (f1.x >= bound ? 16u : 0u) | (f1.y >= bound ? 32u : 0u) |
              (f1.z >= bound ? 64u : 0u) | (f1.w >= bound ? 128u : 0u);
        }
        const int c = __popc(m & 15u) | (__popc(m >> 4) << 16);  // admitted per float4 slot, 16 bits each
        const int wt = __reduce_add_sync(0xffffffffu, c);
        int* ws = s.wsum[slot];  // consecutive tiles use different rows (see block_exclusive_sum)
        if (lane == 0) ws[warp] = wt;
        __syncthreads();
        int v = lane < kWarps ? ws[lane] : 0;
        const int total = __reduce_add_sync(0xffffffffu, v);
        if (total != 0) {
#pragma unroll
          for (int d = 1; d < kWarps; d <<= 1) {  // lanes 0..kWarps-1: inclusive scan of the warp totals
            const int y = __shfl_up_sync(0xffffffffu, v, d);
            if (lane >= d) v += y;
          }
          const int below = __shfl_sync(0xffffffffu, v, (warp + kWarps - 1) % kWarps);
          if (wt != 0) {  // warp-uniform
            int incl = c;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
              const int y = __shfl_up_sync(0xffffffffu, incl, d);
              if (lane >= d) incl += y;
            }
            const int ex = (warp ? below : 0) + incl - c;
            // Element (u, t, e) goes after every admitted element of lower slots and of lower threads in slot u.
            int at0 = cnt + (ex & 0xffff), at1 = cnt + (total & 0xffff) + (ex >> 16);
            while (m) {
              const int i = __ffs(m) - 1, u = i >> 2, e = i & 3;
              m &= m - 1;
              const float4 f = u == 0 ? f0 : f1;
              const float x = e == 0 ? f.x : e == 1 ? f.y : e == 2 ? f.z : f.w;
              const int at = u == 0 ? at0++ : at1++;
              s.key[at] = to_key(x);
              s.idx[at] = tb + 4 * (u * kThreads + tid) + e;
            }
          }
          cnt += (total & 0xffff) + (total >> 16);
        }
        if (t + 1 < nt && cnt + kSTile > kSCap) {
          lo = max(lo, compact(s, cnt, k));
          bound = admit_bound(lo);
          cnt = k;
        }
      }
    }
  }
  __syncthreads();

  // ---- select over the cluster's buffers, then emit in index order ----
  int phase = kScanA;
  const Threshold th = radix_select<true>(s, phase, cnt, k);
  // This CTA's selected counts, then the lower ranks' totals give the chunk's output offsets.
  {
    int c = 0;
    for (int i = tid; i < cnt; i += kThreads) {
      const uint32_t kk = s.key[i];
      c += kk > th.thresh ? (1 << 16) : (th.ties > 0 && kk == th.thresh ? 1 : 0);
    }
    int total;
    block_exclusive_sum(s, next_buf(phase), c, total);
    if (tid == 0) s.tot = (static_cast<unsigned long long>(total >> 16) << 32) | static_cast<unsigned>(total & 0xffff);
  }
  cluster.sync();  // every CTA's totals are published
  unsigned long long before = 0, all = 0;
  for (int q = 0; q < C; ++q) {
    const unsigned long long v = *cluster.map_shared_rank(&s.tot, q);
    before += q < rank ? v : 0ull;
    all += v;
  }
  const OutRow orow = out.row(rc.r, shift);
  emit_ordered(s, phase, cnt, th, static_cast<int>(before >> 32), static_cast<int>(before & 0xffffffffu),
               [&](int at, int32_t id, uint32_t) { orow.put(at, id); });
  if (rank == 0) {
    const int written = static_cast<int>(all >> 32) + min(static_cast<int>(all & 0xffffffffu), th.ties);
    for (int i = written + tid; i < k; i += kThreads) orow.none(i);
  }
  cluster.sync();  // no CTA leaves while another may still read its shared memory
}

}  // namespace

// The shared-memory opt-in of one instance and its resident CTAs per SM (4 / 3 on sm_90, 1 on SM12x's ~100 KB), once.
template <int MINB>
cudaError_t stream_kernel_setup(int& per_sm) {
  static int n = 0;
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(topk_stream_kernel<MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kStreamSmem));
    if (e == cudaSuccess)
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, topk_stream_kernel<MINB>, kThreads, kStreamSmem);
    return e == cudaSuccess && n < 1 ? cudaErrorInvalidConfiguration : e;
  }();
  per_sm = n;
  return attr;
}

int stream_ctas_per_row(int cols, int rows, bool one_cta) {
  int per_sm = 0;
  check(stream_kernel_setup<4>(per_sm), "topk_stream_kernel setup");
  if (one_cta) return 1;
  // CTAs per row from the shapes only (never from device data): about two CTAs per SM (at most what is resident)
  // over all rows, at least two tiles per CTA, at most kMaxCluster. (16 CTAs per row, a non-portable cluster on
  // sm_90, was slower: 40 against 26 us for one 64K row, run 62 in docs/PERFORMANCE.md.)
  const int64_t want = (std::min(2, per_sm) * static_cast<int64_t>(device_config().sm_count) + rows - 1) / rows;
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(want, cols / (2 * kSTile)), 1, kMaxCluster));
}

cudaError_t launch_topk_stream(const float* scores, int64_t row_stride, int cols, const int32_t* lengths,
                               int rows, int k, OutMap out, cudaStream_t stream, bool one_cta) {
  int per_sm = 0, per_sm3 = 0;
  cudaError_t attr = stream_kernel_setup<4>(per_sm);
  if (attr == cudaSuccess) attr = stream_kernel_setup<3>(per_sm3);
  if (attr != cudaSuccess) return attr;
  const int64_t sms = device_config().sm_count;
  const int C = stream_ctas_per_row(cols, rows, one_cta);
  // The 80-register instance wherever the whole grid is resident at its occupancy or it loses none (SM12x: one CTA
  // per SM either way, and the 64-register instance spills 4 bytes there), else the 64-register one.
  const bool wide = per_sm3 >= per_sm || static_cast<int64_t>(rows) * C <= per_sm3 * sms;
  return launch_cluster(wide ? topk_stream_kernel<3> : topk_stream_kernel<4>, dim3(static_cast<unsigned>(rows) * C),
                        dim3(kThreads), kStreamSmem, stream, static_cast<unsigned>(C), scores, row_stride, cols,
                        lengths, k, out);
}

}  // namespace dsv4::cuda::topk_detail
