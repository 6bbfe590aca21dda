// KV compressor (spec dsv4-model.md 2.4; reference cpu::compressor_push, then RMSNorm, RoPE at the block start
// and KvCodec::encode as in engine/attention.cc run_compressor). State layout: kernels_compressor_mhc.h.
//
// Two launches, in stream order:
//  1. entries: one CTA of `head` threads per (closed block, sequence); thread c owns channel c. It gathers the
//     block's rows from the batch (score = gate + ape) or, for rows before the batch start, from the state slot,
//     runs the per-channel gated softmax (ratio 4: 4 previous-block first-half rows + 4 current second-half rows,
//     block 0 has no previous rows; ratio 128: online softmax in chunks of 8 rows), then RMSNorm (block
//     reduction), RoPE (pair partner by warp shuffle) and the storage encoding (fp8 scale = max over the 64- or
//     128-wide scale block via shared memory). Ratio 128 with few entries splits a block's rows over a cluster
//     of 8 CTAs (one CTA per block left a 2048-token chunk 16 CTAs); each CTA's (max, sum, weighted sum) per
//     channel goes to rank 0 through distributed shared memory, which merges them in rank order and finishes.
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

// Row at position p, channel ch, of the sequence whose batch starts at P0 (block b0 = P0 / R).
template <int R, int HEAD>
__device__ __forceinline__ void fetch(const CompressorArgs& a, const float* st, int64_t P0, int64_t first, int64_t p,
                                      int ch, float& kv, float& sc) {
  using S = Shape<R, HEAD>;
  const int r = static_cast<int>(p % R);
  if (p >= P0) {
    const int64_t row = first + (p - P0);
    kv = __ldg(a.kv + row * a.row_stride + ch);
    sc = __ldg(a.gate + row * a.row_stride + ch) + __ldg(a.ape + r * S::W + ch);
  } else if (p / R == P0 / R) {  // open block at batch start
    kv = st[r * S::W + ch];
    sc = st[R * S::W + r * S::W + ch];
  } else {  // overlap: previous block's first half
    kv = st[2 * R * S::W + r * HEAD + ch];
    sc = st[2 * R * S::W + R * HEAD + r * HEAD + ch];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

namespace cg = cooperative_groups;

// kS CTAs per entry: with kS > 1 (ratio 128, few entries) a block's rows are split over a cluster.
template <int R, int HEAD, int kS>
__global__ void __launch_bounds__(HEAD) compressor_entries_kernel(CompressorArgs a) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  using S = Shape<R, HEAD>;
  static_assert(kS == 1 || R % (8 * kS) == 0, "whole chunks of 8 rows per CTA");
  constexpr int kWarps = HEAD / 32;
  __shared__ float red[kWarps];
  __shared__ float part[kS > 1 ? 3 * HEAD : 1];  // this CTA's (max, sum, weighted sum) per channel
  const int rank = kS > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int s = blockIdx.y, c = threadIdx.x, lane = c & 31, warp = c >> 5;
  const int64_t P0 = a.seq_start[s], first = a.seq_first[s];
  const int n = a.seq_count[s];
  const int64_t b0 = P0 / R, n_entries = (P0 + n) / R - b0;
  const float* st = a.state + (a.state_slot ? a.state_slot[s] : s) * S::kStateFloats;
  const int nope = HEAD - a.fp8_rope_dims;
  const int rope0 = HEAD - 2 * a.n_freq;

  for (int64_t e = blockIdx.x / kS; e < n_entries; e += gridDim.x / kS) {  // every CTA of a cluster: the same e
    const int64_t j = b0 + e;  // block index
    float v;
    if constexpr (S::kOverlap) {
      // Same order as the CPU: max over all rows, then the sums (previous block first).
      float kv[2 * R], sc[2 * R];
      const int np = j > 0 ? R : 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < np) fetch<R, HEAD>(a, st, P0, first, (j - 1) * R + r, c, kv[r], sc[r]);
        else kv[r] = 0.f, sc[r] = -INFINITY;
        fetch<R, HEAD>(a, st, P0, first, j * R + r, HEAD + c, kv[R + r], sc[R + r]);
      }
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < 2 * R; ++r) mx = fmaxf(mx, sc[r]);
      float den = 0.f, num = 0.f;
#pragma unroll
      for (int r = 0; r < 2 * R; ++r) {
        const float w = (r < R && r >= np) ? 0.f : expf(sc[r] - mx);
        den += w;
        num += w * kv[r];
      }
      v = num / den;
    } else {
      // Online softmax over this CTA's R / kS rows, 8 loads of each array in flight per thread.
      float mx = -INFINITY, den = 0.f, num = 0.f;
      for (int r0 = rank * (R / kS); r0 < (rank + 1) * (R / kS); r0 += 8) {
        float kv[8], sc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) fetch<R, HEAD>(a, st, P0, first, j * R + r0 + i, c, kv[i], sc[i]);
        float cm = sc[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) cm = fmaxf(cm, sc[i]);
        const float nm = fmaxf(mx, cm);
        if (nm > -INFINITY) {
          const float f = expf(mx - nm);  // 0 when mx = -inf
          den *= f;
          num *= f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float w = expf(sc[i] - nm);
            den += w;
            num += w * kv[i];
          }
          mx = nm;
        }
      }
      if constexpr (kS > 1) {
        part[c] = mx, part[HEAD + c] = den, part[2 * HEAD + c] = num;
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();  // every rank's partials are written
        if (rank == 0) {  // merge in rank order (rank 0's own first)
          float pm[kS], pd[kS], pn[kS];
#pragma unroll
          for (int q = 0; q < kS; ++q) {
            const float* rp = cluster.map_shared_rank(part, q);
            pm[q] = rp[c], pd[q] = rp[HEAD + c], pn[q] = rp[2 * HEAD + c];
          }
          float m = pm[0];
#pragma unroll
          for (int q = 1; q < kS; ++q) m = fmaxf(m, pm[q]);
          den = 0.f, num = 0.f;
#pragma unroll
          for (int q = 0; q < kS; ++q) {
            const float f = pm[q] > -INFINITY ? expf(pm[q] - m) : 0.f;  // a rank whose rows all scored -inf
            den += f * pd[q];
            num += f * pn[q];
          }
        }
        cluster.sync();  // rank 0 has read every rank's partials (they are rewritten for the next entry)
        if (rank != 0) continue;
      }
      v = num / den;
    }

    // RMSNorm over the head (fixed-order reduction: deterministic).
    float ss = warp_sum(v * v);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ss += red[w];
    const float rs = 1.0f / sqrtf(ss / HEAD + a.eps);
    float y = __ldg(a.norm + c) * (v * rs);

    // RoPE at the block's first position; pairs (2i, 2i+1) are adjacent lanes.
    const float partner = __shfl_xor_sync(0xffffffffu, y, 1);
    if (c >= rope0) {
      const int i = (c - rope0) >> 1;
      const float angle = static_cast<float>(j * R) * __ldg(a.inv_freq + i);
      const float cs = cosf(angle), sn = sinf(angle);
      y = (c & 1) ? y * cs + partner * sn : y * cs - partner * sn;
    }

    uint8_t* row = a.out + (a.out_first[s] + e) * a.out_row_bytes;
    if (a.format == KvRowFormat::kF32) {
      reinterpret_cast<float*>(row)[c] = y;
    } else if (a.format == KvRowFormat::kBF16) {
      reinterpret_cast<__nv_bfloat16*>(row)[c] = __float2bfloat16_rn(y);
    } else {
      __syncthreads();  // red[] reuse
      const float am = warp_max(c < nope ? fabsf(y) : 0.f);
      if (lane == 0) red[warp] = am;
      __syncthreads();
      const int rope_d = a.fp8_rope_dims, blk = a.fp8_scale_block;
      if (c < nope) {
        const int b = c / blk, wpb = blk / 32;
        float amax = 1e-4f;
        for (int w = b * wpb; w < (b + 1) * wpb; ++w) amax = fmaxf(amax, red[w]);
        const int ex = static_cast<int>(ceilf(log2f(amax / 448.0f)));
        const float scale = ldexpf(1.0f, ex);
        row[c] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(y / scale, __NV_SATFINITE, __NV_E4M3));
        if (c % blk == 0) row[nope + 2 * rope_d + b] = static_cast<uint8_t>(ex + 127);
      } else {
        reinterpret_cast<__nv_bfloat16*>(row + nope)[c - nope] = __float2bfloat16_rn(y);
      }
      const int used = nope + 2 * rope_d + nope / blk;
      const int total = (used + 7) / 8 * 8;
      if (c < total - used) row[used + c] = 0;
    }
    __syncthreads();  // red[] reuse in the next entry
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
#pragma unroll
      for (int r = 0; r < R; ++r) fetch<R, HEAD>(a, st, P0, first, last * R + r, c, pk[r], ps[r]);
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
  const int per_seq = a.max_count / R + 1;  // entries a sequence of max_count tokens can close
  const int entries = std::min(per_seq, 65535);
  // Ratio 128 with few entries (a prefill chunk: 2048 tokens close 16): a cluster of 8 CTAs per entry (8 = the
  // portable cluster size). Not with many (decode of 1024 sequences: 273.9 against 142.8 us, run 98).
  constexpr int kSplitR = 8;
  bool split = false;
  if constexpr (R == 128) {
    split = static_cast<int64_t>(entries) * a.n_seqs * kSplitR <= 4 * device_config().sm_count;
    if (split) {
      const dim3 ge(static_cast<unsigned>(entries * kSplitR), static_cast<unsigned>(a.n_seqs));
      check(launch_cluster(compressor_entries_kernel<R, HEAD, kSplitR>, ge, dim3(HEAD), 0, stream, kSplitR, a),
            "compressor_entries_kernel launch");
    }
  }
  if (!split) {
    const dim3 ge(static_cast<unsigned>(entries), static_cast<unsigned>(a.n_seqs));
    check(launch(compressor_entries_kernel<R, HEAD, 1>, ge, dim3(HEAD), 0, stream, a),
          "compressor_entries_kernel launch");
  }
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
        a.fp8_scale_block % 32 || nope % a.fp8_scale_block)
      fail("cuda::compressor: unsupported fp8 layout head=", a.head, " rope_dims=", a.fp8_rope_dims,
           " scale_block=", a.fp8_scale_block);
  }
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
