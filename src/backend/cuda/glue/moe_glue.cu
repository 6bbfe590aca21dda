// Router (score function, biased top-k or hash table, normalized weights), SwiGLU, argmax.
#include <cmath>

#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float score_of(int f, float l) {
  if (f == 0) return sqrtf(l > 20.0f ? l : log1pf(expf(l)));  // torch softplus threshold 20
  if (f == 1) return 1.0f / (1.0f + expf(-l));
  return l;
}

// One thread per token (E and K are small); the same selection order as cpu::moe_route: value descending,
// lowest index among equal values.
__global__ void route_kernel(const float* logits, int T, int E, int K, int f, const float* bias, const int32_t* tid2eid,
                             const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx, float* weights) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + static_cast<int64_t>(t) * E;
  float mx = -INFINITY, sum_exp = 1.0f;
  if (f == 2) {
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, l[e]);
    sum_exp = 0.0f;
    for (int e = 0; e < E; ++e) sum_exp += expf(l[e] - mx);
  }
  auto s_of = [&](int e) { return f == 2 ? expf(l[e] - mx) / sum_exp : score_of(f, l[e]); };
  int sel[kMaxTopK];
  if (tid2eid) {
    for (int k = 0; k < K; ++k) sel[k] = tid2eid[static_cast<int64_t>(tokens[t]) * K + k];
  } else {
    for (int k = 0; k < K; ++k) {
      int best = -1;
      float bv = 0.0f;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < k; ++i) taken |= (sel[i] == e);
        if (taken) continue;
        const float v = s_of(e) + bias[e];
        if (best < 0 || v > bv) {
          best = e;
          bv = v;
        }
      }
      sel[k] = best;
    }
  }
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += s_of(sel[k]);
  for (int k = 0; k < K; ++k) {
    float w = s_of(sel[k]);
    if (norm_topk) w /= (sum + 1e-20f);
    idx[static_cast<int64_t>(t) * K + k] = sel[k];
    weights[static_cast<int64_t>(t) * K + k] = w * scaling;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t n, float limit, float* h) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i], ui = u[i];
  if (limit > 0.0f) {
    gi = fminf(gi, limit);
    ui = fminf(fmaxf(ui, -limit), limit);
  }
  h[i] = gi / (1.0f + expf(-gi)) * ui;
}

__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
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
  route_kernel<<<blocks_for(T, 64), 64, 0, stream>>>(logits, T, E, K, score_func, bias, tid2eid, tokens, norm_topk,
                                                      scaling, idx, weights);
  check_launch("glue::route");
}

void swiglu(const float* g, const float* u, int64_t n, float limit, float* h, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(g, u, n, limit, h);
  check_launch("glue::swiglu");
}

void argmax_rows(const float* x, int rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return;
  argmax_kernel<<<rows, 256, 0, stream>>>(x, n, out);
  check_launch("glue::argmax_rows");
}

}  // namespace dsv4::glue
