// Sparse attention with per-head sinks over gathered K = V rows (reference: cpu::sparse_attention; the
// online-softmax contract is spec failure-modes-and-kernels.md section 1.4). Two kernels here, and a third for
// prefill on sm_90a in sparse_attention_wgmma.cu (use_wgmma below chooses):
//
// attn_mma_kernel (fp8 and bf16 rows; AttnPrecision kSplitBf16 / kBf16): bf16 tensor cores (mma.sync
// m16n8k16, fp32 accumulation; the instruction exists on sm_90a and sm_12x). One CTA of 8 warps serves 32 of
// the 64 heads of one query over one split of its slot list (1-2 queries: 4 warps and 16 heads). Tiles of 32 gathered rows are fetched with
// 8-byte cp.async (rows are only 8-byte aligned: 584 B) one tile ahead, fp8 rows are decoded once per CTA
// into a bf16 tile in shared memory (e4m3 x 2^(e-127) and the bf16 RoPE dims are exact in bf16), and every
// warp reads K / V fragments from that tile with ldmatrix (row stride 1040 B: conflict-free). Warp (ht, ds)
// owns heads 16 ht .. +15 of the CTA and dims 128 ds .. +127: it keeps its q fragments in registers, computes
// the partial S = Q K^T over its 128 dims, the four partials of a head tile are summed through shared memory
// in a fixed order (so the four warps hold identical scores, maxima and sums), then it runs the online softmax
// and O += P V for its 128 output dims with P taken straight from the S accumulators (FA2 register layout).
// kSplitBf16 splits q and P into bf16 hi + lo and issues two mma per product (relative error 2^-16 instead
// of 2^-8); the error bounds are derived in tests/cuda/test_cuda_sparse_attention.cc.
//
// fp32_kernel (f32 rows, or AttnPrecision kFp32): the CUDA-core fp32 kernel: one CTA of 16 warps per (query,
// split, 32-head group), a warp owns 2 heads, lane l owns dims {128*i + 4*l .. +3}; tiles of 16 rows are
// decoded to fp32 in shared memory.
//
// Softmax numerics (both): scores are taken in base 2 (scale * log2 e folded into q once). Invalid slots
// (index < 0, >= n_rows, or at/after valid_len) are never dereferenced and get p = 0 by an explicit mask
// (their tile rows are zero-filled, so no stale shared memory reaches an mma). The running max starts at
// the sink (or -inf for a -inf sink, with l = 0); alpha = exp2(m_old - m_new) is taken only when m_new is
// finite. A row with nothing valid ends with acc = 0 and returns 0 (sink-only result), never 0/0.
//
// Split-K: with few queries the slot list is split over several CTAs; each writes (m, l, acc) without the
// sink, and a combine kernel merges the partials together with the sink. A partial with l = 0 has weight
// 0. Nothing is counted across CTAs, so replaying a captured graph needs no reset. The split count depends
// only on the shapes and the SM count (eager and graph runs are bitwise equal).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/sparse_attention_common.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {
using namespace attn;

constexpr int kWarps = 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kHeadGroups = 2;              // CTAs per (query, split); each serves 32 heads (registers)
constexpr int kHeadsPerWarp = kH / kHeadGroups / kWarps;  // 2
constexpr int kTile = 16;                   // rows per tile (one per warp when loading)

// Decodes dims [d, d+4) of one row to fp32.
__device__ __forceinline__ float4 load4(const uint8_t* row, int d, KvRowFormat fmt) {
  if (fmt == KvRowFormat::kF32) return *reinterpret_cast<const float4*>(row + 4 * d);
  if (fmt == KvRowFormat::kBF16) {
    const uint2 u = *reinterpret_cast<const uint2*>(row + 2 * d);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
  if (d >= kNope) {  // bf16 RoPE dims
    const uint2 u = *reinterpret_cast<const uint2*>(row + kNope + 2 * (d - kNope));
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
  const uint32_t u = *reinterpret_cast<const uint32_t*>(row + d);
  const float s = e8m0(row[kNope + 2 * (kD - kNope) + d / 64]);
  __nv_fp8x2_e4m3 lo, hi;
  lo.__x = static_cast<__nv_fp8x2_storage_t>(u & 0xffffu);
  hi.__x = static_cast<__nv_fp8x2_storage_t>(u >> 16);
  const float2 a = static_cast<float2>(lo);
  const float2 b = static_cast<float2>(hi);
  return make_float4(a.x * s, a.y * s, b.x * s, b.y * s);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads, 1) fp32_kernel(Params p) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ __align__(16) float tile[kTile][kD];
  __shared__ int tile_valid[kTile];
  const SparseAttentionArgs& a = p.a;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qi = blockIdx.y, split = blockIdx.x;
  const int h0 = (blockIdx.z * kWarps + warp) * kHeadsPerWarp;

  const float qscale = a.scale * kLog2e;
  float4 q[kHeadsPerWarp][4], acc[kHeadsPerWarp][4];
  float m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const float* qh = a.q + (static_cast<int64_t>(qi) * kH + h0 + hh) * kD;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 v = *reinterpret_cast<const float4*>(qh + 128 * i + 4 * lane);
      q[hh][i] = make_float4(v.x * qscale, v.y * qscale, v.z * qscale, v.w * qscale);
      acc[hh][i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (p.splits == 1) {  // the sink takes part directly: m = sink, l = exp(sink - m) = 1
      const float sk = a.sink[h0 + hh];
      m[hh] = sk == -INFINITY ? -INFINITY : sk * kLog2e;
      l[hh] = sk == -INFINITY ? 0.f : 1.f;
    } else {
      m[hh] = -INFINITY;
      l[hh] = 0.f;
    }
  }

  int begin, end;
  slot_range(p, qi, split, begin, end);
  const int32_t* slots = a.slots + static_cast<int64_t>(qi) * a.n_slots;

  for (int t0 = begin; t0 < end; t0 += kTile) {
    // Load: warp w decodes row t0 + w of the tile.
    {
      const int slot = t0 + warp;
      int64_t idx = -1;
      if (slot < end) idx = slots[slot];
      const bool valid = idx >= 0 && idx < a.n_rows;
      if (valid) {
        const uint8_t* row = a.kv + idx * a.row_bytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int d = 128 * i + 4 * lane;
          *reinterpret_cast<float4*>(&tile[warp][d]) = load4(row, d, a.format);
        }
      }
      if (lane == 0) tile_valid[warp] = valid;
    }
    __syncthreads();
    unsigned vmask = 0;
#pragma unroll
    for (int j = 0; j < kTile; ++j) vmask |= tile_valid[j] ? (1u << j) : 0u;
    if (vmask) {
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
        float sc[kTile];
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
          sc[j] = -INFINITY;
          if (vmask & (1u << j)) {
            float part = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i)
              part += dot4(q[hh][i], *reinterpret_cast<const float4*>(&tile[j][128 * i + 4 * lane]));
            sc[j] = warp_sum(part);
            mt = fmaxf(mt, sc[j]);
          }
        }
        const float mn = fmaxf(m[hh], mt);  // finite: at least one valid score
        const float alpha = exp2f(m[hh] - mn);  // m = -inf -> 0 (acc and l are 0 then anyway)
        l[hh] *= alpha;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[hh][i].x *= alpha; acc[hh][i].y *= alpha; acc[hh][i].z *= alpha; acc[hh][i].w *= alpha;
        }
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
          if (vmask & (1u << j)) {
            const float pj = exp2f(sc[j] - mn);
            l[hh] += pj;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float4 k = *reinterpret_cast<const float4*>(&tile[j][128 * i + 4 * lane]);
              acc[hh][i].x += pj * k.x; acc[hh][i].y += pj * k.y;
              acc[hh][i].z += pj * k.z; acc[hh][i].w += pj * k.w;
            }
          }
        }
        m[hh] = mn;
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = h0 + hh;
    if (p.splits == 1) {
      const float inv = l[hh] > 0.f ? 1.f / l[hh] : 0.f;
      float* o = a.out + (static_cast<int64_t>(qi) * kH + h) * kD;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = acc[hh][i];
        *reinterpret_cast<float4*>(o + 128 * i + 4 * lane) = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
      }
    } else {
      const int64_t pi = (static_cast<int64_t>(qi) * p.splits + split) * kH + h;
      float* o = p.part_acc + pi * kD;
#pragma unroll
      for (int i = 0; i < 4; ++i) *reinterpret_cast<float4*>(o + 128 * i + 4 * lane) = acc[hh][i];
      if (lane == 0) {
        p.part_ml[2 * pi] = m[hh];
        p.part_ml[2 * pi + 1] = l[hh];
      }
    }
  }
}

// The output epilogue (SparseAttentionArgs::rope_pos / out16) on dims 4 * tid .. 4 * tid + 3 of head h of
// query qi, final values v: the RoPE dims hold two whole pairs per thread (the rotated block starts at a
// multiple of 4: rope_n_freq is even), rotated as glue's heads_norm_rope(inverse) does, then written.
// The epilogue's inputs of a thread (position and the two inverse frequencies of its RoPE pairs), read by the
// caller ahead of the values (rope_load) so that their latency is not added after the last partial arrives.
struct RopeIn {
  int64_t pos = 0;
  float f0 = 0.f, f1 = 0.f;
};
__device__ __forceinline__ RopeIn rope_load(const SparseAttentionArgs& a, int qi, int tid) {
  RopeIn r;
  const int r0 = kD - 2 * a.rope_n_freq;
  if (a.rope_pos && 4 * tid >= r0) {
    const int i = (4 * tid - r0) / 2;
    r.pos = a.rope_pos[qi];
    r.f0 = a.rope_inv_freq[i];
    r.f1 = a.rope_inv_freq[i + 1];
  }
  return r;
}
__device__ __forceinline__ void write_out(const SparseAttentionArgs& a, int qi, int h, int tid, float4 v,
                                          const RopeIn& rp) {
  const int r0 = kD - 2 * a.rope_n_freq;
  if (a.rope_pos && 4 * tid >= r0) {
    const float2 x = rope_rotate(v.x, v.y, rp.pos, rp.f0, true);
    const float2 y = rope_rotate(v.z, v.w, rp.pos, rp.f1, true);
    v = make_float4(x.x, x.y, y.x, y.y);
  }
  const int64_t o = (static_cast<int64_t>(qi) * kH + h) * kD + 4 * tid;
  *reinterpret_cast<float4*>(a.out + o) = v;
  if (a.out16) {
    uint2 b;
    if (a.out16_f16) {
      const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
      b = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
      b = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
    *reinterpret_cast<uint2*>(a.out16 + o) = b;
  }
}

// The epilogue alone (no split: the attention kernel wrote out), same CTA layout as the combine.
__global__ void __launch_bounds__(128) epilogue_kernel(SparseAttentionArgs a) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int qi = blockIdx.y, h = blockIdx.x, tid = threadIdx.x;
  const RopeIn rp = rope_load(a, qi, tid);
  const float4 v = *reinterpret_cast<const float4*>(a.out + (static_cast<int64_t>(qi) * kH + h) * kD + 4 * tid);
  write_out(a, qi, h, tid, v, rp);
}

// One CTA of 128 threads per (query, head): merges the split partials with the sink (section 1.4 item 6).
// The partials' (m, l) are read in parallel and every thread forms the same weights and the same L in split
// order; the 128 threads then add their 4 dims over the splits with independent loads (fixed order). The
// first kCombinePre partials' values and the epilogue's inputs are requested together with (m, l), before the
// weights are known (decode at batch 1 has ~20 splits: they were three more round trips after it).
constexpr int kMaxSplits = 256;
constexpr int kCombinePre = 24;
__global__ void __launch_bounds__(128) combine_kernel(Params p) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ float w_s[kMaxSplits], l_s[kMaxSplits], red[4];
  const int qi = blockIdx.y, h = blockIdx.x, tid = threadIdx.x;
  const int64_t base = static_cast<int64_t>(qi) * p.splits * kH + h;  // partial of split s: base + s * kH
  const float* src = p.part_acc + base * kD + 4 * tid;
  float4 pre[kCombinePre];
#pragma unroll
  for (int s = 0; s < kCombinePre; ++s)
    if (s < p.splits) pre[s] = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kH * kD);
  const RopeIn rp = rope_load(p.a, qi, tid);
  const float sk = p.a.sink[h];
  const float sink2 = sk == -INFINITY ? -INFINITY : sk * kLog2e;
  float mloc = -INFINITY;
  for (int s = tid; s < p.splits; s += 128) {
    const int64_t pi = base + static_cast<int64_t>(s) * kH;
    const float ls = p.part_ml[2 * pi + 1];
    const float ms = ls > 0.f ? p.part_ml[2 * pi] : -INFINITY;  // an empty partial has weight 0
    w_s[s] = ms;
    l_s[s] = ls > 0.f ? ls : 0.f;
    mloc = fmaxf(mloc, ms);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, o));
  if ((tid & 31) == 0) red[tid >> 5] = mloc;
  __syncthreads();
  const float M = fmaxf(fmaxf(sink2, fmaxf(red[0], red[1])), fmaxf(red[2], red[3]));
  for (int s = tid; s < p.splits; s += 128) w_s[s] = w_s[s] == -INFINITY ? 0.f : exp2f(w_s[s] - M);
  __syncthreads();
  float L = sk == -INFINITY ? 0.f : exp2f(sink2 - M);
  for (int s = 0; s < p.splits; ++s) L += l_s[s] * w_s[s];
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int s = 0; s < kCombinePre; ++s)
    if (s < p.splits) {
      const float w = w_s[s];
      const float4 v = pre[s];
      o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
    }
#pragma unroll 8
  for (int s = kCombinePre; s < p.splits; ++s) {
    const float w = w_s[s];
    const float4 v = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kH * kD);
    o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  write_out(p.a, qi, h, tid, make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv), rp);
}

// ---- tensor-core kernel ----------------------------------------------------------------------------------
constexpr int kT = 32;                          // rows per tile
// A CTA has kTiles head tiles of 16 heads (kTiles = 1: 4 warps, two CTAs per SM on sm_90; kTiles = 2: 8 warps,
// one CTA per SM, each decoded row serves 32 heads). Each head tile is 4 warps (dim slices of 128).
constexpr int kTileStride = 2 * kD + 16;        // bytes per bf16 tile row (ldmatrix rows land on distinct banks)
constexpr int kTileBytes = kT * kTileStride;    // 33,280
constexpr int kRawStride = 584;                 // fp8 bytes staged per row (583 rounded up to 8)
constexpr int kRawChunks = kRawStride / 8;      // 73
constexpr int kRawBytes = kT * kRawStride;      // 18,688
constexpr int kSpBytesPerTile = 4 * 16 * 32 * 4;  // partial scores [dim slice][j][c][lane] fp32: 8,192

template <bool kFp8, int kTiles>
constexpr int mma_smem_bytes() {  // kTiles = 2: 87,040 (fp8) / 82,944 (bf16); kTiles = 1: 78,848 / 74,752
  return kTiles * kSpBytesPerTile + (kFp8 ? kTileBytes + 2 * kRawBytes : 2 * kTileBytes);
}
static_assert(mma_smem_bytes<true, 2>() <= 99 * 1024 && mma_smem_bytes<false, 2>() <= 99 * 1024,
              "sm_12x: 99 KB per block");

__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
template <bool kFp8, bool kSplit, int kTiles>
__global__ void __launch_bounds__(128 * kTiles, 1) attn_mma_kernel(Params p) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  constexpr int kGroups = 4 / kTiles;        // CTAs per (query, split)
  constexpr int kRows = kT / (4 * kTiles);   // tile rows each warp loads and decodes
  extern __shared__ __align__(16) uint8_t smem[];
  float* sp = reinterpret_cast<float*>(smem);
  uint8_t* tiles = smem + kTiles * kSpBytesPerTile;     // fp8: one decoded tile; bf16: two stages (cp.async targets)
  uint8_t* raw = tiles + kTileBytes;    // fp8: two stages of raw rows
  const SparseAttentionArgs& a = p.a;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int ht = warp >> 2, ds = warp & 3;
  // blockIdx.x = kGroups * split + head group: the CTAs reading the same rows run side by side (L2 hits).
  const int qi = blockIdx.y, split = blockIdx.x / kGroups;
  const int h0 = (blockIdx.x % kGroups) * 16 * kTiles + ht * 16;  // this warp's 16 heads
  const int d0 = ds * 128;                    // and 128 dims

  // Prologue (what batch-1 decode waits for): valid_len, the first two tiles' slot indices and q are requested
  // together; the indices under the split's static bound (n_slots and its chunk: always inside the slots array)
  // and masked by valid_len once it is there. Tile 0's rows are then requested one round trip after the start,
  // before q is converted (it was a chain: q converted, then valid_len, then the indices, then the rows).
  int begin, end;
  slot_range(p, qi, split, begin, end);
  const int32_t* slots = a.slots + static_cast<int64_t>(qi) * a.n_slots;
  const int bound = min(a.n_slots, begin + p.chunk);
  int idx0 = begin + lane < bound ? slots[begin + lane] : -1;
  int idx1 = begin + kT + lane < bound ? slots[begin + kT + lane] : -1;

  // q (A operand, rows = heads, k = dims): its loads are issued here and converted after tile 0's rows are
  // requested below.
  float2 xq[8][4];
  {
    const float* q0 = a.q + (static_cast<int64_t>(qi) * kH + h0 + g) * kD + d0 + 2 * t;
    const float* q1 = q0 + 8 * kD;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      xq[s][0] = *reinterpret_cast<const float2*>(q0 + 16 * s);
      xq[s][1] = *reinterpret_cast<const float2*>(q1 + 16 * s);
      xq[s][2] = *reinterpret_cast<const float2*>(q0 + 16 * s + 8);
      xq[s][3] = *reinterpret_cast<const float2*>(q1 + 16 * s + 8);
    }
  }

  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2], l[2];  // rows g and g + 8; l is this lane's share (summed over the quad at the end)
  init_rows(p, h0 + g, t, m, l);

  // Slot index of row `lane` of the tile at t0 (-1 past the end). Loaded one tile ahead of its use, so the
  // load's latency is not on the critical path.
  auto load_idx = [&](int t0) -> int { return t0 + lane < end ? slots[t0 + lane] : -1; };
  // Issues the loads of the tile at t0 (row indices idx) into stage `stage`; returns its valid-row mask (the
  // same in every warp).
  auto issue = [&](int idx, int stage) -> uint32_t {
    const bool valid = idx >= 0 && idx < a.n_rows;
    const uint32_t mask = __ballot_sync(0xffffffffu, valid);
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int r = warp * kRows + rr;
      const int ridx = __shfl_sync(0xffffffffu, idx, r);
      const bool rv = (mask >> r) & 1u;
      const uint8_t* src = a.kv + (rv ? static_cast<int64_t>(ridx) * a.row_bytes : 0);
      if (kFp8) {
        if (rv) {
          const uint32_t dst = smem_u32(raw + stage * kRawBytes + r * kRawStride);
#pragma unroll
          for (int c = lane; c < kRawChunks; c += 32) cp_async_s<8>(dst + 8 * c, src + 8 * c, 8);
        }
      } else {  // invalid rows are zero-filled (src size 0: nothing is read)
        const uint32_t dst = smem_u32(tiles + stage * kTileBytes + r * kTileStride);
#pragma unroll
        for (int c = lane; c < 2 * kD / 8; c += 32) cp_async_s<8>(dst + 8 * c, src + 8 * c, rv ? 8 : 0);
      }
    }
    cp_async_commit();
    return mask;
  };

  // ldmatrix lane addresses (bytes from the tile start). S: matrix i = lane / 8 covers keys 8 j + (lane & 7),
  // dims d0 + 32 sp2 + 8 i (k-steps 2 sp2 and 2 sp2 + 1). P V (.trans): keys 16 kk + 8 (i & 1) + (lane & 7),
  // dims d0 + 16 np + 8 (i >> 1) (n-tiles 2 np and 2 np + 1).
  const uint32_t qk_off = (lane & 7) * kTileStride + (d0 + 8 * (lane >> 3)) * 2;
  const uint32_t pv_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kTileStride + (d0 + 8 * (lane >> 4)) * 2;

  uint32_t next_mask = 0;
  int next_idx = -1;
  if (begin < end) {
    next_mask = issue(begin + lane < end ? idx0 : -1, 0);
    next_idx = begin + kT + lane < end ? idx1 : -1;
  }

  // q fragments, scaled by scale * log2 e before rounding.
  constexpr int kQL = kSplit ? 8 : 1;
  uint32_t qh[8][4], ql[kQL][4];
  {
    const float qscale = a.scale * kLog2e;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t dummy;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        to_frag<kSplit>(xq[s][c].x * qscale, xq[s][c].y * qscale, qh[s][c], kSplit ? ql[s % kQL][c] : dummy);
    }
  }
  int stage = 0;
  for (int t0 = begin; t0 < end; t0 += kT, stage ^= 1) {
    const uint32_t mask = next_mask;
    cp_async_wait<0>();
    __syncthreads();  // tile t0 has landed; every warp is done with the previous tile's buffers
    if (t0 + kT < end) {
      next_mask = issue(next_idx, stage ^ 1);
      next_idx = load_idx(t0 + 2 * kT);
    }
    const uint8_t* tile;
    if (kFp8) {
      // Decode: warp w converts its kRows rows; lanes 0-27 take 16 e4m3 bytes, lanes 28-31 32 B of RoPE dims.
      const uint8_t* rs = raw + stage * kRawBytes;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int r = warp * kRows + rr;
        uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
        if ((mask >> r) & 1u) {
          const uint8_t* src = rs + r * kRawStride;
          if (lane < 28) {
            const uint2 b0 = *reinterpret_cast<const uint2*>(src + 16 * lane);
            const uint2 b1 = *reinterpret_cast<const uint2*>(src + 16 * lane + 8);
            const float s = e8m0(src[kNope + 2 * (kD - kNope) + lane / 4]);
            v0 = make_uint4(e4m3x2_bf16(b0.x, s), e4m3x2_bf16(b0.x >> 16, s), e4m3x2_bf16(b0.y, s),
                            e4m3x2_bf16(b0.y >> 16, s));
            v1 = make_uint4(e4m3x2_bf16(b1.x, s), e4m3x2_bf16(b1.x >> 16, s), e4m3x2_bf16(b1.y, s),
                            e4m3x2_bf16(b1.y >> 16, s));
          } else {
            const uint2* rp = reinterpret_cast<const uint2*>(src + kNope + 32 * (lane - 28));
            const uint2 x0 = rp[0], x1 = rp[1], x2 = rp[2], x3 = rp[3];
            v0 = make_uint4(x0.x, x0.y, x1.x, x1.y);
            v1 = make_uint4(x2.x, x2.y, x3.x, x3.y);
          }
        }
        uint4* dst = reinterpret_cast<uint4*>(tiles + r * kTileStride + 32 * lane);
        dst[0] = v0;
        dst[1] = v1;
      }
      __syncthreads();
      tile = tiles;
    } else {
      tile = tiles + stage * kTileBytes;
    }
    if (mask == 0) continue;  // uniform over the CTA
    const uint32_t tb = smem_u32(tile);

    // Partial S over this warp's 128 dims: 4 n-tiles of 8 keys.
    float sacc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
#pragma unroll
    for (int sp2 = 0; sp2 < 4; ++sp2) {
      uint32_t b[4][4];  // all four key n-tiles' fragments first, then the mma (loads overlap)
#pragma unroll
      for (int j = 0; j < 4; ++j) ldsm4(tb + qk_off + j * 8 * kTileStride + sp2 * 64, b[j][0], b[j][1], b[j][2], b[j][3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        mma_bf16(sacc[j], qh[2 * sp2], b[j][0], b[j][1]);
        mma_bf16(sacc[j], qh[2 * sp2 + 1], b[j][2], b[j][3]);
      }
      if (kSplit) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          mma_bf16(sacc[j], ql[(2 * sp2) % kQL], b[j][0], b[j][1]);
          mma_bf16(sacc[j], ql[(2 * sp2 + 1) % kQL], b[j][2], b[j][3]);
        }
      }
    }
    {  // partials as float4 [head tile][dim slice][j][lane]
      float4* w = reinterpret_cast<float4*>(sp) + (ht * 4 + ds) * 4 * 32 + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j * 32] = make_float4(sacc[j][0], sacc[j][1], sacc[j][2], sacc[j][3]);
    }
    __syncthreads();
    float s[4][4];
    {
      const float4* rd = reinterpret_cast<const float4*>(sp) + ht * 4 * 4 * 32 + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 p0 = rd[j * 32], p1 = rd[128 + j * 32], p2 = rd[256 + j * 32], p3 = rd[384 + j * 32];
        s[j][0] = ((p0.x + p1.x) + p2.x) + p3.x;
        s[j][1] = ((p0.y + p1.y) + p2.y) + p3.y;
        s[j][2] = ((p0.z + p1.z) + p2.z) + p3.z;
        s[j][3] = ((p0.w + p1.w) + p2.w) + p3.w;
      }
    }

    // Online softmax (base 2), then P as A fragments (k = keys 16 kk .. +15).
    float alpha[2];
    if (softmax_tile(s, mask, t, m, l, alpha)) {
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
        o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
      }
    }
    uint32_t ph[2][4], pl[kSplit ? 2 : 1][4];
    p_frags<kSplit>(s, ph, pl);
    // O += P V over this warp's 128 dims.
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      uint32_t b[2][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) ldsm4_t(tb + pv_off + kk * 16 * kTileStride + np * 32, b[kk][0], b[kk][1], b[kk][2], b[kk][3]);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        mma_bf16(o[2 * np], ph[kk], b[kk][0], b[kk][1]);
        mma_bf16(o[2 * np + 1], ph[kk], b[kk][2], b[kk][3]);
      }
      if (kSplit) {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          mma_bf16(o[2 * np], pl[kk % (kSplit ? 2 : 1)], b[kk][0], b[kk][1]);
          mma_bf16(o[2 * np + 1], pl[kk % (kSplit ? 2 : 1)], b[kk][2], b[kk][3]);
        }
      }
    }
  }

  store_result<16>(p, qi, split, h0 + g, d0 + 2 * t, m, l, ds == 0 && t == 0,
                   [&](int n, int c) { return o[n][c]; });
}

template <bool kFp8, bool kSplit, int kTiles>
void launch_mma_tiles(const Params& p, cudaStream_t stream) {
  constexpr int smem = mma_smem_bytes<kFp8, kTiles>();
  static const bool configured = [] {
    check(cudaFuncSetAttribute(attn_mma_kernel<kFp8, kSplit, kTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem),
          "sparse_attention: shared-memory opt-in");
    return true;
  }();
  (void)configured;
  check(launch(attn_mma_kernel<kFp8, kSplit, kTiles>, dim3(p.splits * (4 / kTiles), p.a.n_queries), dim3(128 * kTiles), smem, stream, p), "attn_mma_kernel launch");
}

// Head tiles per CTA: 1 for 1-2 queries (more, shorter CTAs: measured ~6% faster at batch 1), else 2 (~20%
// faster from 8 queries up). DSV4_ATTN_HEAD_TILES=1 / 2 forces one (a benchmarking knob; the tests run both).
// Read per call, so a captured graph keeps the variant it was captured with.
int head_tiles(int n_queries) {
  const char* e = std::getenv("DSV4_ATTN_HEAD_TILES");
  if (e && (e[0] == '1' || e[0] == '2')) return e[0] - '0';
  return n_queries <= 2 ? 1 : 2;
}

template <bool kFp8, bool kSplit>
void launch_mma(const Params& p, cudaStream_t stream) {
  if (head_tiles(p.a.n_queries) == 1) launch_mma_tiles<kFp8, kSplit, 1>(p, stream);
  else launch_mma_tiles<kFp8, kSplit, 2>(p, stream);
}

// The kernel for fp8 rows in a tensor-core precision: the wgmma kernel (sparse_attention_wgmma.cu) on compute
// capability 9.0 from kWgmmaMinQueries queries (prefill), else attn_mma_kernel. DSV4_ATTN_KERNEL=mma / wgmma
// forces one for fp8 rows (a benchmarking and test knob; wgmma throws on other devices). Read per call, as
// head_tiles.
constexpr int kWgmmaMinQueries = 128;  // equal to attn_mma_kernel at 64 (run 54); decode batches stay below
bool use_wgmma(int n_queries, bool fp8, int64_t n_rows) {
  if (!fp8 || n_rows < 1) return false;  // the wgmma kernel reads row 0 in place of invalid rows
  const char* e = std::getenv("DSV4_ATTN_KERNEL");
  if (e && std::strcmp(e, "wgmma") == 0) return true;
  if (e && std::strcmp(e, "mma") == 0) return false;
  return n_queries >= kWgmmaMinQueries && wgmma_supported();
}

// Deterministic split choice from the shapes and the SM count only (so eager and graph runs agree): about one
// wave of CTAs (2 per query and split), at least one 32-row tile per split.
void choose_split(int n_queries, int n_slots, int* splits, int* chunk) {
  if (n_slots <= 0 || n_queries <= 0) {
    *splits = 1;
    *chunk = std::max(n_slots, 0);
    return;
  }
  const int sms = device_config().sm_count;
  const int ctas = 2 * n_queries;
  int s = std::max(1, (sms + ctas / 2) / ctas);
  s = std::min({s, (n_slots + kT - 1) / kT, kMaxSplits});
  int c = (n_slots + s - 1) / s;
  c = (c + kT - 1) / kT * kT;
  *splits = (n_slots + c - 1) / c;
  *chunk = c;
}

int64_t min_row_bytes(KvRowFormat f) {
  switch (f) {
    case KvRowFormat::kF32: return 4 * kD;
    case KvRowFormat::kBF16: return 2 * kD;
    case KvRowFormat::kFP8: return kNope + 2 * (kD - kNope) + kNope / 64;
  }
  return 0;
}

}  // namespace

// The largest split workspace any call with at most n_queries queries and at most n_slots slots needs (callers
// size the buffer once for their largest batch and then launch smaller ones): choose_split's split count before
// its chunk rounding, which only lowers it, is non-decreasing in n_slots; the maximum over the query counts
// makes the bound non-decreasing in n_queries.
size_t sparse_attention_workspace_bytes(int n_queries, int n_slots) {
  if (n_slots <= 0) return 0;
  size_t best = 0;
  const int sms = device_config().sm_count;
  for (int nq = 1; nq <= std::min(n_queries, sms); ++nq) {
    const int s = std::min({std::max(1, (sms + nq) / (2 * nq)), (n_slots + kT - 1) / kT, kMaxSplits});
    if (s > 1) best = std::max(best, static_cast<size_t>(nq) * s * kH * (kD + 2) * sizeof(float));
  }
  return best;
}

void sparse_attention(const SparseAttentionArgs& a, cudaStream_t stream) {
  device_config();
  if (a.n_queries < 0 || a.n_slots < 0) fail("cuda::sparse_attention: negative shape");
  if (a.n_queries == 0) return;
  if (a.n_queries > 65535) fail("cuda::sparse_attention: ", a.n_queries, " queries in one call (at most 65535)");
  if (a.row_bytes < min_row_bytes(a.format))
    fail("cuda::sparse_attention: row_bytes ", a.row_bytes, " is below the format's ", min_row_bytes(a.format));
  const int align = a.format == KvRowFormat::kF32 ? 16 : 8;
  if (a.row_bytes % align || reinterpret_cast<uintptr_t>(a.kv) % align)
    fail("cuda::sparse_attention: KV rows must be ", align, "-byte aligned (row_bytes ", a.row_bytes, ")");
  if (reinterpret_cast<uintptr_t>(a.q) % 16 || reinterpret_cast<uintptr_t>(a.out) % 16)
    fail("cuda::sparse_attention: q and out must be 16-byte aligned");
  if (a.rope_pos && (!a.rope_inv_freq || a.rope_n_freq <= 0 || a.rope_n_freq % 2 || 2 * a.rope_n_freq > kD))
    fail("cuda::sparse_attention: the RoPE epilogue needs inverse frequencies and an even rope_n_freq in 2..",
         kD / 2, " (got ", a.rope_n_freq, ")");
  if (reinterpret_cast<uintptr_t>(a.out16) % 8) fail("cuda::sparse_attention: out16 must be 8-byte aligned");
  const bool epilogue = a.rope_pos || a.out16;
  Params p{a, 1, 0, nullptr, nullptr};
  choose_split(a.n_queries, a.n_slots, &p.splits, &p.chunk);
  if (p.splits > 1) {
    if (!a.workspace) fail("cuda::sparse_attention: a workspace of ", sparse_attention_workspace_bytes(a.n_queries, a.n_slots), " B is required");
    p.part_acc = static_cast<float*>(a.workspace);
    p.part_ml = p.part_acc + static_cast<size_t>(a.n_queries) * p.splits * kH * kD;
  }
  const bool fp8 = a.format == KvRowFormat::kFP8;
  if (a.format == KvRowFormat::kF32 || a.precision == AttnPrecision::kFp32) {
    check(launch(fp32_kernel, dim3(p.splits, a.n_queries, kHeadGroups), dim3(kThreads), 0, stream, p), "fp32_kernel launch");
  } else if ((a.precision == AttnPrecision::kSplitBf16 || a.precision == AttnPrecision::kBf16) &&
             use_wgmma(a.n_queries, fp8, a.n_rows)) {
    launch_wgmma(p, a.precision == AttnPrecision::kSplitBf16, stream);
  } else if (a.precision == AttnPrecision::kSplitBf16) {
    fp8 ? launch_mma<true, true>(p, stream) : launch_mma<false, true>(p, stream);
  } else if (a.precision == AttnPrecision::kBf16) {
    fp8 ? launch_mma<true, false>(p, stream) : launch_mma<false, false>(p, stream);
  } else {
    fail("cuda::sparse_attention: unknown precision ", static_cast<int>(a.precision));
  }
  if (p.splits > 1) {
    check(launch(combine_kernel, dim3(kH, a.n_queries), dim3(128), 0, stream, p), "combine_kernel launch");
  } else if (epilogue) {
    check(launch(epilogue_kernel, dim3(kH, a.n_queries), dim3(128), 0, stream, a), "epilogue_kernel launch");
  }
}

}  // namespace dsv4::cuda
