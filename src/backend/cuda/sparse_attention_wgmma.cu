// Sparse attention on Hopper's warpgroup MMA (sm_90a only; fp8 rows; AttnPrecision kSplitBf16 / kBf16). The same
// contract, inputs and split-K partials as attn_mma_kernel (sparse_attention.cu, which also holds the combine and
// the epilogue); what changes is how the products run:
//
// One CTA serves all 64 heads of one query over one split of its slots, so every decoded key row serves 64 heads
// (32 in the mma.sync kernel). Per query the 64 heads are exactly one m64 tile. Three warpgroups, specialized
// (setmaxnreg moves registers from the producer to the consumers):
//  * q (times scale * log2 e, split into bf16 hi + lo as before) sits in shared memory as the A operand, eight
//    64-dim blocks of [64 heads][128 B] in the 128-byte swizzle (backend/cuda/wgmma.cuh).
//  * The producer warpgroup gathers tile j of 32 fp8 rows into registers (8-byte loads, issued before it waits for
//    a free buffer) and decodes it into bf16 tile buffer j % 2, eight 64-dim blocks [32 keys][128 B], same
//    swizzle; named barriers hand buffers between it and the consumers (full / empty). The tensor cores read each
//    tile twice: K-major as B of S = Q K^T (n = keys, k = dims), and MN-major (imm-trans-b) as B of O += P V
//    (n = dims, k = keys).
//  * Consumer warpgroup w computes the partial S over dims 256 w .. +255 (m64n32k16, A and B from shared memory), the two
//    partials are exchanged through shared memory and added (the same sum in both warpgroups, so both hold
//    identical scores, maxima and sums), both run the online softmax on the 64 x 32 scores, and warpgroup w adds
//    P V for its 256 output dims (m64n256k16, P taken from the S accumulators as A fragments in registers, the
//    FA2 / FA3 register reuse: two n8 tiles of the accumulator are one k16 A fragment).
// Warp i of a warpgroup holds heads 16 i .. +15 (wgmma's accumulator rows), thread (g, t) of it rows g and g + 8
// and columns 2t, 2t + 1 of every n8 tile, as in the mma.sync kernel, so the softmax code is the same.
//
// Shared memory (split): q 128 KB + two tiles 64 KB + S exchange 16 KB = 208 KB (+ 1 KB of alignment): sm_90's
// 227 KB, not sm_12x's 99 KB, which keep the mma.sync kernel. Numerics as attn_mma_kernel: the bounds in
// tests/cuda/test_cuda_sparse_attention.cc apply unchanged (the sum order of S over dims differs, so results are
// not bit-identical to the mma.sync kernel, but are to themselves: fixed order, no atomics).
#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sparse_attention_common.cuh"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace dsv4::cuda::attn {
namespace {

constexpr int kN = 32;                            // keys per tile
constexpr int kThreads = 384;                     // two consumer warpgroups and one producer
// Registers per thread after setmaxnreg: the consumers hold o (128) and the S fragments, the producer one tile's
// share of raw rows. The CTA starts with 168 per thread (65536 / 384, rounded down to 8); what the producer gives
// back, 128 x (168 - 72), is what the consumers take, 256 x (216 - 168).
constexpr int kConsumerRegs = 216, kProducerRegs = 72;
static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "register pool");
constexpr int kQBytes = kH * kD * 2;              // one bf16 copy of q: 64 KB (8 blocks of 8 KB)
constexpr int kQBlock = kH * 128;                 // 8,192
constexpr int kTileBlock = kN * 128;              // one 64-dim block of the tile: 4,096
constexpr int kTileBytes = 8 * kTileBlock;        // 32,768
constexpr int kScaleOffset = kNope + 2 * (kD - kNope);  // 576: the 7 UE8M0 scales of an fp8 row
constexpr int kXBytes = 2 * 4 * 4 * 32 * 16;      // S partials [warpgroup][warp][n-tile][lane] float4: 16 KB

template <bool kSplit>
constexpr int wgmma_smem_bytes() {  // split: 214,016; bf16: 148,480 (+ 1 KB to align to the swizzle atom)
  return 1024 + (kSplit ? 2 : 1) * kQBytes + 2 * kTileBytes + kXBytes + 16;  // + the two tiles' masks
}

// This thread's share of one tile of fp8 rows, held in registers from its load (one tile ahead) to its decode.
struct RawRow {
  uint2 e[7];     // 8 e4m3 bytes of each of the 7 e4m3 blocks
  uint2 rope[2];  // 16 bytes (8 dims) of the bf16 RoPE dims
  uint2 scales;   // the row's 7 scale bytes (and one byte of padding; rows are >= 584 bytes); [0] only
};
static_assert(wgmma_smem_bytes<true>() <= 227 * 1024, "sm_90: 227 KB per block");

// Byte offset of 16-byte chunk c (0..7) of row r inside a 128-byte-row block of the 128-byte swizzle.
__device__ __forceinline__ int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Named barriers (id 0 is __syncthreads): tile buffer b full (producer arrives, consumers wait) and empty
// (consumers arrive, producer waits), all 384 threads; the consumers' S exchange, 256 threads.
constexpr int kBarFull = 1, kBarEmpty = 3, kBarExchange = 5;
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) attn_wgmma_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* qs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles = qs + (kSplit ? 2 : 1) * kQBytes;  // two bf16 tile buffers
  float4* xs = reinterpret_cast<float4*>(tiles + 2 * kTileBytes);
  uint32_t* tile_mask = reinterpret_cast<uint32_t*>(xs + kXBytes / 16);  // valid rows of each buffer's tile
  const SparseAttentionArgs& a = p.a;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qi = blockIdx.y, split = blockIdx.x;

  // q * scale * log2 e as bf16 (hi, lo) into the swizzled A blocks, by all threads: unit u = (head, 8-dim chunk).
  {
    const float qscale = a.scale * kLog2e;
    const float* q = a.q + static_cast<int64_t>(qi) * kH * kD;
    for (int u = tid; u < kH * kD / 8; u += kThreads) {
      const int h = u >> 6, c = u & 63;
      const float4 x0 = *reinterpret_cast<const float4*>(q + h * kD + 8 * c);
      const float4 x1 = *reinterpret_cast<const float4*>(q + h * kD + 8 * c + 4);
      uint4 hi, lo;
      to_frag<kSplit>(x0.x * qscale, x0.y * qscale, hi.x, lo.x);
      to_frag<kSplit>(x0.z * qscale, x0.w * qscale, hi.y, lo.y);
      to_frag<kSplit>(x1.x * qscale, x1.y * qscale, hi.z, lo.z);
      to_frag<kSplit>(x1.z * qscale, x1.w * qscale, hi.w, lo.w);
      const int off = (c >> 3) * kQBlock + sw128(h, c & 7);
      *reinterpret_cast<uint4*>(qs + off) = hi;
      if (kSplit) *reinterpret_cast<uint4*>(qs + kQBytes + off) = lo;
    }
  }
  wgmma::fence_proxy_async();  // q visible to the tensor cores
  __syncthreads();

  int end = a.valid_len ? min(a.valid_len[qi], a.n_slots) : a.n_slots;
  const int begin = split * p.chunk;
  end = min(end, begin + p.chunk);
  const int n_tiles = end > begin ? (end - begin + kN - 1) / kN : 0;

  if (warp >= 8) {
    // ---- producer warpgroup: gathers and decodes tile j into buffer j % 2 once the consumers freed it ----------
    wgmma::setmaxnreg_dec<kProducerRegs>();
    const int32_t* slots = a.slots + static_cast<int64_t>(qi) * a.n_slots;
    const int ptid = tid - 256, r = ptid >> 2, c4 = ptid & 3;  // key r; 8-byte columns c4 and c4 + 4 of each block
    // Row index of key `lane` of tile j (-1 past the end or invalid).
    auto row_index = [&](int j) -> int {
      const int i = begin + j * kN + lane;
      const int idx = i < end ? slots[i] : -1;
      return idx >= 0 && idx < a.n_rows ? idx : -1;
    };
    RawRow raw[2];  // columns c4 and c4 + 4 of key r of the next tile
    uint32_t mask = 0;
    auto load = [&](int j) {
      const int idx = row_index(j);
      mask = __ballot_sync(0xffffffffu, idx >= 0);
      const int ridx = __shfl_sync(0xffffffffu, idx, r);
      if (ridx >= 0) {
        const uint8_t* src = a.kv + static_cast<int64_t>(ridx) * a.row_bytes;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int cc = c4 + 4 * h;
#pragma unroll
          for (int b = 0; b < 7; ++b) raw[h].e[b] = *reinterpret_cast<const uint2*>(src + 64 * b + 8 * cc);
          raw[h].rope[0] = *reinterpret_cast<const uint2*>(src + kNope + 16 * cc);
          raw[h].rope[1] = *reinterpret_cast<const uint2*>(src + kNope + 16 * cc + 8);
        }
        raw[0].scales = *reinterpret_cast<const uint2*>(src + kScaleOffset);  // 7 scales + 1 byte of padding
      }
    };
    if (n_tiles > 0) load(0);
    for (int j = 0; j < n_tiles; ++j) {
      const int b = j & 1;
      if (j >= 2) bar_sync(kBarEmpty + b, kThreads);  // the consumers are done with tile j - 2
      uint8_t* buf = tiles + b * kTileBytes;
      const bool valid = (mask >> r) & 1u;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cc = c4 + 4 * h;
#pragma unroll
        for (int blk = 0; blk < 8; ++blk) {
          uint4 v = make_uint4(0, 0, 0, 0);
          if (valid) {
            if (blk < 7) {  // e4m3 dims times the block's UE8M0 scale (exact in bf16)
              const uint32_t sw = blk < 4 ? raw[0].scales.x : raw[0].scales.y;
              const float sc = e8m0(static_cast<uint8_t>(sw >> (8 * (blk & 3))));
              const uint2 e = raw[h].e[blk];
              v = make_uint4(e4m3x2_bf16(e.x, sc), e4m3x2_bf16(e.x >> 16, sc), e4m3x2_bf16(e.y, sc),
                             e4m3x2_bf16(e.y >> 16, sc));
            } else {  // the bf16 RoPE dims, copied
              v = make_uint4(raw[h].rope[0].x, raw[h].rope[0].y, raw[h].rope[1].x, raw[h].rope[1].y);
            }
          }
          *reinterpret_cast<uint4*>(buf + blk * kTileBlock + sw128(r, cc)) = v;  // invalid rows: zeros
        }
      }
      if (ptid == 0) tile_mask[b] = mask;
      wgmma::fence_proxy_async();  // the tile visible to the tensor cores
      bar_arrive(kBarFull + b, kThreads);
      if (j + 1 < n_tiles) load(j + 1);  // in flight while this warp waits for the next free buffer
    }
    return;
  }

  // ---- consumer warpgroups ---------------------------------------------------------------------------------------
  wgmma::setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup (output dims 256 wg ..), warp in it (heads 16 wq ..)
  const int g = lane >> 2, t = lane & 3;
  float o[128];  // o[4 j + c]: head 16 wq + g (c < 2) or + 8, dim 256 wg + 8 j + 2 t + (c & 1)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m[2], l[2];  // rows g and g + 8; l is this lane's share (summed over the quad at the end)
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    if (p.splits == 1) {  // the sink takes part directly: m = sink, l = exp(sink - m) = 1 (held by lane t = 0)
      const float sk = a.sink[16 * wq + g + 8 * ri];
      m[ri] = sk == -INFINITY ? -INFINITY : sk * kLog2e;
      l[ri] = (sk != -INFINITY && t == 0) ? 1.f : 0.f;
    } else {
      m[ri] = -INFINITY;
      l[ri] = 0.f;
    }
  }

  const uint32_t q_addr = smem_u32(qs);
  for (int j = 0; j < n_tiles; ++j) {
    const int b = j & 1;
    bar_sync(kBarFull + b, kThreads);  // tile j decoded in buffer b
    const uint32_t mask = tile_mask[b];
    const uint32_t tile_addr = smem_u32(tiles + b * kTileBytes);
    if (mask != 0) {  // uniform over the CTA
      // Partial S over this warpgroup's dims: 4 blocks x 4 k-steps (x hi, lo).
      float sacc[16];
      wgmma::fence();
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int blk = 4 * wg + kb;
          const uint64_t kdesc = wgmma::sw128_desc(tile_addr + blk * kTileBlock + 32 * ks);
          wgmma::mma_ss_n32_bf16(sacc, wgmma::sw128_desc(q_addr + blk * kQBlock + 32 * ks), kdesc, kb | ks);
          if (kSplit)
            wgmma::mma_ss_n32_bf16(sacc, wgmma::sw128_desc(q_addr + kQBytes + blk * kQBlock + 32 * ks), kdesc, 1);
        }
      wgmma::commit();
      wgmma::wait0();
#pragma unroll
      for (int i = 0; i < 16; ++i) wgmma::fence_operand(sacc[i]);
      // Exchange: S = (partial of dims 0..255) + (partial of dims 256..511), the same addends in both warpgroups.
      {
        float4* mine = xs + (wg * 4 + wq) * 4 * 32 + lane;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          mine[jj * 32] = make_float4(sacc[4 * jj], sacc[4 * jj + 1], sacc[4 * jj + 2], sacc[4 * jj + 3]);
      }
      bar_sync(kBarExchange, 256);
      float s[4][4];
      {
        const float4* other = xs + ((1 - wg) * 4 + wq) * 4 * 32 + lane;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const float4 x = other[jj * 32];
          const float4 me = make_float4(sacc[4 * jj], sacc[4 * jj + 1], sacc[4 * jj + 2], sacc[4 * jj + 3]);
          const float4 lo = wg == 0 ? me : x, hi = wg == 0 ? x : me;
          s[jj][0] = lo.x + hi.x;
          s[jj][1] = lo.y + hi.y;
          s[jj][2] = lo.z + hi.z;
          s[jj][3] = lo.w + hi.w;
        }
      }

      // Online softmax (base 2), as attn_mma_kernel. c = 0, 1: row g; c = 2, 3: row g + 8; key 8 jj + 2 t + (c & 1).
      float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if ((mask >> (8 * jj + 2 * t + (c & 1))) & 1u) mt[c >> 1] = fmaxf(mt[c >> 1], s[jj][c]);
      float alpha[2], mn[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        mt[ri] = fmaxf(mt[ri], __shfl_xor_sync(0xffffffffu, mt[ri], 1));
        mt[ri] = fmaxf(mt[ri], __shfl_xor_sync(0xffffffffu, mt[ri], 2));
        mn[ri] = fmaxf(m[ri], mt[ri]);
        alpha[ri] = mn[ri] == -INFINITY ? 1.f : fast_exp2(m[ri] - mn[ri]);
        m[ri] = mn[ri];
      }
      float rs[2] = {0.f, 0.f};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const bool v = ((mask >> (8 * jj + 2 * t + (c & 1))) & 1u) && mn[c >> 1] != -INFINITY;
          s[jj][c] = v ? fast_exp2(s[jj][c] - mn[c >> 1]) : 0.f;
          rs[c >> 1] += s[jj][c];
        }
      l[0] = l[0] * alpha[0] + rs[0];
      l[1] = l[1] * alpha[1] + rs[1];
      if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {  // the max moved: rescale
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
          o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
        }
      }
      // P as A fragments (k = keys 16 kk .. +15), then O += P V over this warpgroup's 256 dims; the tile's keys
      // 16 kk .. start 2048 kk bytes into each block, the four blocks of the dims 4096 bytes apart (LBO).
      uint32_t ph[2][4], pl[kSplit ? 2 : 1][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t dummy;
        to_frag<kSplit>(s[2 * kk][0], s[2 * kk][1], ph[kk][0], kSplit ? pl[kk % (kSplit ? 2 : 1)][0] : dummy);
        to_frag<kSplit>(s[2 * kk][2], s[2 * kk][3], ph[kk][1], kSplit ? pl[kk % (kSplit ? 2 : 1)][1] : dummy);
        to_frag<kSplit>(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[kk][2], kSplit ? pl[kk % (kSplit ? 2 : 1)][2] : dummy);
        to_frag<kSplit>(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[kk][3], kSplit ? pl[kk % (kSplit ? 2 : 1)][3] : dummy);
      }
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint64_t vdesc = wgmma::sw128_desc(tile_addr + 4 * wg * kTileBlock + 2048 * kk, kTileBlock);
        wgmma::mma_rs_n256_bf16_tb(o, ph[kk], vdesc);
        if (kSplit) wgmma::mma_rs_n256_bf16_tb(o, pl[kk % (kSplit ? 2 : 1)], vdesc);
      }
      wgmma::commit();
      wgmma::wait0();  // within the iteration: an o stage open across the back edge serializes the wgmmas (C7515)
#pragma unroll
      for (int i = 0; i < 128; ++i) wgmma::fence_operand(o[i]);
    }
    if (j + 2 < n_tiles) bar_arrive(kBarEmpty + b, kThreads);  // buffer b free for tile j + 2
  }

#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 1);
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 2);
  }
  const int h0 = 16 * wq + g, d0 = 256 * wg + 2 * t;
  if (p.splits == 1) {
    float* o0 = a.out + (static_cast<int64_t>(qi) * kH + h0) * kD + d0;
    float* o1 = o0 + 8 * kD;
    const float i0 = l[0] > 0.f ? 1.f / l[0] : 0.f, i1 = l[1] > 0.f ? 1.f / l[1] : 0.f;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<float2*>(o0 + 8 * n) = make_float2(o[4 * n] * i0, o[4 * n + 1] * i0);
      *reinterpret_cast<float2*>(o1 + 8 * n) = make_float2(o[4 * n + 2] * i1, o[4 * n + 3] * i1);
    }
  } else {
    const int64_t pi = (static_cast<int64_t>(qi) * p.splits + split) * kH + h0;
    float* o0 = p.part_acc + pi * kD + d0;
    float* o1 = o0 + 8 * kD;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<float2*>(o0 + 8 * n) = make_float2(o[4 * n], o[4 * n + 1]);
      *reinterpret_cast<float2*>(o1 + 8 * n) = make_float2(o[4 * n + 2], o[4 * n + 3]);
    }
    if (wg == 0 && t == 0) {
      p.part_ml[2 * pi] = m[0];
      p.part_ml[2 * pi + 1] = l[0];
      p.part_ml[2 * (pi + 8)] = m[1];
      p.part_ml[2 * (pi + 8) + 1] = l[1];
    }
  }
#else
  __trap();  // launched only on compute capability 9.0 (wgmma_supported)
#endif
}

template <bool kSplit>
void launch_kernel(const Params& p, cudaStream_t stream) {
  constexpr int smem = wgmma_smem_bytes<kSplit>();
  static const bool configured = [] {
    check(cudaFuncSetAttribute(attn_wgmma_kernel<kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "sparse_attention (wgmma): shared-memory opt-in");
    return true;
  }();
  (void)configured;
  check(launch(attn_wgmma_kernel<kSplit>, dim3(p.splits, p.a.n_queries), dim3(kThreads), smem, stream, p),
        "attn_wgmma_kernel launch");
}

}  // namespace

bool wgmma_supported() { return device_config().major == 9 && device_config().minor == 0; }

void launch_wgmma(const Params& p, bool split, cudaStream_t stream) {
  if (!wgmma_supported()) fail("cuda::sparse_attention: the wgmma kernel needs compute capability 9.0");
  if (p.a.format != KvRowFormat::kFP8) fail("cuda::sparse_attention: the wgmma kernel reads fp8 rows only");
  split ? launch_kernel<true>(p, stream) : launch_kernel<false>(p, stream);
}

}  // namespace dsv4::cuda::attn
