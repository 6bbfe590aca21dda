// Router (score function, biased top-k or hash table, normalized weights), SwiGLU, argmax.
#include <cmath>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"
#include "backend/cuda/glue/route_rank.cuh"
#include "core/error.h"

namespace dsv4::glue {
using namespace detail;

namespace {

// Above kRankMaxExperts experts (route_rank_kernel below serves the rest; the register variant NJ > 0 only on
// request, set_route_warp_kernel, for the bitwise test: one warp's dependent chain cost ~10 us per token).
// One warp per token (kRouteWarps tokens per block), no block barriers: lane i holds experts i + 32 j (j < NJ)
// in registers, or in this warp's rows of shared memory when E > 32 * kRouteSlots (NJ == 0). The experts are
// picked in cpu::moe_route's order (biased score descending, lowest index among equal values; NaN never
// beats a number) by K warp-shuffle argmax rounds; the weights are summed in selection order, as on the CPU.
// (A thread-per-token version spent ~0.5 ms per layer re-reading the logits 6 x 256 times with dependent
// global loads; a block per token with block-wide argmax rounds ~10 us at decode.)
constexpr int kRouteWarps = 4;
constexpr int kRouteSlots = 8;  // experts per lane in registers: E <= 256

// A strict total order on (value, expert) with expert >= 0, so any reduction order finds the same maximum.
__device__ __forceinline__ bool route_better(float v1, int e1, float v2, int e2) {
  if (e2 < 0) return e1 >= 0;
  if (e1 < 0) return false;
  const bool n1 = v1 != v1, n2 = v2 != v2;
  if (n1 != n2) return n2;  // a number beats NaN
  if (!n1 && v1 != v2) return v1 > v2;
  return e1 < e2;
}

template <int NJ>
__global__ void route_kernel(const float* logits, int T, int E, int K, int f, const float* bias,
                             const int32_t* tid2eid, const int32_t* tokens, bool norm_topk, float scaling,
                             int32_t* idx, float* weights) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t = blockIdx.x * (blockDim.x / 32) + warp;
  if (t >= T) return;
  constexpr unsigned kAll = 0xffffffffu;
  const int nj = NJ > 0 ? NJ : (E + 31) / 32;
  extern __shared__ float route_smem[];
  float* srow = route_smem + static_cast<size_t>(warp) * 64 * nj;  // NJ == 0: scores [32 nj], keys [32 nj]
  float rsc[NJ > 0 ? NJ : 1], rkey[NJ > 0 ? NJ : 1];
  auto sc = [&](int j) -> float& {
    if constexpr (NJ > 0) return rsc[j];
    else return srow[j * 32 + lane];
  };
  auto key = [&](int j) -> float& {
    if constexpr (NJ > 0) return rkey[j];
    else return srow[(nj + j) * 32 + lane];
  };
  const float* l = logits + static_cast<int64_t>(t) * E;
#pragma unroll
  for (int j = 0; j < nj; ++j) {
    const int e = j * 32 + lane;
    sc(j) = e < E ? l[e] : -INFINITY;
    key(j) = e < E && !tid2eid ? bias[e] : 0.0f;
  }
  if (f == 2) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < nj; ++j) m = fmaxf(m, sc(j));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kAll, m, o));
#pragma unroll
    for (int j = 0; j < nj; ++j) sc(j) = j * 32 + lane < E ? expf(sc(j) - m) : 0.0f;
    // The sum in the former block-per-token kernel's order, so the results stay bit-identical: thread
    // w * 32 + lane of 256 summed its experts w * 32 + lane + 256 r, then a warp sum, then warps 0..7.
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      float p = 0.0f;
#pragma unroll
      for (int j = w; j < nj; j += 8) p += sc(j);
      s += warp_sum(p);
    }
#pragma unroll
    for (int j = 0; j < nj; ++j) sc(j) = sc(j) / s;
  } else {
#pragma unroll
    for (int j = 0; j < nj; ++j) sc(j) = score_of(f, sc(j));
  }
  float sum = 0.0f, my_s = 0.0f;  // lane k < K keeps the k-th pick
  int my_e = -1;
  if (tid2eid) {
    const int he = lane < K ? tid2eid[static_cast<int64_t>(tokens[t]) * K + lane] : -1;
    if constexpr (NJ == 0) __syncwarp();
    for (int k = 0; k < K; ++k) {
      const int e = __shfl_sync(kAll, he, k);
      float s;
      if constexpr (NJ > 0) {
        float mine = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          if (j == e >> 5) mine = rsc[j];
        s = __shfl_sync(kAll, mine, e & 31);
      } else {
        s = e >= 0 && e < E ? srow[e] : 0.0f;
      }
      sum += s;
      if (lane == k) my_e = e, my_s = s;
    }
  } else {
#pragma unroll
    for (int j = 0; j < nj; ++j) key(j) += sc(j);
    // Each lane's best candidate; after a round only the winner's lane looks again, below the winner (the
    // order is total, so everything above it is taken).
    float bv = 0.0f, bs = 0.0f;
    int be = -1;
#pragma unroll
    for (int j = 0; j < nj; ++j) {
      const int e = j * 32 + lane;
      if (e < E && route_better(key(j), e, bv, be)) bv = key(j), be = e, bs = sc(j);
    }
    for (int k = 0; k < K; ++k) {
      float v = bv;
      int e = be;
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kAll, v, o);
        const int oe = __shfl_xor_sync(kAll, e, o);
        if (route_better(ov, oe, v, e)) v = ov, e = oe;
      }
      const float s = __shfl_sync(kAll, bs, e & 31);
      sum += s;
      if (lane == k) my_e = e, my_s = s;
      if (e >= 0 && be == e) {
        bv = 0.0f, be = -1;
#pragma unroll
        for (int j = 0; j < nj; ++j) {
          const int c = j * 32 + lane;
          if (c < E && route_better(v, e, key(j), c) && route_better(key(j), c, bv, be))
            bv = key(j), be = c, bs = sc(j);
        }
      }
    }
  }
  if (lane < K) {
    float w = my_s;
    if (norm_topk) w /= (sum + 1e-20f);
    idx[static_cast<int64_t>(t) * K + lane] = my_e;
    weights[static_cast<int64_t>(t) * K + lane] = w * scaling;
  }
}

// The rank router (route_rank.cuh): one block per token.
__global__ void __launch_bounds__(kRankThreads) route_rank_kernel(const float* logits, int E, int K, int f,
                                                                  const float* bias, const int32_t* tid2eid,
                                                                  const int32_t* tokens, bool norm_topk,
                                                                  float scaling, int32_t* idx, float* weights) {
  float b[kRankPerThread];
  route_rank_bias(bias, tid2eid, E, b);
  cuda::pdl::enter();  // PDL: every access to non-constant data after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x;
  route_rank_row(logits + static_cast<int64_t>(t) * E, t, E, K, f, b, tid2eid, tokens, norm_topk, scaling, idx,
                 weights);
}

// h [rows, n] from g, u rows of stride ld.
__global__ void swiglu_kernel(const float* g, const float* u, int64_t rows, int64_t n, int64_t ld, float limit,
                              float* h, uint16_t* hb, bool f16) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t src = (i / n) * ld + i % n;
  float gi = g[src], ui = u[src];
  if (limit > 0.0f) {
    gi = fminf(gi, limit);
    ui = fminf(fmaxf(ui, -limit), limit);
  }
  const float o = gi / (1.0f + expf(-gi)) * ui;
  h[i] = o;
  if (hb) hb[i] = act16_bits_rn(o, f16);
}

__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ float bv[256];
  __shared__ int64_t bi[256];
  const float* r = x + static_cast<int64_t>(blockIdx.x) * n;
  float v = -INFINITY;
  int64_t best = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (best < 0 || r[i] > v) {
      v = r[i];
      best = i;
    }
  bv[threadIdx.x] = v;
  bi[threadIdx.x] = best;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = bv[threadIdx.x + s];
      const int64_t oi = bi[threadIdx.x + s];
      if (oi >= 0 && (bi[threadIdx.x] < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))) {
        bv[threadIdx.x] = ov;
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(bi[0]);
}
}  // namespace

namespace {
bool g_route_warp_kernel = false;
}  // namespace
void set_route_warp_kernel(bool on) { g_route_warp_kernel = on; }
bool route_warp_kernel_set() { return g_route_warp_kernel; }

void route(const float* logits, int T, int E, int K, int score_func, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx, float* weights, cudaStream_t stream) {
  if (K > kMaxTopK) dsv4::cuda::check(cudaErrorInvalidValue, "glue::route: num_experts_per_tok > 16");
  if (T <= 0) return;
  if (g_route_warp_kernel && E <= 32 * kRouteSlots) {
    cuda::check(cuda::launch(route_kernel<kRouteSlots>, dim3((T + kRouteWarps - 1) / kRouteWarps),
                             dim3(32 * kRouteWarps), 0, stream, logits, T, E, K, score_func, bias, tid2eid, tokens,
                             norm_topk, scaling, idx, weights),
                "route_kernel launch");
  } else if (E <= kRankMaxExperts) {
    cuda::check(cuda::launch(route_rank_kernel, dim3(T), dim3(kRankThreads), 0, stream, logits, E, K, score_func,
                             bias, tid2eid, tokens, norm_topk, scaling, idx, weights),
                "route_rank_kernel launch");
  } else {  // one warp per block, its scores and keys in shared memory
    const size_t smem = 2 * sizeof(float) * 32 * ((static_cast<size_t>(E) + 31) / 32);
    if (smem > 48 * 1024) dsv4::cuda::check(cudaErrorInvalidValue, "glue::route: more than 6144 experts");
    cuda::check(cuda::launch(route_kernel<0>, dim3(T), dim3(32), smem, stream, logits, T, E, K, score_func, bias,
                             tid2eid, tokens, norm_topk, scaling, idx, weights),
                "route_kernel launch");
  }
}

void swiglu(const float* g, const float* u, int64_t n, float limit, float* h, cudaStream_t stream) {
  swiglu_rows(g, u, 1, n, n, limit, h, stream);
}

void swiglu_rows(const float* g, const float* u, int64_t rows, int64_t n, int64_t ld, float limit, float* h,
                 cudaStream_t stream, uint16_t* hb, bool f16) {
  if (rows <= 0 || n <= 0) return;
  if (ld < n) fail("glue::swiglu_rows: ld=", ld, " < n=", n);
  cuda::check(cuda::launch(swiglu_kernel, dim3(blocks_for(rows * n, 256)), dim3(256), 0, stream, g, u, rows, n, ld,
                           limit, h, hb, f16),
              "swiglu_kernel launch");
}

void argmax_rows(const float* x, int rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return;
  cuda::check(cuda::launch(argmax_kernel, dim3(rows), dim3(256), 0, stream, x, n, out), "argmax_kernel launch");
}

}  // namespace dsv4::glue
