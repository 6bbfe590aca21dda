// The rank router (glue::route for E <= kRankMaxExperts) as one block's device code: route_rank_kernel in
// moe_glue.cu. (The eighteenth session also called it from a one-launch router; measured within the noise of
// the two launches, runs 112-114, and removed.)
#pragma once
#include <cstdint>

#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue::detail {

constexpr int kMaxTopK = 16;

__device__ __forceinline__ float score_of(int f, float l) {
  if (f == 0) return sqrtf(l > 20.0f ? l : log1pf(expf(l)));  // torch softplus threshold 20
  if (f == 1) return 1.0f / (1.0f + expf(-l));
  return l;
}

// Decode router for E <= kRankMaxExperts: one block per token, a thread per expert (strided), no selection
// rounds. Scores as route_kernel (the softmax sum in the same order: thread w*32+lane over its experts
// w*32+lane+256r, a warp butterfly, then warps 0..7 in order). The rank of an expert = the number of experts
// that beat it in route_better's strict total order; rank < K puts it at sel[rank], cpu::moe_route's order. It
// is counted in two steps: first within the expert's group of 32 (experts 32g .. 32g+31); only experts of group
// rank < K can be among the K best (an expert that beats one of the K best is itself among them, so within
// its group it has fewer than K ahead of it), and every expert that beats a candidate of global rank < K is a
// candidate too, so counting among the candidates gives the exact rank of the K best and >= K for the rest.
// (E x E compares per token took ~1.3 us of the ~7 us kernel at E = 256; now 32 E + candidates^2.) The
// warp-per-token route_kernel is a ~1,500-instruction dependent chain in one warp: ~10 us at one token.
constexpr int kRankThreads = 256;
constexpr int kRankMaxExperts = 1024;
constexpr int kRankMaxCand = kRankMaxExperts / 32 * kMaxTopK;  // group ranks < K: at most K per group of 32
constexpr int kRankPerThread = kRankMaxExperts / kRankThreads;

// Whether key o of expert j beats key v of expert e: numbers beat NaN; larger numbers, and equal ones of lower
// index, beat a number; NaNs of lower index beat a NaN (an expert never beats itself).
__device__ __forceinline__ bool rank_beats(float o, int j, float v, int e) {
  return v == v ? (o > v) | ((o == v) & (j < e)) : (o == o) | (j < e);
}

// The selection bias of this thread's experts (tid + 256 r), read by the caller before its PDL wait (a
// weight: its latency then stays off the chain).
__device__ __forceinline__ void route_rank_bias(const float* bias, const int32_t* tid2eid, int E,
                                                float (&b)[kRankPerThread]) {
#pragma unroll
  for (int r = 0; r < kRankPerThread; ++r) {
    const int e = threadIdx.x + r * kRankThreads;
    b[r] = !tid2eid && e < E ? bias[e] : 0.0f;
  }
}

// Token t's routes from its E logits l; every thread of the kRankThreads-thread block calls it. b: route_rank_bias.
__device__ __forceinline__ void route_rank_row(const float* l, int t, int E, int K, int f,
                                               const float (&b)[kRankPerThread], const int32_t* tid2eid,
                                               const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx,
                                               float* weights) {
  __shared__ float sc[kRankMaxExperts], key[kRankMaxExperts];
  __shared__ float red[kRankThreads / 32];
  __shared__ int sel[kMaxTopK];
  __shared__ int cand[kRankMaxCand];
  __shared__ int n_cand;
  constexpr unsigned kAll = 0xffffffffu;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid < kMaxTopK) sel[tid] = -1;
  if (tid == 0) n_cand = 0;
  for (int e = tid; e < E; e += kRankThreads) sc[e] = l[e];
  if (f == 2) {
    float m = -INFINITY;
    for (int e = tid; e < E; e += kRankThreads) m = fmaxf(m, sc[e]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kAll, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < kRankThreads / 32; ++w) m = fmaxf(m, red[w]);
    float p = 0.0f;
    for (int e = tid; e < E; e += kRankThreads) p += expf(sc[e] - m);
    p = warp_sum(p);
    __syncthreads();  // everyone has read red[] (the max)
    if (lane == 0) red[warp] = p;
    __syncthreads();
    float sum = 0.0f;
    for (int w = 0; w < kRankThreads / 32; ++w) sum += red[w];
    for (int e = tid; e < E; e += kRankThreads) sc[e] = expf(sc[e] - m) / sum;
  } else {
    for (int e = tid; e < E; e += kRankThreads) sc[e] = score_of(f, sc[e]);
  }
  if (!tid2eid)
#pragma unroll
    for (int r = 0; r < kRankPerThread; ++r) {
      const int e = tid + r * kRankThreads;
      if (e < E) key[e] = sc[e] + b[r];
    }
  __syncthreads();
  if (tid2eid) {
    if (tid < K) sel[tid] = tid2eid[static_cast<int64_t>(tokens[t]) * K + tid];
  } else {
    // Step 1: rank within the group of 32; candidates (group rank < K) appended in any order.
    for (int e = tid; e < E; e += kRankThreads) {
      const float v = key[e];
      const int g0 = e & ~31, g1 = min(g0 + 32, E);
      int rank = 0;
      for (int j = g0; j < g1; ++j) rank += rank_beats(key[j], j, v, e);
      if (rank < K) cand[atomicAdd(&n_cand, 1)] = e;
    }
    __syncthreads();
    // Step 2: the rank among the candidates.
    const int nc = n_cand;
    for (int i = tid; i < nc; i += kRankThreads) {
      const int e = cand[i];
      const float v = key[e];
      int rank = 0;
      for (int q = 0; q < nc; ++q) {
        const int j = cand[q];
        rank += rank_beats(key[j], j, v, e);
      }
      if (rank < K) sel[rank] = e;
    }
  }
  __syncthreads();
  if (warp == 0) {  // weights: the picks' scores summed in pick order, as on the CPU
    const int e = lane < K ? sel[lane] : -1;
    const float my_s = e >= 0 && e < E ? sc[e] : 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += __shfl_sync(kAll, my_s, k);
    if (lane < K) {
      float w = my_s;
      if (norm_topk) w /= (sum + 1e-20f);
      idx[static_cast<int64_t>(t) * K + lane] = e;
      weights[static_cast<int64_t>(t) * K + lane] = w * scaling;
    }
  }
}

}  // namespace dsv4::glue::detail
