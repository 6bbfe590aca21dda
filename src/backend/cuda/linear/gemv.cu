// Decode-shaped GEMM (1..64 activation rows) streaming FP8 block-scaled or MXFP4 weights. See warp_tile.cuh
// for the per-warp work and docs/GEMM_MOE.md for the measured bandwidth.
//
// Grid: x = 16-row tiles, y = split of K across blocks; each block's warps split its K range further.
// Partial sums are reduced in shared memory (fixed warp order), then, when K is split across blocks, the
// last block of a row tile to finish adds the partials in fixed block order: the result is deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

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

struct GemvArgs {
  const uint8_t* w;
  const uint8_t* s;
  bool sf32;
  int64_t N, K;
  const uint16_t* x;
  int64_t ldx;
  int T;
  float* y;
  int64_t ldy;
  float* partial;
  int* counters;
  int gy;
  // Grouped form (gemv_grouped): output rows [g*group_rows, (g+1)*group_rows) read the activations at
  // column offset g*group_x_stride. 0: one group.
  int64_t group_rows = 0, group_x_stride = 0;
  // Optional 16-bit copy of y (same indexing and stride) for a linear that reads this output next.
  uint16_t* y16 = nullptr;
  bool y16_f16 = false;
};

// y[i] = v, and its 16-bit copy (round to nearest even) when asked for.
__device__ __forceinline__ void store_y(const GemvArgs& a, int64_t i, float v) {
  a.y[i] = v;
  if (a.y16) a.y16[i] = cuda::ptx::act16_bits_rn(v, a.y16_f16);
}

// The activations of row tile `tile` (16 rows): the group's column block in the grouped form.
__device__ __forceinline__ const uint16_t* tile_x(const GemvArgs& a, int64_t tile) {
  return a.group_rows ? a.x + (tile * 16 / a.group_rows) * a.group_x_stride : a.x;
}

// Split-K epilogue of both GEMV kernels: the last of a row tile's gy blocks (found through the tile's arrival
// counter) adds the gy partial sums in block order, so the result does not depend on which block finishes
// last, and re-arms the counter for the next launch. `last` is the caller's __shared__ flag.
__device__ __forceinline__ void finish_split_k(const GemvArgs& a, int64_t row0, int& last) {
  if (!cuda::ptx::last_block_to_arrive(&a.counters[blockIdx.x], a.gy, last)) return;
  for (int i = threadIdx.x; i < 16 * a.T; i += blockDim.x) {
    const int r = i & 15, tok = i >> 4;
    float v = 0.f;
    for (int by = 0; by < a.gy; ++by) v += __ldcg(&a.partial[(int64_t(by) * a.T + tok) * a.N + row0 + r]);
    store_y(a, tok * a.ldy + row0 + r, v);
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;  // ready for the next launch
}

template <bool FP4, int NT, int CPW>
__global__ void __launch_bounds__(256) gemv_kernel(GemvArgs a) {
  __shared__ float red[8][128];
  __shared__ int last;
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int C = static_cast<int>(a.K / 128);
  const int c0 = (blockIdx.y * nwarps + warp) * CPW;
  const int nt_valid = (a.T + 7) / 8;
  const uint16_t* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    xr[nt] = tok < a.T ? tile_x(a, blockIdx.x) + tok * a.ldx + t * 32 : nullptr;
  }
  float acc[1][NT][4] = {};
  const uint8_t* const W[1] = {a.w};
  const uint8_t* const S[1] = {a.s};
  if constexpr (FP4) dev::fp4_warp<NT, CPW, 1>(W, S, a.K, row0, c0, C, nt_valid, xr, acc);
  else dev::fp8_warp<NT, CPW, 1>(W, S, a.sf32, a.K, row0, c0, C, nt_valid, xr, acc);

#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= nt_valid) break;
    dev::stash_frag(red[warp], acc[0][nt]);
    __syncthreads();
    // 16 rows x 8 tokens = 128 outputs per fragment. A block has 1 to 8 warps (wb), so fewer than 128
    // threads when the K range is short: stride over the outputs instead of assuming 128 threads.
    for (int i = threadIdx.x; i < 128; i += blockDim.x) {
      const int r = i >> 3, c = i & 7, tok = nt * 8 + c;
      float v = 0.f;
      for (int w = 0; w < nwarps; ++w) v += red[w][i];
      if (tok < a.T) {
        if (a.gy == 1) store_y(a, tok * a.ldy + row0 + r, v);
        else a.partial[(int64_t(blockIdx.y) * a.T + tok) * a.N + row0 + r] = v;
      }
    }
    __syncthreads();
  }
  if (a.gy == 1) return;
  finish_split_k(a, row0, last);
}

template <bool FP4, int NT>
void launch_nt(int cpw, dim3 grid, int threads, const GemvArgs& a, cudaStream_t s) {
  switch (cpw) {
    case 1: gemv_kernel<FP4, NT, 1><<<grid, threads, 0, s>>>(a); break;
    case 2: gemv_kernel<FP4, NT, 2><<<grid, threads, 0, s>>>(a); break;
    default: gemv_kernel<FP4, NT, 4><<<grid, threads, 0, s>>>(a); break;
  }
}

template <bool FP4>
void launch(int T, int cpw, dim3 grid, int threads, const GemvArgs& a, cudaStream_t s) {
  if (T <= 8) launch_nt<FP4, 1>(cpw, grid, threads, a, s);
  else if (T <= 16) launch_nt<FP4, 2>(cpw, grid, threads, a, s);
  else if (T <= 32) launch_nt<FP4, 4>(cpw, grid, threads, a, s);
  else launch_nt<FP4, 8>(cpw, grid, threads, a, s);
}

// ---- v2: streamed through a per-warp cp.async ring (stream.cuh), sized to one wave.
// Block = MW warps (8, or 4: set_gemv_block_warps) = (MW / ksb) row tiles x ksb K splits; grid.y splits K
// further (then ksb = MW, one tile per
// block) with the same last-block reduction as above. Warp split s of ks_total takes chunks
// [s*C/ks_total, (s+1)*C/ks_total). Partial sums of a tile's splits are added in fixed split order.
template <bool FP4>
constexpr int gemv_stages() { return FP4 ? 6 : 4; }
template <bool FP4, int MW>
constexpr int gemv2_smem() { return MW * dev::ring_bytes_per_warp<FP4, 1, gemv_stages<FP4>()>(); }

template <bool FP4, int NT, bool H16, int MW>
__global__ void __launch_bounds__(MW * 32, (NT <= 2 ? 2 : 1) * (8 / MW)) gemv2_kernel(GemvArgs a, int ksb, int ks_total) {
  extern __shared__ uint4 ring[];
  __shared__ float red[MW][128];
  __shared__ int last;
  constexpr int STAGES = gemv_stages<FP4>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tpb = MW / ksb, tiles = static_cast<int>(a.N / 16);
  const int tile = blockIdx.x * tpb + warp / ksb, s = blockIdx.y * ksb + warp % ksb;
  const int C = static_cast<int>(a.K / 128);
  const int cb = static_cast<int>(int64_t(s) * C / ks_total), ce = static_cast<int>(int64_t(s + 1) * C / ks_total);
  const int nt_valid = (a.T + 7) / 8;
  const uint16_t* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    xr[nt] = tok < a.T ? tile_x(a, tile) + tok * a.ldx + t * (FP4 ? 32 : 16) : nullptr;  // lane layout: stream.cuh
  }
  float acc[1][NT][4] = {};
  const uint8_t* const W[1] = {a.w};
  const uint8_t* const S[1] = {a.s};
  // Only weights and scales (constant) are read before stream_warp's pdl_wait(); warps without a tile wait
  // here, so every write below follows the preceding grid's completion.
  if (tile < tiles)
    dev::stream_warp<FP4, NT, 1, STAGES, H16>(ring + warp * (STAGES * dev::RingGeom<FP4>::kU4), W, S, a.sf32, a.K,
                                         int64_t(tile) * 16, cb, ce, nt_valid, xr, acc);
  else
    cuda::pdl::wait();
  cuda::pdl::trigger();
  float(*const parts[1])[128] = {red};
  dev::reduce_tiles<1, NT>(parts, acc, nt_valid, tpb, ksb, [&](int nt, int tl, int r, int col, const float (&v)[1]) {
    const int tok = nt * 8 + col, tt = blockIdx.x * tpb + tl;
    if (tok < a.T && tt < tiles) {
      if (a.gy == 1) store_y(a, tok * a.ldy + int64_t(tt) * 16 + r, v[0]);
      else a.partial[(int64_t(blockIdx.y) * a.T + tok) * a.N + int64_t(tt) * 16 + r] = v[0];
    }
  });
  if (a.gy == 1) return;
  // gy > 1: one tile per block (ksb = MW); the last block of the tile adds the gy partials in order.
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  finish_split_k(a, row0, last);
}

}  // namespace
void set_linear_pdl(bool on) { cuda::set_pdl(on); }
namespace {

template <bool FP4, int NT, bool H16, int MW>
struct Gemv2 {
  static int occupancy() {
    static_assert(gemv2_smem<FP4, MW>() <= 99 * 1024, "SM12x allows ~99 KB of shared memory per block");
    static const int n = blocks_per_sm(gemv2_kernel<FP4, NT, H16, MW>, MW * 32, gemv2_smem<FP4, MW>());
    return n;
  }
  static void run(dim3 grid, const GemvArgs& a, int ksb, int ks_total, cudaStream_t s) {
    launch_pdl_threads(gemv2_kernel<FP4, NT, H16, MW>, grid, MW * 32, gemv2_smem<FP4, MW>(), s, a, ksb, ks_total);
  }
};

template <bool FP4, bool H16, int MW>
int gemv2_occupancy(int T) {
  return T <= 8 ? Gemv2<FP4, 1, H16, MW>::occupancy() : T <= 16 ? Gemv2<FP4, 2, H16, MW>::occupancy()
         : T <= 32 ? Gemv2<FP4, 4, H16, MW>::occupancy() : Gemv2<FP4, 8, H16, MW>::occupancy();
}
template <bool FP4, bool H16, int MW>
void gemv2_launch(int T, dim3 grid, const GemvArgs& a, int ksb, int ks_total, cudaStream_t s) {
  if (T <= 8) Gemv2<FP4, 1, H16, MW>::run(grid, a, ksb, ks_total, s);
  else if (T <= 16) Gemv2<FP4, 2, H16, MW>::run(grid, a, ksb, ks_total, s);
  else if (T <= 32) Gemv2<FP4, 4, H16, MW>::run(grid, a, ksb, ks_total, s);
  else Gemv2<FP4, 8, H16, MW>::run(grid, a, ksb, ks_total, s);
}

// The v2 launch for one block size: K split as in gemv_impl (see there).
template <int MW>
void gemv2_dispatch(bool fp4, bool h16, int T, int tiles, int C, int cap_blocks, GemvArgs a, int64_t ws_partial_floats,
                    int ws_counters, int force_ks, cudaStream_t stream) {
  auto blocks = [&](int ks) {
    return int64_t((tiles + (MW / std::min(ks, MW)) - 1) / (MW / std::min(ks, MW))) * std::max(1, ks / MW);
  };
  int ks = 1;
  while (ks * 2 <= C && blocks(ks * 2) <= cap_blocks) ks *= 2;
  if (force_ks > 0) {
    ks = 1;
    while (ks * 2 <= std::min(force_ks, C)) ks *= 2;
  }
  const int ksb = std::min(ks, MW), gy = std::max(1, ks / MW), tpb = MW / ksb;
  a.gy = gy;
  if (gy > 1 && (size_t(gy) * T * a.N > size_t(ws_partial_floats) || tiles > ws_counters))
    throw Error(str_cat("cuda gemv: workspace too small for [", a.N, ", ", a.K, "] x ", T, " rows"));
  const dim3 grid((tiles + tpb - 1) / tpb, gy);
  if (fp4) gemv2_launch<true, false, MW>(T, grid, a, ksb, ks, stream);
  else if (h16) gemv2_launch<false, true, MW>(T, grid, a, ksb, ks, stream);
  else gemv2_launch<false, false, MW>(T, grid, a, ksb, ks, stream);
}

template <typename H>
__global__ void cast_kernel(const float* x, H* y, int64_t n) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<H, __half>) y[i] = __float2half_rn(x[i]);
    else y[i] = __float2bfloat16_rn(x[i]);
  }
}

}  // namespace

static int g_force_cpw = 0;
void set_gemv_chunks_per_warp(int cpw) { g_force_cpw = cpw; }
static int g_force_ks = 0;
void set_gemv_ksplit(int ks) { g_force_ks = ks; }
static int g_wave_div = 1;  // set_decode_wave_div
void set_decode_wave_div(int div) {
  if (div < 1 || div > 8) throw Error(str_cat("cuda decode kernels: wave divisor ", div, " (1..8)"));
  g_wave_div = div;
}
int wave_blocks(int blocks_per_sm) { return std::max(1, device_info().sm_count * blocks_per_sm / g_wave_div); }
static int g_gemv_warps = 8;
void set_gemv_block_warps(int warps) {
  if (warps != 4 && warps != 8) throw Error(str_cat("cuda gemv: ", warps, " warps per block (4 or 8)"));
  g_gemv_warps = warps;
}
static int g_version = 2;
void set_linear_kernel_version(int v) { g_version = v == 1 ? 1 : 2; }
int linear_kernel_version() { return g_version; }

Workspace workspace_create(size_t partial_floats, int n_counters) {
  Workspace ws;
  check_cuda(cudaMalloc(&ws.partial, partial_floats * sizeof(float)), "workspace_create");
  check_cuda(cudaMalloc(&ws.counters, size_t(n_counters) * sizeof(int)), "workspace_create");
  check_cuda(cudaMemset(ws.counters, 0, size_t(n_counters) * sizeof(int)), "workspace_create");
  ws.partial_floats = partial_floats;
  ws.n_counters = n_counters;
  return ws;
}

void workspace_destroy(Workspace& ws) {
  cudaFree(ws.partial);
  cudaFree(ws.counters);
  ws = Workspace{};
}

namespace {
void gemv_impl(const DevWeight& w, const uint16_t* x, int64_t ldx, int T, float* y, int64_t ldy, Workspace& ws,
               cudaStream_t stream, int64_t group_rows, int64_t group_x_stride, ActFormat act, Out16 y16) {
  require_supported_device();
  const bool fp4 = w.fmt == WeightFormat::kFP4, h16 = act == ActFormat::kF16;
  if (!fp4 && w.fmt != WeightFormat::kFP8Block)
    throw Error(str_cat("cuda gemv: weight [", w.rows, ", ", w.cols, "] is BF16; only FP8 and MXFP4 are supported"));
  if (h16 && (fp4 || g_version != 2 || reinterpret_cast<uintptr_t>(w.w) % 16 != 0))
    throw Error(str_cat("cuda gemv: f16 activations need FP8 weights, 16-byte aligned, and the v2 kernels (weight [",
                        w.rows, ", ", w.cols, "]", fp4 ? " is MXFP4" : "", ")"));
  if (w.rows <= 0 || w.rows % 16 != 0 || w.cols <= 0 || w.cols % 128 != 0)
    throw Error(str_cat("cuda gemv: weight shape [", w.rows, ", ", w.cols,
                        "] unsupported (rows must be a multiple of 16, cols of 128)"));
  if (T < 1 || T > 64) throw Error(str_cat("cuda gemv: ", T, " activation rows unsupported (1..64; use the prefill GEMM)"));
  if (ldx % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw Error(str_cat("cuda gemv: activations must be 16-byte aligned with a row stride multiple of 8 (ldx ", ldx, ")"));
  const int C = static_cast<int>(w.cols / 128), tiles = static_cast<int>(w.rows / 16);
  const bool fp4_scale_aligned = !fp4 || reinterpret_cast<uintptr_t>(w.scale) % 4 == 0;
  if (g_version == 2 && fp4_scale_aligned && reinterpret_cast<uintptr_t>(w.w) % 16 == 0) {
    // K split: the largest power of two (<= C) whose grid still fits in one wave of resident blocks (beyond
    // 8 splits per tile, grid.y > 1 with the extra reduction round trip: measured still faster for the small
    // shapes, docs/GEMM_MOE.md).
    GemvArgs a{w.w, w.scale, w.scale_is_f32, w.rows, w.cols, x, ldx, T, y, ldy, ws.partial, ws.counters, 1,
               group_rows, group_x_stride, y16.p, y16.fmt == ActFormat::kF16};
    auto cap = [&](auto mw) {
      constexpr int MW = decltype(mw)::value;
      return wave_blocks(fp4   ? gemv2_occupancy<true, false, MW>(T)
                         : h16 ? gemv2_occupancy<false, true, MW>(T)
                               : gemv2_occupancy<false, false, MW>(T));
    };
    if (g_gemv_warps == 4)
      gemv2_dispatch<4>(fp4, h16, T, tiles, C, cap(std::integral_constant<int, 4>{}), a, ws.partial_floats,
                        ws.n_counters, g_force_ks, stream);
    else
      gemv2_dispatch<8>(fp4, h16, T, tiles, C, cap(std::integral_constant<int, 8>{}), a, ws.partial_floats,
                        ws.n_counters, g_force_ks, stream);
    return;
  }
  // v1 (set_linear_kernel_version(1), or a weight pointer the cp.async path cannot take).
  // As many K chunks per warp (bytes in flight per load round) as still leave ~6 warps per SM; measured on
  // the H200 (docs/GEMM_MOE.md, cpw sweep): 4 chunks beat 1-2 at batch 1 for 4096x4096 FP8 and 2048x4096 MXFP4.
  const int target = device_info().sm_count * 6;
  int cpw = 4;
  while (cpw > 1 && int64_t(tiles) * ((C + cpw - 1) / cpw) < target) cpw /= 2;
  if (g_force_cpw == 1 || g_force_cpw == 2 || g_force_cpw == 4) cpw = g_force_cpw;
  const int groups = (C + cpw - 1) / cpw, wb = std::min(8, groups), gy = (groups + wb - 1) / wb;
  GemvArgs a{w.w, w.scale, w.scale_is_f32, w.rows, w.cols, x, ldx, T, y, ldy, ws.partial, ws.counters, gy,
             group_rows, group_x_stride, y16.p, y16.fmt == ActFormat::kF16};
  if (gy > 1 && (size_t(gy) * T * w.rows > ws.partial_floats || tiles > ws.n_counters))
    throw Error(str_cat("cuda gemv: workspace too small for [", w.rows, ", ", w.cols, "] x ", T, " rows"));
  const dim3 grid(tiles, gy);
  if (fp4) launch<true>(T, cpw, grid, wb * 32, a, stream);
  else launch<false>(T, cpw, grid, wb * 32, a, stream);
  check_cuda(cudaGetLastError(), "gemv launch");
}
}  // namespace

void gemv(const DevWeight& w, const uint16_t* x, int64_t ldx, int T, float* y, int64_t ldy, Workspace& ws,
          cudaStream_t stream, ActFormat act, Out16 y16) {
  gemv_impl(w, x, ldx, T, y, ldy, ws, stream, 0, 0, act, y16);
}

void gemv_grouped(const DevWeight& w, int64_t group_rows, int64_t group_x_stride, const uint16_t* x, int64_t ldx,
                  int T, float* y, int64_t ldy, Workspace& ws, cudaStream_t stream, ActFormat act, Out16 y16) {
  if (group_rows <= 0 || group_rows % 16 != 0 || w.rows % group_rows != 0 || group_x_stride < 0 ||
      group_x_stride % 8 != 0)
    throw Error(str_cat("cuda gemv_grouped: groups of ", group_rows, " rows with activation stride ", group_x_stride,
                        " do not fit weight [", w.rows, ", ", w.cols, "] (rows a multiple of 16 dividing the weight's, ",
                        "stride a multiple of 8)"));
  const int64_t groups = w.rows / group_rows;
  if ((groups - 1) * group_x_stride + w.cols > ldx)
    throw Error(str_cat("cuda gemv_grouped: ", groups, " groups of ", w.cols, " columns at stride ", group_x_stride,
                        " exceed the activation row of ", ldx));
  gemv_impl(w, x, ldx, T, y, ldy, ws, stream, group_rows, group_x_stride, act, y16);
}

namespace {
template <typename H>
void cast_f32(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  check_cuda(cuda::launch(cast_kernel<H>, dim3(std::max(blocks, 1)), dim3(256), 0, stream, x, reinterpret_cast<H*>(y), n),
             "cast_kernel launch");
}
}  // namespace

void cast_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  cast_f32<__nv_bfloat16>(x, y, n, stream);
}

void cast_f32_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) { cast_f32<__half>(x, y, n, stream); }

}  // namespace dsv4::cudalin
