// Exact top-k, register-resident rows (reference: cpu::topk_row; keys and selection rule in topk_common.cuh).
// For a few rows of up to 64K entries (topk_rows picks it), where a row is one short latency chain.
//
// A row is served by a thread-block cluster of C <= 8 CTAs (C from the row length only). CTA c owns the
// contiguous chunk [c*chunk, (c+1)*chunk) of at most 8192 elements (16 floats per thread) and loads it into
// registers once: every pass below runs on registers, so the row is read from memory exactly once. CTAs
// exchange small tables through distributed shared memory; the only synchronisation is the hardware cluster
// barrier, so there is no spin loop, no global workspace and nothing to reset between graph replays.
//
//   A. Each CTA builds a 2048-bin histogram of its chunk (the coarse bins); after a cluster barrier every CTA
//      adds up all C histograms (the same sums in every CTA) -> pivot bin P holding the k-th largest and
//      `need` = how many of P's members are still to take.
//   B. Each CTA appends its members of P to a local buffer. After a barrier, when every local buffer fit and
//      the total fits the gather buffer (the usual case: P holds a few hundred keys), every CTA copies all C
//      buffers into its own shared memory and resolves the exact k-th key there with MSD radix rounds of 11
//      and 10 bits (no further cluster traffic).
//      Exact fallback otherwise: cluster-wide radix rounds, each CTA counting its own chunk's members of P,
//      per-round 256-bin histograms exchanged through distributed shared memory. No candidate is ever dropped;
//      the buffer sizes only decide which path runs.
//   C. Emission in index order: per-thread (greater-than-threshold, equal-to-threshold) counts, a block scan,
//      and the totals of lower-ranked CTAs give every selected element its output slot. On the fast path (and
//      when every valid entry is selected) each CTA derives those totals itself, with no barrier: before S2 a
//      CTA publishes how many of its elements lie above the pivot bin (or are valid), which the others read
//      with its candidate count, and once the threshold is known every CTA counts the gathered candidates above
//      / at it, those of lower-ranked CTAs first in the gather order (eighteenth session: one cluster barrier
//      and one distributed-shared-memory round fewer; not yet measured). The fallback publishes the totals
//      after a barrier (S3), as before.
// (Binning on the value rounded to fp16 instead of the key's top bits is finer where scores live, but cost
// ~15 instructions per element and pass: a register-resident kernel is bound by instruction issue.)
#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/topk_common.cuh"

namespace dsv4::cuda::topk_detail {
namespace {

constexpr int kTile = kResidentTile;             // 8192 elements per CTA
constexpr int kDigitBins = 256;                  // 8-bit radix rounds (at most one bin per thread)
constexpr int kLocalCap = 2048;                  // pivot-bin keys a CTA may publish (8 KB)
constexpr int kCap = 6144;                       // pivot-bin keys gathered from the whole cluster (24 KB)

// The CTA: 512 threads hold the 8192-element tile as 4 float4 each, two CTAs per SM (64 registers). Measured on
// the H200 (run 75 in docs/PERFORMANCE.md) against CTAs of 256 threads (32 values each, the earlier shape) and
// 1024: 512 was the fastest or within 0.3 us everywhere (1 x 64K 14.7 us against 20.3 and 15.1): more warps hide
// the chain's latencies, and fewer values per thread shrink the fully unrolled code (instruction-cache misses
// were 31% of the stall samples with 256 threads).
constexpr int kRThreads = 512;
constexpr int kRWarps = kRThreads / 32;
constexpr int kVec = kTile / (4 * kRThreads);        // float4 per thread
constexpr int kBinsPerThread = kBins / kRThreads;    // coarse bins per thread in the pivot scans
using RScan = cub::BlockScan<int, kRThreads, cub::BLOCK_SCAN_WARP_SCANS>;
static_assert(kTile == 4 * kVec * kRThreads && kDigitBins <= kRThreads, "one register tile per CTA");
static_assert(kVec * kRThreads <= kCap, "emission offsets reuse the gather buffer");
static_assert(kBinsPerThread == 4, "the coarse scan reads one int4 per CTA");

struct Shared {
  int hist[kBins];             // coarse histogram (read by the other CTAs), later digit histograms
  uint32_t lcand[kLocalCap];   // this CTA's pivot-bin keys (read by the other CTAs)
  uint32_t gcand[kCap];        // every CTA's pivot-bin keys, in rank order
  int wsum[kRWarps][kVec];     // emission: per-warp totals of each float4 slot, (gt << 16) | eq
  typename RScan::TempStorage scan;
  int n_local;                 // this CTA's pivot-bin population (may exceed kLocalCap)
  int nl[kMaxCluster];         // every CTA's n_local
  int n_above;                 // this CTA's elements above the pivot bin (all valid ones when nothing is cut)
  int na[kMaxCluster];         // every CTA's n_above
  int cand_count[4];           // gathered candidates: > thresh, == thresh; of lower-ranked CTAs: > , ==
  int fast;                    // step C's totals come from the counts above (every valid entry taken, or fits)
  unsigned long long before, all;  // then: the (gt << 32) | eq totals of the lower-ranked CTAs and of all
  unsigned long long tot;      // this CTA's (gt << 32) | eq after the threshold is known
  int pivot, above, pcnt;      // result of a pivot search
};

// Tile layout: float4 slot u of thread t covers elements tb + 4 (u * kRThreads + t) + 0..3, so every load
// instruction is coalesced; the element order is (u, t, e) lexicographic, which the emission scan follows.
__device__ __forceinline__ void load_tile(const float* __restrict__ row, bool aligned, int tb, int ce,
                                          uint32_t (&v)[4 * kVec]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int u = 0; u < kVec; ++u) {
    const int j = tb + 4 * (u * kRThreads + tid);
    if (aligned && j + 3 < ce) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row + j));
      v[4 * u] = to_key(f.x); v[4 * u + 1] = to_key(f.y); v[4 * u + 2] = to_key(f.z); v[4 * u + 3] = to_key(f.w);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[4 * u + e] = j + e < ce ? to_key(__ldg(row + j + e)) : 0u;
    }
  }
}

// Bin b of an nb-bin histogram held by thread t as its count i: b = nb - 1 - (B t + i), B = kBinsPerThread, so
// the scan runs from the top bin down (b < 0: no bin, count 0).
__device__ __forceinline__ int bin_of(int i, int nb) {
  return nb - 1 - (kBinsPerThread * static_cast<int>(threadIdx.x) + i);
}

// Picks, over the bins whose counts the threads hold as bin_of lays out, the bin b with above(b) < need <=
// above(b) + count(b) (none when the total is below need). Result in s.pivot / s.above / s.pcnt, visible to all
// threads on return; returns the total.
__device__ int find_pivot(Shared& s, int (&c)[kBinsPerThread], int nb, int need) {
  int ex[kBinsPerThread], total;
  RScan(s.scan).ExclusiveSum(c, ex, total);
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i)
    if (ex[i] < need && ex[i] + c[i] >= need) {
      s.pivot = bin_of(i, nb);
      s.above = ex[i];
      s.pcnt = c[i];
    }
  __syncthreads();
  return total;
}

// After find_pivot over the w-bit digit below the top 32 - rem bits (`prefix`): appends the pivot digit to prefix,
// takes the entries above it from `need`, and returns true with (thresh, ties) set once the selection is decided:
// the pivot bucket taken whole (threshold just below its range) or the last digit (the exact k-th key, of which
// `need` copies are taken, lowest index first).
__device__ __forceinline__ bool take_digit(const Shared& s, int w, uint32_t& prefix, int& rem, int& need,
                                           uint32_t& thresh, int& ties) {
  const int shift = rem - w, dcnt = s.pcnt;
  need -= s.above;
  prefix = (prefix << w) | static_cast<uint32_t>(s.pivot);
  rem = shift;
  if (dcnt == need) {
    const uint32_t lo = prefix << shift;
    thresh = lo == 0 ? 0u : lo - 1u;  // key 0 (invalid) is never selected anyway
    ties = 0;
    return true;
  }
  if (shift == 0) {
    thresh = prefix;
    ties = need;
    return true;
  }
  return false;
}

__global__ void __launch_bounds__(kRThreads, 2)
    topk_resident_kernel(const float* __restrict__ scores, int64_t row_stride, int cols,
                         const int32_t* __restrict__ lengths, int k, OutMap out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ Shared s;
  cg::cluster_group cluster = cg::this_cluster();
  const RowChunk rc = row_chunk(cluster, scores, row_stride, cols, lengths);
  const int C = rc.C, rank = rc.rank, cb = rc.cb, ce = rc.ce;
  const float* row = rc.row;
  const bool aligned = rc.aligned;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The output shift (OutMap): one thread loads it before S2 into shared memory and the emission reads it from
  // there (held in a register across the selection, it spilled: the kernel is at its 64-register bound).
  __shared__ int32_t row_shift;

  uint32_t v[4 * kVec];  // keys: the whole chunk (the host launches this kernel for chunks of <= kTile only)
  load_tile(row, aligned, cb, ce, v);  // issued first: the loads fly while shared is reset
  // Calls f(key) for every element of the chunk.
  auto for_each = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < 4 * kVec; ++i) f(v[i]);
  };

  for (int i = tid; i < kBins; i += kRThreads) s.hist[i] = 0;
  if (tid == 0) s.n_local = 0, s.n_above = 0, s.fast = 1;
  if (tid < 4) s.cand_count[tid] = 0;
  __syncthreads();

  // Defaults: select every valid element (used when the row has at most k valid entries).
  int pivot = 0;
  uint32_t thresh = 0u;  // every valid key is above it
  int ties = 0;

  // ---- A: coarse histogram, summed over the cluster ----
  for_each([&](uint32_t key) {
    if (key) atomicAdd(&s.hist[key >> kBinShift], 1);
  });
  cluster.sync();  // S1: every CTA's histogram is complete
  int cnt[kBinsPerThread];
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) cnt[i] = 0;
  // Thread t holds bins bin_of(i) = kBins-1-(4t+i): one int4 from every CTA.
  for (int q = 0; q < C; ++q) {
    const int4 a = *reinterpret_cast<const int4*>(cluster.map_shared_rank(s.hist, q) + bin_of(3, kBins));
    cnt[0] += a.w; cnt[1] += a.z; cnt[2] += a.y; cnt[3] += a.x;
  }
  const int n_valid = find_pivot(s, cnt, kBins, k);
  const bool select = n_valid > k;  // identical in every CTA of the cluster
  {
    // This CTA's elements above the pivot bin (select) or valid ones (everything is taken), from its own
    // coarse histogram (which counts the valid keys), published with n_local at S2 for the barrier-free
    // totals of step C.
    const int pb = s.pivot;
    int mine_above = 0;
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) {
      const int b = bin_of(i, kBins);
      if (!select || b > pb) mine_above += s.hist[b];
    }
    mine_above = __reduce_add_sync(0xffffffffu, mine_above);
    if (lane == 0 && mine_above) atomicAdd(&s.n_above, mine_above);
  }
  int need = 0;
  if (select) {
    pivot = s.pivot;
    need = k - s.above;
    // ---- B: this CTA's members of the pivot bin ----
    for_each([&](uint32_t key) {
      const bool mine = key && static_cast<int>(key >> kBinShift) == pivot;
      // Warp-aggregated append: one shared atomic per warp and element position.
      const unsigned m = __ballot_sync(0xffffffffu, mine);
      if (m) {
        const int leader = __ffs(m) - 1;
        int base = 0;
        if (lane == leader) base = atomicAdd(&s.n_local, __popc(m));
        base = __shfl_sync(0xffffffffu, base, leader);
        const int at = base + __popc(m & ((1u << lane) - 1));
        if (mine && at < kLocalCap) s.lcand[at] = key;  // overflow is counted, and handled below
      }
    });
  }
  if (threadIdx.x == 0) row_shift = out.shift(rc.r);  // visible after S2
  cluster.sync();  // S2: local candidate buffers and counts complete; nobody reads s.hist remotely any more
  if (tid < C) {
    s.nl[tid] = *cluster.map_shared_rank(&s.n_local, tid);
    s.na[tid] = *cluster.map_shared_rank(&s.n_above, tid);
  }
  __syncthreads();
  if (select) {
    int total = 0;
    bool fits = true;  // identical in every CTA of the cluster
    for (int q = 0; q < C; ++q) {
      total += s.nl[q];
      fits = fits && s.nl[q] <= kLocalCap;
    }
    fits = fits && total <= kCap;
    if (!fits && tid == 0) s.fast = 0;  // read in step C, after scan_tile's barriers
    if (fits) {
      // Fast path: gather every CTA's candidates, then resolve the threshold locally in radix rounds of 11 and
      // 10 bits (the 21 bits below the coarse bin). s.hist is free since S2; each thread zeroes the bins it
      // reads in the scans below, before the barrier, so every round finds its bins zeroed.
      int off = 0;
      for (int q = 0; q < C; ++q) {
        const uint32_t* src = cluster.map_shared_rank(s.lcand, q);
        for (int i = tid; i < s.nl[q]; i += kRThreads) s.gcand[off + i] = src[i];
        off += s.nl[q];
      }
#pragma unroll
      for (int i = 0; i < kBinsPerThread; ++i) s.hist[bin_of(i, kBins)] = 0;
      __syncthreads();
      uint32_t prefix = static_cast<uint32_t>(pivot);
      int rem = kBinShift;  // bits still to resolve: [0, rem)
      while (true) {
        const int w = min(11, rem), shift = rem - w, nb = 1 << w;
        for (int i = tid; i < total; i += kRThreads) {
          const uint32_t key = s.gcand[i];
          if ((key >> rem) == prefix) atomicAdd(&s.hist[(key >> shift) & (nb - 1)], 1);
        }
        __syncthreads();
        int c[kBinsPerThread];
#pragma unroll
        for (int i = 0; i < kBinsPerThread; ++i) {
          const int b = bin_of(i, nb);
          c[i] = b >= 0 ? s.hist[b] : 0;
          if (b >= 0) s.hist[b] = 0;  // only this thread reads bin b (before the next round's barrier)
        }
        find_pivot(s, c, nb, need);
        if (take_digit(s, w, prefix, rem, need, thresh, ties)) break;
        // s.pivot is rewritten after the next round's scan barrier, which every thread reaches after reading it.
      }
      // Step C's totals: the gathered candidates above / at the threshold, all and those of lower-ranked CTAs
      // (gcand holds CTA q's candidates after those of CTAs 0 .. q - 1).
      int off_rank = 0;
      for (int q = 0; q < rank; ++q) off_rank += s.nl[q];
      int c4[4] = {0, 0, 0, 0};
      for (int i = tid; i < total; i += kRThreads) {
        const uint32_t key = s.gcand[i];
        const int g = key > thresh, e = ties > 0 && key == thresh;
        c4[0] += g, c4[1] += e;
        if (i < off_rank) c4[2] += g, c4[3] += e;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        c4[j] = __reduce_add_sync(0xffffffffu, c4[j]);
        if (lane == 0 && c4[j]) atomicAdd(&s.cand_count[j], c4[j]);
      }
      __syncthreads();  // (s.gcand is reused for the emission offsets below)
    } else {
      // Exact fallback: cluster-wide rounds over the chunks themselves, up to 8 of the remaining 21 key bits
      // each. Digit histograms alternate between two halves of s.hist: a CTA zeroes one half only after the
      // barrier of the previous round, which every CTA reaches after it finished reading that half.
      uint32_t prefix = static_cast<uint32_t>(pivot);
      int rem = kBinShift;
      for (int round = 0;; ++round) {
        const int w = min(8, rem), shift = rem - w;
        int* buf = s.hist + kDigitBins * (round & 1);
        if (tid < kDigitBins) buf[tid] = 0;
        __syncthreads();
        for_each([&](uint32_t key) {
          if (key && (key >> rem) == prefix) atomicAdd(&buf[(key >> shift) & ((1u << w) - 1u)], 1);
        });
        cluster.sync();
        const int nb = 1 << w;
        int c[kBinsPerThread];
#pragma unroll
        for (int i = 0; i < kBinsPerThread; ++i) {
          const int b = bin_of(i, nb);
          c[i] = 0;
          if (b >= 0)
            for (int q = 0; q < C; ++q) c[i] += cluster.map_shared_rank(buf, q)[b];
        }
        find_pivot(s, c, nb, need);
        if (take_digit(s, w, prefix, rem, need, thresh, ties)) break;
        __syncthreads();
      }
    }
  }

  // Step C's totals on the fast path (s.fast: thread 0 cleared it itself on the fallback), from the CTAs'
  // published counts and the gathered candidates' (counted above; zero when every valid entry is taken).
  if (tid == 0 && s.fast) {
    int gt_before = s.cand_count[2], gt_all = s.cand_count[0];
    for (int q = 0; q < C; ++q) {
      gt_before += q < rank ? s.na[q] : 0;
      gt_all += s.na[q];
    }
    s.before = (static_cast<unsigned long long>(gt_before) << 32) | static_cast<unsigned>(s.cand_count[3]);
    s.all = (static_cast<unsigned long long>(gt_all) << 32) | static_cast<unsigned>(s.cand_count[1]);
  }

  // ---- C: ordered emission ----
  // Per tile: (gt << 16) | eq per float4 slot (at most 8192 each per tile, so 16 bits suffice), a warp scan
  // of each slot column, per-warp totals in shared memory -> exclusive offset of every slot in tile order.
  unsigned gtm = 0u, eqm = 0u;  // bit 4u+e: element (u, e) of this thread is greater / equal
  // Each slot's exclusive offset lives in the (by now unused) gather buffer rather than in registers: the
  // register-resident tile already takes 32 of the 128 registers, and sm_120a spilled with off[] in registers.
  uint32_t* off = s.gcand;  // [kVec][kRThreads], each thread touches only its own entries
  auto classify_tile = [&]() {
    gtm = 0u;
    eqm = 0u;
#pragma unroll
    for (int i = 0; i < 4 * kVec; ++i) {
      const bool g = v[i] > thresh;               // key 0 (invalid) never is
      const bool e = ties > 0 && v[i] == thresh;  // thresh != 0 whenever ties > 0
      gtm |= static_cast<unsigned>(g) << i;
      eqm |= static_cast<unsigned>(e) << i;
    }
  };
  // Returns the tile total (gt << 32 | eq); fills off[] with each slot's exclusive (gt << 16 | eq) offset.
  auto scan_tile = [&]() -> unsigned long long {
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int c = (__popc((gtm >> (4 * u)) & 15u) << 16) | __popc((eqm >> (4 * u)) & 15u);
      int x = c;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
      }
      if (lane == 31) s.wsum[warp][u] = x;
      off[u * kRThreads + tid] = x - c;
    }
    __syncthreads();
    int run = 0;
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      // Lanes 0..kRWarps-1: inclusive scan of the slot's warp totals; col = the slot's total.
      int x = lane < kRWarps ? s.wsum[lane][u] : 0;
#pragma unroll
      for (int d = 1; d < kRWarps; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
      }
      const int col = __shfl_sync(0xffffffffu, x, kRWarps - 1);
      const int below = warp ? __shfl_sync(0xffffffffu, x, (warp + kRWarps - 1) % kRWarps) : 0;
      off[u * kRThreads + tid] += run + below;
      run += col;
    }
    __syncthreads();  // s.wsum is rewritten by the next tile
    return (static_cast<unsigned long long>(run >> 16) << 32) | static_cast<unsigned>(run & 0xffff);
  };

  classify_tile();
  const unsigned long long mine = scan_tile();  // this CTA's (gt << 32) | eq
  unsigned long long before = 0, all = 0;
  if (s.fast) {  // every valid entry taken, or the fast path: the totals from the published counts
    before = s.before;
    all = s.all;
  } else {
    if (tid == 0) s.tot = mine;
    cluster.sync();  // S3: every CTA's totals are published
    for (int q = 0; q < C; ++q) {
      const unsigned long long t = *cluster.map_shared_rank(&s.tot, q);
      before += q < rank ? t : 0ull;
      all += t;
    }
  }
  // The row's output (its shift: row_shift, in shared memory).
  int32_t* const orow = out.out + static_cast<int64_t>(rc.r) * out.stride;
  auto emit_tile = [&](int tb, unsigned long long base) {
    if (!(gtm | eqm)) return;
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const uint32_t o = off[u * kRThreads + tid];
      int gb = static_cast<int>(base >> 32) + static_cast<int>(o >> 16);
      int eb = static_cast<int>(base & 0xffffffffu) + static_cast<int>(o & 0xffffu);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool g = (gtm >> (4 * u + e)) & 1u, q = (eqm >> (4 * u + e)) & 1u;
        if (g || (q && eb < ties)) orow[gb + min(eb, ties)] = tb + 4 * (u * kRThreads + tid) + e + row_shift;
        gb += g;
        eb += q;
      }
    }
  };
  emit_tile(cb, before);
  if (rank == 0) {
    const int written = static_cast<int>(all >> 32) + min(static_cast<int>(all & 0xffffffffu), ties);
    for (int i = written + tid; i < k; i += kRThreads) orow[i] = -1;
  }
  cluster.sync();  // S4: no CTA leaves while another may still read its shared memory
}

}  // namespace

cudaError_t launch_topk_resident(const float* scores, int64_t row_stride, int cols, const int32_t* lengths,
                                 int rows, int k, OutMap out, cudaStream_t stream) {
  const int C = std::max(1, (cols + kTile - 1) / kTile);  // <= kMaxCluster: the caller's contract
  return launch_cluster(topk_resident_kernel, dim3(static_cast<unsigned>(rows) * C), dim3(kRThreads), 0, stream,
                        static_cast<unsigned>(C), scores, row_stride, cols, lengths, k, out);
}

}  // namespace dsv4::cuda::topk_detail
