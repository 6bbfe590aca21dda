// mHC (spec dsv4-model.md 2.3, 2.6; reference cpu::hc_pre / hc_post / hc_head / sinkhorn).
//
// hc_pre / hc_head: mixes = (X · fnᵀ) · rsqrt(mean(X²) + eps) is a skinny GEMM [T, 4D] x [4D, M] (M = 24 or 4)
// plus the sum of squares, then the coefficients and x = Σ_j pre_j h_j. Above kHcFusedPostTokens tokens
// (prefill) it runs on the tensor cores (mhc_prefill.cu). Up to that (decode), in fp32 on CUDA cores:
//   1. hc_mix_small_kernel: a warp per K range, lanes along k, tokens looped; M+1 partials (mixes, sum of
//      squares) per token and K range to the workspace [KS][T][M+1]. It can first form the previous
//      sub-layer's hc_post (HcArgs::prev_*).
//   2. hc_finish_kernel: CTA = one token (512 threads): sums the KS partials (fixed order), applies the norm,
//      sigmoids and (hc_pre, warp 15 alone) Sinkhorn in fp32 on 16 lanes, while warps 0..14 form
//      x = Σ_j pre_j h_j, and optionally the sub-layer's RMSNorm and bf16 / f16 copies of x (HcArgs::norm_w,
//      xb, xh: one kernel instead of three). This re-reads h, from L2 at these sizes.
//   At one token with HcArgs::counter both run as one kernel (hc_one_token_kernel).
// hc_post: pure streaming, one float4 of D per thread for all 4 output streams.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "backend/cuda/mhc_common.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using namespace mhc;            // kN, kMaxMix, kMaxKs, sigmoidf, sinkhorn_lane, store_x (mhc_common.cuh)
constexpr int kKc = 128;        // k per chunk of the decode mix

// Decode (few tokens): a warp owns cpw chunks of 128 k (lane = 4 consecutive k, float4 loads of fn and h
// straight from global), loops over the tokens, and reduces its M + 1 sums across lanes (butterfly, fixed
// order): one partial per warp and token in the workspace layout [KS][T][M+1] (KS = the number of warps). It
// runs for up to kHcFusedPostTokens tokens (kernels_compressor_mhc.h), the range in which it also fuses the
// pending hc_post.
constexpr int kSmallMixWarps = 1;  // one warp per CTA: the K ranges spread over as many SMs
int small_mix_cpw(int64_t dim) { return static_cast<int>((kN * dim / kKc + kMaxKs - 1) / kMaxKs); }
int small_mix_ks(int64_t dim) {
  const int chunks = static_cast<int>(kN * dim / kKc), cpw = small_mix_cpw(dim);
  return (chunks + cpw - 1) / cpw;
}

// One float4 of hc_post's output: stream k, elements d4*4 .. d4*4+3 of token t (hc_post_kernel's arithmetic).
__device__ __forceinline__ float4 post_float4(const float* __restrict__ y, const float* __restrict__ res,
                                              const float* __restrict__ post, const float* __restrict__ comb, int t,
                                              int64_t D, int k, int64_t d4) {
  const int64_t D4 = D / 4;
  float w[kN];
  float4 r[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    w[j] = __ldg(comb + t * kN * kN + j * kN + k);
    r[j] = __ldg(reinterpret_cast<const float4*>(res + t * kN * D) + j * D4 + d4);
  }
  return post_stream(__ldg(post + t * kN + k), __ldg(reinterpret_cast<const float4*>(y + t * D) + d4), w, r);
}

// fn is a weight (constant): the lines of K range w (chunks [w*cpw, (w+1)*cpw), all M rows) are sent to L2
// before the kernel waits for its predecessor, so the mixes find them there. Threads tid of nthreads share it.
template <int M>
__device__ __forceinline__ void prefetch_fn_l2(const HcArgs& a, int w, int cpw, int tid, int nthreads) {
  const int64_t K = kN * a.dim, n_chunks = K / kKc, c0 = static_cast<int64_t>(w) * cpw, c1 = min(c0 + cpw, n_chunks);
  const int lines = static_cast<int>((c1 - c0) * kKc / 32);  // 128-byte lines per fn row
  for (int i = tid; i < M * lines; i += nthreads)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a.fn + (i / lines) * K + c0 * kKc + (i % lines) * 32));
}

// a.x*b.x + a.y*b.y + a.z*b.z + a.w*b.w with its roundings spelled out. Left to the compiler, the contraction
// into FMAs depends on the surrounding code: one warp with all 24 sums fused (x*fx) into the y product, 4 warps
// fused (y*fy) into the x product (PTX of c16c046; run 114 caught hc_head's bits differing between the one-token
// kernel and the two launches). Every mix path that must agree bit for bit calls this.
__device__ __forceinline__ float dot4_fixed(float4 a, float4 b) {
  return __fmaf_rn(a.w, b.w, __fmaf_rn(a.z, b.z, __fmaf_rn(a.y, b.y, __fmul_rn(a.x, b.x))));
}

// Warp `sub` of S: token t's sums over K range w (chunks [w*cpw, (w+1)*cpw)) for its share of the M mixes,
// mixes m0 .. m0 + MS - 1 (MS = ceil(M / S), m0 = sub * MS), and for sub 0 also the sum of squares (index M),
// each reduced across lanes (butterfly, fixed order) into the workspace [KS][T][M+1]. A sum's arithmetic does
// not depend on S (S only spreads the sums over warps; dot4_fixed fixes the FMAs), so the bits do not either.
// With HcArgs::prev_* every warp forms the previous hc_post's output for its float4s (the same loads) and warp 0
// writes it to h. fn's loads are issued before h's: they are independent, and issued after them (as until the
// eighteenth session, one warp, all 24 mixes) they were a second round trip after the fused hc_post's loads.
template <int M, int S>
__device__ __forceinline__ void mix_token(const HcArgs& a, int w, int cpw, int t, int sub) {
  constexpr int MS = (M + S - 1) / S;
  static_assert(MS < 32, "lane MS holds the sum of squares");
  const int lane = threadIdx.x & 31, n_tokens = a.n_tokens, m0 = sub * MS;
  const int64_t D = a.dim, K = kN * D;
  const float* __restrict__ fn = a.fn;
  float* __restrict__ ws = static_cast<float*>(a.workspace);
  const int64_t n_chunks = K / kKc, c0 = static_cast<int64_t>(w) * cpw, c1 = min(c0 + cpw, n_chunks);
  float acc[MS + 1];
#pragma unroll
  for (int i = 0; i <= MS; ++i) acc[i] = 0.f;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t k0 = c * kKc + 4 * lane;
    float4 f[MS];
#pragma unroll
    for (int i = 0; i < MS; ++i)
      f[i] = m0 + i < M ? __ldg(reinterpret_cast<const float4*>(fn + (m0 + i) * K + k0)) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 hv;
    if (a.prev_y) {  // the fused hc_post: this lane's 4 elements of h, written and used
      hv = post_float4(a.prev_y, a.prev_res, a.prev_post, a.prev_comb, t, D, static_cast<int>(k0 / D), (k0 % D) / 4);
      if (sub == 0) *reinterpret_cast<float4*>(const_cast<float*>(a.h) + t * K + k0) = hv;
    } else {
      hv = __ldg(reinterpret_cast<const float4*>(a.h + t * K + k0));
    }
    acc[MS] = __fadd_rn(acc[MS], dot4_fixed(hv, hv));
#pragma unroll
    for (int i = 0; i < MS; ++i) acc[i] = __fadd_rn(acc[i], dot4_fixed(hv, f[i]));
  }
  float mine = 0.f;
#pragma unroll
  for (int i = 0; i <= MS; ++i) {
    float v = acc[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == i) mine = v;
  }
  float* out = ws + (static_cast<int64_t>(w) * n_tokens + t) * (M + 1);
  if (lane < MS && m0 + lane < M) out[m0 + lane] = mine;
  if (sub == 0 && lane == MS) out[M] = mine;
}

template <int M>
__global__ void __launch_bounds__(kSmallMixWarps * 32) hc_mix_small_kernel(HcArgs a, int cpw, int ks_count) {
  const int w = blockIdx.x * kSmallMixWarps + (threadIdx.x >> 5);
  if (w < ks_count) prefetch_fn_l2<M>(a, w, cpw, threadIdx.x & 31, 32);
  pdl::enter();  // PDL: every access to non-constant data after this (backend/cuda/pdl.cuh)
  if (w >= ks_count) return;
  for (int t = 0; t < a.n_tokens; ++t) mix_token<M, 1>(a, w, cpw, t, 0);
}

constexpr int kFinThreads = 512;
constexpr int kFinX = kFinThreads - 32;  // warps 0..14 compute x; warp 15 runs hc_pre's post / Sinkhorn meanwhile
constexpr int kFinVec = 4;               // float4s of D per x thread: D <= 4 * 4 * 480 = 7680 (validate: <= 7168)
constexpr int kSumLanes = 16;            // threads per mix summing the KS partials

__device__ __forceinline__ void x_warps_barrier() { asm volatile("bar.sync 1, %0;" ::"n"(kFinX) : "memory"); }

// Warps 0..14 of finish_token: x = sum_j pre_j h_j, the optional RMSNorm and the 16-bit copies.
// scale0 = a.scale[0], base = a.base[0..kN), nw = norm_w's float4s of this thread: read by the caller.
template <int M>
__device__ __forceinline__ void finish_x(const HcArgs& a, int t, const float4 (&hv)[kFinVec][kN], const float* mix,
                                         double* part, float r, float scale0, const float (&base)[kN],
                                         const float4 (&nw)[kFinVec]) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t D = a.dim, D4 = D / 4;
  float p[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) p[j] = sigmoidf(mix[j] * r * scale0 + base[j]) + a.hc_eps;
  float4 xv[kFinVec];
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kFinVec; ++i) {
    xv[i] = combine_streams(p, hv[i]);
    ss += sum_squares(xv[i]);
  }
  float rn = 1.0f;
  if (a.norm_w) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) part[tid >> 5] = ss;
    x_warps_barrier();
    double tot = 0.0;
    for (int w = 0; w < kFinX / 32; ++w) tot += part[w];  // fixed order
    rn = 1.0f / sqrtf(static_cast<float>(tot / static_cast<double>(D)) + a.norm_eps);
  }
#pragma unroll
  for (int i = 0; i < kFinVec; ++i) {
    const int64_t d4 = tid + static_cast<int64_t>(i) * kFinX;
    if (d4 < D4) store_x(a, t, d4, xv[i], rn, nw[i]);
  }
}

// Token t's finish by one block of kFinThreads threads (every thread calls it). All loads first (the KS
// partials and this thread's h, independent of each other), then the KS partials summed per mix by 16 threads
// (strided, then a butterfly: a fixed order), the norm and the sigmoids; then warp 15 alone does hc_pre's post
// and Sinkhorn (a chain of 40 dependent divisions) while warps 0..14 form x = sum_j pre_j h_j, optionally
// RMSNorm(x) * norm_w (cpu::rmsnorm's formula, sum of squares in double; their own barrier, bar.sync 1) and
// the bf16 / f16 copies (round to nearest even, as cudalin::cast_f32_to_bf16) for the linears that read x.
// L2: h and the partials were written by other blocks of this grid (hc_one_token_kernel), so they are read
// through L2 (ld.global.cg) rather than the non-coherent path.
template <int M>
struct FinShared {
  float mix[M + 1];
  double part[kFinX / 32];
  float partial[kMaxKs * (M + 1)];
};

template <int M, bool L2>
__device__ __forceinline__ void finish_token(const HcArgs& a, int ks_count, int t, FinShared<M>& sh) {
  float* const mix = sh.mix;
  double* const part = sh.part;
  float* const partial = sh.partial;
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t D = a.dim, K = kN * D, D4 = D / 4;
  const float* ws = static_cast<const float*>(a.workspace);
  for (int i = tid; i < ks_count * (M + 1); i += kFinThreads)
    partial[i] = L2 ? __ldcg(ws + (static_cast<int64_t>(i / (M + 1)) * a.n_tokens + t) * (M + 1) + i % (M + 1))
                    : ws[(static_cast<int64_t>(i / (M + 1)) * a.n_tokens + t) * (M + 1) + i % (M + 1)];
  const float4* h = reinterpret_cast<const float4*>(a.h + t * K);
  float4 hv[kFinVec][kN];
  // The weights the finish reads (base, scale, norm_w) go out with h and the partials: read after the sums
  // (until run 111), each was one more DRAM round trip on the block's chain (the weight stream of a decode
  // step evicts them from L2 between layers).
  float base[kN], scale0 = __ldg(a.scale), scale_pc[2] = {0.f, 0.f}, base_post = 0.f, base_comb = 0.f;
  float4 nw[kFinVec];
  if (tid < kFinX) {
#pragma unroll
    for (int i = 0; i < kFinVec; ++i) {
      const int64_t d4 = tid + static_cast<int64_t>(i) * kFinX;
#pragma unroll
      for (int j = 0; j < kN; ++j)
        hv[i][j] = d4 >= D4 ? make_float4(0.f, 0.f, 0.f, 0.f) : L2 ? __ldcg(h + j * D4 + d4) : __ldg(h + j * D4 + d4);
      nw[i] = a.norm_w && d4 < D4 ? __ldg(reinterpret_cast<const float4*>(a.norm_w) + d4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) base[j] = __ldg(a.base + j);
  } else if constexpr (M == kMaxMix) {
    scale_pc[0] = __ldg(a.scale + 1);
    scale_pc[1] = __ldg(a.scale + 2);
    base_post = lane < kN ? __ldg(a.base + kN + lane) : 0.f;
    base_comb = __ldg(a.base + 2 * kN + (lane & 15));
  }
  __syncthreads();
  {
    const int m = tid / kSumLanes, sub = tid % kSumLanes;  // every lane joins the shuffles
    float s = 0.f;
    if (m <= M)
      for (int ks = sub; ks < ks_count; ks += kSumLanes) s += partial[ks * (M + 1) + m];
#pragma unroll
    for (int o = kSumLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (m <= M && sub == 0) mix[m] = s;
  }
  __syncthreads();
  const float r = 1.0f / sqrtf(mix[M] / static_cast<float>(K) + a.norm_eps);
  if (tid >= kFinX) {  // warp 15
    if constexpr (M == kMaxMix) {
      if (lane < kN) a.post[t * kN + lane] = 2.0f * sigmoidf(mix[kN + lane] * r * scale_pc[0] + base_post);
      const int l = lane & 15;
      const float c = sinkhorn_lane(mix[2 * kN + l] * r * scale_pc[1] + base_comb, a.sinkhorn_iters, a.hc_eps);
      if (lane < 16) a.comb[t * kN * kN + l] = c;
    }
  } else {
    finish_x<M>(a, t, hv, mix, part, r, scale0, base, nw);
  }
}

// One block per token, after the mix kernels.
// (Minimum 1 block per SM in the bounds: without it ptxas spills around the double reduction.)
template <int M>
__global__ void __launch_bounds__(kFinThreads, 1) hc_finish_kernel(HcArgs a, int ks_count) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ FinShared<M> sh;
  finish_token<M, false>(a, ks_count, blockIdx.x, sh);
}

// One token with HcArgs::counter: the mixes and the finish in one launch. Block w (kFinThreads threads) mixes
// K range w on warps 0 .. kOneTokenMixWarps - 1 (mix_token, the arithmetic of hc_mix_small_kernel, its sums
// spread over the warps); the last block to count its partials in (threadfence, then an atomic on the counter,
// which it re-arms) runs finish_token. Same bits as the two launches; one kernel boundary fewer on the decode
// step's critical path.
constexpr int kOneTokenMixWarps = 4;  // 6 of hc_pre's 24 mixes per warp: fn's loads fit the 128 registers
template <int M>
__global__ void __launch_bounds__(kFinThreads, 1) hc_one_token_kernel(HcArgs a, int cpw, int ks_count) {
  __shared__ FinShared<M> sh;
  __shared__ bool last;
  prefetch_fn_l2<M>(a, blockIdx.x, cpw, threadIdx.x, kFinThreads);
  pdl::enter();  // PDL: every access to non-constant data after this (backend/cuda/pdl.cuh)
  if (threadIdx.x < 32 * kOneTokenMixWarps)
    mix_token<M, kOneTokenMixWarps>(a, blockIdx.x, cpw, 0, threadIdx.x >> 5);
  if (!ptx::last_block_to_arrive(a.counter, ks_count, last)) return;
  finish_token<M, true>(a, ks_count, 0, sh);
  if (threadIdx.x == 0) *a.counter = 0;  // ready for the next launch
}

__global__ void __launch_bounds__(256) hc_post_kernel(int n_tokens, int64_t D, const float* __restrict__ y,
                                                      const float* __restrict__ res, const float* __restrict__ post,
                                                      const float* __restrict__ comb, float* __restrict__ out) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.y;
  const int64_t d4 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d4 * 4 >= D) return;
  const int64_t D4 = D / 4;
  float p[kN], c[kN * kN];
#pragma unroll
  for (int k = 0; k < kN; ++k) p[k] = __ldg(post + t * kN + k);
#pragma unroll
  for (int m = 0; m < kN * kN; ++m) c[m] = __ldg(comb + t * kN * kN + m);
  const float4 yv = __ldg(reinterpret_cast<const float4*>(y + t * D) + d4);
  float4 r[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) r[j] = __ldg(reinterpret_cast<const float4*>(res + t * kN * D) + j * D4 + d4);
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const float w[kN] = {c[k], c[kN + k], c[2 * kN + k], c[3 * kN + k]};
    reinterpret_cast<float4*>(out + t * kN * D)[k * D4 + d4] = post_stream(p[k], yv, w, r);
  }
}

__global__ void hc_sinkhorn_kernel(const float* logits, float* comb, int n_mats, int iters, float eps) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;  // matrix
  const int l = threadIdx.x & 15;
  const float x = i < n_mats ? logits[i * 16 + l] : 0.f;  // every lane joins the shuffles
  const float c = sinkhorn_lane(x, iters, eps);
  if (i < n_mats) comb[i * 16 + l] = c;
}

void validate(const HcArgs& a, const char* who, bool pre) {
  device_config();
  if (a.n != kN) fail("cuda::", who, ": hc_mult=", a.n, " unsupported (only 4)");
  if (a.dim < 32 || a.dim > 7168 || a.dim % 32)
    fail("cuda::", who, ": dim=", a.dim, " unsupported (a multiple of 32 in 32..7168)");
  if (a.n_tokens < 0 || a.n_tokens > 2147483647 / 64) fail("cuda::", who, ": n_tokens=", a.n_tokens, " out of range");
  if (!a.h || !a.fn || !a.base || !a.scale || !a.x || !a.workspace || (pre && (!a.post || !a.comb)))
    fail("cuda::", who, ": a required pointer is null");
  if (reinterpret_cast<uintptr_t>(a.h) % 16 || reinterpret_cast<uintptr_t>(a.fn) % 16 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 || reinterpret_cast<uintptr_t>(a.norm_w) % 16 ||
      reinterpret_cast<uintptr_t>(a.xb) % 8 || reinterpret_cast<uintptr_t>(a.xh) % 8 ||
      reinterpret_cast<uintptr_t>(a.prev_y) % 16 || reinterpret_cast<uintptr_t>(a.prev_res) % 16)
    fail("cuda::", who, ": h, fn, x, norm_w, prev_y and prev_res must be 16-byte aligned, xb and xh 8-byte aligned");
  if (pre && a.sinkhorn_iters < 1) fail("cuda::", who, ": sinkhorn_iters=", a.sinkhorn_iters, " must be >= 1");
  if (a.prev_y && (!a.prev_res || !a.prev_post || !a.prev_comb || a.prev_res == a.h))
    fail("cuda::", who, ": the fused hc_post needs prev_res, prev_post and prev_comb, and h must not alias prev_res");
}

template <int M>
void run_hc(const HcArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return;
  if (a.n_tokens > kHcFusedPostTokens) {  // prefill: the tensor-core path (mhc_prefill.cu)
    if (a.prev_y)  // the previous hc_post as its own launch
      hc_post(a.n_tokens, a.dim, a.n, a.prev_y, a.prev_res, a.prev_post, a.prev_comb, const_cast<float*>(a.h), stream);
    if constexpr (M == kMaxMix) prefill_pre(a, stream);
    else prefill_head(a, stream);
    return;
  }
  const int ks = small_mix_ks(a.dim);
  if (a.n_tokens == 1 && a.counter) {
    check(launch(hc_one_token_kernel<M>, dim3(ks), dim3(kFinThreads), 0, stream, a, small_mix_cpw(a.dim), ks),
          "hc_one_token_kernel launch");
    return;
  }
  check(launch(hc_mix_small_kernel<M>, dim3((ks + kSmallMixWarps - 1) / kSmallMixWarps), dim3(kSmallMixWarps * 32),
               0, stream, a, small_mix_cpw(a.dim), ks),
        "hc_mix_small_kernel launch");
  check(launch(hc_finish_kernel<M>, dim3(a.n_tokens), dim3(kFinThreads), 0, stream, a, ks), "hc_finish_kernel launch");
}

}  // namespace

size_t hc_workspace_bytes(int n_tokens, int64_t dim) {
  if (n_tokens <= 0 || dim < 32) return 16;
  // The split count falls as the token count grows, so splits x tokens is not monotone in the tokens: take
  // the largest over every count a caller sized for n_tokens may launch with.
  size_t most = 0;
  for (int t = 1; t <= n_tokens; ++t) {
    most = std::max(most, t <= kHcFusedPostTokens
                              ? static_cast<size_t>(small_mix_ks(dim)) * t * (kMaxMix + 1) * sizeof(float)
                              : prefill_workspace_bytes(t, dim));
  }
  return most;
}

void hc_pre(const HcArgs& a, cudaStream_t stream) {
  validate(a, "hc_pre", true);
  run_hc<kMaxMix>(a, stream);
}

void hc_head(const HcArgs& a, cudaStream_t stream) {
  validate(a, "hc_head", false);
  run_hc<kN>(a, stream);
}

void hc_post(int n_tokens, int64_t dim, int n, const float* y, const float* res, const float* post, const float* comb,
             float* out, cudaStream_t stream) {
  device_config();
  if (n != kN) fail("cuda::hc_post: hc_mult=", n, " unsupported (only 4)");
  if (dim <= 0 || dim % 4) fail("cuda::hc_post: dim=", dim, " unsupported (a positive multiple of 4)");
  if (n_tokens < 0 || n_tokens > 65535) fail("cuda::hc_post: n_tokens=", n_tokens, " outside 0..65535");
  if (n_tokens == 0) return;
  if (!y || !res || !post || !comb || !out) fail("cuda::hc_post: a required pointer is null");
  if (out == res) fail("cuda::hc_post: out must not alias res");
  dim3 g(static_cast<unsigned>((dim / 4 + 255) / 256), n_tokens);
  check(launch(hc_post_kernel, dim3(g), dim3(256), 0, stream, n_tokens, dim, y, res, post, comb, out), "hc_post_kernel launch");
}

void hc_sinkhorn(const float* logits, float* comb, int n_mats, int iters, float eps, cudaStream_t stream) {
  device_config();
  if (n_mats <= 0) return;
  if (iters < 1) fail("cuda::hc_sinkhorn: iters=", iters, " must be >= 1");
  check(launch(hc_sinkhorn_kernel, dim3((n_mats + 7) / 8), dim3(128), 0, stream, logits, comb, n_mats, iters, eps), "hc_sinkhorn_kernel launch");
}

}  // namespace dsv4::cuda
