// hc_pre / hc_head for more than kHcFusedPostTokens tokens (prefill chunks), on the tensor cores. Reference
// cpu::hc_pre / hc_head (fp32); docs/KERNELS.md, "mHC". Two launches:
//   1. hc_mix_tc_kernel: the split-K skinny GEMM mixes = X · fnᵀ ([T, 4D] x [4D, M]) and the sums of squares of
//      X, on mma.sync m16n8k8 tf32 as 3xTF32 (ptx::split_tf32): each product within ~2^-20 of fp32's,
//      accumulated in fp32. (The CUDA-core fp32 kernel it replaced ran the ~24 FLOP per element of h at ~9
//      TFLOP/s: 5x the DRAM time of h at T = 2048.) CTA = 64 tokens x a K range, chunks of 64 k through a
//      3-stage cp.async ring in shared memory (84 KB: fits the 99 KB of sm_120). Warp w owns 32 tokens (two m16
//      tiles, so each split of fn serves both) and one 16-k quarter of every chunk. The k order inside a
//      quarter is permuted so that a thread's A (h) and B (fn) operands are float4 reads: thread (g, c) of a
//      quad holds k = 4 c .. 4 c + 3 of its rows, and k8 step s takes columns c / c + 4 as k = 4 c + 2 s / + 1
//      (A and B permuted alike, so the products are unchanged). Partials [KS][T][M + 1] in the workspace,
//      fixed summation orders.
//   2. hc_collapse_kernel: per token, pre from the partials and x = Σ_j pre_j h_j (re-reading h), the optional
//      RMSNorm and the 16-bit copies; for hc_pre, extra CTAs at the front of the same grid form post and comb
//      (a warp per token, Sinkhorn on 16 lanes), their dependent chains overlapping the streaming.
#include <algorithm>

#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "core/error.h"

namespace dsv4::cuda::mhc {
namespace {

using ptx::cp_async;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_tf32;
using ptx::split_tf32;

constexpr int kTcTok = 64;             // tokens per CTA: two groups of 32 (two m16 tiles each)
constexpr int kTcKc = 64;              // k per chunk (one pipeline stage): four 16-k quarters
constexpr int kTcThreads = 256;        // warp w: token group w % 2, k quarter w / 2 of every chunk
constexpr int kTcStages = 3;
constexpr int kTcStride = kTcKc + 16;  // floats per staged row: 80 = 16 (mod 32), so a quarter warp's 16-byte
                                       // reads of two rows (16 floats each) cover the 32 banks once

template <int M>
struct TcCfg {
  static constexpr int kNt = (M + 7) / 8;      // n8 tiles of mixes
  static constexpr int kFnRows = 8 * kNt;      // staged fn rows; rows M.. stay zero
  static constexpr int kStage = (kTcTok + kFnRows) * kTcStride;  // floats
  static constexpr size_t kSmem = static_cast<size_t>(kTcStages) * kStage * sizeof(float);
  static constexpr int kRed = 2 * kNt * 4 + 4;  // per lane in the k-quarter exchange: accumulators, 4 squares
  static_assert(2 * 3 * 32 * kRed <= kStage, "the exchange reuses stage 0");
  static_assert(kSmem <= 99 * 1024, "the ring must fit sm_120's 99 KB per block");
};

template <int M>
__global__ void __launch_bounds__(kTcThreads) hc_mix_tc_kernel(const float* __restrict__ h,
                                                               const float* __restrict__ fn, int n_tokens,
                                                               int64_t K, int ks_count, float* __restrict__ ws) {
  using C = TcCfg<M>;
  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int tg = warp & 1, kq = warp >> 1;
  const int r0 = 32 * tg + g;  // this thread's staged rows: r0 + 16 mt (+ 8) of m16 tile mt
  const int t0 = blockIdx.x * kTcTok;
  const int64_t n_chunks = K / kTcKc;
  const int64_t c_begin = n_chunks * blockIdx.y / ks_count;
  const int n_do = static_cast<int>(n_chunks * (blockIdx.y + 1) / ks_count - c_begin);
  if constexpr (C::kFnRows > M) {  // padding rows of fn (hc_head): zero in every stage, never copied into
    constexpr int kPad = (C::kFnRows - M) * kTcStride;
    for (int i = tid; i < kTcStages * kPad; i += kTcThreads)
      smem[(i / kPad) * C::kStage + (kTcTok + M) * kTcStride + i % kPad] = 0.f;
  }
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)

  // Chunk c_begin + i into stage i % kTcStages, 16-byte pieces: thread (pr, pc) copies piece pc of rows
  // pr + 16 it of h and of fn (rows of h past n_tokens zero-filled). Sources and liveness are formed once: the
  // per-chunk address arithmetic had been a third of the loop's instructions.
  const int pr = tid >> 4, pc = tid & 15;
  constexpr int kHIt = kTcTok / 16, kFIt = (M + 15) / 16;
  const float* hsrc = h + static_cast<int64_t>(t0 + pr) * K + c_begin * kTcKc + 4 * pc;
  const float* fsrc = fn + static_cast<int64_t>(pr) * K + c_begin * kTcKc + 4 * pc;
  const int64_t step16 = 16 * K;  // 16 rows
  const int n_live = min(kHIt, max(0, (n_tokens - t0 - pr + 15) / 16));  // its = 0 .. n_live - 1 are live
  auto issue = [&](int i) {
    float* st = smem + (i % kTcStages) * C::kStage + pr * kTcStride + 4 * pc;
    const int64_t off = static_cast<int64_t>(i) * kTcKc;
#pragma unroll
    for (int it = 0; it < kHIt; ++it) {
      const bool live = it < n_live;
      cp_async<16>(st + 16 * it * kTcStride, live ? hsrc + it * step16 + off : h, live ? 16 : 0);
    }
#pragma unroll
    for (int it = 0; it < kFIt; ++it)
      if (pr + 16 * it < M) cp_async<16>(st + (kTcTok + 16 * it) * kTcStride, fsrc + it * step16 + off, 16);
  };

  float acc[2][C::kNt][4], cross[2][C::kNt][4];  // per m16 tile: hi·hi, and the two cross terms
  float ss[4] = {0.f, 0.f, 0.f, 0.f};             // squares of rows r0, r0 + 8, r0 + 16, r0 + 24
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = cross[mt][nt][e] = 0.f;
#pragma unroll
  for (int i = 0; i < kTcStages - 1; ++i) {
    if (i < n_do) issue(i);
    cp_async_commit();  // empty groups keep the wait counts uniform
  }
  const int kk = 16 * kq + 4 * c;  // this thread's 4 k of its quarter of every chunk
  for (int i = 0; i < n_do; ++i) {
    cp_async_wait<kTcStages - 2>();
    __syncthreads();  // chunk i landed for every thread; every warp is done with chunk i - 1, refilled below
    if (i + kTcStages - 1 < n_do) issue(i + kTcStages - 1);
    cp_async_commit();
    const float* st = smem + (i % kTcStages) * C::kStage;
    // A of k8 step s: a0 = (row g, col c), a1 = (g + 8, c), a2 = (g, c + 4), a3 = (g + 8, c + 4).
    uint32_t ah[2][2][4], al[2][2][4];  // [tile][step][register]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const float4 x0 = *reinterpret_cast<const float4*>(st + (r0 + 16 * mt) * kTcStride + kk);
      const float4 x1 = *reinterpret_cast<const float4*>(st + (r0 + 16 * mt + 8) * kTcStride + kk);
      ss[2 * mt] = fmaf(x0.x, x0.x, fmaf(x0.y, x0.y, fmaf(x0.z, x0.z, fmaf(x0.w, x0.w, ss[2 * mt]))));
      ss[2 * mt + 1] = fmaf(x1.x, x1.x, fmaf(x1.y, x1.y, fmaf(x1.z, x1.z, fmaf(x1.w, x1.w, ss[2 * mt + 1]))));
      split_tf32(x0.x, ah[mt][0][0], al[mt][0][0]);
      split_tf32(x1.x, ah[mt][0][1], al[mt][0][1]);
      split_tf32(x0.y, ah[mt][0][2], al[mt][0][2]);
      split_tf32(x1.y, ah[mt][0][3], al[mt][0][3]);
      split_tf32(x0.z, ah[mt][1][0], al[mt][1][0]);
      split_tf32(x1.z, ah[mt][1][1], al[mt][1][1]);
      split_tf32(x0.w, ah[mt][1][2], al[mt][1][2]);
      split_tf32(x1.w, ah[mt][1][3], al[mt][1][3]);
    }
#pragma unroll
    for (int nt = 0; nt < C::kNt; ++nt) {
      // B of step s: b0 = (k row c, mix g), b1 = (c + 4, g): fn row 8 nt + g at the same k.
      const float4 f = *reinterpret_cast<const float4*>(st + (kTcTok + 8 * nt + g) * kTcStride + kk);
      uint32_t bh[4], bl[4];
      split_tf32(f.x, bh[0], bl[0]);
      split_tf32(f.y, bh[1], bl[1]);
      split_tf32(f.z, bh[2], bl[2]);
      split_tf32(f.w, bh[3], bl[3]);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          mma_tf32(acc[mt][nt], ah[mt][s], bh[2 * s], bh[2 * s + 1]);
          mma_tf32(cross[mt][nt], ah[mt][s], bl[2 * s], bl[2 * s + 1]);
          mma_tf32(cross[mt][nt], al[mt][s], bh[2 * s], bh[2 * s + 1]);
        }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 4; ++r) {  // the quad's lanes hold disjoint k of the same rows
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
  }
  float sum[2][C::kNt][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[mt][nt][e] = acc[mt][nt][e] + cross[mt][nt][e];
  __syncthreads();  // the stages are no longer read: stage 0 holds the k-quarter exchange
  if (kq > 0) {
    float* red = smem + ((tg * 3 + kq - 1) * 32 + lane) * C::kRed;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(mt * C::kNt + nt) * 4 + e] = sum[mt][nt][e];
#pragma unroll
    for (int r = 0; r < 4; ++r) red[2 * C::kNt * 4 + r] = ss[r];
  }
  __syncthreads();
  if (kq > 0) return;
#pragma unroll
  for (int q = 1; q < 4; ++q) {  // quarters 1, 2, 3 in order
    const float* red = smem + ((tg * 3 + q - 1) * 32 + lane) * C::kRed;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[mt][nt][e] += red[(mt * C::kNt + nt) * 4 + e];
#pragma unroll
    for (int r = 0; r < 4; ++r) ss[r] += red[2 * C::kNt * 4 + r];
  }
  float* w = ws + static_cast<int64_t>(blockIdx.y) * n_tokens * (M + 1);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // c0, c1: row g, mixes 2c, 2c + 1 of the n-tile; c2, c3: row g + 8
        const int m = 8 * nt + 2 * c + (e & 1), tok = t0 + r0 + 16 * mt + (e < 2 ? 0 : 8);
        if (m < M && tok < n_tokens) w[static_cast<int64_t>(tok) * (M + 1) + m] = sum[mt][nt][e];
      }
  if (c == 0)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tok = t0 + r0 + 8 * r;
      if (tok < n_tokens) w[static_cast<int64_t>(tok) * (M + 1) + M] = ss[r];
    }
}

// Lane m <= M of a warp: token t's mix m summed over the KS partials (in split order) and multiplied by the norm
// rsqrt(mean(X²) + eps) (finish_token's formulas). Every lane of the warp calls it.
template <int M>
__device__ __forceinline__ float lane_mix(const HcArgs& a, int ks_count, int t, int lane) {
  // Loads in batches of kBatch independent ones (a chain of ks_count dependent L2 round trips otherwise: ~10 us
  // at 128 splits); the zeros past ks_count change no sum.
  constexpr int kBatch = 16;
  const float* ws = static_cast<const float*>(a.workspace);
  float s = 0.f;
  if (lane <= M)
    for (int k0 = 0; k0 < ks_count; k0 += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        v[j] = k0 + j < ks_count ? ws[(static_cast<int64_t>(k0 + j) * a.n_tokens + t) * (M + 1) + lane] : 0.f;
#pragma unroll
      for (int j = 0; j < kBatch; ++j) s += v[j];
    }
  const float r = 1.0f / sqrtf(__shfl_sync(0xffffffffu, s, M) / static_cast<float>(kN * a.dim) + a.norm_eps);
  return s * r;
}

// One launch after the mixes, kThreads per CTA. hc_pre's first n_coef CTAs: a warp per token forms post and
// comb (Sinkhorn on 16 lanes); they share the launch so that their dependent chains overlap the streaming.
// The other CTAs, one per token: pre from the partials (warp 0), x = Σ_j pre_j h_j, the optional RMSNorm
// (cpu::rmsnorm's formula, squares summed in double in a fixed order) and the 16-bit copies; kCollapseVec
// float4s of D per thread.
constexpr int kCollapseVec = 4;
// pre comes first: with the loads of h issued before it (to overlap warp 0's chain of partial sums) the kernel
// took 86-99 registers, one or two CTAs per SM, and stalled on that chain (run 93). Four or more CTAs per SM
// (at most 64 registers) hide it instead.
template <int M, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads) hc_collapse_kernel(HcArgs a, int ks_count, int n_coef) {
  pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  constexpr unsigned kAll = 0xffffffffu;
  __shared__ double part[kThreads / 32];
  __shared__ float p_s[kN];
  const int tid = threadIdx.x, lane = tid & 31;
  if (static_cast<int>(blockIdx.x) < n_coef) {
    if constexpr (M == kMaxMix) {
      const int t = blockIdx.x * (kThreads / 32) + (tid >> 5);
      if (t >= a.n_tokens) return;  // whole warps
      const float v = lane_mix<M>(a, ks_count, t, lane);
      if (lane >= kN && lane < 2 * kN) a.post[t * kN + lane - kN] = 2.0f * sigmoidf(v * a.scale[1] + a.base[lane]);
      const int l = lane & 15;  // lanes l and 16 + l both hold comb logit l (every lane joins the shuffles)
      const float cl = __shfl_sync(kAll, v, 2 * kN + l) * a.scale[2] + a.base[2 * kN + l];
      const float cc = sinkhorn_lane(cl, a.sinkhorn_iters, a.hc_eps);
      if (lane < 16) a.comb[t * kN * kN + lane] = cc;
    }
    return;
  }
  const int t = blockIdx.x - n_coef;
  if (tid < 32) {
    const float v = lane_mix<M>(a, ks_count, t, lane);
    if (lane < kN) p_s[lane] = sigmoidf(v * a.scale[0] + a.base[lane]) + a.hc_eps;
  }
  __syncthreads();
  float p[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) p[j] = p_s[j];
  const int64_t D4 = a.dim / 4;
  const float4* h = reinterpret_cast<const float4*>(a.h + t * kN * a.dim);
  float4 xv[kCollapseVec];
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kCollapseVec; ++i) {
    const int64_t d4 = tid + static_cast<int64_t>(i) * kThreads;
    float4 hv[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) hv[j] = d4 < D4 ? __ldg(h + j * D4 + d4) : make_float4(0.f, 0.f, 0.f, 0.f);
    xv[i] = combine_streams(p, hv);
    ss += sum_squares(xv[i]);
  }
  float rn = 1.0f;
  if (a.norm_w) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kAll, ss, o);
    if (lane == 0) part[tid >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) tot += part[w];  // fixed order
    rn = 1.0f / sqrtf(static_cast<float>(tot / static_cast<double>(a.dim)) + a.norm_eps);
  }
#pragma unroll
  for (int i = 0; i < kCollapseVec; ++i) {
    const int64_t d4 = tid + static_cast<int64_t>(i) * kThreads;
    if (d4 < D4) store_x(a, t, d4, xv[i], rn);
  }
}

// K ranges per 64-token tile: at most one wave of two CTAs per SM (floor, as the indexer's split_keys: a
// partial second wave costs as much as a full one), at most one chunk per CTA and kMaxKs.
int tc_split(int n_tokens, int64_t dim) {
  const int tiles = (n_tokens + kTcTok - 1) / kTcTok;
  const int chunks = static_cast<int>(kN * dim / kTcKc);
  return std::max(1, std::min({2 * device_config().sm_count / tiles, chunks, kMaxKs}));
}

template <int M>
void run(const HcArgs& a, cudaStream_t stream) {
  using C = TcCfg<M>;
  static const bool smem_set = [] {
    check(cudaFuncSetAttribute(hc_mix_tc_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem),
          "hc_mix_tc_kernel smem attribute");
    return true;
  }();
  (void)smem_set;
  const int T = a.n_tokens, ks = tc_split(T, a.dim);
  check(launch(hc_mix_tc_kernel<M>, dim3((T + kTcTok - 1) / kTcTok, ks), dim3(kTcThreads), C::kSmem, stream, a.h,
               a.fn, T, kN * a.dim, ks, static_cast<float*>(a.workspace)),
        "hc_mix_tc_kernel launch");
  // kCollapseVec float4s per thread: 256 threads up to D = 4096, 512 up to 8192 (validate: D <= 7168).
  auto collapse = [&](auto kernel, int threads) {
    const int n_coef = M == kMaxMix ? (T + threads / 32 - 1) / (threads / 32) : 0;
    check(launch(kernel, dim3(n_coef + T), dim3(threads), 0, stream, a, ks, n_coef), "hc_collapse_kernel launch");
  };
  if (a.dim / 4 <= 256 * kCollapseVec) collapse(hc_collapse_kernel<M, 256>, 256);
  else collapse(hc_collapse_kernel<M, 512>, 512);
}

}  // namespace

void prefill_pre(const HcArgs& a, cudaStream_t stream) { run<kMaxMix>(a, stream); }
void prefill_head(const HcArgs& a, cudaStream_t stream) { run<kN>(a, stream); }

size_t prefill_workspace_bytes(int n_tokens, int64_t dim) {
  return static_cast<size_t>(tc_split(n_tokens, dim)) * n_tokens * (kMaxMix + 1) * sizeof(float);
}

}  // namespace dsv4::cuda::mhc
