// Exact top-k, register-resident rows (reference: cpu::topk_row; keys and selection rule in topk_common.cuh).
// For a few rows of up to 64K entries (topk_rows picks it), where a row is one short latency chain.
//
// A row is served by a thread-block cluster of C <= 8 CTAs (C from the row length only). CTA c owns the
// contiguous chunk [c*chunk, (c+1)*chunk) of at most 8192 elements (32 floats per thread) and loads it into
// registers once: every pass below runs on registers, so the row is read from memory exactly once. CTAs
// exchange small tables through distributed shared memory; the only synchronisation is the hardware cluster
// barrier, so there is no spin loop, no global workspace and nothing to reset between graph replays.
//
//   A. Each CTA builds a 2048-bin histogram of its chunk (the coarse bins); after a cluster barrier every CTA
//      adds up all C histograms (the same sums in every CTA) -> pivot bin P holding the k-th largest and
//      `need` = how many of P's members are still to take.
//   B. Each CTA appends its members of P to a local buffer. After a barrier, when every local buffer fit and
//      the total fits the gather buffer (the usual case: P holds a few hundred keys), every CTA copies all C
//      buffers into its own shared memory and resolves the exact k-th key there with MSD radix rounds of 8
//      bits, starting at the highest bit in which the candidates differ (no further cluster traffic).
//      Exact fallback otherwise: cluster-wide radix rounds, each CTA counting its own chunk's members of P,
//      per-round 256-bin histograms exchanged through distributed shared memory. No candidate is ever dropped;
//      the buffer sizes only decide which path runs.
//   C. Emission in index order: per-thread (greater-than-threshold, equal-to-threshold) counts, a block scan,
//      and the totals of lower-ranked CTAs (published after a barrier) give every selected element its output
//      slot.
// (Binning on the value rounded to fp16 instead of the key's top bits is finer where scores live, but cost
// ~15 instructions per element and pass: a register-resident kernel is bound by instruction issue.)
#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/topk_common.cuh"

namespace dsv4::cuda::topk_detail {
namespace {

constexpr int kVec = 8;                          // float4 per thread (32 values in registers)
constexpr int kTile = kResidentTile;             // 8192 elements per CTA
static_assert(kTile == 4 * kVec * kThreads, "one register tile per CTA");
constexpr int kDigitBins = 256;                  // 8-bit radix rounds (== kThreads: one bin per thread)
constexpr int kLocalCap = 2048;                  // pivot-bin keys a CTA may publish (8 KB)
constexpr int kCap = 6144;                       // pivot-bin keys gathered from the whole cluster (24 KB)
static_assert(kDigitBins == kThreads, "one digit bin per thread");
static_assert(kVec * kThreads <= kCap, "emission offsets reuse the gather buffer");

struct Shared {
  int hist[kBins];             // coarse histogram (read by the other CTAs), later digit histograms
  uint32_t lcand[kLocalCap];   // this CTA's pivot-bin keys (read by the other CTAs)
  uint32_t gcand[kCap];        // every CTA's pivot-bin keys, in rank order
  int wsum[kWarps][kVec];      // emission: per-warp totals of each float4 slot, (gt << 16) | eq
  typename ScanInt::TempStorage scan;
  int n_local;                 // this CTA's pivot-bin population (may exceed kLocalCap)
  int nl[kMaxCluster];         // every CTA's n_local
  unsigned long long tot;      // this CTA's (gt << 32) | eq after the threshold is known
  int pivot, above, pcnt;      // result of a pivot search
  unsigned or_all, and_all;
};

// Tile layout: float4 slot u of thread t covers elements tb + 4 (u * kThreads + t) + 0..3, so every load
// instruction is coalesced; the element order is (u, t, e) lexicographic, which the emission scan follows.
__device__ __forceinline__ void load_tile(const float* __restrict__ row, bool aligned, int tb, int ce,
                                          uint32_t (&v)[4 * kVec]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int u = 0; u < kVec; ++u) {
    const int j = tb + 4 * (u * kThreads + tid);
    if (aligned && j + 3 < ce) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row + j));
      v[4 * u] = to_key(f.x); v[4 * u + 1] = to_key(f.y); v[4 * u + 2] = to_key(f.z); v[4 * u + 3] = to_key(f.w);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[4 * u + e] = j + e < ce ? to_key(__ldg(row + j + e)) : 0u;
    }
  }
}

// Picks, over nb <= 256 bins whose counts are given one per thread (thread t holds bin nb-1-t, i.e. the scan
// runs from the top bin down), the bin b with above(b) < need <= above(b) + count(b). Requires
// 1 <= need <= total. Result in s.pivot / s.above / s.pcnt, visible to all threads on return.
__device__ void select_digit(Shared& s, int c, int need, int nb) {
  const int tid = threadIdx.x;
  if (tid >= nb) c = 0;
  int ex;
  ScanInt(s.scan).ExclusiveSum(c, ex);
  if (tid < nb && ex < need && ex + c >= need) {
    s.pivot = nb - 1 - tid;
    s.above = ex;
    s.pcnt = c;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 2)
    topk_resident_kernel(const float* __restrict__ scores, int64_t row_stride, int cols,
                         const int32_t* __restrict__ lengths, int k, int32_t* __restrict__ out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ Shared s;
  cg::cluster_group cluster = cg::this_cluster();
  const RowChunk rc = row_chunk(cluster, scores, row_stride, cols, lengths);
  const int C = rc.C, rank = rc.rank, cb = rc.cb, ce = rc.ce;
  const float* row = rc.row;
  const bool aligned = rc.aligned;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int32_t* orow = out + static_cast<int64_t>(rc.r) * k;

  uint32_t v[4 * kVec];  // keys: the whole chunk (the host launches this kernel for chunks of <= kTile only)
  load_tile(row, aligned, cb, ce, v);  // issued first: the loads fly while shared is reset
  // Calls f(key) for every element of the chunk.
  auto for_each = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < 4 * kVec; ++i) f(v[i]);
  };

  for (int i = tid; i < kBins; i += kThreads) s.hist[i] = 0;
  if (tid == 0) {
    s.n_local = 0;
    s.or_all = 0u;
    s.and_all = 0xffffffffu;
  }
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
  // Thread t holds bins kBins-1-(8t+i): the scan below runs from the top bin down.
  for (int q = 0; q < C; ++q) {
    const int* h = cluster.map_shared_rank(s.hist, q);
    const int4 a = *reinterpret_cast<const int4*>(h + kBins - kBinsPerThread * (tid + 1));
    const int4 b = *reinterpret_cast<const int4*>(h + kBins - kBinsPerThread * (tid + 1) + 4);
    cnt[0] += b.w; cnt[1] += b.z; cnt[2] += b.y; cnt[3] += b.x;
    cnt[4] += a.w; cnt[5] += a.z; cnt[6] += a.y; cnt[7] += a.x;
  }
  int n_valid;
  {
    int ex[kBinsPerThread];
    ScanInt(s.scan).ExclusiveSum(cnt, ex, n_valid);
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i)
      if (ex[i] < k && ex[i] + cnt[i] >= k) {
        s.pivot = kBins - 1 - (kBinsPerThread * tid + i);
        s.above = ex[i];
        s.pcnt = cnt[i];
      }
  }
  __syncthreads();
  const bool select = n_valid > k;  // identical in every CTA of the cluster
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
  cluster.sync();  // S2: local candidate buffers complete; nobody reads s.hist remotely any more
  if (select) {
    if (tid < C) s.nl[tid] = *cluster.map_shared_rank(&s.n_local, tid);
    __syncthreads();
    int total = 0;
    bool fits = true;
    for (int q = 0; q < C; ++q) {
      total += s.nl[q];
      fits = fits && s.nl[q] <= kLocalCap;
    }
    fits = fits && total <= kCap;
    if (fits) {
      // Fast path: gather every CTA's candidates, then resolve the threshold locally.
      int off = 0;
      for (int q = 0; q < C; ++q) {
        const uint32_t* src = cluster.map_shared_rank(s.lcand, q);
        for (int i = tid; i < s.nl[q]; i += kThreads) s.gcand[off + i] = src[i];
        off += s.nl[q];
      }
      __syncthreads();
      // Bits shared by every candidate need no radix round: start at the highest differing bit.
      unsigned o = 0u, a = 0xffffffffu;
      for (int i = tid; i < total; i += kThreads) {
        o |= s.gcand[i];
        a &= s.gcand[i];
      }
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) {
        o |= __shfl_xor_sync(0xffffffffu, o, d);
        a &= __shfl_xor_sync(0xffffffffu, a, d);
      }
      if (lane == 0) {
        atomicOr(&s.or_all, o);
        atomicAnd(&s.and_all, a);
      }
      __syncthreads();
      const uint32_t diff = s.or_all ^ s.and_all;
      if (diff == 0) {  // every candidate has the same key
        thresh = s.and_all;
        ties = need;
      } else {
        int rem = 32 - __clz(diff);  // bits still to resolve: [0, rem)
        uint64_t prefix = static_cast<uint64_t>(s.and_all) >> rem;
        while (true) {
          const int w = min(8, rem), shift = rem - w;
          s.hist[tid] = 0;
          __syncthreads();
          for (int i = tid; i < total; i += kThreads) {
            const uint32_t key = s.gcand[i];
            if ((static_cast<uint64_t>(key) >> rem) == prefix) atomicAdd(&s.hist[(key >> shift) & ((1u << w) - 1u)], 1);
          }
          __syncthreads();
          const int nb = 1 << w;
          select_digit(s, tid < nb ? s.hist[nb - 1 - tid] : 0, need, nb);
          const int digit = s.pivot, dcnt = s.pcnt;
          need -= s.above;
          prefix = (prefix << w) | static_cast<uint64_t>(digit);
          rem = shift;
          if (dcnt == need) {
            // Every candidate with this prefix is taken: threshold just below the prefix's range.
            const uint32_t lo = static_cast<uint32_t>(prefix << shift);
            thresh = lo == 0 ? 0u : lo - 1u;  // key 0 (invalid) is never selected anyway
            ties = 0;
            break;
          }
          if (shift == 0) {
            thresh = static_cast<uint32_t>(prefix);  // the exact k-th key
            ties = need;                             // how many keys equal to it to take, lowest index first
            break;
          }
          __syncthreads();  // s.pivot / s.hist are rewritten by the next round
        }
      }
    } else {
      // Exact fallback: cluster-wide rounds over the chunks themselves, up to 8 of the remaining 21 key bits
      // each. Digit histograms alternate between two halves of s.hist: a CTA zeroes one half only after the
      // barrier of the previous round, which every CTA reaches after it finished reading that half.
      uint32_t prefix = static_cast<uint32_t>(pivot);
      int rem = kBinShift;
      for (int round = 0;; ++round) {
        const int w = min(8, rem), shift = rem - w;
        int* buf = s.hist + kDigitBins * (round & 1);
        buf[tid] = 0;
        __syncthreads();
        for_each([&](uint32_t key) {
          if (key && (key >> rem) == prefix) atomicAdd(&buf[(key >> shift) & ((1u << w) - 1u)], 1);
        });
        cluster.sync();
        const int nb = 1 << w;
        int c = 0;
        if (tid < nb)
          for (int q = 0; q < C; ++q) c += cluster.map_shared_rank(buf, q)[nb - 1 - tid];
        select_digit(s, c, need, nb);
        const int digit = s.pivot, dcnt = s.pcnt;
        need -= s.above;
        prefix = (prefix << w) | static_cast<uint32_t>(digit);
        rem = shift;
        if (dcnt == need) {
          const uint32_t lo = prefix << shift;
          thresh = lo == 0 ? 0u : lo - 1u;
          ties = 0;
          break;
        }
        if (shift == 0) {
          thresh = prefix;
          ties = need;
          break;
        }
        __syncthreads();
      }
    }
  }

  // ---- C: ordered emission ----
  // Per tile: (gt << 16) | eq per float4 slot (at most 8192 each per tile, so 16 bits suffice), a warp scan
  // of each slot column, per-warp totals in shared memory -> exclusive offset of every slot in tile order.
  unsigned gtm = 0u, eqm = 0u;  // bit 4u+e: element (u, e) of this thread is greater / equal
  // Each slot's exclusive offset lives in the (by now unused) gather buffer rather than in registers: the
  // register-resident tile already takes 32 of the 128 registers, and sm_120a spilled with off[] in registers.
  uint32_t* off = s.gcand;  // [kVec][kThreads], each thread touches only its own entries
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
      off[u * kThreads + tid] = x - c;
    }
    __syncthreads();
    int run = 0;
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      int col = 0, below = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int x = s.wsum[w][u];
        col += x;
        below += w < warp ? x : 0;
      }
      off[u * kThreads + tid] += run + below;
      run += col;
    }
    __syncthreads();  // s.wsum is rewritten by the next tile
    return (static_cast<unsigned long long>(run >> 16) << 32) | static_cast<unsigned>(run & 0xffff);
  };

  classify_tile();
  const unsigned long long mine = scan_tile();  // this CTA's (gt << 32) | eq
  if (tid == 0) s.tot = mine;
  cluster.sync();  // S3: every CTA's totals are published
  unsigned long long before = 0, all = 0;
  for (int q = 0; q < C; ++q) {
    const unsigned long long t = *cluster.map_shared_rank(&s.tot, q);
    before += q < rank ? t : 0ull;
    all += t;
  }
  auto emit_tile = [&](int tb, unsigned long long base) {
    if (!(gtm | eqm)) return;
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const uint32_t o = off[u * kThreads + tid];
      int gb = static_cast<int>(base >> 32) + static_cast<int>(o >> 16);
      int eb = static_cast<int>(base & 0xffffffffu) + static_cast<int>(o & 0xffffu);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool g = (gtm >> (4 * u + e)) & 1u, q = (eqm >> (4 * u + e)) & 1u;
        if (g || (q && eb < ties)) orow[gb + min(eb, ties)] = tb + 4 * (u * kThreads + tid) + e;
        gb += g;
        eb += q;
      }
    }
  };
  emit_tile(cb, before);
  if (rank == 0) {
    const int written = static_cast<int>(all >> 32) + min(static_cast<int>(all & 0xffffffffu), ties);
    for (int i = written + tid; i < k; i += kThreads) orow[i] = -1;
  }
  cluster.sync();  // S4: no CTA leaves while another may still read its shared memory
}

}  // namespace

cudaError_t launch_topk_resident(const float* scores, int64_t row_stride, int cols, const int32_t* lengths,
                                 int rows, int k, int32_t* out, cudaStream_t stream) {
  const int C = std::max(1, (cols + kTile - 1) / kTile);  // <= kMaxCluster: the caller's contract
  return launch_cluster(topk_resident_kernel, dim3(static_cast<unsigned>(rows) * C), dim3(kThreads), 0, stream,
                        static_cast<unsigned>(C), scores, row_stride, cols, lengths, k, out);
}

}  // namespace dsv4::cuda::topk_detail
