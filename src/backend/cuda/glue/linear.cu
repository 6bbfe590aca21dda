// fp32-activation linear over weights in their shipped formats, and the exact-mode routed experts.
// One warp per weight row; up to 8 tokens per pass share each decoded weight element. BF16 weights (the
// compressor, weights_proj, router and LM head of the GPU engine) take a streaming path: 16-byte loads,
// four in flight per lane, so a few thousand rows keep enough bytes in flight to stream at copy bandwidth;
// below that (router, weights_proj, compressor at decode) a block of 8 warps splits each row's columns. The
// generic path reads one element per lane per step.
#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {
constexpr int kWarps = 8;  // rows per block
constexpr int kTok = 8;    // tokens per pass

__device__ __forceinline__ void row_dots(const Weight& w, int64_t r, const float* x, int64_t ldx, int nt,
                                         float* acc) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = 0.0f;
  for (int64_t k = lane; k < w.cols; k += 32) {
    const float wv = weight_at(w, r, k);
#pragma unroll
    for (int j = 0; j < kTok; ++j)
      if (j < nt) acc[j] += wv * x[j * ldx + k];
  }
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = warp_sum(acc[j]);
}

__global__ void linear_kernel(Weight w, int64_t row_begin, int64_t rows, const float* x, int64_t T, int64_t ldx,
                              float* y, int64_t ldy) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int nt = static_cast<int>(T - t0 < kTok ? T - t0 : kTok);
  float acc[kTok];
  row_dots(w, row_begin + r, x + t0 * ldx, ldx, nt, acc);
  if (threadIdx.x % 32 == 0)
    for (int j = 0; j < nt; ++j) y[(t0 + j) * ldy + r] = acc[j];
}

// BF16 rows, 16-byte weight loads (8 elements) and float4 activation loads; cols % 256 == 0.
// Lane l covers elements [l*8, l*8+8) of each 256-wide chunk; kUnroll chunks are loaded before use.
// acc[j] += row chunks [c_begin, c_end) . token j of x (row stride ldx), j < nt; the lane's share only,
// the caller sums over the warp.
constexpr int kUnroll = 4;
__device__ __forceinline__ void bf16_chunk_dots(const uint4* __restrict__ wr, int64_t c_begin, int64_t c_end,
                                                const float* __restrict__ x, int64_t ldx, int nt, int lane,
                                                float* acc) {
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u < c_end) wv[u] = __ldg(wr + (c0 + u) * 32 + lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u >= c_end) break;
      const int64_t k = (c0 + u) * 256 + lane * 8;
      const uint32_t p[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
      float f[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        f[2 * e] = __uint_as_float(p[e] << 16);
        f[2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
      }
#pragma unroll
      for (int j = 0; j < kTok; ++j) {
        if (j >= nt) break;
        const float4* xv = reinterpret_cast<const float4*>(x + j * ldx + k);
        const float4 a = xv[0], b = xv[1];
        acc[j] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z +
                  f[7] * b.w;
      }
    }
  }
}

// Many rows (the LM head): one warp per row walks all of its chunks.
__global__ void linear_bf16_kernel(const uint16_t* __restrict__ w, int64_t cols, int64_t row_begin, int64_t rows,
                                   const float* __restrict__ x, int64_t T, int64_t ldx, float* __restrict__ y,
                                   int64_t ldy) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int nt = static_cast<int>(T - t0 < kTok ? T - t0 : kTok);
  const uint4* wr = reinterpret_cast<const uint4*>(w + (row_begin + r) * cols);
  float acc[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = 0.0f;
  bf16_chunk_dots(wr, 0, cols / 256, x + t0 * ldx, ldx, nt, lane, acc);
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = warp_sum(acc[j]);
  if (lane == 0)
    for (int j = 0; j < nt; ++j) y[(t0 + j) * ldy + r] = acc[j];
}

// Few rows (router, weights_proj, compressor): one block per row, so there are 8x more warps in flight.
// Warp w takes the contiguous chunk range [chunks*w/8, chunks*(w+1)/8); the 8 warp sums are added in warp
// order through shared memory, so the result does not depend on scheduling (same bits every launch).
__global__ void linear_bf16_split_kernel(const uint16_t* __restrict__ w, int64_t cols, int64_t row_begin,
                                         const float* __restrict__ x, int64_t T, int64_t ldx,
                                         float* __restrict__ y, int64_t ldy) {
  __shared__ float part[kWarps][kTok];
  const int64_t r = blockIdx.x;
  // The weight row is constant: its 128-byte lines go to L2 before the wait for the preceding kernel.
  for (int64_t i = threadIdx.x; i < cols / 64; i += blockDim.x)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (row_begin + r) * cols + i * 64));
  cuda::pdl::enter();  // PDL: every access to non-constant data after this (backend/cuda/pdl.cuh)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int nt = static_cast<int>(T - t0 < kTok ? T - t0 : kTok);
  const uint4* wr = reinterpret_cast<const uint4*>(w + (row_begin + r) * cols);
  const int64_t chunks = cols / 256;
  float acc[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = 0.0f;
  bf16_chunk_dots(wr, chunks * warp / kWarps, chunks * (warp + 1) / kWarps, x + t0 * ldx, ldx, nt, lane, acc);
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = warp_sum(acc[j]);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kTok; ++j) part[warp][j] = acc[j];
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    float s = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += part[v][threadIdx.x];
    y[(t0 + threadIdx.x) * ldy + r] = s;
  }
}

// h[p, i] = silu(min(w1 x, L)) * clamp(w3 x, -L, L) * weight[p] for pair p = t * top_k + k.
__global__ void moe_up_kernel(const Expert* experts, int64_t hidden, int64_t inter, int top_k, float limit,
                              const float* x, const int32_t* idx, const float* weights, float* h, int p0) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (i >= inter) return;
  const int p = p0 + static_cast<int>(blockIdx.y);
  const Expert& e = experts[idx[p]];
  const float* xt = x + static_cast<int64_t>(p / top_k) * hidden;
  float g[kTok], u[kTok];
  row_dots(e.w1, i, xt, hidden, 1, g);
  row_dots(e.w3, i, xt, hidden, 1, u);
  float gi = g[0], ui = u[0];
  if (limit > 0.0f) {
    gi = fminf(gi, limit);
    ui = fminf(fmaxf(ui, -limit), limit);
  }
  if (threadIdx.x % 32 == 0) h[static_cast<int64_t>(p) * inter + i] = gi / (1.0f + expf(-gi)) * ui * weights[p];
}

// out[t, d] (+)= sum_k w2[idx[t,k]] row d . h[t*top_k + k]
__global__ void moe_down_kernel(const Expert* experts, int64_t hidden, int64_t inter, int top_k, const int32_t* idx,
                                const float* h, float* out, bool accumulate) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (d >= hidden) return;
  const int t = blockIdx.y;
  float sum = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    const int p = t * top_k + k;
    float acc[kTok];
    row_dots(experts[idx[p]].w2, d, h + static_cast<int64_t>(p) * inter, inter, 1, acc);
    sum += acc[0];
  }
  if (threadIdx.x % 32 == 0) {
    float* o = out + static_cast<int64_t>(t) * hidden + d;
    *o = accumulate ? *o + sum : sum;
  }
}
}  // namespace

void linear(const Weight& w, int64_t row_begin, int64_t rows, const float* x, int64_t T, int64_t ldx, float* y,
            int64_t ldy, cudaStream_t stream) {
  if (rows <= 0 || T <= 0) return;
  dim3 grid(blocks_for(rows, kWarps), blocks_for(T, kTok));
  const bool streaming = w.fmt == WFormat::kBF16 && w.cols % 256 == 0 && ldx % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0;
  // Split K across a block's warps while one warp per row would give fewer than ~2 blocks per SM
  // (rows < 16 * SMs: 2112 rows on an H200); the LM head keeps the warp-per-row path.
  const int64_t split_below = int64_t{2} * kWarps * cuda::device_config().sm_count;
  const auto* wb = reinterpret_cast<const uint16_t*>(w.w);
  if (streaming && rows < split_below)
    cuda::check(cuda::launch(linear_bf16_split_kernel, dim3(static_cast<unsigned>(rows), grid.y), dim3(kWarps * 32),
                             0, stream, wb, w.cols, row_begin, x, T, ldx, y, ldy),
                "linear_bf16_split_kernel launch");
  else if (streaming)
    cuda::check(cuda::launch(linear_bf16_kernel, grid, dim3(kWarps * 32), 0, stream, wb, w.cols, row_begin, rows, x,
                             T, ldx, y, ldy),
                "linear_bf16_kernel launch");
  else
    cuda::check(cuda::launch(linear_kernel, grid, dim3(kWarps * 32), 0, stream, w, row_begin, rows, x, T, ldx, y,
                             ldy),
                "linear_kernel launch");
}

void moe_exact(const Expert* experts, int64_t hidden, int64_t inter, int top_k, float limit, const float* x,
               const int32_t* idx, const float* weights, int T, float* h, float* out, bool accumulate,
               cudaStream_t stream, bool act_quant) {
  if (T <= 0) return;
  for (int p0 = 0; p0 < T * top_k; p0 += 65535) {  // gridDim.y is at most 65535
    const int n = std::min(65535, T * top_k - p0);
    cuda::check(cuda::launch(moe_up_kernel, dim3(blocks_for(inter, kWarps), n), dim3(kWarps * 32), 0, stream, experts, hidden, inter, top_k, limit,
                                                                                   x, idx, weights, h, p0), "moe_up_kernel launch");
  }
  if (act_quant) act_quant_rows(h, inter, int64_t{T} * top_k, inter, h, inter, nullptr, 0, stream);  // in place
  cuda::check(cuda::launch(moe_down_kernel, dim3(blocks_for(hidden, kWarps), T), dim3(kWarps * 32), 0, stream, experts, hidden, inter, top_k,
                                                                                    idx, h, out, accumulate), "moe_down_kernel launch");
}

}  // namespace dsv4::glue
