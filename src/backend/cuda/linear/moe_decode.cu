// MXFP4 MoE for decode (T <= 64 tokens x top_k experts), four launches:
//   1. group:   (token, slot) pairs bucketed by expert, in token order; the list of experts with >= 1 token;
//   2. w13:     for each active expert, w1 and w3 rows streamed once for all its tokens, SwiGLU with the
//               clamp and the routing weight (applied before w2, as the DeepSeek reference does) -> h (bf16);
//   3. w2:      for each active expert, y = w2 h for its tokens, one fp32 row per (token, slot);
//   4. combine: out[t] = sum over slots in slot order (deterministic, no atomics).
// Grids are sized for the most experts T*top_k tokens can touch; blocks past the active count exit at once,
// so an expert with no token costs no weight traffic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "backend/cuda/linear/stream.cuh"
#include "backend/cuda/linear/warp_tile.cuh"
#include "core/error.h"

namespace dsv4::cudalin {
namespace {

constexpr int kMaxExperts = 1024;
int g_force_moe_ks = 0;
int g_moe_warps = 4;  // set_moe_block_warps
int g_moe_max_nt = 2;  // set_moe_max_ntiles
MoeSplit g_moe_split;  // set_moe_split
MoeLean g_moe_lean;  // set_moe_lean

// meta layout (ints): [0] n_active | [1, 1+E) active expert ids | [1+E, 2+2E) offsets into the pair lists |
// [2+2E, 2+2E+P) token of each grouped pair | [2+2E+P, 2+2E+2P) pair id t*top_k+k of each grouped pair.
struct Meta {
  int* base;
  int E, P;
  __device__ __host__ int* n_active() const { return base; }
  __device__ __host__ int* active() const { return base + 1; }
  __device__ __host__ int* offs() const { return base + 1 + E; }
  __device__ __host__ int* tok() const { return base + 2 + 2 * E; }
  __device__ __host__ int* pid() const { return base + 2 + 2 * E + P; }
};

__global__ void group_kernel(const int32_t* idx, int P, int top_k, Meta m) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ int cnt[kMaxExperts], pos[kMaxExperts];
  const int E = m.E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int p = 0; p < P; ++p) c += idx[p] == e;
    cnt[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // E <= 1024 sequential steps: negligible next to the weight streaming
    int na = 0, off = 0;
    for (int e = 0; e < E; ++e) {
      pos[e] = off;
      if (cnt[e] > 0) {
        m.active()[na] = e;
        m.offs()[na] = off;
        ++na;
        off += cnt[e];
      }
    }
    m.offs()[na] = off;
    *m.n_active() = na;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    if (cnt[e] == 0) continue;
    int o = pos[e];
    for (int p = 0; p < P; ++p)
      if (idx[p] == e) m.tok()[o] = p / top_k, m.pid()[o++] = p;
  }
}

struct MoeArgs {
  const DevExpert* ex;
  int hidden, inter;
  float limit;
  const uint16_t* x;
  const float* rw;
  __nv_bfloat16* h;
  float* ybuf;
  Meta m;
};

template <int NT, int CPW>
__global__ void __launch_bounds__(256) w13_kernel(MoeArgs a) {
  __shared__ float red[2][8][128];
  if (blockIdx.y >= *a.m.n_active()) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int e = a.m.active()[blockIdx.y], off = a.m.offs()[blockIdx.y], ntok = a.m.offs()[blockIdx.y + 1] - off;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const DevExpert ex = a.ex[e];
  const uint8_t* const W[2] = {ex.w1, ex.w3};
  const uint8_t* const S[2] = {ex.s1, ex.s3};
  // NT is sized for T tokens; an expert listed twice for one token (possible with hash tables) can have
  // more, and then streams its weights once per group of 8*NT.
  for (int base = 0; base < ntok; base += 8 * NT) {
  const uint16_t* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int j = base + nt * 8 + g;
    xr[nt] = j < ntok ? a.x + int64_t(a.m.tok()[off + j]) * a.hidden + t * 32 : nullptr;
  }
  const int nt_valid = min(NT, (ntok - base + 7) / 8);
  float acc[2][NT][4] = {};
  dev::fp4_warp<NT, CPW, 2>(W, S, a.hidden, row0, warp * CPW, a.hidden / 128, nt_valid, xr, acc);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= nt_valid) break;
    dev::stash_frag(red[0][warp], acc[0][nt]);
    dev::stash_frag(red[1][warp], acc[1][nt]);
    __syncthreads();
    if (threadIdx.x < 128) {
      const int r = threadIdx.x >> 3, c = threadIdx.x & 7, j = base + nt * 8 + c;
      float gv = 0.f, uv = 0.f;
      for (int w = 0; w < 8; ++w) gv += red[0][w][threadIdx.x], uv += red[1][w][threadIdx.x];
      if (j < ntok) {
        if (a.limit > 0.f) {
          gv = fminf(gv, a.limit);
          uv = fminf(fmaxf(uv, -a.limit), a.limit);
        }
        const float hv = gv / (1.0f + expf(-gv)) * uv * a.rw[a.m.pid()[off + j]];
        a.h[int64_t(off + j) * a.inter + row0 + r] = __float2bfloat16_rn(hv);
      }
    }
    __syncthreads();
  }
  }
}

template <int NT, int CPW>
__global__ void __launch_bounds__(256) w2_kernel(MoeArgs a) {
  __shared__ float red[8][128];
  if (blockIdx.y >= *a.m.n_active()) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int e = a.m.active()[blockIdx.y], off = a.m.offs()[blockIdx.y], ntok = a.m.offs()[blockIdx.y + 1] - off;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const uint16_t* hb = reinterpret_cast<const uint16_t*>(a.h);
  const DevExpert ex = a.ex[e];
  const uint8_t* const W[1] = {ex.w2};
  const uint8_t* const S[1] = {ex.s2};
  for (int base = 0; base < ntok; base += 8 * NT) {
  const uint16_t* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int j = base + nt * 8 + g;
    xr[nt] = j < ntok ? hb + int64_t(off + j) * a.inter + t * 32 : nullptr;
  }
  const int nt_valid = min(NT, (ntok - base + 7) / 8);
  float acc[1][NT][4] = {};
  dev::fp4_warp<NT, CPW, 1>(W, S, a.inter, row0, warp * CPW, a.inter / 128, nt_valid, xr, acc);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= nt_valid) break;
    dev::stash_frag(red[warp], acc[0][nt]);
    __syncthreads();
    if (threadIdx.x < 128) {
      const int r = threadIdx.x >> 3, c = threadIdx.x & 7, j = base + nt * 8 + c;
      float v = 0.f;
      for (int w = 0; w < 8; ++w) v += red[w][threadIdx.x];
      if (j < ntok) a.ybuf[int64_t(a.m.pid()[off + j]) * a.hidden + row0 + r] = v;
    }
    __syncthreads();
  }
  }
}

__global__ void combine_kernel(const float* ybuf, const int32_t* idx, int T, int top_k, int E, int hidden,
                               bool accumulate, float* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t n = int64_t(T) * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, d = i % hidden;
    float v = accumulate ? out[i] : 0.f;
    for (int k = 0; k < top_k; ++k) {
      const int e = idx[t * top_k + k];
      v += (e >= 0 && e < E) ? ybuf[(t * top_k + k) * hidden + d] : __int_as_float(0x7FC00000);  // bad id: NaN
    }
    out[i] = v;
  }
}

// ---------------------------------------------------------------- v2 (default): two launches
// Every block finds its expert itself (no grouping kernel): the a-th smallest expert id present in idx
// (blockIdx.y = a), its (token, slot) pairs in pair order, and the number of valid pairs of smaller experts
// (the offset of its rows in h). w13 and w2 stream through the per-warp cp.async ring (stream.cuh); a block
// is MW warps = (MW / ksb) row tiles x ksb K splits, ksb chosen so the grid fits one wave. w2 also combines:
// after writing its fp32 rows per pair into ybuf, a block counts arrivals per (token, row block); the block
// completing a token adds its top_k rows in slot order (fixed order: deterministic) into out.
constexpr int kMaxPairs = 1024;

struct Slot {
  int e, off, ntok;
};

// Needs blockDim.x >= 32. s_pid gets the expert's pair ids in increasing order.
__device__ Slot find_slot(const int32_t* idx, int P, int E, int slot, int* s_pid, unsigned* s_bits, int* s_info) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) s_bits[threadIdx.x] = 0u;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = idx[p];
    if (e >= 0 && e < E) atomicOr(&s_bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const unsigned bits = s_bits[lane];
    const int cnt = __popc(bits);
    int incl = cnt;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += v;
    }
    const int excl = incl - cnt, total = __shfl_sync(0xFFFFFFFFu, incl, 31);
    int e = -1;
    if (slot < total) {
      const unsigned own = __ballot_sync(0xFFFFFFFFu, slot >= excl && slot < incl);
      const int owner = __ffs(own) - 1;
      int cand = -1;
      if (lane == owner) {
        unsigned w = bits;
        for (int j = excl; j < slot; ++j) w &= w - 1u;
        cand = lane * 32 + __ffs(w) - 1;
      }
      e = __shfl_sync(0xFFFFFFFFu, cand, owner);
    }
    int n = 0, less = 0;
    if (e >= 0) {
      for (int base = 0; base < P; base += 32) {
        const int p = base + lane;
        const int v = p < P ? idx[p] : -1;
        const unsigned m = __ballot_sync(0xFFFFFFFFu, v == e);
        if (v == e) s_pid[n + __popc(m & ((1u << lane) - 1u))] = p;
        n += __popc(m);
        less += __popc(__ballot_sync(0xFFFFFFFFu, v >= 0 && v < e));
      }
    }
    if (lane == 0) s_info[0] = e, s_info[1] = less, s_info[2] = n;
  }
  __syncthreads();
  return Slot{s_info[0], s_info[1], s_info[2]};
}

// find_slot for the heavy launch of a split (set_moe_split): the slot-th expert, in id order, among those with
// at least lo pairs; the same Slot (off = valid pairs of smaller experts, s_pid = its pairs in order) as
// find_slot gives that expert. s_cnt: E ints of scratch (the caller's ring, unused until streaming starts).
__device__ Slot find_slot_heavy(const int32_t* idx, int P, int E, int slot, int lo, int* s_pid, int* s_cnt,
                                int* s_info) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < E; e += blockDim.x) s_cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = idx[p];
    if (e >= 0 && e < E) atomicAdd(&s_cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    int e = -1, less = 0, seen = 0;  // seen: heavy experts in earlier groups of 32 ids
    for (int base = 0; base < E; base += 32) {  // warp-uniform control flow throughout
      const int c = base + lane < E ? s_cnt[base + lane] : 0;
      const unsigned heavy = __ballot_sync(kAll, c >= lo);
      const int n = __popc(heavy);
      int sum = c;
      if (slot < seen + n) {
        unsigned w = heavy;
        for (int j = seen; j < slot; ++j) w &= w - 1u;
        const int owner = __ffs(w) - 1;
        e = base + owner;
        sum = lane < owner ? c : 0;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kAll, sum, o);
      less += sum;
      if (e >= 0) break;
      seen += n;
    }
    int n = 0;
    if (e >= 0) {
      for (int base = 0; base < P; base += 32) {
        const int p = base + lane;
        const int v = p < P ? idx[p] : -1;
        const unsigned m = __ballot_sync(kAll, v == e);
        if (v == e) s_pid[n + __popc(m & ((1u << lane) - 1u))] = p;
        n += __popc(m);
      }
    }
    if (lane == 0) s_info[0] = e, s_info[1] = less, s_info[2] = n;
  }
  __syncthreads();
  return Slot{s_info[0], s_info[1], s_info[2]};
}

constexpr int kMoeStages = 4;
// MW warps per block: 4 by default (set_moe_block_warps). At one token the w1/w3 grid is 6 experts x 128 row
// tiles; in blocks of 8 warps that is 192 blocks for 264 slots (60 SMs run two, 72 one, and the kernels are
// issue-bound, so the two-block SMs set the time); blocks of 4 warps spread the same warps as 2-3 blocks on
// every SM.
template <int NMAT, int MW>
constexpr int moe2_smem() { return MW * dev::ring_bytes_per_warp<true, NMAT, kMoeStages>(); }
constexpr int moe2_min_blocks(int nt, int mw) { return nt <= 2 ? 16 / mw : 8 / mw; }
// The lean kernels (set_moe_lean, NT == 1 only): no activation prefetch, so they compile to <= 80 registers
// with no spill (ptxas, sm_90a and sm_120a) and 24 warps fit an SM (6 blocks of 4 warps). w2's shared memory
// allows 7 such blocks as it is; w1/w3 needs a 3-stage ring and a short pair list (kLeanPairs) to fit 6
// (3 x 2 x 1280 B per warp + 4 KB of partials: ~35.5 KB per block). The split picker then finds more K
// splits at one token (for w2, 768 blocks of 4 warps instead of 384 in 792 slots).
constexpr int lean_blocks(int mw) { return 24 / mw; }
constexpr int kLeanW13Stages = 3;
constexpr int kLeanPairs = 128;  // pairs of one launch the lean w1/w3 kernel takes (T <= 8 tokens x top_k <= 16)
template <int NMAT, int MW, bool LEAN>
constexpr int moe2_ring_smem() {
  return moe2_smem<NMAT, MW>() * (LEAN && NMAT == 2 ? kLeanW13Stages : kMoeStages) / kMoeStages;
}
// Which lean kernels a launch of P pairs takes when `lean` allows them: set_moe_lean's kernel flags, and lean
// w1/w3 only while its pair list holds every pair (kLeanPairs).
struct LeanKernels {
  bool w13, w2;
};
LeanKernels lean_kernels(bool lean, int P) {
  return {lean && g_moe_lean.w13 && P <= kLeanPairs, lean && g_moe_lean.w2};
}

struct Moe2Args {
  const DevExpert* ex;
  const int32_t* idx;
  int hidden, inter, E, top_k, P, T;
  float limit;
  const uint16_t* x;  // bf16, or f16 (H16)
  const float* rw;
  uint16_t* h;  // bf16, or f16 (H16)
  float* ybuf;
  float* out;
  int* counters;  // [T, gridDim.x of w2], zero between launches
  bool accumulate;
  int ksb;
  // A split launch (set_moe_split, MoeClass): light kernels take experts of <= ntok_hi pairs, heavy ones the
  // experts of >= ntok_lo pairs.
  int ntok_lo = 1, ntok_hi = kMaxPairs;
};
static_assert(moe2_smem<1, 4>() >= kMaxExperts * int(sizeof(int)), "find_slot_heavy counts experts in the ring");

// Expert classes of the v2 kernels (a template parameter, so the default kernels carry no split code):
// every expert, or a split launch's light experts (<= ntok_hi pairs) or heavy ones (>= ntok_lo pairs; the
// grid's y counts only those: find_slot_heavy). set_moe_split.
enum MoeClass { kAllExperts = 0, kLight = 1, kHeavy = 2 };

// The block's expert in its class; e = -1 when it has none.
template <int CLASS>
__device__ __forceinline__ Slot block_slot(const Moe2Args& a, int* s_pid, unsigned* s_bits, int* s_info, void* ring) {
  if constexpr (CLASS == kHeavy) {
    return find_slot_heavy(a.idx, a.P, a.E, blockIdx.y, a.ntok_lo, s_pid, static_cast<int*>(ring), s_info);
  } else {
    Slot sl = find_slot(a.idx, a.P, a.E, blockIdx.y, s_pid, s_bits, s_info);
    if (CLASS == kLight && sl.ntok > a.ntok_hi) sl.e = -1;
    return sl;
  }
}

template <int NT, bool H16, int MW, bool LEAN = false, int CLASS = kAllExperts>
__global__ void __launch_bounds__(MW * 32, LEAN ? lean_blocks(MW) : moe2_min_blocks(NT, MW)) w13_v2_kernel(Moe2Args a) {
  static_assert(!LEAN || (NT == 1 && CLASS != kHeavy), "the lean kernels are for T <= 8, light experts");
  constexpr int kStages = LEAN ? kLeanW13Stages : kMoeStages;
  extern __shared__ uint4 ring[];
  __shared__ float red[2][MW][128];
  __shared__ int s_pid[LEAN ? kLeanPairs : kMaxPairs];
  __shared__ unsigned s_bits[32];
  __shared__ int s_info[3];
  cuda::pdl::wait();  // routes and activations come from the preceding kernels
  cuda::pdl::trigger();
  const Slot sl = block_slot<CLASS>(a, s_pid, s_bits, s_info, ring);
  if (sl.e < 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ksb = a.ksb, tpb = MW / ksb, tiles = a.inter / 16, C = a.hidden / 128;
  const int tile = blockIdx.x * tpb + warp / ksb, ks = warp % ksb;
  const int cb = ks * C / ksb, ce = (ks + 1) * C / ksb;
  const DevExpert ex = a.ex[sl.e];
  const uint8_t* const W[2] = {ex.w1, ex.w3};
  const uint8_t* const S[2] = {ex.s1, ex.s3};
  constexpr int kRing = kStages * 2 * dev::RingGeom<true>::kU4;
  // NT is sized for T tokens; an expert listed twice for one token (possible with hash tables) can have
  // more, and then streams its weights once per group of 8*NT.
  for (int base = 0; base < sl.ntok; base += 8 * NT) {
    const uint16_t* xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = base + nt * 8 + g;
      xr[nt] = j < sl.ntok ? a.x + int64_t(s_pid[j] / a.top_k) * a.hidden + t * 32 : nullptr;
    }
    const int nt_valid = min(NT, (sl.ntok - base + 7) / 8);
    float acc[2][NT][4] = {};
    if (tile < tiles)
      dev::stream_warp<true, NT, 2, kStages, H16, LEAN ? 0 : -1>(ring + warp * kRing, W, S, false, a.hidden,
                                                                 int64_t(tile) * 16, cb, ce, nt_valid, xr, acc);
    float(*const parts[2])[128] = {red[0], red[1]};
    dev::reduce_tiles<2, NT>(parts, acc, nt_valid, tpb, ksb, [&](int nt, int tl, int r, int col, const float (&v)[2]) {
      const int j = base + nt * 8 + col, tt = blockIdx.x * tpb + tl;
      if (j < sl.ntok && tt < tiles) {
        float gv = v[0], uv = v[1];
        if (a.limit > 0.f) {
          gv = fminf(gv, a.limit);
          uv = fminf(fmaxf(uv, -a.limit), a.limit);
        }
        const float hv = gv / (1.0f + expf(-gv)) * uv * a.rw[s_pid[j]];
        a.h[int64_t(sl.off + j) * a.inter + tt * 16 + r] =
            cuda::ptx::act16_bits_rn(hv, H16);
      }
    });
  }
}

__device__ __forceinline__ int valid_slots(const int32_t* idx, int t, int top_k, int E) {
  int n = 0;
  for (int k = 0; k < top_k; ++k) {
    const int e = idx[t * top_k + k];
    n += e >= 0 && e < E;
  }
  return n;
}

// out[t, rows] = (accumulate ? out : 0) + sum_k ybuf[t*top_k + k, rows] in slot order; a bad id adds NaN.
__device__ __forceinline__ void combine_rows(const Moe2Args& a, int t, int r0, int nrows) {
  for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
    const int64_t i = int64_t(t) * a.hidden + r0 + r;
    float v = a.accumulate ? a.out[i] : 0.f;
    for (int k = 0; k < a.top_k; ++k) {
      const int e = a.idx[t * a.top_k + k];
      v += (e >= 0 && e < a.E) ? __ldcg(&a.ybuf[int64_t(t * a.top_k + k) * a.hidden + r0 + r]) : __int_as_float(0x7FC00000);
    }
    a.out[i] = v;
  }
}

template <int NT, bool H16, int MW, bool LEAN = false, int CLASS = kAllExperts>
__global__ void __launch_bounds__(MW * 32, LEAN ? lean_blocks(MW) : moe2_min_blocks(NT, MW)) w2_v2_kernel(Moe2Args a) {
  static_assert(!LEAN || (NT == 1 && CLASS != kHeavy), "the lean kernels are for T <= 8, light experts");
  extern __shared__ uint4 ring[];
  __shared__ float red[MW][128];
  __shared__ int s_pid[kMaxPairs];
  __shared__ unsigned char s_last[kMaxPairs];
  __shared__ unsigned s_bits[32];
  __shared__ int s_info[3];
  __shared__ int s_zero[64];
  const int ksb = a.ksb, tpb = MW / ksb, tiles = a.hidden / 16, C = a.inter / 128;
  const int r0 = blockIdx.x * tpb * 16, nrows = min(tpb * 16, a.hidden - r0);
  // PDL: idx was written before w13 started (w13 triggers after its wait), so it may be read before
  // pdl_wait(); h, ybuf and out only after it.
  if (CLASS != kHeavy && blockIdx.y == 0) {  // tokens whose every id is invalid get no expert block: NaN
    if (threadIdx.x < a.T) s_zero[threadIdx.x] = valid_slots(a.idx, threadIdx.x, a.top_k, a.E) == 0;
    __syncthreads();
    for (int t = 0; t < a.T; ++t)
      if (s_zero[t]) {
        cuda::pdl::wait();
        combine_rows(a, t, r0, nrows);
      }
  }
  const Slot sl = block_slot<CLASS>(a, s_pid, s_bits, s_info, ring);
  if (sl.e < 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * tpb + warp / ksb, ks = warp % ksb;
  const int cb = ks * C / ksb, ce = (ks + 1) * C / ksb;
  const uint16_t* hb = a.h;
  const DevExpert ex = a.ex[sl.e];
  const uint8_t* const W[1] = {ex.w2};
  const uint8_t* const S[1] = {ex.s2};
  constexpr int kRing = kMoeStages * dev::RingGeom<true>::kU4;
  for (int base = 0; base < sl.ntok; base += 8 * NT) {
    const uint16_t* xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = base + nt * 8 + g;
      xr[nt] = j < sl.ntok ? hb + int64_t(sl.off + j) * a.inter + t * 32 : nullptr;
    }
    const int nt_valid = min(NT, (sl.ntok - base + 7) / 8);
    float acc[1][NT][4] = {};
    if (tile < tiles)
      dev::stream_warp<true, NT, 1, kMoeStages, H16, LEAN ? 0 : -1>(ring + warp * kRing, W, S, false, a.inter,
                                                                   int64_t(tile) * 16, cb, ce, nt_valid, xr, acc);
    float(*const parts[1])[128] = {red};
    dev::reduce_tiles<1, NT>(parts, acc, nt_valid, tpb, ksb, [&](int nt, int tl, int r, int col, const float (&v)[1]) {
      const int j = base + nt * 8 + col, tt = blockIdx.x * tpb + tl;
      if (j < sl.ntok && tt < tiles) a.ybuf[int64_t(s_pid[j]) * a.hidden + tt * 16 + r] = v[0];
    });
  }
  cuda::pdl::wait();  // (no-op after stream_warp's) before any write
  cuda::pdl::trigger();
  // Arrival count per (token, row block); the pair completing its token's valid slots combines the token
  // (ptx::count_arrival: fences only in the counting threads; the combine reads ybuf through L2).
  __syncthreads();
  for (int j = threadIdx.x; j < sl.ntok; j += blockDim.x) {
    const int tok = s_pid[j] / a.top_k;
    s_last[j] =
        cuda::ptx::count_arrival(&a.counters[tok * gridDim.x + blockIdx.x], valid_slots(a.idx, tok, a.top_k, a.E));
  }
  __syncthreads();
  for (int j = 0; j < sl.ntok; ++j) {
    if (!s_last[j]) continue;
    const int tok = s_pid[j] / a.top_k;
    combine_rows(a, tok, r0, nrows);
    if (threadIdx.x == 0) a.counters[tok * gridDim.x + blockIdx.x] = 0;  // ready for the next launch
  }
}

// moe_decode's out_ready: the stream waits for it before the first kernel that reads or writes `out` (w2's
// combine; v1's combine kernel), so w1/w3 may run beside the producer of `out`.
void wait_out_ready(cudaStream_t s, cudaEvent_t out_ready) {
  if (out_ready) check_cuda(cudaStreamWaitEvent(s, out_ready, 0), "moe_decode: cudaStreamWaitEvent (out_ready)");
}

template <int NT, bool H16, int MW>
struct Moe2 {
  // Resident blocks per SM of each kernel (the lean ones exist for NT == 1 only).
  template <bool LEAN, int CLASS = kAllExperts>
  static int occ13() {
    static_assert(moe2_ring_smem<2, MW, LEAN>() <= 99 * 1024, "SM12x allows ~99 KB of shared memory per block");
    static const int n = blocks_per_sm(w13_v2_kernel<NT, H16, MW, LEAN, CLASS>, MW * 32, moe2_ring_smem<2, MW, LEAN>());
    return n;
  }
  template <bool LEAN, int CLASS = kAllExperts>
  static int occ2() {
    static_assert(moe2_ring_smem<1, MW, LEAN>() <= 99 * 1024, "SM12x allows ~99 KB of shared memory per block");
    static const int n = blocks_per_sm(w2_v2_kernel<NT, H16, MW, LEAN, CLASS>, MW * 32, moe2_ring_smem<1, MW, LEAN>());
    return n;
  }
  // K splits per tile: the most (<= MW, <= chunks) whose grid of y expert slots still fits one wave of
  // resident blocks at occ blocks per SM (or 1 / div of it: set_decode_wave_div).
  static int pick(int tiles, int C, int occ, int y) {
    const int64_t cap = wave_blocks(occ);
    int ks = 1;
    while (ks * 2 <= MW && ks * 2 <= C && int64_t((tiles + MW / (ks * 2) - 1) / (MW / (ks * 2))) * y <= cap) ks *= 2;
    if (g_force_moe_ks > 0) {
      ks = 1;
      while (ks * 2 <= std::min({g_force_moe_ks, C, MW})) ks *= 2;
    }
    return ks;
  }
  // w1/w3 over y expert slots (tiles of inter).
  template <bool LEAN, int CLASS = kAllExperts>
  static void w13(Moe2Args a, int y, cudaStream_t s) {
    a.ksb = pick(a.inter / 16, a.hidden / 128, occ13<LEAN, CLASS>(), y);
    const int tpb = MW / a.ksb, tiles = a.inter / 16;
    launch_pdl_threads(w13_v2_kernel<NT, H16, MW, LEAN, CLASS>, dim3((tiles + tpb - 1) / tpb, y), MW * 32,
                       moe2_ring_smem<2, MW, LEAN>(), s, a);
  }
  // w2 over y expert slots (tiles of hidden) with ksb K splits (0: pick them); returns them. The row
  // blocking (MW / ksb tiles per block) indexes w2's per-token arrival counters, so both w2 launches of a
  // split share it.
  template <bool LEAN, int CLASS = kAllExperts>
  static int w2(Moe2Args a, int y, int ksb, cudaStream_t s) {
    a.ksb = ksb > 0 ? ksb : pick(a.hidden / 16, a.inter / 128, occ2<LEAN, CLASS>(), y);
    const int tpb = MW / a.ksb, tiles = a.hidden / 16;
    launch_pdl_threads(w2_v2_kernel<NT, H16, MW, LEAN, CLASS>, dim3((tiles + tpb - 1) / tpb, y), MW * 32,
                       moe2_ring_smem<1, MW, LEAN>(), s, a);
    return a.ksb;
  }
  static void run(const Moe2Args& a, int max_active, cudaStream_t s, cudaEvent_t out_ready) {
    if constexpr (NT == 1) {  // the lean kernels exist for one n-tile only
      const LeanKernels lean = lean_kernels(a.T <= g_moe_lean.max_tokens, a.P);
      if (lean.w13) w13<true>(a, max_active, s);
      else w13<false>(a, max_active, s);
      wait_out_ready(s, out_ready);
      if (lean.w2) w2<true>(a, max_active, 0, s);
      else w2<false>(a, max_active, 0, s);
    } else {
      w13<false>(a, max_active, s);
      wait_out_ready(s, out_ready);
      w2<false>(a, max_active, 0, s);
    }
  }
};

// A split launch (set_moe_split): the experts with at most light_max pairs through the NT = 1 kernels (lean
// ones where `lean` and set_moe_lean's kernel flags allow), the others through the NTH kernels, in the order
// w1/w3 light, heavy, w2 light, heavy (PDL keeps each after its predecessor). The heavy grid has one slot per
// expert that can have more than light_max pairs.
template <int MW, int NTH>
void run_split(const Moe2Args& a, int max_active, int light_max, bool lean, cudaStream_t s, cudaEvent_t out_ready) {
  using L = Moe2<1, true, MW>;
  using H = Moe2<NTH, true, MW>;
  Moe2Args light = a, heavy = a;
  light.ntok_hi = light_max;
  heavy.ntok_lo = light_max + 1;
  int heavy_y = std::min(max_active, a.P / (light_max + 1));
  // With T <= light_max the router's experts (distinct per token) are all light: the light kernels take every
  // expert (a test's expert listed twice per token included) and the heavy launches are left out.
  if (a.T <= light_max) light.ntok_hi = kMaxPairs, heavy_y = 0;
  const LeanKernels lk = lean_kernels(lean, a.P);
  if (lk.w13) L::template w13<true, kLight>(light, max_active, s);
  else L::template w13<false, kLight>(light, max_active, s);
  if (heavy_y > 0) H::template w13<false, kHeavy>(heavy, heavy_y, s);
  wait_out_ready(s, out_ready);
  const int ksb = lk.w2 ? L::template w2<true, kLight>(light, max_active, 0, s)
                        : L::template w2<false, kLight>(light, max_active, 0, s);
  if (heavy_y > 0) H::template w2<false, kHeavy>(heavy, heavy_y, ksb, s);
}

template <int NT>
void launch_experts(int cpw13, int cpw2, dim3 g13, dim3 g2, const MoeArgs& a, cudaStream_t s) {
  switch (cpw13) {
    case 1: w13_kernel<NT, 1><<<g13, 256, 0, s>>>(a); break;
    case 2: w13_kernel<NT, 2><<<g13, 256, 0, s>>>(a); break;
    default: w13_kernel<NT, 4><<<g13, 256, 0, s>>>(a); break;
  }
  check_cuda(cudaGetLastError(), "moe w13 launch");
  switch (cpw2) {
    case 1: w2_kernel<NT, 1><<<g2, 256, 0, s>>>(a); break;
    case 2: w2_kernel<NT, 2><<<g2, 256, 0, s>>>(a); break;
    default: w2_kernel<NT, 4><<<g2, 256, 0, s>>>(a); break;
  }
  check_cuda(cudaGetLastError(), "moe w2 launch");
}

// The n-tile count NT for T tokens (8 per tile, up to 64 tokens), at most g_moe_max_nt (an expert with more
// than 8 * NT tokens streams its weights once per group of 8 * NT). Default 2 (H200 run 21: T = 64 with
// random routes 1,985 -> 1,447 us, batch-64 step 92.0 -> 73.3 ms; all 64 tokens on the same 6 experts
// 450 -> 632 us): the NT = 8 kernels hold 234-246 registers, so 2 blocks of 4 warps per SM.
template <bool H16, int MW>
void run_v2_nt(const Moe2Args& a, int T, int max_active, cudaStream_t stream, cudaEvent_t out_ready) {
  // The split's kernels are built for the default format and blocks only (f16 activations, 4 warps).
  if constexpr (H16 && MW == 4) {
    if (g_moe_split.on && T >= 2 && T <= g_moe_split.max_tokens) {
      if (T <= 8) return run_split<MW, 1>(a, max_active, g_moe_split.light_tokens, true, stream, out_ready);
      const int wide = g_moe_split.wide_light_tokens;
      const bool lean = T <= g_moe_split.lean_light_tokens;
      if (T <= 16) return run_split<MW, 2>(a, max_active, wide, lean, stream, out_ready);
      if (T <= 32) return run_split<MW, 4>(a, max_active, wide, lean, stream, out_ready);
      return run_split<MW, 8>(a, max_active, g_moe_split.wider_light_tokens, lean, stream, out_ready);
    }
  }
  if (T <= 8 || g_moe_max_nt == 1) Moe2<1, H16, MW>::run(a, max_active, stream, out_ready);
  else if (T <= 16 || g_moe_max_nt == 2) Moe2<2, H16, MW>::run(a, max_active, stream, out_ready);
  else if (T <= 32 || g_moe_max_nt == 4) Moe2<4, H16, MW>::run(a, max_active, stream, out_ready);
  else Moe2<8, H16, MW>::run(a, max_active, stream, out_ready);
}

template <int MW>
void run_v2(const Moe2Args& a, int T, bool h16, int max_active, cudaStream_t stream, cudaEvent_t out_ready) {
  if (h16) run_v2_nt<true, MW>(a, T, max_active, stream, out_ready);
  else run_v2_nt<false, MW>(a, T, max_active, stream, out_ready);
}

int chunks_per_warp(int K, const char* what, const MoeShape& s) {
  // 8 warps split K; each holds at most 4 chunks of 128 in flight.
  const int C = K / 128, cpw = (C + 7) / 8;
  if (K % 128 != 0 || cpw > 4)
    throw Error(str_cat("cuda moe_decode: ", what, " K = ", K, " unsupported (multiple of 128, at most 4096); shape hidden ",
                        s.hidden, " inter ", s.inter));
  return cpw <= 1 ? 1 : cpw <= 2 ? 2 : 4;
}

}  // namespace

bool moe_expert_aligned(const DevExpert& e) {
  auto at = [](const uint8_t* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; };
  return at(e.w1, 16) && at(e.w3, 16) && at(e.w2, 16) && at(e.s1, 4) && at(e.s3, 4) && at(e.s2, 4);
}

void set_moe_ksplit(int ks) { g_force_moe_ks = ks; }
void set_moe_max_ntiles(int nt) {
  if (nt != 1 && nt != 2 && nt != 4 && nt != 8)
    throw Error(str_cat("cuda moe_decode: ", nt, " n-tiles at most (1, 2, 4 or 8)"));
  g_moe_max_nt = nt;
}
void set_moe_lean(const MoeLean& lean) {
  if (lean.max_tokens < 0 || lean.max_tokens > 8)
    throw Error(str_cat("cuda moe_decode: lean kernels for up to ", lean.max_tokens, " tokens (0..8)"));
  g_moe_lean = lean;
}
MoeLean moe_lean() { return g_moe_lean; }
void set_moe_split(const MoeSplit& split) {
  if (split.light_tokens < 1 || split.light_tokens > 8)
    throw Error(str_cat("cuda moe_decode: split at ", split.light_tokens, " pairs per light expert (1..8)"));
  if (split.max_tokens < 2 || split.max_tokens > 64)
    throw Error(str_cat("cuda moe_decode: split up to ", split.max_tokens, " tokens (2..64)"));
  if (split.wide_light_tokens < 1 || split.wide_light_tokens > 64)
    throw Error(str_cat("cuda moe_decode: split at ", split.wide_light_tokens,
                        " pairs per light expert at 9..32 tokens (1..64)"));
  if (split.wider_light_tokens < 1 || split.wider_light_tokens > 64)
    throw Error(str_cat("cuda moe_decode: split at ", split.wider_light_tokens,
                        " pairs per light expert at 33..64 tokens (1..64)"));
  if (split.lean_light_tokens < 8 || split.lean_light_tokens > 64)
    throw Error(str_cat("cuda moe_decode: lean light kernels up to ", split.lean_light_tokens, " tokens (8..64)"));
  g_moe_split = split;
}
void set_moe_block_warps(int warps) {
  if (warps != 4 && warps != 8) throw Error(str_cat("cuda moe_decode: ", warps, " warps per block (4 or 8)"));
  g_moe_warps = warps;
}

MoeWorkspace moe_workspace_create(const MoeShape& s, int max_tokens) {
  MoeWorkspace ws;
  ws.max_tokens = max_tokens;
  const size_t P = size_t(max_tokens) * s.top_k;
  // meta: the v1 grouping lists, then the v2 arrival counters [max_tokens, hidden / 16] (kept at zero).
  const size_t meta = 2 + 2 * size_t(s.n_experts) + 2 * P, counters = size_t(max_tokens) * (s.hidden / 16 + 1);
  check_cuda(cudaMalloc(&ws.meta, (meta + counters) * sizeof(int)), "moe_workspace_create");
  check_cuda(cudaMemset(ws.meta, 0, (meta + counters) * sizeof(int)), "moe_workspace_create");
  check_cuda(cudaMalloc(&ws.h, P * s.inter * sizeof(uint16_t)), "moe_workspace_create");
  check_cuda(cudaMalloc(&ws.ybuf, P * s.hidden * sizeof(float)), "moe_workspace_create");
  return ws;
}

void moe_workspace_destroy(MoeWorkspace& ws) {
  cudaFree(ws.meta);
  cudaFree(ws.h);
  cudaFree(ws.ybuf);
  ws = MoeWorkspace{};
}

void moe_decode(const MoeShape& s, const DevExpert* experts, const uint16_t* x, const int32_t* idx,
                const float* weights, int T, float* out, bool accumulate, MoeWorkspace& ws, cudaStream_t stream,
                ActFormat act, cudaEvent_t out_ready) {
  require_supported_device();
  const bool h16 = act == ActFormat::kF16;
  if (T < 1 || T > 64 || T > ws.max_tokens)
    throw Error(str_cat("cuda moe_decode: ", T, " tokens unsupported (1..64 and at most the workspace's ", ws.max_tokens, ")"));
  if (s.hidden % 16 != 0 || s.inter % 16 != 0 || s.n_experts < 1 || s.n_experts > kMaxExperts || s.top_k < 1)
    throw Error(str_cat("cuda moe_decode: shape hidden ", s.hidden, " inter ", s.inter, " experts ", s.n_experts,
                        " top_k ", s.top_k, " unsupported"));
  const int cpw13 = chunks_per_warp(s.hidden, "w1/w3", s), cpw2 = chunks_per_warp(s.inter, "w2", s);
  const int P = T * s.top_k, max_active = std::min(s.n_experts, P);
  if (h16 && (linear_kernel_version() != 2 || P > kMaxPairs))
    throw Error(str_cat("cuda moe_decode: f16 activations need the v2 kernels and at most ", kMaxPairs,
                        " (token, expert) pairs (", P, ")"));
  if (linear_kernel_version() == 2 && P <= kMaxPairs) {
    Moe2Args a{experts, idx, s.hidden, s.inter, s.n_experts, s.top_k, P, T, s.swiglu_limit, x, weights,
               ws.h, ws.ybuf, out,
               ws.meta + 2 + 2 * size_t(s.n_experts) + 2 * size_t(ws.max_tokens) * s.top_k, accumulate, 1};
    if (g_moe_warps == 8) run_v2<8>(a, T, h16, max_active, stream, out_ready);
    else run_v2<4>(a, T, h16, max_active, stream, out_ready);
    return;
  }
  Meta m{ws.meta, s.n_experts, P};
  check_cuda(cuda::launch(group_kernel, dim3(1), dim3(256), 0, stream, idx, P, s.top_k, m), "group_kernel launch");
  check_cuda(cudaGetLastError(), "moe group launch");
  MoeArgs a{experts, s.hidden, s.inter, s.swiglu_limit, x, weights, reinterpret_cast<__nv_bfloat16*>(ws.h), ws.ybuf, m};
  const dim3 g13(s.inter / 16, max_active), g2(s.hidden / 16, max_active);
  if (T <= 8) launch_experts<1>(cpw13, cpw2, g13, g2, a, stream);
  else if (T <= 16) launch_experts<2>(cpw13, cpw2, g13, g2, a, stream);
  else if (T <= 32) launch_experts<4>(cpw13, cpw2, g13, g2, a, stream);
  else launch_experts<8>(cpw13, cpw2, g13, g2, a, stream);
  const int64_t n = int64_t(T) * s.hidden;
  wait_out_ready(stream, out_ready);
  check_cuda(cuda::launch(combine_kernel, dim3(static_cast<int>(std::min<int64_t>((n + 255) / 256, 2048))), dim3(256), 0, stream, 
      ws.ybuf, idx, T, s.top_k, s.n_experts, s.hidden, accumulate, out), "combine_kernel launch");
  check_cuda(cudaGetLastError(), "moe combine launch");
}

namespace {
// flag |= 1 when a scale byte of expert blockIdx.x's matrix blockIdx.y lies outside [kFp4F16MinE, kFp4F16MaxE].
__global__ void scale_range_kernel(const DevExpert* experts, int64_t n13, int64_t n2, int* flag) {
  const DevExpert ex = experts[blockIdx.x];
  const uint8_t* p = blockIdx.y == 0 ? ex.s1 : blockIdx.y == 1 ? ex.s3 : ex.s2;
  const int64_t n = blockIdx.y == 2 ? n2 : n13;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t e = p[i];
    bad |= e < dev::kFp4F16MinE || e > dev::kFp4F16MaxE;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, 1);
}
}  // namespace

bool moe_scales_fit_f16(const MoeShape& s, const DevExpert* experts, cudaStream_t stream) {
  int* flag = nullptr;
  check_cuda(cudaMallocAsync(&flag, sizeof(int), stream), "moe_scales_fit_f16");
  check_cuda(cudaMemsetAsync(flag, 0, sizeof(int), stream), "moe_scales_fit_f16");
  scale_range_kernel<<<dim3(s.n_experts, 3), 256, 0, stream>>>(experts, int64_t(s.inter) * (s.hidden / 32),
                                                               int64_t(s.hidden) * (s.inter / 32), flag);
  check_cuda(cudaGetLastError(), "moe_scales_fit_f16 launch");
  int h = 1;
  check_cuda(cudaMemcpyAsync(&h, flag, sizeof(int), cudaMemcpyDeviceToHost, stream), "moe_scales_fit_f16");
  check_cuda(cudaFreeAsync(flag, stream), "moe_scales_fit_f16");
  check_cuda(cudaStreamSynchronize(stream), "moe_scales_fit_f16");
  return h == 0;
}

}  // namespace dsv4::cudalin
