// Lightning-indexer scores (reference: cpu::indexer_scores_fp8 / cpu::indexer_scores_mxfp4; formula spec
// dsv4-model.md 2.4):  I(s,t) = sum_h w[s,h] * ReLU(q[s,h] . k[t]) * d^-0.5.
// Key t of query s is addressed per query (shared rows, key_offset[s] + t, or a block table), so one launch
// serves a batch of decode queries from different sequences; n_visible is read on the device.
//
// Two kernels:
//  * indexer_stream_kernel (default, FP8 and MXFP4 keys): q rounded once to fp16 with a per-head power-of-two
//    scale and kept in shared memory; keys streamed through per-warp cp.async rings, each key converted and
//    multiplied by exactly one warp against all 64 heads (comment above the kernel).
//  * indexer_fp8_kernel (exact_q, FP8 only): the first tensor-core kernel, kept as the high-precision option.
//    mma.sync m16n8k16 bf16 with M = 16 keys, N = 8 heads; q split into bf16 q_hi + q_lo (~16 significant
//    bits, two mma per tile), matching the fp32 reference to ~1e-5 of the row's largest score (test: 1e-4).
//    A CTA of 4 warps serves one query; warp w keeps the B fragments of heads 16w..16w+15 in registers and
//    reads key bytes straight from global memory (8-byte loads, K permuted identically for keys and q); the
//    four warps' per-key partial sums are added in a fixed order.
// Both are deterministic (fixed summation order, no atomics).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_wgmma.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/ptx.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {
using namespace ptx;
using idx::cp_async;
using idx::key_row;
using idx::rope_q4;
using idx::rope_q4_at;
using idx::rope_r0;

constexpr int kH = kIndexerHeads;  // 64
constexpr int kD = kIndexerDim;    // 128
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kHeadsPerWarp = kH / kWarps;  // 16 = two n-tiles of 8
constexpr int kKeys = 64;                   // keys per tile = 4 groups of 16 (the mma's M)
constexpr int kSteps = kD / 16;             // 8 k-steps of 16 dims

// Two e4m3 codes (low byte first) -> bf16x2, exactly (e4m3 -> f16 is exact, f16 -> f32 -> bf16 too).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

__global__ void __launch_bounds__(kThreads, 3) indexer_fp8_kernel(IndexerArgs a) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ float red[kWarps][kKeys];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;  // mma group (row / column) and thread-in-group
  const int s = blockIdx.y;
  const float* q = a.q + static_cast<int64_t>(s) * kH * kD;
  const int r0 = rope_r0(a);  // IndexerArgs::rope_cs

  // B fragments (k x n = dims x heads) of this warp's 16 heads, permuted as described above: for k-step
  // ks = 2j + p, register r holds dims 32j + 8c + 4p + 2r + {0, 1} of head 16 warp + 8 nt + g.
  uint32_t qh[2][kSteps][2], ql[2][kSteps][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float* qr = q + (warp * kHeadsPerWarp + nt * 8 + g) * kD;
#pragma unroll
    for (int j = 0; j < kSteps / 2; ++j) {
      const float4 lo4 = rope_q4(a, s, *reinterpret_cast<const float4*>(qr + 32 * j + 8 * c), 32 * j + 8 * c, r0);
      const float4 hi4 = rope_q4(a, s, *reinterpret_cast<const float4*>(qr + 32 * j + 8 * c + 4), 32 * j + 8 * c + 4, r0);
      split_bf16x2(lo4.x, lo4.y, qh[nt][2 * j][0], ql[nt][2 * j][0]);
      split_bf16x2(lo4.z, lo4.w, qh[nt][2 * j][1], ql[nt][2 * j][1]);
      split_bf16x2(hi4.x, hi4.y, qh[nt][2 * j + 1][0], ql[nt][2 * j + 1][0]);
      split_bf16x2(hi4.z, hi4.w, qh[nt][2 * j + 1][1], ql[nt][2 * j + 1][1]);
    }
  }
  // Head weights of this thread's accumulator columns: heads 16 warp + 8 nt + 2c + {0, 1}.
  float wv[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) wv[nt][e] = a.w[static_cast<int64_t>(s) * kH + warp * kHeadsPerWarp + nt * 8 + 2 * c + e] * a.w_scale;

  const int64_t n_vis = a.n_visible ? min(static_cast<int64_t>(a.n_visible[s]), a.n_keys) : a.n_keys;
  float* out = a.scores + static_cast<int64_t>(s) * a.score_stride;
  const float softmax_scale = rsqrtf(static_cast<float>(kD));
  const int64_t n_tiles = (a.n_keys + kKeys - 1) / kKeys;

  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t t0 = tile * kKeys;
    if (t0 >= n_vis) {  // nothing visible in this tile (uniform over the CTA)
      const int64_t t = t0 + tid;
      if (tid < kKeys && t < a.n_keys) out[t] = -INFINITY;
      continue;
    }
#pragma unroll 1
    for (int grp = 0; grp < kKeys / 16; ++grp) {
      // Rows g and g + 8 of this 16-key group; invisible rows read as zeros (their output is -inf anyway).
      const int64_t ta = t0 + 16 * grp + g, tb = ta + 8;
      uint2 ka[kSteps / 2], kb[kSteps / 2];
      float sa = 0.f, sb = 0.f;
      const uint8_t* ra = ta < n_vis ? key_row(a, s, ta) : a.keys;
      const uint8_t* rb = tb < n_vis ? key_row(a, s, tb) : a.keys;
#pragma unroll
      for (int j = 0; j < kSteps / 2; ++j) {
        ka[j] = ta < n_vis ? __ldg(reinterpret_cast<const uint2*>(ra + 32 * j + 8 * c)) : make_uint2(0u, 0u);
        kb[j] = tb < n_vis ? __ldg(reinterpret_cast<const uint2*>(rb + 32 * j + 8 * c)) : make_uint2(0u, 0u);
      }
      if (ta < n_vis) sa = e8m0(__ldg(ra + kD));
      if (tb < n_vis) sb = e8m0(__ldg(rb + kD));
      // A fragments: a0 / a2 = row g, a1 / a3 = row g + 8; low / high 16 bits of each 4-byte half.
      uint32_t af[kSteps][4];
#pragma unroll
      for (int j = 0; j < kSteps / 2; ++j) {
        af[2 * j][0] = e4m3x2_to_bf16x2(ka[j].x);
        af[2 * j][2] = e4m3x2_to_bf16x2(ka[j].x >> 16);
        af[2 * j][1] = e4m3x2_to_bf16x2(kb[j].x);
        af[2 * j][3] = e4m3x2_to_bf16x2(kb[j].x >> 16);
        af[2 * j + 1][0] = e4m3x2_to_bf16x2(ka[j].y);
        af[2 * j + 1][2] = e4m3x2_to_bf16x2(ka[j].y >> 16);
        af[2 * j + 1][1] = e4m3x2_to_bf16x2(kb[j].y);
        af[2 * j + 1][3] = e4m3x2_to_bf16x2(kb[j].y >> 16);
      }
      float pa = 0.f, pb = 0.f;  // this thread's sum over its 4 heads, rows g and g + 8
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          mma_bf16(acc, af[ks], qh[nt][ks][0], qh[nt][ks][1]);
          mma_bf16(acc, af[ks], ql[nt][ks][0], ql[nt][ks][1]);
        }
        pa += fmaxf(acc[0] * sa, 0.f) * wv[nt][0] + fmaxf(acc[1] * sa, 0.f) * wv[nt][1];
        pb += fmaxf(acc[2] * sb, 0.f) * wv[nt][0] + fmaxf(acc[3] * sb, 0.f) * wv[nt][1];
      }
      pa += __shfl_xor_sync(0xffffffffu, pa, 1);
      pa += __shfl_xor_sync(0xffffffffu, pa, 2);
      pb += __shfl_xor_sync(0xffffffffu, pb, 1);
      pb += __shfl_xor_sync(0xffffffffu, pb, 2);
      if (c == 0) {
        red[warp][16 * grp + g] = pa;
        red[warp][16 * grp + g + 8] = pb;
      }
    }
    __syncthreads();
    if (tid < kKeys) {
      const int64_t t = t0 + tid;
      const float total = ((red[0][tid] + red[1][tid]) + red[2][tid]) + red[3][tid];
      if (t < a.n_keys) out[t] = t < n_vis ? total * softmax_scale : -INFINITY;
    }
    __syncthreads();
  }
}


// ============================ streaming kernel (default) ============================================
// Keys as M: mma.sync m16n8k16 f16 x f16 -> f32 with M = 16 keys, N = 8 heads, K = 16 dims. A CTA of 8 warps
// (FP8) or 4 (MXFP4) serves one query; q (64 heads x 128, fp16) sits in shared memory and each warp streams its
// own run of keys: a unit of 32 keys (two m-tiles) is converted once into A fragments (64 registers), then
// multiplied by the 8 n-tiles of heads, whose B fragments come from shared memory by ldmatrix.x4 (each shared by
// both m-tiles).
// The dot is order-free over dims, so K is permuted: in k-step ks, thread (g, c) covers dims 32c + 4ks +
// {0,1} (logical k 2c, 2c+1) and 32c + 4ks + {2,3} (logical 2c+8, 2c+9); thread c therefore reads the 32
// contiguous dims 32c .. 32c+31 of its rows (32 B of e4m3, or 16 B of e2m1 = exactly one MXFP4 scale block),
// and q is written to shared memory in the same logical order. ReLU and the head weights are applied per
// n-tile into 4 running per-key sums per thread, reduced over the 4 threads of a group at the end of a unit.
// Keys stream through a per-warp ring of kStages units (cp.async, 8-byte chunks for FP8, 4-byte for MXFP4,
// zero-filled past n_visible), so each warp keeps its next unit in flight without block barriers. Warps own
// contiguous runs of units; grid = (CTAs per query, queries). On sm_90a: FP8 128 registers and 91,392 B of
// shared memory (2 CTAs = 16 warps per SM), MXFP4 168 registers and 38,144 B (3 CTAs of 4 warps per SM).
// Tried and dropped: e4m3 -> fp16 by integer ops (PRMT/SHF/LOP3) instead of cvt: 3-4% slower on the H200;
// the earlier "heads as M" layout (all 64 heads' q in 128 registers per warp, 8 warps per SM): 1.6x slower.
// q: per head h, q' = q * 2^e_h with max|q'| in [2^14, 2^15), rounded to fp16 (relative error <= 2^-11; the
// smallest elements may be fp16 subnormals: absolute error <= 2^-25 * 2^-e_h <= 2^-38 max|q_h|); the scale is
// undone exactly through w'_h = w_h * 2^-e_h. Keys: e4m3 -> fp16 is exact; e2m1 * 2^(e_b - e_max) is exact in
// fp16 while e_max - e_b <= 23 (else rounded at 2^-25 of the row's largest block scale, flushed past 38).
// Products are exact in fp32; sums are fp32. Per key the score is (sum_h w'_h ReLU(acc_h)) * s_key * d^-0.5,
// s_key = 2^(e - 127) (FP8) or 2^(e_max - 127) (MXFP4): ReLU(x s) = s ReLU(x) for s > 0. Error bound (used
// by the test): |I - I_ref| <= 2^-10 * d^-0.5 sum_h |w_h| sum_d |q_hd k_td| + 2^-23 * d^-0.5 * s_key *
// sum_h |w_h| sum_d |q_hd| (the second term only matters for MXFP4 rows with very unequal block scales).
constexpr int kUnit = 32;    // keys per ring stage (two m-tiles of 16)
constexpr int kStages = 2;   // ring depth per warp
constexpr int kChunks = 17;  // copy chunks per key row: 17 x 8 B (FP8, 136 B) or 17 x 4 B (MXFP4, 68 B)
static_assert(kChunks == 16 + 1 && kUnit == 32,
              "the copy issue: 16 data chunks per row in rounds of two rows, then the scale chunk");
constexpr int kQRow = kD + 8;  // halfs per q row in shared memory (272 B: 16-byte aligned, ldmatrix conflict-free)

template <IndexerKeyFormat F>
struct KeyFmt;
template <>
struct KeyFmt<IndexerKeyFormat::kFP8> {
  static constexpr int kChunk = 8, kRowS = 144;
  static constexpr int kWarps = 8;  // 2 CTAs of 8 warps per sm_90 SM (4 of 4 before: the same warps, half the
                                    // q prologue per warp, which is what short contexts wait for)
};
template <>
struct KeyFmt<IndexerKeyFormat::kMXFP4> {
  static constexpr int kChunk = 4, kRowS = 80;
  static constexpr int kWarps = 4;  // 168 registers: 8 warps would leave one CTA per SM
};

// Resident CTAs per SM the register budget is sized for: sm_90 (227 KB of shared memory per SM) holds 2 FP8
// CTAs of 8 warps and 91 KB (128 registers) or 3 MXFP4 CTAs of 4 warps (168 registers); sm_12x (~100 KB) holds
// 1 FP8 / 2 MXFP4 CTAs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
constexpr int kMinBlocksFP8 = 1, kMinBlocksFP4 = 2;
#else
constexpr int kMinBlocksFP8 = 2, kMinBlocksFP4 = 3;
#endif

template <IndexerKeyFormat F>
constexpr int smem_bytes() {
  return 256 + kH * kQRow * 2 + KeyFmt<F>::kWarps * kStages * kUnit * KeyFmt<F>::kRowS;
}

// Two e4m3 codes (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(hr.x) | (static_cast<uint32_t>(hr.y) << 16);
}

// One byte of two e2m1 codes (low nibble first) -> f16x2 holding value * 2^-14 (bit placement: sign to bit
// 15, exponent and mantissa to bits 9..11; e2m1 subnormals land on fp16 subnormals with the same 2^-14 ratio).
__device__ __forceinline__ uint32_t e2m1x2_raw(uint32_t b) {
  const uint32_t t = b | (b << 12);
  return ((t & 0x00080008u) << 12) | ((t & 0x00070007u) << 9);
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t x, uint32_t f) {
  __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// fp16 2^E for E in [-24, 14] (0 below).
__device__ __forceinline__ uint32_t pow2_half_bits(int E) {
  if (E >= -14) return static_cast<uint32_t>(E + 15) << 10;
  if (E >= -24) return 1u << (E + 24);
  return 0u;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <IndexerKeyFormat F>
__global__ void __launch_bounds__(32 * KeyFmt<F>::kWarps, F == IndexerKeyFormat::kFP8 ? kMinBlocksFP8 : kMinBlocksFP4)
    indexer_stream_kernel(IndexerArgs a, int64_t units_per_warp) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  using KF = KeyFmt<F>;
  extern __shared__ __align__(16) uint8_t smem[];
  float* wq = reinterpret_cast<float*>(smem);
  __half* qs = reinterpret_cast<__half*>(smem + 256);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  uint8_t* ring = smem + 256 + kH * kQRow * 2 + warp * (kStages * kUnit * KF::kRowS);
  const int s = blockIdx.y;

  const int64_t n_vis = a.n_visible ? max(int64_t{0}, min(static_cast<int64_t>(a.n_visible[s]), a.n_keys))
                                    : a.n_keys;
  const int64_t n_units = (a.n_keys + kUnit - 1) / kUnit;
  const int64_t u0 = (static_cast<int64_t>(blockIdx.x) * KF::kWarps + warp) * units_per_warp;
  const int64_t u1 = min(u0 + units_per_warp, n_units);
  const int64_t vis_units = (n_vis + kUnit - 1) / kUnit;
  const int64_t n_do = max(int64_t{0}, min(u1, vis_units) - u0);  // units with work (warp-uniform)

  // q (rotated first with rope_cs) -> fp16 with a per-head power-of-two scale, into shared memory in the permuted
  // K order (row h, logical position 16 ks + lk). Four threads per head, thread cc holding the 32 dims of thread
  // column cc (dims 32 cc + 4 ks .. + 3 are k-step ks), 64 / (8 warps) rounds of heads: each element is loaded
  // once, before the key copies are issued, and scaled by a multiply (2^e is exact in fp32 for |e| <= 100, so
  // x * 2^e is ldexpf's result; an fp32 subnormal product would round to fp16 zero either way). Short contexts
  // run this prologue and little else, one or two warps per scheduler, so its instruction count is the kernel's
  // latency (the old form, two threads per head, two passes and ldexpf, took 9.2 us at 128 keys in a graph:
  // run 137, docs/PERFORMANCE.md).
  constexpr int kRounds = kH * 4 / (32 * KF::kWarps);
  const int cc = tid & 3, r0 = rope_r0(a);
  auto load_q = [&](int round, float4 (&v)[kSteps]) {
    const int h = 8 * KF::kWarps * round + (tid >> 2);
    const float4* qr = reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(s) * kH + h) * kD) + 8 * cc;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) v[ks] = __ldg(qr + ks);
  };
  // With one round (FP8) q's 32 floats wait in registers while the copies are issued; the MXFP4 kernel's two
  // rounds load theirs after, one round at a time (both at once spilled on sm_120a).
  constexpr bool kEarlyQ = kRounds == 1;
  float4 q_early[kSteps];
  if constexpr (kEarlyQ) load_q(0, q_early);

  // Issue the copies of unit u0 + i into ring stage i % kStages. Lane k resolves key k's row address. A row is 17
  // chunks: its 16 chunks of key data go two rows per round (lanes 0-15 row 2j, lanes 16-31 row 2j + 1, chunk
  // lane & 15: each round reads two rows' 128 / 64 contiguous bytes), so a lane's chunk and destination offset are
  // fixed and only the row pointer is shuffled; then each lane copies its own row's 17th chunk (the scale bytes).
  // (Chunk = 32 j + lane over all 544 needed a division by 17 and more address arithmetic per round: ~13
  // instructions against ~7, on the long-context path where the copies' issue is a third of a unit's work.)
  const int pair_row = lane >> 4, part_off = (lane & 15) * KF::kChunk;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  auto issue = [&](int64_t i) {
    const int64_t t = (u0 + i) * kUnit + lane;
    const bool valid = t < n_vis;
    // Invalid rows copy nothing (source size 0: the destination is zero-filled) from a.keys.
    const uint8_t* mine = valid ? key_row(a, s, t) : a.keys;
    const uint32_t vmask = __ballot_sync(0xffffffffu, valid);
    const uint32_t stage = ring_s + static_cast<uint32_t>((i % kStages) * (kUnit * KF::kRowS));
    const uint32_t dst = stage + pair_row * KF::kRowS + part_off;
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      const int row = 2 * j + pair_row;
      const uint8_t* src = reinterpret_cast<const uint8_t*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), row));
      cp_async_s<KF::kChunk>(dst + 2 * j * KF::kRowS, src + part_off, (vmask >> row) & 1u ? KF::kChunk : 0);
    }
    cp_async_s<KF::kChunk>(stage + lane * KF::kRowS + 16 * KF::kChunk, mine + 16 * KF::kChunk, valid ? KF::kChunk : 0);
  };
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (i < n_do) issue(i);
    cp_async_commit();
  }

  // rope_cs row of this query, offset so that csr[(d - 32 cc) / 2] holds the factors of dims d, d + 1 (d >= r0).
  const float2* csr =
      a.rope_cs != nullptr ? a.rope_cs + static_cast<int64_t>(s) * a.rope_n_freq + (32 * cc - r0) / 2 : nullptr;
#pragma unroll 1
  for (int round = 0; round < kRounds; ++round) {
    float4 qv[kSteps];
    if constexpr (kEarlyQ) {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) qv[ks] = q_early[ks];
    } else {
      load_q(round, qv);
    }
    const int h = 8 * KF::kWarps * round + (tid >> 2);
    float m = 0.f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      float4& v = qv[ks];
      v = rope_q4_at(csr + 2 * ks, v, 32 * cc + 4 * ks, r0);  // the factor row addressed once (csr)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int e = 0;
    if (m > 0.f && m < INFINITY) {
      int ex;
      frexpf(m, &ex);  // m < 2^ex <= 2m
      e = max(-100, min(100, 15 - ex));
    }
    const float p = __int_as_float((e + 127) << 23);  // 2^e
    __half* dst = qs + h * kQRow + 2 * cc;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const float4 v = qv[ks];
      *reinterpret_cast<__half2*>(dst + 16 * ks) = __floats2half2_rn(v.x * p, v.y * p);
      *reinterpret_cast<__half2*>(dst + 16 * ks + 8) = __floats2half2_rn(v.z * p, v.w * p);
    }
    if (cc == 0) wq[h] = ldexpf(a.w[static_cast<int64_t>(s) * kH + h] * a.w_scale, -e);
  }
  __syncthreads();

  // ldmatrix.x4 row address of this lane: matrix (lane >> 3) = (k-step 2kk + (lane >> 4), half (lane >> 3) & 1),
  // row (lane & 7) = head 8 nt + (lane & 7).
  const __half* qlane = qs + (lane & 7) * kQRow + (lane >> 4) * 16 + ((lane >> 3) & 1) * 8;
  float* out = a.scores + static_cast<int64_t>(s) * a.score_stride;
  const float softmax_scale = rsqrtf(static_cast<float>(kD));
  for (int64_t i = 0; i < n_do; ++i) {
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint8_t* buf = ring + (i % kStages) * (kUnit * KF::kRowS);
    const int64_t t0 = (u0 + i) * kUnit;
    // A fragments of keys 16 mt + g + 8 r: a[r] / a[2 + r] = logical k (2c, 2c+1) / (2c+8, 2c+9).
    uint32_t af[2][kSteps][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* row = buf + (16 * mt + g + 8 * r) * KF::kRowS;
        if constexpr (F == IndexerKeyFormat::kFP8) {
          const uint4 k0 = *reinterpret_cast<const uint4*>(row + 32 * c);
          const uint4 k1 = *reinterpret_cast<const uint4*>(row + 32 * c + 16);
          const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
#pragma unroll
          for (int ks = 0; ks < kSteps; ++ks) {
            af[mt][ks][r] = e4m3x2_to_f16x2(kw[ks]);
            af[mt][ks][2 + r] = e4m3x2_to_f16x2(kw[ks] >> 16);
          }
        } else {
          const uint4 k0 = *reinterpret_cast<const uint4*>(row + 16 * c);
          const uint32_t sc = *reinterpret_cast<const uint32_t*>(row + 64);
          const int emax = max(max(static_cast<int>(sc & 0xff), static_cast<int>((sc >> 8) & 0xff)),
                               max(static_cast<int>((sc >> 16) & 0xff), static_cast<int>(sc >> 24)));
          const int ec = (sc >> (8 * c)) & 0xff;
          const uint32_t f1 = pow2_half_bits(14 - (emax - ec));
          const uint32_t f = f1 | (f1 << 16);
          const uint32_t kw[4] = {k0.x, k0.y, k0.z, k0.w};
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int b = 0; b < 4; ++b)
              af[mt][2 * j + b / 2][2 * (b & 1) + r] = hmul2_u32(e2m1x2_raw((kw[j] >> (8 * b)) & 0xffu), f);
        }
      }
    // acc[mt]: {key 16mt+g, key 16mt+g+8} x {head 8nt+2c, head 8nt+2c+1} as {0: (g, 2c), 1: (g, 2c+1),
    // 2: (g+8, 2c), 3: (g+8, 2c+1)}.
    float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int nt = 0; nt < kH / 8; ++nt) {
      float acc[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kSteps / 2; ++kk) {
        uint32_t bq[4];
        ldmatrix_x4(bq, qlane + 8 * nt * kQRow + 32 * kk);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_f16(acc[mt], af[mt][2 * kk], bq[0], bq[1]);
          mma_f16(acc[mt], af[mt][2 * kk + 1], bq[2], bq[3]);
        }
      }
      const float2 wv = *reinterpret_cast<const float2*>(wq + 8 * nt + 2 * c);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        sum[mt][0] += wv.x * fmaxf(acc[mt][0], 0.f) + wv.y * fmaxf(acc[mt][1], 0.f);
        sum[mt][1] += wv.x * fmaxf(acc[mt][2], 0.f) + wv.y * fmaxf(acc[mt][3], 0.f);
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sum[mt][r] += __shfl_xor_sync(0xffffffffu, sum[mt][r], 1);
        sum[mt][r] += __shfl_xor_sync(0xffffffffu, sum[mt][r], 2);
      }
    if (c == 0) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int k = 16 * mt + g + 8 * r;
          const uint8_t* row = buf + k * KF::kRowS;
          float sk;
          if constexpr (F == IndexerKeyFormat::kFP8) {
            sk = e8m0(row[kD]);
          } else {
            const uint32_t sc = *reinterpret_cast<const uint32_t*>(row + 64);
            sk = e8m0(static_cast<uint8_t>(max(max(sc & 0xff, (sc >> 8) & 0xff), max((sc >> 16) & 0xff, sc >> 24))));
          }
          const int64_t t = t0 + k;
          if (t < a.n_keys) out[t] = t < n_vis ? sum[mt][r] * sk * softmax_scale : -INFINITY;
        }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (i + kStages < n_do) issue(i + kStages);
    cp_async_commit();
  }
  cp_async_wait<0>();
  for (int64_t i = n_do; i < u1 - u0; ++i) {  // units past n_visible
    const int64_t t = (u0 + i) * kUnit + lane;
    if (t < a.n_keys) out[t] = -INFINITY;
  }
}

// indexer_stream_kernel<F>'s resident CTAs per SM (2 FP8 / 3 MXFP4 on sm_90; fewer on SM12x's ~100 KB of shared
// memory), after opting in to its dynamic shared memory; once per process.
template <IndexerKeyFormat F>
int stream_ctas_per_sm() {
  constexpr int smem = smem_bytes<F>();
  static_assert(smem <= 99 * 1024, "SM12x allows ~99 KB of shared memory per block");
  static const int n = [] {
    check(cudaFuncSetAttribute(indexer_stream_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "indexer smem attribute");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, indexer_stream_kernel<F>, 32 * KeyFmt<F>::kWarps,
                                                        smem),
          "indexer occupancy");
    if (blocks < 1) fail("cuda::indexer_scores_fp8: the streaming kernel does not fit an SM of this device");
    return blocks;
  }();
  return n;
}

template <IndexerKeyFormat F>
void launch_stream(dim3 grid, cudaStream_t stream, const IndexerArgs& a, int64_t units_per_warp) {
  stream_ctas_per_sm<F>();  // the opt-in
  check(launch(indexer_stream_kernel<F>, grid, dim3(32 * KeyFmt<F>::kWarps), smem_bytes<F>(), stream, a,
               units_per_warp),
        "indexer_stream_kernel launch");
}

}  // namespace

namespace idx {
KeySplit split_keys(int64_t slots, int64_t groups, int64_t n_units, int workers, int64_t min_units) {
  KeySplit k;
  const int64_t most = (n_units + workers * min_units - 1) / (workers * min_units);  // >= min_units each
  k.ctas = std::max<int64_t>(1, std::min<int64_t>(slots / groups, most));
  k.units_per_worker = std::max<int64_t>(1, (n_units + k.ctas * workers - 1) / (k.ctas * workers));
  k.ctas = std::max<int64_t>(1, (n_units + k.units_per_worker * workers - 1) / (k.units_per_worker * workers));
  return k;
}
}  // namespace idx

bool indexer_fp8_q_supported() { return idx::fp8_q_supported(); }

void indexer_scores_fp8(const IndexerArgs& a, cudaStream_t stream) {
  const DeviceConfig& dev = device_config();
  const bool fp4 = a.format == IndexerKeyFormat::kMXFP4;
  if (a.format != IndexerKeyFormat::kFP8 && !fp4) fail("cuda::indexer_scores_fp8: unknown key format");
  if (a.n_queries < 0 || a.n_keys < 0) fail("cuda::indexer_scores_fp8: negative shape");
  if (a.n_queries == 0 || a.n_keys == 0) return;
  if (a.n_queries > 65535) fail("cuda::indexer_scores_fp8: ", a.n_queries, " queries in one call (at most 65535)");
  if (!fp4 && (a.row_bytes < 136 || a.row_bytes % 8 || reinterpret_cast<uintptr_t>(a.keys) % 8))
    fail("cuda::indexer_scores_fp8: FP8 key rows of ", a.row_bytes,
         " B are not supported (need >= 136 B, 8-byte aligned, scale byte at offset 128)");
  if (fp4 && (a.row_bytes < 68 || a.row_bytes % 4 || reinterpret_cast<uintptr_t>(a.keys) % 4))
    fail("cuda::indexer_scores_fp8: MXFP4 key rows of ", a.row_bytes,
         " B are not supported (need >= 68 B, 4-byte aligned, scales at offset 64)");
  if (fp4 && a.exact_q) fail("cuda::indexer_scores_fp8: exact_q supports FP8 keys only");
  if (a.fp8_q && (fp4 || a.exact_q)) fail("cuda::indexer_scores_fp8: fp8_q needs FP8 keys and excludes exact_q");
  if (a.block_table != nullptr && (a.block_size <= 0 || a.max_blocks <= 0 || a.key_offset != nullptr))
    fail("cuda::indexer_scores_fp8: block table needs block_size > 0, max_blocks > 0 and no key_offset (got ",
         a.block_size, ", ", a.max_blocks, ")");
  if (a.block_table != nullptr && (a.n_keys + a.block_size - 1) / a.block_size > a.max_blocks)
    fail("cuda::indexer_scores_fp8: ", a.n_keys, " keys need more than max_blocks = ", a.max_blocks, " blocks of ",
         a.block_size);
  if (a.score_stride < a.n_keys) fail("cuda::indexer_scores_fp8: score stride ", a.score_stride, " < ", a.n_keys);
  if (reinterpret_cast<uintptr_t>(a.q) % 16) fail("cuda::indexer_scores_fp8: q must be 16-byte aligned");
  if (a.rope_cs != nullptr && (a.rope_n_freq < 1 || a.rope_n_freq > kD / 2))
    fail("cuda::indexer_scores_fp8: rope_cs needs 1 <= rope_n_freq <= ", kD / 2, " (got ", a.rope_n_freq, ")");
  if (a.fp8_q) {
    idx::launch_fp8_q(a, stream);
    return;
  }
  if (a.exact_q) {
    const int64_t n_tiles = (a.n_keys + kKeys - 1) / kKeys;
    // Enough CTAs for ~8 resident per SM in total, each reusing its q fragments over many tiles.
    int64_t per_query = (8LL * dev.sm_count + a.n_queries - 1) / a.n_queries;
    per_query = std::max<int64_t>(1, std::min<int64_t>(per_query, n_tiles));
    check(launch(indexer_fp8_kernel, dim3(static_cast<unsigned>(per_query), a.n_queries), dim3(kThreads), 0, stream, a), "indexer_fp8_kernel launch");
    return;
  }
  // One wave of resident CTAs (16 warps per sm_90 SM; 4-8 on SM12x) over all queries when possible, with at
  // least kMinUnits units (of 32 keys) per warp. The per-CTA q setup (32 KB read, 64 x 128 conversions) once made
  // 2 the better minimum; since the one-pass prologue 1 is (the engine's decode step at contexts 259 / 8K / 64K:
  // 6.67-6.69 / 6.80-6.84 / 7.12 ms against 6.71-6.72 / 6.88-6.90 / 7.22-7.24, run 140).
  constexpr int64_t kMinUnits = 1;
  const int64_t n_units = (a.n_keys + kUnit - 1) / kUnit;
  const int per_sm = fp4 ? std::min(4, stream_ctas_per_sm<IndexerKeyFormat::kMXFP4>())
                         : std::min(2, stream_ctas_per_sm<IndexerKeyFormat::kFP8>());
  const int warps = fp4 ? KeyFmt<IndexerKeyFormat::kMXFP4>::kWarps : KeyFmt<IndexerKeyFormat::kFP8>::kWarps;
  const idx::KeySplit sp =
      idx::split_keys(static_cast<int64_t>(per_sm) * dev.sm_count, a.n_queries, n_units, warps, kMinUnits);
  const int64_t per_query = sp.ctas, units_per_warp = sp.units_per_worker;
  if (per_query > 0x7fffffffLL) fail("cuda::indexer_scores_fp8: too many keys (", a.n_keys, ")");
  const dim3 grid(static_cast<unsigned>(per_query), static_cast<unsigned>(a.n_queries));
  if (fp4) launch_stream<IndexerKeyFormat::kMXFP4>(grid, stream, a, units_per_warp);
  else launch_stream<IndexerKeyFormat::kFP8>(grid, stream, a, units_per_warp);
}

}  // namespace dsv4::cuda
