// Sparse attention on Hopper's warpgroup MMA (sm_90a only; fp8 rows; AttnPrecision kSplitBf16 / kBf16). The same
// contract, inputs and split-K partials as attn_mma_kernel (sparse_attention.cu, which also holds the combine and
// the epilogue); what changes is how the products run:
//
// One CTA of two warpgroups serves all 64 heads of one query over one split of its slots, so every decoded key
// row serves 64 heads (32 in the mma.sync kernel). Per query the 64 heads are exactly one m64 tile:
//  * q (times scale * log2 e, split into bf16 hi + lo as before) sits in shared memory as the A operand, eight
//    64-dim blocks of [64 heads][128 B] in the 128-byte swizzle (backend/cuda/wgmma.cuh).
//  * A tile of 32 gathered fp8 rows is loaded into registers (8-byte loads, two tiles ahead of its use) and decoded
//    once into one of two bf16 tile buffers of eight 64-dim blocks [32 keys][128 B], same swizzle, while the
//    tensor cores compute S of the previous tile. They read each tile twice: K-major as B of S = Q K^T (n = keys,
//    k = dims), and MN-major (imm-trans-b) as B of O += P V (n = dims, k = keys).
//  * Warpgroup w computes the partial S over dims 256 w .. +255 (m64n32k16, A and B from shared memory), the two
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
constexpr int kThreads = 256;                     // two warpgroups
constexpr int kQBytes = kH * kD * 2;              // one bf16 copy of q: 64 KB (8 blocks of 8 KB)
constexpr int kQBlock = kH * 128;                 // 8,192
constexpr int kTileBlock = kN * 128;              // one 64-dim block of the tile: 4,096
constexpr int kTileBytes = 8 * kTileBlock;        // 32,768
constexpr int kScaleOffset = kNope + 2 * (kD - kNope);  // 576: the 7 UE8M0 scales of an fp8 row
constexpr int kXBytes = 2 * 4 * 4 * 32 * 16;      // S partials [warpgroup][warp][n-tile][lane] float4: 16 KB

template <bool kSplit>
constexpr int wgmma_smem_bytes() {  // split: 214,016; bf16: 148,480 (+ 1 KB to align to the swizzle atom)
  return 1024 + (kSplit ? 2 : 1) * kQBytes + 2 * kTileBytes + kXBytes;
}

// This thread's share of one tile of fp8 rows, held in registers from its load (an iteration early) to its decode.
struct RawRow {
  uint2 e[7];     // 8 e4m3 bytes of each of the 7 e4m3 blocks
  uint2 rope[2];  // 16 bytes (8 dims) of the bf16 RoPE dims
  uint2 scales;   // the row's 7 scale bytes (and one byte of padding; rows are >= 584 bytes)
};
static_assert(wgmma_smem_bytes<true>() <= 227 * 1024, "sm_90: 227 KB per block");

// Byte offset of 16-byte chunk c (0..7) of row r inside a 128-byte-row block of the 128-byte swizzle.
__device__ __forceinline__ int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) attn_wgmma_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* qs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles = qs + (kSplit ? 2 : 1) * kQBytes;  // two bf16 tile buffers
  float4* xs = reinterpret_cast<float4*>(tiles + 2 * kTileBytes);
  const SparseAttentionArgs& a = p.a;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup (output dims 256 wg ..), warp in it (heads 16 wq ..)
  const int g = lane >> 2, t = lane & 3;
  const int qi = blockIdx.y, split = blockIdx.x;

  int begin, end;
  slot_range(p, qi, split, begin, end);
  const int32_t* slots = a.slots + static_cast<int64_t>(qi) * a.n_slots;

  // Slot index of row `lane` of the tile at t0 (-1 past the end), loaded one tile ahead of its use.
  auto load_idx = [&](int t0) -> int { return t0 + lane < end ? slots[t0 + lane] : -1; };
  // This thread's share of a tile's rows (row indices idx, one per lane): key r = tid / 8, 8-byte column
  // cc = tid % 8 of each e4m3 block, 16 bytes of the RoPE dims, and the row's scale bytes. row_of returns the
  // valid-row mask (the same in every warp) and the row's address, row 0 standing in for an invalid row
  // (n_rows >= 1 here); load_row then reads it unconditionally. Split in two, and branch-free, because a warp
  // vote or a divergent branch while S's wgmmas are in flight makes ptxas serialize them (C7518).
  const int r = tid >> 3, cc = tid & 7;
  auto row_of = [&](int idx, const uint8_t*& src) -> uint32_t {
    const bool valid = idx >= 0 && idx < a.n_rows;
    const uint32_t mask = __ballot_sync(0xffffffffu, valid);
    const int ridx = __shfl_sync(0xffffffffu, idx, r);
    src = a.kv + static_cast<int64_t>((mask >> r) & 1u ? ridx : 0) * a.row_bytes;
    return mask;
  };
  auto load_row = [&](const uint8_t* src, RawRow& raw) {
#pragma unroll
    for (int b = 0; b < 7; ++b) raw.e[b] = *reinterpret_cast<const uint2*>(src + 64 * b + 8 * cc);
    raw.rope[0] = *reinterpret_cast<const uint2*>(src + kNope + 16 * cc);
    raw.rope[1] = *reinterpret_cast<const uint2*>(src + kNope + 16 * cc + 8);
    raw.scales = *reinterpret_cast<const uint2*>(src + kScaleOffset);  // 7 scales + 1 byte of padding
  };
  // Decodes them into tile buffer `buf`: chunk cc of block b (dims 64 b + 8 cc .. +7) of key r for b = 0..7;
  // invalid rows become zeros (no stale value reaches a wgmma).
  auto decode = [&](const RawRow& raw, uint32_t mask, uint8_t* buf) {
    const uint32_t keep = (mask >> r) & 1u ? 0xffffffffu : 0u;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      uint4 v;
      if (b < 7) {  // e4m3 dims times the block's UE8M0 scale (exact in bf16)
        const uint32_t sw = b < 4 ? raw.scales.x : raw.scales.y;
        const float s = e8m0(static_cast<uint8_t>(sw >> (8 * (b & 3))));
        const uint2 e = raw.e[b];
        v = make_uint4(e4m3x2_bf16(e.x, s), e4m3x2_bf16(e.x >> 16, s), e4m3x2_bf16(e.y, s), e4m3x2_bf16(e.y >> 16, s));
      } else {  // the bf16 RoPE dims, copied
        v = make_uint4(raw.rope[0].x, raw.rope[0].y, raw.rope[1].x, raw.rope[1].y);
      }
      v = make_uint4(v.x & keep, v.y & keep, v.z & keep, v.w & keep);
      *reinterpret_cast<uint4*>(buf + b * kTileBlock + sw128(r, cc)) = v;
    }
  };

  // The first tiles' slot indices and tile 0's rows are requested before q is staged, so that their dependent
  // round trips (slots, then rows) overlap the staging instead of following it (HCA layers have few tiles).
  RawRow raw;
  uint32_t cur_mask = 0, next_mask = 0;
  int next_idx = -1, idx1 = -1;
  const uint8_t* src;
  if (begin < end) {
    const int idx0 = load_idx(begin);
    idx1 = load_idx(begin + kN);
    next_idx = load_idx(begin + 2 * kN);
    cur_mask = row_of(idx0, src);
    load_row(src, raw);
  }

  // q * scale * log2 e as bf16 (hi, lo) into the swizzled A blocks: unit u = (head, 8-dim chunk), units tid +
  // kThreads i. A thread's units are loaded kQBatch at a time, all in flight before the first is converted (one
  // at a time, the loop waited a round trip per unit pair: 8 in the prologue of every CTA).
  {
    constexpr int kUnits = kH * kD / 8 / kThreads, kQBatch = 8;
    static_assert(kUnits * 8 * kThreads == kH * kD && kUnits % kQBatch == 0, "whole batches of q units");
    const float qscale = a.scale * kLog2e;
    const float* q = a.q + static_cast<int64_t>(qi) * kH * kD;
    for (int i0 = 0; i0 < kUnits; i0 += kQBatch) {
      float4 xs0[kQBatch], xs1[kQBatch];
#pragma unroll
      for (int i = 0; i < kQBatch; ++i) {
        const int u = tid + (i0 + i) * kThreads, h = u >> 6, c = u & 63;
        xs0[i] = *reinterpret_cast<const float4*>(q + h * kD + 8 * c);
        xs1[i] = *reinterpret_cast<const float4*>(q + h * kD + 8 * c + 4);
      }
#pragma unroll
      for (int i = 0; i < kQBatch; ++i) {
        const int u = tid + (i0 + i) * kThreads, h = u >> 6, c = u & 63;
        const float4 x0 = xs0[i], x1 = xs1[i];
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
  }

  float o[128];  // o[4 j + c]: head 16 wq + g (c < 2) or + 8, dim 256 wg + 8 j + 2 t + (c & 1)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m[2], l[2];  // rows g and g + 8; l is this lane's share (summed over the quad at the end)
  init_rows(p, 16 * wq + g, t, m, l);

  // Pipeline: tile j is decoded in buffer j % 2 before the barrier that starts its iteration; while its S runs on
  // the tensor cores, the threads decode tile j + 1 (its rows arrived in registers during iteration j - 1) into
  // the other buffer, free since P V of tile j - 1 completed, and load the rows of tile j + 2.
  const uint32_t q_addr = smem_u32(qs);
  if (begin < end) {
    decode(raw, cur_mask, tiles);
    next_mask = row_of(idx1, src);
    load_row(src, raw);
  }
  int buf = 0;
  for (int t0 = begin; t0 < end; t0 += kN, buf ^= 1) {
    const uint32_t mask = cur_mask;
    const uint32_t tile_addr = smem_u32(tiles + buf * kTileBytes);
    const uint32_t mask2 = row_of(next_idx, src);  // tile j + 2 (loaded after S is issued)
    wgmma::fence_proxy_async();  // tile j (and, the first time, q) visible to the tensor cores
    __syncthreads();
    // Partial S over this warpgroup's dims: 4 blocks x 4 k-steps (x hi, lo). A tile with no valid row is skipped
    // (uniform over the CTA), but the next one is still decoded.
    float sacc[16];
    if (mask != 0) {
      wgmma::fence();
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int blk = 4 * wg + kb;
          const uint64_t kdesc = wgmma::sw128_desc(tile_addr + blk * kTileBlock + 32 * ks);
          const uint32_t qa = q_addr + blk * kQBlock + 32 * ks;
          wgmma::mma_ss_n32_bf16(sacc, wgmma::sw128_desc(qa), kdesc, kb | ks);  // the first overwrites sacc
          if (kSplit) wgmma::mma_ss_n32_bf16(sacc, wgmma::sw128_desc(qa + kQBytes), kdesc, 1);
        }
      wgmma::commit();
    }
    // Tile j + 1 into the other buffer, the rows of j + 2 into registers (past the end: masks of 0, row 0 read).
    decode(raw, next_mask, tiles + (buf ^ 1) * kTileBytes);
    load_row(src, raw);
    cur_mask = next_mask;
    next_mask = mask2;
    next_idx = load_idx(t0 + 3 * kN);
    if (mask == 0) continue;
    wgmma::wait0();
#pragma unroll
    for (int i = 0; i < 16; ++i) wgmma::fence_operand(sacc[i]);
    // Exchange: S = (partial of dims 0..255) + (partial of dims 256..511), the same two addends in both warpgroups.
    {
      float4* mine = xs + (wg * 4 + wq) * 4 * 32 + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        mine[j * 32] = make_float4(sacc[4 * j], sacc[4 * j + 1], sacc[4 * j + 2], sacc[4 * j + 3]);
    }
    __syncthreads();
    float s[4][4];
    {
      const float4* other = xs + ((1 - wg) * 4 + wq) * 4 * 32 + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 x = other[j * 32];
        const float4 lo = wg == 0 ? make_float4(sacc[4 * j], sacc[4 * j + 1], sacc[4 * j + 2], sacc[4 * j + 3]) : x;
        const float4 hi = wg == 0 ? x : make_float4(sacc[4 * j], sacc[4 * j + 1], sacc[4 * j + 2], sacc[4 * j + 3]);
        s[j][0] = lo.x + hi.x;
        s[j][1] = lo.y + hi.y;
        s[j][2] = lo.z + hi.z;
        s[j][3] = lo.w + hi.w;
      }
    }

    // Online softmax (base 2), then P as A fragments (k = keys 16 kk .. +15) and O += P V over this warpgroup's
    // 256 dims; the tile's keys 16 kk .. start 2048 kk bytes into each block, the four blocks of the dims 4096
    // bytes apart (LBO).
    float alpha[2];
    if (softmax_tile(s, mask, t, m, l, alpha)) {
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
      }
    }
    uint32_t ph[2][4], pl[kSplit ? 2 : 1][4];
    p_frags<kSplit>(s, ph, pl);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint64_t vdesc = wgmma::sw128_desc(tile_addr + 4 * wg * kTileBlock + 2048 * kk, kTileBlock);
      wgmma::mma_rs<256, false, 1>(o, ph[kk], vdesc);
      if (kSplit) wgmma::mma_rs<256, false, 1>(o, pl[kk % (kSplit ? 2 : 1)], vdesc);
    }
    wgmma::commit();
    // Waited here, not at the next tile's barrier: an o pipeline stage open across the loop's back edge makes
    // ptxas serialize every wgmma (C7515). The next tile's decode overwrites the tile anyway.
    wgmma::wait0();
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma::fence_operand(o[i]);
  }

  store_result<32>(p, qi, split, 16 * wq + g, 256 * wg + 2 * t, m, l, wg == 0 && t == 0,
                   [&](int n, int c) { return o[4 * n + c]; });
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
