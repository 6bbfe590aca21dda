// KV compressor (spec dsv4-model.md 2.4; reference cpu::compressor_push, then RMSNorm, RoPE at the block start
// and KvCodec::encode as in engine/attention.cc run_compressor). State layout: kernels_compressor_mhc.h.
//
// Two launches, in stream order:
//  1. entries: a group of head / 4 threads per (sequence, closed block), 512 / head groups per CTA of 128
//     threads; thread = 4 consecutive channels (float4 loads). It gathers the block's rows from the batch (score
//     = gate + ape) or, for rows before the batch start, from the state slot, with every load of the entry (ratio
//     4) or of a step of 4 rows (ratio 128) in flight at once; runs the per-channel gated softmax (ratio 4: 4
//     previous-block first-half rows + 4 current second-half rows, block 0 has no previous rows; ratio 128:
//     online softmax), then RMSNorm (warp sums, then the group's warps through shared memory), RoPE (pairs
//     inside a thread) and the storage encoding (fp8 scale = max over the 64- or 128-wide scale block by
//     shuffles). Ratio 128 with few entries splits a block's rows over a cluster of 8 CTAs; each CTA's (max, sum,
//     weighted sum) per channel goes to rank 0 through distributed shared memory, which merges them in rank
//     order and finishes. Seventeenth session: one channel per thread with a branch per row left one DRAM round
//     trip per row in flight (0.06-0.39 of copy bandwidth in prefill).
//  2. state: one thread per (channel, sequence) moves the rows of the block left open after the batch into the
//     slot and, for ratio 4, the first half of the last closed block into prev_*. It reads before it writes and
//     touches only its own channel, so no other synchronisation is needed. It runs after (1), which reads the
//     old state.
// Both kernels read every batch value once: bandwidth-bound streaming.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

template <int R, int HEAD>
struct Shape {
  static constexpr bool kOverlap = (R == 4);
  static constexpr int W = (kOverlap ? 2 : 1) * HEAD;
  static constexpr int64_t kStateFloats = 2 * R * W + (kOverlap ? 2 * R * HEAD : 0);
};

// Where row p >= 0, channel ch, of the sequence whose batch starts at P0 (block b0 = P0 / R) lives: in the batch
// (score = gate + ape) or, before P0, in the slot (open block rows, or for the overlap the previous block's first
// half; scores stored with ape already).
struct RowRef {
  const float* kv;
  const float* score;  // gate row (batch) or stored score (slot)
  const float* ape;    // always a valid address; added only for batch rows
  bool batch;
};

template <int R, int HEAD>
__device__ __forceinline__ RowRef locate(const CompressorArgs& a, const float* st, int64_t P0, int64_t first,
                                         int64_t p, int ch) {
  using S = Shape<R, HEAD>;
  const int r = static_cast<int>(p % R);
  RowRef ref;
  ref.batch = p >= P0;
  ref.ape = a.ape + r * S::W + ch;
  if (ref.batch) {
    const int64_t row = first + (p - P0);
    ref.kv = a.kv + row * a.row_stride + ch;
    ref.score = a.gate + row * a.row_stride + ch;
  } else if (p / R == P0 / R) {  // open block at batch start
    ref.kv = st + r * S::W + ch;
    ref.score = st + R * S::W + r * S::W + ch;
  } else {  // overlap: previous block's first half
    ref.kv = st + 2 * R * S::W + r * HEAD + ch;
    ref.score = st + 2 * R * S::W + R * HEAD + r * HEAD + ch;
  }
  return ref;
}

// N rows: every address first, then every load, then the adds, so that all of a thread's rows are in flight at
// once. With one row at a time the add sat in the row's branch and each row waited for its loads (one DRAM round
// trip per row; seventeenth session). ape is read for batch rows only (a predicated load: ratio 128's table is
// 256 KB, and decode reads 127 slot rows per entry). Plain loads: the state kernel writes the slot it reads here.
template <int N>
__device__ __forceinline__ void load_rows(const RowRef (&ref)[N], float (&kv)[N], float (&sc)[N]) {
  float g[N], ape[N];
#pragma unroll
  for (int i = 0; i < N; ++i) kv[i] = *ref[i].kv, g[i] = *ref[i].score, ape[i] = ref[i].batch ? __ldg(ref[i].ape) : 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) sc[i] = g[i] + ape[i];  // x + 0 = x for slot scores
}

// The same for 4 consecutive channels (16-byte aligned: compressor() checks the strides and pointers).
template <int N>
__device__ __forceinline__ void load_rows4(const RowRef (&ref)[N], float4 (&kv)[N], float4 (&sc)[N]) {
  float4 g[N], ape[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    kv[i] = *reinterpret_cast<const float4*>(ref[i].kv);
    g[i] = *reinterpret_cast<const float4*>(ref[i].score);
    ape[i] = ref[i].batch ? __ldg(reinterpret_cast<const float4*>(ref[i].ape)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    sc[i] = make_float4(g[i].x + ape[i].x, g[i].y + ape[i].y, g[i].z + ape[i].z, g[i].w + ape[i].w);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

namespace cg = cooperative_groups;

// Component k of a float4 (k a compile-time constant after unrolling, so the value stays in a register).
__device__ __forceinline__ float& at(float4& v, int k) { return (&v.x)[k]; }

constexpr int kEntryThreads = 128;  // CTA of the entries kernel: 512 / HEAD entries of HEAD / 4 threads each
constexpr int kOnlineRows = 4;      // ratio 128: rows per step of the online softmax (3 float4 loads per row)

// Ratio 4: the block's 2R rows for 4 channels, max then sums in row order (previous block first), as the CPU.
template <int R, int HEAD>
__device__ __forceinline__ float4 pool_overlap(const CompressorArgs& a, const float* st, int64_t P0, int64_t first,
                                               int64_t j, int c) {
  using S = Shape<R, HEAD>;
  const int np = j > 0 ? R : 0;
  // Block 0 has no previous rows: read valid rows (its own) and drop them, so the loads stay unconditional.
  const int64_t pp = (np ? j - 1 : j) * R;  // position of the first "previous" row
  RowRef ref[2 * R];
  if (pp >= P0) {  // every row in the batch (prefill): plain strides, no per-row choice
    const int64_t o = (first + pp - P0) * a.row_stride + c, o2 = o + (j * R - pp) * a.row_stride + HEAD;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ref[r] = {a.kv + o + r * a.row_stride, a.gate + o + r * a.row_stride, a.ape + r * S::W + c, true};
      ref[R + r] = {a.kv + o2 + r * a.row_stride, a.gate + o2 + r * a.row_stride, a.ape + r * S::W + HEAD + c, true};
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ref[r] = locate<R, HEAD>(a, st, P0, first, pp + r, c);
      ref[R + r] = locate<R, HEAD>(a, st, P0, first, j * R + r, HEAD + c);
    }
  }
  float4 kv[2 * R], sc[2 * R];
  load_rows4(ref, kv, sc);
  if (np == 0)  // dropped rows: weight expf(-inf) = 0 and value 0 add nothing (no branch per row)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sc[r] = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      kv[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  float4 v;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) mx = fmaxf(mx, at(sc[r], k));
    float den = 0.f, num = 0.f;
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) {
      const float w = expf(at(sc[r], k) - mx);
      den += w;
      num += w * at(kv[r], k);
    }
    at(v, k) = num / den;
  }
  return v;
}

// Ratio 128: online softmax over rows [r_begin, r_end) of block j for 4 channels, kOnlineRows rows per step.
template <int R, int HEAD>
__device__ __forceinline__ void pool_online(const CompressorArgs& a, const float* st, int64_t P0, int64_t first,
                                            int64_t j, int c, int r_begin, int r_end, float4& mx, float4& den,
                                            float4& num) {
  mx = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  den = num = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r0 = r_begin; r0 < r_end; r0 += kOnlineRows) {
    RowRef ref[kOnlineRows];
    const int64_t p = j * R + r0;
    if (p >= P0) {  // every row of the step in the batch
      const int64_t o = (first + p - P0) * a.row_stride + c;
#pragma unroll
      for (int i = 0; i < kOnlineRows; ++i)
        ref[i] = {a.kv + o + i * a.row_stride, a.gate + o + i * a.row_stride, a.ape + (r0 + i) * HEAD + c, true};
    } else {
#pragma unroll
      for (int i = 0; i < kOnlineRows; ++i) ref[i] = locate<R, HEAD>(a, st, P0, first, p + i, c);
    }
    float4 kv[kOnlineRows], sc[kOnlineRows];
    load_rows4(ref, kv, sc);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float cm = at(sc[0], k);
#pragma unroll
      for (int i = 1; i < kOnlineRows; ++i) cm = fmaxf(cm, at(sc[i], k));
      const float nm = fmaxf(at(mx, k), cm);
      if (nm > -INFINITY) {
        const float f = expf(at(mx, k) - nm);  // 0 when mx = -inf
        float d = at(den, k) * f, n = at(num, k) * f;
#pragma unroll
        for (int i = 0; i < kOnlineRows; ++i) {
          const float w = expf(at(sc[i], k) - nm);
          d += w;
          n += w * at(kv[i], k);
        }
        at(den, k) = d, at(num, k) = n, at(mx, k) = nm;
      }
    }
  }
}

// Ratio 128 split over a cluster of kS CTAs: each publishes its (max, sum, weighted sum) per thread in part[];
// where `merge` (rank 0, live entry) they are combined in rank order (rank 0's own first) into mx, den, num.
// Every CTA of the cluster calls it (two cluster barriers).
template <int kS>
__device__ __forceinline__ void merge_ranks(float4* part, bool merge, float4& mx, float4& den, float4& num) {
  constexpr int kT = kEntryThreads;
  const int t = threadIdx.x;
  part[t] = mx, part[kT + t] = den, part[2 * kT + t] = num;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every rank's partials are written
  if (merge) {
    float4 pm[kS], pd[kS], pn[kS];
#pragma unroll
    for (int q = 0; q < kS; ++q) {
      const float4* rp = cluster.map_shared_rank(part, q);
      pm[q] = rp[t], pd[q] = rp[kT + t], pn[q] = rp[2 * kT + t];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float m = at(pm[0], k);
#pragma unroll
      for (int q = 1; q < kS; ++q) m = fmaxf(m, at(pm[q], k));
      float d = 0.f, n = 0.f;
#pragma unroll
      for (int q = 0; q < kS; ++q) {
        const float f = at(pm[q], k) > -INFINITY ? expf(at(pm[q], k) - m) : 0.f;  // a rank whose rows all scored -inf
        d += f * at(pd[q], k);
        n += f * at(pn[q], k);
      }
      at(den, k) = d, at(num, k) = n;
    }
  }
  cluster.sync();  // rank 0 has read every rank's partials (they are rewritten for the next entries)
}

// RMSNorm, RoPE at the block's first position and the storage encoding of one entry; thread = channels c..c+3 of
// the entry's group of HEAD / 4 threads (t = c / 4). Every thread of the CTA calls it (barriers, shuffles);
// `live` says whether the group's entry exists. kWarps = warps per group: the RMSNorm sums meet in red[].
template <int R, int HEAD>
__device__ __forceinline__ void finish_entry(const CompressorArgs& a, float4 v, bool live, int64_t j, uint8_t* row,
                                             int c, float* red) {
  constexpr int kWarps = HEAD / 4 / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = c / 4;
  // RMSNorm over the head (fixed-order reduction: deterministic).
  float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
  if constexpr (kWarps > 1) {
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    const int w0 = warp / kWarps * kWarps;
    ss = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ss += red[w0 + w];
  }
  const float rs = 1.0f / sqrtf(ss / HEAD + a.eps);
  const float4 nw = __ldg(reinterpret_cast<const float4*>(a.norm) + t);
  float y[4] = {nw.x * (v.x * rs), nw.y * (v.y * rs), nw.z * (v.z * rs), nw.w * (v.w * rs)};

  // RoPE at the block's first position on the pairs (2i, 2i+1) from rope0; rope0 is even, so a pair never
  // straddles two threads.
  const int rope0 = HEAD - 2 * a.n_freq;
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int ch = c + 2 * p;
    if (ch >= rope0) {
      const float angle = static_cast<float>(j * R) * __ldg(a.inv_freq + ((ch - rope0) >> 1));
      float sn, cs;
      sincosf(angle, &sn, &cs);  // the values of sinf and cosf, one argument reduction
      const float y0 = y[2 * p], y1 = y[2 * p + 1];
      y[2 * p] = y0 * cs - y1 * sn;
      y[2 * p + 1] = y1 * cs + y0 * sn;
    }
  }

  if (a.format == KvRowFormat::kF32) {
    if (live)
#pragma unroll
      for (int k = 0; k < 4; ++k) reinterpret_cast<float*>(row)[c + k] = y[k];
  } else if (a.format == KvRowFormat::kBF16) {
    if (live)
#pragma unroll
      for (int k = 0; k < 4; ++k) reinterpret_cast<__nv_bfloat16*>(row)[c + k] = __float2bfloat16_rn(y[k]);
  } else {
    // fp8: scale = max |y| over the scale block (blk / 4 <= 32 aligned lanes of one warp: compressor() checks).
    const int nope = HEAD - a.fp8_rope_dims, rope_d = a.fp8_rope_dims, blk = a.fp8_scale_block;
    float am = c < nope ? fmaxf(fmaxf(fabsf(y[0]), fabsf(y[1])), fmaxf(fabsf(y[2]), fabsf(y[3]))) : 0.f;
    for (int o = 1; o < blk / 4; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if (live) {
      if (c < nope) {
        const float amax = fmaxf(1e-4f, am);
        const int ex = static_cast<int>(ceilf(log2f(amax / 448.0f)));
        const float inv_scale = ldexpf(1.0f, -ex);  // y * 2^-ex is exactly y / 2^ex (ex in -22 .. 120)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          row[c + k] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(y[k] * inv_scale, __NV_SATFINITE, __NV_E4M3));
        if (c % blk == 0) row[nope + 2 * rope_d + c / blk] = static_cast<uint8_t>(ex + 127);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          reinterpret_cast<__nv_bfloat16*>(row + nope)[c - nope + k] = __float2bfloat16_rn(y[k]);
      }
      const int used = nope + 2 * rope_d + nope / blk;
      const int total = (used + 7) / 8 * 8;
      if (t < total - used) row[used + t] = 0;
    }
  }
  if constexpr (kWarps > 1) __syncthreads();  // red[] reuse by the next entry
}

// Entries: CTA = 512 / HEAD groups of HEAD / 4 threads, a group per (sequence, entry) pair, thread = 4
// consecutive channels (float4 loads). kS CTAs per group: with kS > 1 (ratio 128, few entries) a block's rows
// are split over a cluster; each CTA's (max, sum, weighted sum) per channel goes to rank 0 through distributed
// shared memory, which merges them in rank order and finishes.
template <int R, int HEAD, int kS>
__global__ void __launch_bounds__(kEntryThreads, 4) compressor_entries_kernel(CompressorArgs a, int per_seq,
                                                                               int64_t groups) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  using S = Shape<R, HEAD>;
  constexpr int kGroup = HEAD / 4, kE = kEntryThreads / kGroup;
  static_assert(kGroup % 32 == 0 && kE >= 1, "whole warps per entry");
  static_assert(kS == 1 || (!S::kOverlap && R % (kOnlineRows * kS) == 0), "whole steps of rows per CTA");
  __shared__ float red[kEntryThreads / 32];
  __shared__ float4 part[kS > 1 ? 3 * kEntryThreads : 1];  // this CTA's (max, sum, weighted sum) per thread
  const int rank = kS > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int g = threadIdx.x / kGroup, c = 4 * (threadIdx.x % kGroup);

  // Every CTA of a cluster walks the same groups; the loop bound is uniform over the CTA (barriers inside).
  for (int64_t G0 = static_cast<int64_t>(blockIdx.x / kS) * kE; G0 < groups;
       G0 += static_cast<int64_t>(gridDim.x / kS) * kE) {
    const int64_t G = G0 + g;
    const int s = G < groups ? static_cast<int>(G / per_seq) : 0;
    const int64_t P0 = a.seq_start[s], first = a.seq_first[s];
    const int64_t b0 = P0 / R, n_entries = (P0 + a.seq_count[s]) / R - b0;
    const float* st = a.state + (a.state_slot ? a.state_slot[s] : s) * S::kStateFloats;
    // Entries e, e + per_seq, ...: counts above max_count (which only sized the grid) still get every entry.
    // The CTA leaves the round loop together (barriers inside); a cluster's CTAs see the same groups.
    for (int64_t e = G < groups ? G % per_seq : 0;; e += per_seq) {
      const bool live = G < groups && e < n_entries;
      if (!__syncthreads_or(live)) break;
      const int64_t j = b0 + e;  // block index
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (S::kOverlap) {
        if (live) v = pool_overlap<R, HEAD>(a, st, P0, first, j, c);
      } else {
        float4 mx = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY), den = v, num = v;
        if (live) pool_online<R, HEAD>(a, st, P0, first, j, c, rank * (R / kS), (rank + 1) * (R / kS), mx, den, num);
        if constexpr (kS > 1) {
          merge_ranks<kS>(part, rank == 0 && live, mx, den, num);
          if (rank != 0) continue;  // to the next round: the same break decision as rank 0
        }
        if (live) v = make_float4(num.x / den.x, num.y / den.y, num.z / den.z, num.w / den.w);
      }
      uint8_t* row = live ? a.out + (a.out_first[s] + e) * a.out_row_bytes : nullptr;
      finish_entry<R, HEAD>(a, v, live, j, row, c, red);
    }
  }
}

template <int R, int HEAD>
__global__ void __launch_bounds__(128) compressor_state_kernel(CompressorArgs a) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  using S = Shape<R, HEAD>;
  const int s = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= S::W) return;
  const int64_t P0 = a.seq_start[s], first = a.seq_first[s];
  const int n = a.seq_count[s];
  if (n <= 0) return;
  const int64_t P1 = P0 + n, b0 = P0 / R, open = P1 / R, last = open - 1;
  float* st = a.state + (a.state_slot ? a.state_slot[s] : s) * S::kStateFloats;
  if constexpr (S::kOverlap) {
    if (c < HEAD && last >= b0) {  // a block closed in this batch: its first half becomes prev
      float pk[R], ps[R];
      RowRef ref[R];
#pragma unroll
      for (int r = 0; r < R; ++r) ref[r] = locate<R, HEAD>(a, st, P0, first, last * R + r, c);
      load_rows(ref, pk, ps);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        st[2 * R * S::W + r * HEAD + c] = pk[r];
        st[2 * R * S::W + R * HEAD + r * HEAD + c] = ps[r];
      }
    }
  }
  for (int64_t p = max(open * R, P0); p < P1; ++p) {
    const int r = static_cast<int>(p % R);
    const int64_t row = first + (p - P0);
    st[r * S::W + c] = __ldg(a.kv + row * a.row_stride + c);
    st[R * S::W + r * S::W + c] = __ldg(a.gate + row * a.row_stride + c) + __ldg(a.ape + r * S::W + c);
  }
}

template <int R, int HEAD>
void launch(const CompressorArgs& a, cudaStream_t stream) {
  using S = Shape<R, HEAD>;
  constexpr int kE = kEntryThreads / (HEAD / 4);
  const int per_seq = a.max_count / R + 1;  // entries a sequence of max_count tokens can close
  const int64_t groups = static_cast<int64_t>(per_seq) * a.n_seqs;
  const int64_t ctas = std::min<int64_t>((groups + kE - 1) / kE, 1 << 20);  // more groups: the kernel loops
  // Ratio 128 with few entries (a prefill chunk: 2048 tokens close 16): a cluster of 8 CTAs per group of entries
  // (8 = the portable cluster size). Not with many (decode of 1024 sequences: 273.9 against 142.8 us, run 98).
  constexpr int kSplitR = 8;
  bool split = false;
  if constexpr (R == 128) {
    split = groups * kSplitR <= 8 * device_config().sm_count;
    if (split)
      check(launch_cluster(compressor_entries_kernel<R, HEAD, kSplitR>, dim3(static_cast<unsigned>(ctas * kSplitR)),
                           dim3(kEntryThreads), 0, stream, kSplitR, a, per_seq, groups),
            "compressor_entries_kernel launch");
  }
  if (!split)
    check(launch(compressor_entries_kernel<R, HEAD, 1>, dim3(static_cast<unsigned>(ctas)), dim3(kEntryThreads), 0,
                 stream, a, per_seq, groups),
          "compressor_entries_kernel launch");
  dim3 gs((S::W + 127) / 128, static_cast<unsigned>(a.n_seqs));
  check(launch(compressor_state_kernel<R, HEAD>, dim3(gs), dim3(128), 0, stream, a), "compressor_state_kernel launch");
}

}  // namespace

size_t compressor_state_floats(int ratio, int head) {
  const bool ov = ratio == 4;
  const size_t w = (ov ? 2 : 1) * static_cast<size_t>(head);
  return 2 * ratio * w + (ov ? 2 * static_cast<size_t>(ratio) * head : 0);
}

size_t compressor_row_bytes(KvRowFormat format, int head, int fp8_rope_dims, int fp8_scale_block) {
  switch (format) {
    case KvRowFormat::kF32: return 4u * head;
    case KvRowFormat::kBF16: return 2u * head;
    case KvRowFormat::kFP8: {
      const int nope = head - fp8_rope_dims;
      return (nope + 2u * fp8_rope_dims + nope / fp8_scale_block + 7u) / 8u * 8u;
    }
  }
  return 0;
}

void compressor(const CompressorArgs& a, cudaStream_t stream) {
  device_config();
  const bool main512 = a.head == 512 && (a.ratio == 4 || a.ratio == 128);
  const bool index128 = a.head == 128 && a.ratio == 4;
  if (!main512 && !index128)
    fail("cuda::compressor: unsupported shape ratio=", a.ratio, " head=", a.head,
         " (supported: ratio 4 or 128 with head 512, ratio 4 with head 128)");
  const int W = (a.ratio == 4 ? 2 : 1) * a.head;
  if (a.n_seqs < 0 || a.n_seqs > 65535) fail("cuda::compressor: n_seqs=", a.n_seqs, " outside 0..65535");
  if (a.n_seqs == 0) return;
  if (a.max_count < 0) fail("cuda::compressor: max_count=", a.max_count, " is negative");
  if (a.row_stride < W) fail("cuda::compressor: row_stride=", a.row_stride, " is below the width ", W);
  if (a.n_freq < 0 || 2 * a.n_freq > a.head || (a.head - 2 * a.n_freq) % 2 != 0)
    fail("cuda::compressor: n_freq=", a.n_freq, " does not fit head ", a.head);
  if (!a.kv || !a.gate || !a.ape || !a.norm || (a.n_freq && !a.inv_freq) || !a.seq_first || !a.seq_count ||
      !a.seq_start || !a.state || !a.out || !a.out_first)
    fail("cuda::compressor: a required pointer is null");
  const size_t need = compressor_row_bytes(a.format, a.head, a.fp8_rope_dims, a.fp8_scale_block);
  if (a.format == KvRowFormat::kFP8) {
    const int nope = a.head - a.fp8_rope_dims;
    if (a.fp8_rope_dims < 0 || a.fp8_rope_dims % 2 || nope <= 0 || nope % 32 || a.fp8_scale_block <= 0 ||
        a.fp8_scale_block % 32 || a.fp8_scale_block > 128 || nope % a.fp8_scale_block)
      fail("cuda::compressor: unsupported fp8 layout head=", a.head, " rope_dims=", a.fp8_rope_dims,
           " scale_block=", a.fp8_scale_block);
  }
  // The entries kernel reads 4 channels per thread as float4.
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (a.row_stride % 4 || misaligned(a.kv) || misaligned(a.gate) || misaligned(a.ape) || misaligned(a.norm) ||
      misaligned(a.state))
    fail("cuda::compressor: row_stride=", a.row_stride, " must be a multiple of 4 and kv, gate, ape, norm and state ",
         "16-byte aligned (float4 loads)");
  const int align = a.format == KvRowFormat::kF32 ? 4 : 2;
  if (a.out_row_bytes < static_cast<int64_t>(need) || a.out_row_bytes % align ||
      reinterpret_cast<uintptr_t>(a.out) % align)
    fail("cuda::compressor: out_row_bytes=", a.out_row_bytes, " is below the row size ", need,
         " or misaligned (", align, " B)");
  if (a.ratio == 4 && a.head == 512) launch<4, 512>(a, stream);
  else if (a.ratio == 128) launch<128, 512>(a, stream);
  else launch<4, 128>(a, stream);
}

}  // namespace dsv4::cuda
