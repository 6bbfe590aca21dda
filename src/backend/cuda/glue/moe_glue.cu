// Router (score function, biased top-k or hash table, normalized weights), SwiGLU, argmax.
#include <cmath>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"
#include "core/error.h"

namespace dsv4::glue {
using namespace detail;

namespace {
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float score_of(int f, float l) {
  if (f == 0) return sqrtf(l > 20.0f ? l : log1pf(expf(l)));  // torch softplus threshold 20
  if (f == 1) return 1.0f / (1.0f + expf(-l));
  return l;
}

// One block per token, a thread per expert (strided when E > blockDim): the scores are computed once into
// shared memory, then K rounds of a block-wide argmax pick the experts in cpu::moe_route's order (biased
// score descending, lowest index among equal values; NaN never beats a number). The weights are summed in
// selection order by one thread, as on the CPU. (A thread-per-token version spent ~0.5 ms per layer
// re-reading the logits 6 x 256 times with dependent global loads.)
constexpr int kRouteThreads = 256;

__device__ __forceinline__ bool route_better(float v1, int e1, float v2, int e2) {
  if (e2 < 0) return e1 >= 0;
  if (e1 < 0) return false;
  const bool n1 = v1 != v1, n2 = v2 != v2;
  if (n1 != n2) return n2;  // a number beats NaN
  if (!n1 && v1 != v2) return v1 > v2;
  return e1 < e2;
}

__global__ void route_kernel(const float* logits, int E, int K, int f, const float* bias, const int32_t* tid2eid,
                             const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx, float* weights) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  extern __shared__ float route_smem[];
  float* sc = route_smem;      // [E] scores
  float* key = route_smem + E;  // [E] biased scores (selection keys)
  __shared__ float red_v[kRouteThreads / 32];
  __shared__ int red_e[kRouteThreads / 32];
  __shared__ int sel[kMaxTopK];
  __shared__ float mx_sh, sum_sh;
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* l = logits + static_cast<int64_t>(t) * E;
  if (f == 2) {  // softmax: max and sum over the row (fixed-order tree)
    float m = -INFINITY;
    for (int e = tid; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red_v[warp] = m;
    __syncthreads();
    if (tid == 0) {
      float mm = red_v[0];
      for (int w = 1; w < blockDim.x / 32; ++w) mm = fmaxf(mm, red_v[w]);
      mx_sh = mm;
    }
    __syncthreads();
    float su = 0.0f;
    for (int e = tid; e < E; e += blockDim.x) su += expf(l[e] - mx_sh);
    su = warp_sum(su);
    __syncthreads();
    if (lane == 0) red_v[warp] = su;
    __syncthreads();
    if (tid == 0) {
      float ss = 0.0f;
      for (int w = 0; w < blockDim.x / 32; ++w) ss += red_v[w];
      sum_sh = ss;
    }
    __syncthreads();
  }
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = f == 2 ? expf(l[e] - mx_sh) / sum_sh : score_of(f, l[e]);
    sc[e] = v;
    if (!tid2eid) key[e] = v + bias[e];
  }
  __syncthreads();
  if (tid2eid) {
    if (tid < K) sel[tid] = tid2eid[static_cast<int64_t>(tokens[t]) * K + tid];
  } else {
    for (int k = 0; k < K; ++k) {
      float bv = 0.0f;
      int be = -1;
      for (int e = tid; e < E; e += blockDim.x) {
        bool taken = false;
        for (int i = 0; i < k; ++i) taken |= sel[i] == e;
        if (!taken && route_better(key[e], e, bv, be)) bv = key[e], be = e;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (route_better(ov, oe, bv, be)) bv = ov, be = oe;
      }
      if (lane == 0) red_v[warp] = bv, red_e[warp] = be;
      __syncthreads();
      if (tid == 0) {
        float fv = red_v[0];
        int fe = red_e[0];
        for (int w = 1; w < blockDim.x / 32; ++w)
          if (route_better(red_v[w], red_e[w], fv, fe)) fv = red_v[w], fe = red_e[w];
        sel[k] = fe;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += sc[sel[k]];
    for (int k = 0; k < K; ++k) {
      float w = sc[sel[k]];
      if (norm_topk) w /= (sum + 1e-20f);
      idx[static_cast<int64_t>(t) * K + k] = sel[k];
      weights[static_cast<int64_t>(t) * K + k] = w * scaling;
    }
  }
}

// h [rows, n] from g, u rows of stride ld.
__global__ void swiglu_kernel(const float* g, const float* u, int64_t rows, int64_t n, int64_t ld, float limit,
                              float* h, uint16_t* hb) {
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
  if (hb) hb[i] = bf16_bits_rn(o);
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

void route(const float* logits, int T, int E, int K, int score_func, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx, float* weights, cudaStream_t stream) {
  if (K > kMaxTopK) dsv4::cuda::check(cudaErrorInvalidValue, "glue::route: num_experts_per_tok > 16");
  if (T <= 0) return;
  const size_t smem = 2 * sizeof(float) * static_cast<size_t>(E);
  if (smem > 48 * 1024) dsv4::cuda::check(cudaErrorInvalidValue, "glue::route: more than 6144 experts");
  cuda::check(cuda::launch(route_kernel, dim3(T), dim3(kRouteThreads), smem, stream, logits, E, K, score_func, bias, tid2eid, tokens, norm_topk,
                                                    scaling, idx, weights), "route_kernel launch");
  check_launch("glue::route");
}

void swiglu(const float* g, const float* u, int64_t n, float limit, float* h, cudaStream_t stream) {
  swiglu_rows(g, u, 1, n, n, limit, h, stream);
}

void swiglu_rows(const float* g, const float* u, int64_t rows, int64_t n, int64_t ld, float limit, float* h,
                 cudaStream_t stream, uint16_t* hb) {
  if (rows <= 0 || n <= 0) return;
  if (ld < n) fail("glue::swiglu_rows: ld=", ld, " < n=", n);
  cuda::check(cuda::launch(swiglu_kernel, dim3(blocks_for(rows * n, 256)), dim3(256), 0, stream, g, u, rows, n, ld,
                           limit, h, hb),
              "swiglu_kernel launch");
}

void argmax_rows(const float* x, int rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return;
  cuda::check(cuda::launch(argmax_kernel, dim3(rows), dim3(256), 0, stream, x, n, out), "argmax_kernel launch");
  check_launch("glue::argmax_rows");
}

}  // namespace dsv4::glue
