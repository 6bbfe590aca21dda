// Lightning-indexer scores on Hopper's FP8 warpgroup MMA (sm_90a only; FP8 keys; IndexerArgs::fp8_q). The same
// inputs, outputs and addressing as the streaming kernel (indexer.cu); what changes is q's precision and the MMA:
//
//  * q is quantized per (query, head) as DeepSeek's act_quant does with a block of 128 (the vLLM / DeepGEMM
//    indexer numerics): e = ceil(log2(max(amax, 1e-4) / 448)), codes = e4m3(q * 2^-e) (round to nearest even,
//    saturating), the same as cpu::act_quant_e4m3(q_h, 128, 128). The power of two is folded into the head
//    weight: w'_h = w_h * 2^e, since ReLU(2^e x) = 2^e ReLU(x).
//  * Keys as M, queries' heads as N: the wgmma m64 N k32 e4m3 (N = 64 kQ) takes 64 keys (A: the tile of key rows,
//    exactly as stored, 128 B each) against kQ queries x 64 heads (B: q codes), K = the 128 dims in 4 steps, both
//    operands K-major from shared memory in the 128-byte swizzle (backend/cuda/wgmma.cuh). Thread (warp w, lane
//    4g + c) then holds keys 16w + g and 16w + g + 8 against heads 8j + 2c + {0, 1} of every n8 block j, so the
//    head sum is 16 products per (key, query) in the thread plus two shuffles over c: no shared-memory reduction.
//  * Score = s_key * d^-0.5 * sum_h w'_h ReLU(acc_h): the key's UE8M0 scale also commutes with the ReLU.
//  * Each warpgroup streams its own run of 64-key tiles through a ring of kStages stages (cp.async, 8- or 16-byte
//    pieces//    in the swizzled order, zero-filled past the visible keys), one named barrier per tile. Two warpgroups per
//    CTA share q; while one runs its epilogue the other's MMAs run.
//  * kQ = 4 (prefill: consecutive queries over the same key rows) or 1 (decode: every query its own keys). A CTA
//    of kQ queries loads a tile once for all queries whose key rows coincide (equal key_offset; block tables only
//    with kQ = 1); queries with other offsets are served in further passes, so the result never depends on how
//    queries were grouped.
// Error (tests/cuda/test_cuda_indexer.cc): against cpu::indexer_scores_fp8 run on the dequantized codes (q'' =
// code * 2^e), products of two e4m3 values are exact and the tensor cores keep ~14 bits of each k32 running sum:
// |I - I_ref| <= 2^-10 d^-0.5 sum_h |w_h| sum_d |q''_hd k_td| (a margin of ~4x over 4 instructions at 2^-13 each).
// Deterministic: fixed summation order, no atomics.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_wgmma.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace dsv4::cuda::idx {
namespace {
using namespace ptx;

constexpr int kH = kIndexerHeads;          // 64
constexpr int kD = kIndexerDim;            // 128 = one 128-byte swizzled row of e4m3
constexpr int kM = 64;                     // keys per tile (the wgmma's M)
constexpr int kWG = 2;                     // warpgroups per CTA
constexpr int kThreads = 128 * kWG;
constexpr int kTileBytes = kM * kD;        // 8 KB, 1024-byte aligned
constexpr int kScaleBytes = kM * 16;       // per key 8 or 16 bytes from offset 128: the UE8M0 scale and padding

template <int kQ>
struct Cfg {
  static constexpr int kN = kH * kQ;                   // the wgmma's N
  static constexpr int kStages = kQ == 1 ? 5 : 4;      // tiles per warpgroup ring (kStages - 1 loading ahead)
  static constexpr int kTilesOff = kN * kD;            // q codes first: kQ x 8 KB
  static constexpr int kScalesOff = kTilesOff + kWG * kStages * kTileBytes;
  static constexpr int kWOff = kScalesOff + kWG * kStages * kScaleBytes;
  static constexpr int kSmem = 1024 + kWOff + kN * 4;  // + 1 KB to align to the swizzle atom
};
// sm_90 only (227 KB per SM; other devices never launch it, cuda::indexer_fp8_q_supported): two CTAs of kQ = 1 per SM.
static_assert(2 * Cfg<1>::kSmem <= 227 * 1024 && Cfg<4>::kSmem <= 227 * 1024, "sm_90 shared memory");

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void wg_barrier(int wg) {  // the 128 threads of warpgroup wg (barrier 0 is __syncthreads)
  asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// Four floats -> four e4m3 codes (round to nearest even, saturating at 448), low byte first.
__device__ __forceinline__ uint32_t e4m3x4(float4 v) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x, v.y), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z, v.w), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// UE8M0 scale 2^(e-127) as ptx::e8m0, with selects instead of branches (used inside the wgmma pipeline).
__device__ __forceinline__ float e8m0_sel(uint32_t e) {
  return __int_as_float(e == 0xffu ? 0x7fc00000 : e == 0u ? 0x00400000 : static_cast<int>(e << 23));
}

// kPaged: keys through a block table (kQ = 1 only); else shared rows or per-query key_offset. kPiece: the copy
// granule, 8 bytes (any row_bytes multiple of 8, e.g. the cache's 136) or 16 (row_bytes a multiple of 16: half the
// copy instructions, which Nsight Compute shows throttling the prefill kernel's issue, run 85).
template <int kQ, bool kPaged, int kPiece>
__global__ void __launch_bounds__(kThreads, kQ == 1 ? 2 : 1) indexer_wgmma_kernel(IndexerArgs a, int64_t tiles_per_wg) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<kQ>;
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  uint8_t* tiles = smem + C::kTilesOff + wg * C::kStages * kTileBytes;
  uint8_t* scales = smem + C::kScalesOff + wg * C::kStages * kScaleBytes;
  float* ws = reinterpret_cast<float*>(smem + C::kWOff);
  const int s0 = blockIdx.y * kQ;
  const int nq = min(kQ, a.n_queries - s0);

  const int64_t n_tiles = (a.n_keys + kM - 1) / kM;
  const int64_t u0 = (static_cast<int64_t>(blockIdx.x) * kWG + wg) * tiles_per_wg;
  const int64_t u1 = min(u0 + tiles_per_wg, n_tiles);
  int64_t vis[kQ], off[kQ];
#pragma unroll
  for (int qi = 0; qi < kQ; ++qi) {
    vis[qi] = qi >= nq ? 0
              : a.n_visible ? max(int64_t{0}, min(static_cast<int64_t>(__ldg(a.n_visible + s0 + qi)), a.n_keys))
                            : a.n_keys;
    off[qi] = qi < nq && a.key_offset != nullptr ? __ldg(a.key_offset + s0 + qi) : 0;
  }
  const float softmax_scale = rsqrtf(static_cast<float>(kD));
  const uint32_t q_addr = smem_u32(smem);

  unsigned todo = (1u << nq) - 1;
  bool first = true;
  while (todo != 0) {  // one pass per distinct key offset among the CTA's queries (almost always one)
    const int lead = __ffs(todo) - 1;
    int64_t lead_off = 0;
#pragma unroll
    for (int qi = 0; qi < kQ; ++qi)
      if (qi == lead) lead_off = off[qi];  // (a constant index keeps off[] in registers)
    unsigned mask = 0;
    int64_t vmax = 0;
#pragma unroll
    for (int qi = 0; qi < kQ; ++qi)
      if (((todo >> qi) & 1) && off[qi] == lead_off) {
        mask |= 1u << qi;
        vmax = max(vmax, vis[qi]);
      }
    todo &= ~mask;
    const int s_lead = s0 + lead;
    const int64_t n_do = max(int64_t{0}, min(u1, (vmax + kM - 1) / kM) - u0);  // tiles with visible keys

    // Tile u0 + i into stage i % kStages. Warp w copies keys 16w .. 16w + 15 of the tile: lane l < 16 resolves
    // key l's row, then rounds of 32 lanes copy the 16 x 17 (8-byte) or 16 x 9 (16-byte) pieces in row order.
    // Tiles past n_do are zero-filled without reading memory; lanes past the last piece repeat it.
    auto issue = [&](int64_t i) {
      const int64_t t = (u0 + i) * kM + 16 * warp + (lane & 15);
      const bool live = lane < 16 && i < n_do && t < vmax;
      // key_row() with 32-bit index arithmetic: a 64-bit division is a called routine with branches.
      const int tc = static_cast<int>(min(t, vmax - 1));  // vmax >= 1 when n_do > 0; n_keys < 2^31
      int64_t rr = lead_off + tc;
      if constexpr (kPaged) {
        const int b = tc / a.block_size;
        rr = static_cast<int64_t>(__ldg(a.block_table + static_cast<int64_t>(s_lead) * a.max_blocks + b)) *
                 a.block_size + (tc - b * a.block_size);
      }
      const uint8_t* row = a.keys + rr * a.row_bytes;
      const uint8_t* mine = live ? row : nullptr;
      uint8_t* tile = tiles + (i % C::kStages) * kTileBytes;
      uint8_t* sc = scales + (i % C::kStages) * kScaleBytes;
      constexpr int kPieces = 128 / kPiece + 1;  // per key row: the codes, then one piece holding the scale
#pragma unroll
      for (int it = 0; it < (16 * kPieces + 31) / 32; ++it) {
        const int ch = min(it * 32 + lane, 16 * kPieces - 1);
        const int k = ch / kPieces, part = ch - k * kPieces;
        const uint8_t* src = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), k));
        const int r = 16 * warp + k, byte = part * kPiece;  // byte offset in the row
        uint8_t* dst = byte < 128 ? tile + r * 128 + ((((byte >> 4) ^ (r & 7)) << 4) | (byte & 15)) : sc + r * 16;
        cp_async<kPiece>(dst, src != nullptr ? src + byte : a.keys, src != nullptr ? kPiece : 0);
      }
    };
    if (n_do > 0) {
#pragma unroll
      for (int i = 0; i < C::kStages - 1; ++i) {
        issue(i);
        cp_async_commit();
      }
    }

    if (first) {  // q (rotated with rope_cs) -> e4m3 codes (swizzled rows n = 64 qi + h) and w' = w 2^e
      first = false;
      const int r0 = rope_r0(a);
      constexpr int kTpr = kThreads / C::kN >= 4 ? 4 : 2;  // kQ = 1: 4 (both warpgroups); kQ = 4: 2
      constexpr int kF4 = kD / 4 / kTpr;                    // float4 per thread, held in registers (one load)
      for (int r = tid / kTpr; r < C::kN; r += kThreads / kTpr) {
        const int qi = r / kH, h = r % kH, part = tid % kTpr;
        const bool valid = qi < nq;
        const float4* qr = reinterpret_cast<const float4*>(
            a.q + (static_cast<int64_t>(s0 + (valid ? qi : 0)) * kH + h) * kD + part * (kD / kTpr));
        float4 v[kF4];
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < kF4; ++j) {
          v[j] = rope_q4(a, s0 + (valid ? qi : 0), __ldg(qr + j), part * (kD / kTpr) + 4 * j, r0);
          m = fmaxf(m, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
        }
#pragma unroll
        for (int x = 1; x < kTpr; x <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
        const int e = static_cast<int>(ceilf(log2f(fmaxf(m, 1e-4f) / 448.0f)));  // as e4m3_block_exponent
        const float inv = ldexpf(1.0f, -e);
#pragma unroll
        for (int j = 0; j < kF4 / 4; ++j) {  // 16-byte chunk (kF4 / 4) part + j of row r
          uint4 codes = make_uint4(0, 0, 0, 0);
          if (valid) {
            float4 u[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float4 x = v[4 * j + k];
              u[k] = make_float4(x.x * inv, x.y * inv, x.z * inv, x.w * inv);
            }
            codes = make_uint4(e4m3x4(u[0]), e4m3x4(u[1]), e4m3x4(u[2]), e4m3x4(u[3]));
          }
          *reinterpret_cast<uint4*>(smem + r * 128 + ((((kF4 / 4) * part + j) ^ (r & 7)) << 4)) = codes;
        }
        if (part == 0) ws[r] = valid ? ldexpf(__ldg(a.w + static_cast<int64_t>(s0 + qi) * kH + h) * a.w_scale, e) : 0.f;
      }
      wgmma::fence_proxy_async();
      __syncthreads();
    }

    // The MMAs of a tile run in two halves of N (kN / 2 columns each, accumulators d0 / d1), committed as two
    // groups: the epilogue of the first half runs while the tensor cores compute the second. Both are waited on
    // inside the iteration: a wgmma in flight across the loop's branch makes ptxas serialize every wgmma (C7518).
    // ready(i) refills the stage of tile i - 1 (done with), so kStages - 1 tiles are loading ahead.
    constexpr int kHalf = C::kN / 2;  // columns per half; accumulators per thread per half: kHalf / 2
    float d0[kHalf / 2], d1[kHalf / 2];
    auto ready = [&](int64_t i) {
      cp_async_wait<C::kStages - 2>();  // this thread's pieces of tile i have landed
      wgmma::fence_proxy_async();
      wg_barrier(wg);  // everyone's pieces have landed; every warp is done with tile i - 1
      issue(i + C::kStages - 1);
      cp_async_commit();
    };
    auto mma_half = [&](float (&d)[kHalf / 2], int64_t i, int h) {
      const uint32_t tile_addr = smem_u32(tiles + (i % C::kStages) * kTileBytes);
      const uint32_t b_addr = q_addr + h * kHalf * kD;
#pragma unroll
      for (int r = 0; r < kHalf / 2; ++r) wgmma::fence_operand(d[r]);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kD / 32; ++kk)
        wgmma::mma_ss_e4m3<kHalf>(d, wgmma::sw128_desc(tile_addr + 32 * kk), wgmma::sw128_desc(b_addr + 32 * kk), kk);
      wgmma::commit();
    };
    // Adds this thread's heads of half h (n8 blocks j = 0 .. kHalf / 8 - 1 of it) into part[query][row]: keys
    // r0 = 16 warp + g and r0 + 8; heads 8 j' + 2c + {0, 1} of block j' = h kHalf / 8 + j.
    // kAcc independent running sums per (query, row): the epilogue is a chain of dependent FMAs, and with one or
    // two warps per scheduler its latency, not its issue, set the pace (Nsight Compute, run 86: "wait" stalls).
    constexpr int kAcc = kQ == 1 ? 4 : 2;
    float part[kQ][2][kAcc];
    // kQ = 1: this thread's 16 head weights in registers (kQ = 4 would need 64: read from shared memory).
    float2 wreg[kQ == 1 ? C::kN / 8 : 1];
    if constexpr (kQ == 1) {
#pragma unroll
      for (int nb = 0; nb < C::kN / 8; ++nb) wreg[nb] = *reinterpret_cast<const float2*>(ws + 8 * nb + 2 * c);
    }
    auto epilogue_half = [&](float (&d)[kHalf / 2], int h) {
#pragma unroll
      for (int r = 0; r < kHalf / 2; ++r) wgmma::fence_operand(d[r]);
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j) {
        const int nb = h * (kHalf / 8) + j;  // n8 block of the whole N
        const int qi = nb / 8, x = j % kAcc;
        const float2 wv = kQ == 1 ? wreg[nb % (C::kN / 8)] : *reinterpret_cast<const float2*>(ws + 8 * nb + 2 * c);
        part[qi][0][x] = fmaf(wv.x, fmaxf(d[4 * j], 0.f), part[qi][0][x]);
        part[qi][0][x] = fmaf(wv.y, fmaxf(d[4 * j + 1], 0.f), part[qi][0][x]);
        part[qi][1][x] = fmaf(wv.x, fmaxf(d[4 * j + 2], 0.f), part[qi][1][x]);
        part[qi][1][x] = fmaf(wv.y, fmaxf(d[4 * j + 3], 0.f), part[qi][1][x]);
      }
    };
    for (int64_t i = 0; i < n_do; ++i) {
      ready(i);
      mma_half(d0, i, 0);
      mma_half(d1, i, 1);
      const uint8_t* sc = scales + (i % C::kStages) * kScaleBytes;
      const float sk0 = e8m0_sel(sc[(16 * warp + g) * 16]), sk1 = e8m0_sel(sc[(16 * warp + g + 8) * 16]);
#pragma unroll
      for (int qi = 0; qi < kQ; ++qi)
#pragma unroll
        for (int x = 0; x < kAcc; ++x) part[qi][0][x] = part[qi][1][x] = 0.f;
      wgmma::wait<1>();  // the first half (groups complete in order)
      epilogue_half(d0, 0);
      wgmma::wait<0>();
      epilogue_half(d1, 1);

      // The quad's four lanes hold partial sums over disjoint heads: add them, then the lanes share the writes.
      const int64_t t0 = (u0 + i) * kM + 16 * warp + g;
#pragma unroll
      for (int qi = 0; qi < kQ; ++qi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float v = part[qi][r][0];
#pragma unroll
          for (int x = 1; x < kAcc; ++x) v += part[qi][r][x];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          const int64_t t = t0 + 8 * r;
          if ((2 * qi + r) % 4 == c && ((mask >> qi) & 1) && t < a.n_keys)
            a.scores[static_cast<int64_t>(s0 + qi) * a.score_stride + t] =
                t < vis[qi] ? v * (r ? sk1 : sk0) * softmax_scale : -INFINITY;
        }
    }
    cp_async_wait<0>();
    // Tiles past every visible key of this pass: -inf.
    for (int64_t i = n_do; i < u1 - u0; ++i)
      for (int e = tid & 127; e < kM * kQ; e += 128) {
        const int qi = e / kM;
        const int64_t t = (u0 + i) * kM + e % kM;
        if (((mask >> qi) & 1) && t < a.n_keys)
          a.scores[static_cast<int64_t>(s0 + qi) * a.score_stride + t] = -INFINITY;
      }
    wg_barrier(wg);  // the ring is free before the next pass refills it
  }
#else
  __trap();  // launched only on compute capability 9.0 (fp8_q_supported)
#endif
}

template <int kQ, bool kPaged, int kPiece>
void launch_q(const IndexerArgs& a, cudaStream_t stream) {
  using C = Cfg<kQ>;
  static const int per_sm = [] {
    constexpr auto kernel = indexer_wgmma_kernel<kQ, kPaged, kPiece>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem),
          "indexer_wgmma smem attribute");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, C::kSmem),
          "indexer_wgmma occupancy");
    if (blocks < 1) fail("cuda::indexer_scores_fp8: the FP8 tensor-core kernel does not fit an SM of this device");
    return blocks;
  }();
  // At least kMinTiles tiles per warpgroup, so the per-CTA q setup (kQ x 32 KB read and quantized) stays small
  // against the keys it serves.
  constexpr int64_t kMinTiles = 2;
  const int64_t groups = (a.n_queries + kQ - 1) / kQ;
  const KeySplit sp = split_keys(static_cast<int64_t>(per_sm) * device_config().sm_count, groups,
                                 (a.n_keys + kM - 1) / kM, kWG, kMinTiles);
  const int64_t per_group = sp.ctas, tiles_per_wg = sp.units_per_worker;
  if (per_group > 0x7fffffffLL || groups > 65535) fail("cuda::indexer_scores_fp8: too many keys or queries");
  const dim3 grid(static_cast<unsigned>(per_group), static_cast<unsigned>(groups));
  check(cuda::launch(indexer_wgmma_kernel<kQ, kPaged, kPiece>, grid,
                     dim3(kThreads), C::kSmem, stream, a, tiles_per_wg),
        "indexer_wgmma_kernel launch");
}

}  // namespace

bool fp8_q_supported() { return device_config().major == 9 && device_config().minor == 0; }

void launch_fp8_q(const IndexerArgs& a, cudaStream_t stream) {
  if (!fp8_q_supported()) fail("cuda::indexer_scores_fp8: fp8_q needs compute capability 9.0 (wgmma)");
  if (a.n_keys > 0x7fffffffLL) fail("cuda::indexer_scores_fp8: fp8_q takes at most 2^31 - 1 keys (got ", a.n_keys, ")");
  // Four queries per CTA where consecutive queries share their key rows (prefill); one otherwise (decode).
  const bool shared = a.block_table == nullptr && (a.key_offset == nullptr || a.queries_share_keys);
  const bool p16 = a.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.keys) % 16 == 0;
  if (shared && a.n_queries >= 8) {
    if (p16) launch_q<4, false, 16>(a, stream);
    else launch_q<4, false, 8>(a, stream);
  } else if (a.block_table != nullptr) {
    if (p16) launch_q<1, true, 16>(a, stream);
    else launch_q<1, true, 8>(a, stream);
  } else {
    if (p16) launch_q<1, false, 16>(a, stream);
    else launch_q<1, false, 8>(a, stream);
  }
}

}  // namespace dsv4::cuda::idx
