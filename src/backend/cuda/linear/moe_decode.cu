// MXFP4 MoE for decode (T <= 64 tokens x top_k experts), four launches:
//   1. group:   (token, slot) pairs bucketed by expert, in token order; the list of experts with >= 1 token;
//   2. w13:     for each active expert, w1 and w3 rows streamed once for all its tokens, SwiGLU with the
//               clamp and the routing weight (applied before w2, as the DeepSeek reference does) -> h (bf16);
//   3. w2:      for each active expert, y = w2 h for its tokens, one fp32 row per (token, slot);
//   4. combine: out[t] = sum over slots in slot order (deterministic, no atomics).
// Grids are sized for the most experts T*top_k tokens can touch; blocks past the active count exit at once,
// so an expert with no token costs no weight traffic.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "backend/cuda/linear/warp_tile.cuh"
#include "core/error.h"

namespace dsv4::cudalin {
namespace {

constexpr int kMaxExperts = 1024;

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

int chunks_per_warp(int K, const char* what, const MoeShape& s) {
  // 8 warps split K; each holds at most 4 chunks of 128 in flight.
  const int C = K / 128, cpw = (C + 7) / 8;
  if (K % 128 != 0 || cpw > 4)
    throw Error(str_cat("cuda moe_decode: ", what, " K = ", K, " unsupported (multiple of 128, at most 4096); shape hidden ",
                        s.hidden, " inter ", s.inter));
  return cpw <= 1 ? 1 : cpw <= 2 ? 2 : 4;
}

}  // namespace

MoeWorkspace moe_workspace_create(const MoeShape& s, int max_tokens) {
  MoeWorkspace ws;
  ws.max_tokens = max_tokens;
  const size_t P = size_t(max_tokens) * s.top_k;
  check_cuda(cudaMalloc(&ws.meta, (2 + 2 * size_t(s.n_experts) + 2 * P) * sizeof(int)), "moe_workspace_create");
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
                const float* weights, int T, float* out, bool accumulate, MoeWorkspace& ws, cudaStream_t stream) {
  require_supported_device();
  if (T < 1 || T > 64 || T > ws.max_tokens)
    throw Error(str_cat("cuda moe_decode: ", T, " tokens unsupported (1..64 and at most the workspace's ", ws.max_tokens, ")"));
  if (s.hidden % 16 != 0 || s.inter % 16 != 0 || s.n_experts < 1 || s.n_experts > kMaxExperts || s.top_k < 1)
    throw Error(str_cat("cuda moe_decode: shape hidden ", s.hidden, " inter ", s.inter, " experts ", s.n_experts,
                        " top_k ", s.top_k, " unsupported"));
  const int cpw13 = chunks_per_warp(s.hidden, "w1/w3", s), cpw2 = chunks_per_warp(s.inter, "w2", s);
  const int P = T * s.top_k, max_active = std::min(s.n_experts, P);
  Meta m{ws.meta, s.n_experts, P};
  group_kernel<<<1, 256, 0, stream>>>(idx, P, s.top_k, m);
  check_cuda(cudaGetLastError(), "moe group launch");
  MoeArgs a{experts, s.hidden, s.inter, s.swiglu_limit, x, weights, reinterpret_cast<__nv_bfloat16*>(ws.h), ws.ybuf, m};
  const dim3 g13(s.inter / 16, max_active), g2(s.hidden / 16, max_active);
  if (T <= 8) launch_experts<1>(cpw13, cpw2, g13, g2, a, stream);
  else if (T <= 16) launch_experts<2>(cpw13, cpw2, g13, g2, a, stream);
  else if (T <= 32) launch_experts<4>(cpw13, cpw2, g13, g2, a, stream);
  else launch_experts<8>(cpw13, cpw2, g13, g2, a, stream);
  const int64_t n = int64_t(T) * s.hidden;
  combine_kernel<<<static_cast<int>(std::min<int64_t>((n + 255) / 256, 2048)), 256, 0, stream>>>(
      ws.ybuf, idx, T, s.top_k, s.n_experts, s.hidden, accumulate, out);
  check_cuda(cudaGetLastError(), "moe combine launch");
}

}  // namespace dsv4::cudalin
