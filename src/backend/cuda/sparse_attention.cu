// Sparse attention with per-head sinks over gathered K = V rows (reference: cpu::sparse_attention; the
// online-softmax contract is spec failure-modes-and-kernels.md section 1.4).
//
// Layout of the work: one CTA of 16 warps serves 32 of the 64 heads of one query over one split of the
// query's slot list (MQA: each gathered row is shared by the CTA's heads; the second head group's read of
// the same row mostly hits L2; 64 heads in one CTA spilled registers). A warp owns 2 heads;
// lane l owns dims {128*i + 4*l .. +3, i = 0..3} of q and of the accumulator, so every shared-memory read is
// a conflict-free float4. Keys are processed in tiles of 16 rows that the 16 warps decode (fp8 / bf16 / f32
// -> fp32) into shared memory.
//
// Softmax numerics (all fp32): scores are taken in base 2 (scale * log2 e folded into q once). Invalid
// slots (index < 0, >= n_rows, or at/after valid_len) are skipped before any arithmetic, so they carry
// exactly zero weight and never touch memory. The running max starts at the sink (or -inf for a -inf
// sink, with l = 0); alpha = exp2(m_old - m_new) is taken only when m_new is finite. A row with nothing
// valid ends with acc = 0 and returns 0 (sink-only result), never 0/0.
//
// Split-K: with few queries the slot list is split over several CTAs; each writes (m, l, acc) without the
// sink, and a combine kernel merges the partials together with the sink. A partial with l = 0 has weight
// 0. Nothing is counted across CTAs, so replaying a captured graph needs no reset.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kH = kAttnHeads;     // 64
constexpr int kD = kAttnDim;       // 512
constexpr int kWarps = 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kHeadGroups = 2;              // CTAs per (query, split); each serves 32 heads (registers)
constexpr int kHeadsPerWarp = kH / kHeadGroups / kWarps;  // 2
constexpr int kTile = 16;                   // rows per tile (one per warp when loading)
constexpr int kNope = 448;                  // fp8 layout: e4m3 dims, then 64 bf16 RoPE dims, then scales
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float e8m0(uint8_t e) {
  // 2^(e-127), exactly as the CPU decoder: e = 0 is the denormal 2^-127, 0xff is NaN.
  if (e == 0xff) return __int_as_float(0x7fc00000);
  if (e == 0) return __int_as_float(0x00400000);
  return __int_as_float(static_cast<int>(e) << 23);
}

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

struct Params {
  SparseAttentionArgs a;
  int splits;
  int chunk;  // slots per split (multiple of kTile)
  float* part_acc;  // [nq, splits, 64, 512]
  float* part_ml;   // [nq, splits, 64, 2]
};

__global__ void __launch_bounds__(kThreads, 1) sparse_attention_kernel(Params p) {
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

  int end = a.valid_len ? min(a.valid_len[qi], a.n_slots) : a.n_slots;
  const int begin = split * p.chunk;
  end = min(end, begin + p.chunk);
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

// One CTA of 128 threads per (query, head): merges the split partials with the sink (section 1.4 item 6).
__global__ void __launch_bounds__(128) combine_kernel(Params p) {
  const int qi = blockIdx.y, h = blockIdx.x;
  const float sk = p.a.sink[h];
  float M = sk == -INFINITY ? -INFINITY : sk * kLog2e;
  for (int s = 0; s < p.splits; ++s) {
    const int64_t pi = (static_cast<int64_t>(qi) * p.splits + s) * kH + h;
    if (p.part_ml[2 * pi + 1] > 0.f) M = fmaxf(M, p.part_ml[2 * pi]);
  }
  float L = sk == -INFINITY ? 0.f : exp2f(sk * kLog2e - M);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  const int d = 4 * threadIdx.x;
  for (int s = 0; s < p.splits; ++s) {
    const int64_t pi = (static_cast<int64_t>(qi) * p.splits + s) * kH + h;
    const float ls = p.part_ml[2 * pi + 1];
    if (!(ls > 0.f)) continue;  // empty partial: weight 0
    const float w = exp2f(p.part_ml[2 * pi] - M);
    L += ls * w;
    const float4 v = *reinterpret_cast<const float4*>(p.part_acc + pi * kD + d);
    o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  *reinterpret_cast<float4*>(p.a.out + (static_cast<int64_t>(qi) * kH + h) * kD + d) =
      make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
}

// Deterministic split choice from the shapes and the SM count only (so eager and graph runs agree).
void choose_split(int n_queries, int n_slots, int* splits, int* chunk) {
  const int sms = device_config().sm_count;
  int s = 1;
  if (n_queries < 2 * sms) s = (2 * sms + n_queries - 1) / n_queries;
  const int max_by_len = (n_slots + 31) / 32;  // at least 32 slots per split
  s = std::max(1, std::min(s, max_by_len));
  int c = (n_slots + s - 1) / s;
  c = (c + kTile - 1) / kTile * kTile;
  s = std::max(1, (n_slots + c - 1) / c);
  *splits = s;
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

size_t sparse_attention_workspace_bytes(int n_queries, int n_slots) {
  int s, c;
  choose_split(n_queries, n_slots, &s, &c);
  if (s == 1) return 0;
  return static_cast<size_t>(n_queries) * s * kH * (kD + 2) * sizeof(float);
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
  Params p{a, 1, 0, nullptr, nullptr};
  choose_split(a.n_queries, a.n_slots, &p.splits, &p.chunk);
  if (p.splits > 1) {
    if (!a.workspace) fail("cuda::sparse_attention: a workspace of ", sparse_attention_workspace_bytes(a.n_queries, a.n_slots), " B is required");
    p.part_acc = static_cast<float*>(a.workspace);
    p.part_ml = p.part_acc + static_cast<size_t>(a.n_queries) * p.splits * kH * kD;
  }
  sparse_attention_kernel<<<dim3(p.splits, a.n_queries, kHeadGroups), kThreads, 0, stream>>>(p);
  check(cudaGetLastError(), "sparse_attention_kernel launch");
  if (p.splits > 1) {
    combine_kernel<<<dim3(kH, a.n_queries), 128, 0, stream>>>(p);
    check(cudaGetLastError(), "sparse_attention combine launch");
  }
}

}  // namespace dsv4::cuda
