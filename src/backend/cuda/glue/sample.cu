// Token sampling on the GPU (sample.h): the CPU sampler's rule (engine/sampler.cc) for a batch of rows.
//
// Launch 1: cuda::topk_rows selects the top C = min(2048, vocab) logits of every row (exact, lowest id among
//   equal values, NaN / -inf never selected) into the workspace.
// Launch 2: one 512-thread block per row (4 candidates per thread; 1024 threads would cap registers at 64), in
//   a cluster of kScanCtas blocks that share step a:
//   a. max, argmax (lowest id among equal maxima, -0 == +0), smallest finite logit, NaN / +inf check. Each
//      block of the cluster scans 1 / kScanCtas of the row; block 0 merges the results through distributed
//      shared memory and alone goes on. Greedy rows (temperature 0 or top_k 1) end here.
//   b. The candidates are sorted in shared memory by (logit desc, id asc): bitonic sort of 64-bit keys.
//   c. Weights w = exp((l - max) / T) in double (the CPU's formula); S = their double sum over the top-k set
//      (top_k in (0, C]) or over the whole vocabulary (top_k == 0 or >= vocab). Sums are fixed-order trees
//      (warp shuffles, then the 16 warp sums in order), so results are reproducible run to run.
//   d. p = w / S; inclusive prefix sums of p over the sorted candidates (double); top-p = the first prefix
//      >= top_p; min-p = the first candidate with p < min_p * p[0].
//   e. Draw: u = sample_uniform53(seed, step), r = u * total, the first kept candidate with prefix > r.
//      When the kept set is the whole vocabulary the draw walks the vocabulary in id order instead (same
//      distribution): per-thread contiguous chunks, a block scan of the chunk sums, the chunk holding r
//      walked by its thread.
//   Anything that would need logits past the C candidates (and is not the whole vocabulary) is status 2.
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/sample.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::glue {
namespace {
namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Blocks per row for the scan of step a (a portable cluster size). One block reading the whole row (0.5 MB at
// V4's vocabulary) took 19 us at one row on the H200 even with float4 loads (Nsight Compute, run 111): a single
// SM's share of the memory system; 8 SMs read it in a fraction of that.
constexpr int kScanCtas = 8;
constexpr int kCand = 2048;  // candidates per row (the most cuda::topk_rows selects)
constexpr int kPer = kCand / kThreads;  // candidates per thread, contiguous: [kPer * tid, kPer * tid + kPer)
static_assert(kPer * kThreads == kCand && kPer >= 2, "candidates split evenly");

struct Smem {
  unsigned long long keys[kCand];  // sorted candidates: (~ordered(logit)) << 32 | id
  double incl[kCand];              // inclusive prefix sums of p over the sorted candidates
  double wd[kWarps];               // per-warp partials
  float wf[kWarps];
  int wi[kWarps];
  int first;  // block-wide min / max of an index (atomics)
  int last;
  // Step a's result of this block (read by block 0 of the cluster).
  float scan_max, scan_min;
  int scan_arg, scan_bad;
};

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Fixed-order block sum: every thread returns the same value. Ends with a barrier (sm.wd reusable).
__device__ double block_sum(double v, Smem& sm) {
  v = warp_sum_d(v);
  if ((threadIdx.x & 31) == 0) sm.wd[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < kWarps; ++i) t += sm.wd[i];
  __syncthreads();
  return t;
}

// Block exclusive scan in thread order; *total = the block sum. Ends with a barrier.
__device__ double block_exclusive_scan(double v, Smem& sm, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += n;
  }
  double ex = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) ex = 0.0;
  if (lane == 31) sm.wd[warp] = x;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int i = 0; i < kWarps; ++i) {
    if (i == warp) before = all;
    all += sm.wd[i];
  }
  __syncthreads();
  *total = all;
  return before + ex;
}

// Block-wide smallest / largest index satisfying a per-thread predicate (INT_MAX / -1 when none).
__device__ int block_min_index(int idx, Smem& sm) {
  if (threadIdx.x == 0) sm.first = INT_MAX;
  __syncthreads();
  if (idx != INT_MAX) atomicMin(&sm.first, idx);
  __syncthreads();
  const int r = sm.first;
  __syncthreads();
  return r;
}
__device__ int block_max_index(int idx, Smem& sm) {
  if (threadIdx.x == 0) sm.last = -1;
  __syncthreads();
  if (idx >= 0) atomicMax(&sm.last, idx);
  __syncthreads();
  const int r = sm.last;
  __syncthreads();
  return r;
}

// The CPU's weight: std::exp((logit - mx) / temperature) with mx a double, in double.
__device__ __forceinline__ double weight(float l, float mx, float temperature) {
  return exp((static_cast<double>(l) - static_cast<double>(mx)) / static_cast<double>(temperature));
}

// Sort key: ascending key order = logit descending, then id ascending. -0 folds into +0 (equal logits).
__device__ __forceinline__ unsigned long long cand_key(float l, int id) {
  uint32_t f = __float_as_uint(l == 0.0f ? 0.0f : l);
  const uint32_t ord = (f & 0x80000000u) ? ~f : (f | 0x80000000u);  // unsigned order = float order
  return (static_cast<unsigned long long>(~ord) << 32) | static_cast<uint32_t>(id);
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {  // for the argmax reduction
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const float* __restrict__ logits, int64_t vocab, int C, const SampleRowParams* __restrict__ params,
                  const int32_t* __restrict__ cand, int32_t* __restrict__ out_token,
                  int32_t* __restrict__ out_status) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ Smem sm;
  cg::cluster_group cluster = cg::this_cluster();
  const int row = blockIdx.x / kScanCtas, rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  const SampleRowParams p = params[row];
  const int V = static_cast<int>(vocab);  // <= 2^24 (host check)

  auto finish = [&](int32_t token, int32_t status) {
    if (tid == 0 && rank == 0) {
      out_token[row] = token;
      out_status[row] = status;
    }
  };

  // dsv4::validate's rule.
  if (!(p.temperature >= 0.0f) || !isfinite(p.temperature) || p.top_k < 0 || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
      !(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    finish(-1, kSampleBadParams);
    return;  // uniform over the cluster: every thread read the same parameters
  }

  // ---- a. max / argmax / min finite / non-finite -------------------------------------------------------------
  float bv = -INFINITY, lmin = INFINITY;
  int bi = -1;
  bool bad = false;
  // Ascending i per thread (strict > keeps the lowest id); the reductions below are order-free (`better` is a
  // total order, min and or), so any split of the row over the threads and blocks gives the same result. Block
  // `rank` of the cluster scans float4s [n4 rank / kScanCtas, n4 (rank + 1) / kScanCtas) and its share of the
  // scalar rest; 4 float4 loads in flight per thread (a scalar loop with one load in flight in one block took
  // 36 us at one row on the H200, Nsight Compute in run 110).
  auto visit = [&](float v, int i) {
    bad |= isnan(v) || v == INFINITY;
    if (bi < 0 || v > bv) {
      bv = v;
      bi = i;
    }
    if (v > -INFINITY) lmin = fminf(lmin, v);
  };
  int head = 0;  // elements [0, head) go through float4 loads
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    constexpr int kUnroll = 4;
    const int n4 = V / 4;
    const int e4 = static_cast<int>(static_cast<int64_t>(n4) * (rank + 1) / kScanCtas);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    head = 4 * n4;
    for (int b = static_cast<int>(static_cast<int64_t>(n4) * rank / kScanCtas); b < e4; b += kUnroll * kThreads) {
      float4 f[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i4 = b + u * kThreads + tid;
        f[u] = i4 < e4 ? __ldg(x4 + i4) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i4 = b + u * kThreads + tid;
        if (i4 < e4) {
          visit(f[u].x, 4 * i4);
          visit(f[u].y, 4 * i4 + 1);
          visit(f[u].z, 4 * i4 + 2);
          visit(f[u].w, 4 * i4 + 3);
        }
      }
    }
  }
  for (int i = head + rank * kThreads + tid; i < V; i += kScanCtas * kThreads) visit(x[i], i);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
    lmin = fminf(lmin, __shfl_xor_sync(0xffffffffu, lmin, o));
  }
  if (lane == 0) {
    sm.wf[warp] = bv;
    sm.wi[warp] = bi;
    sm.wd[warp] = lmin;
  }
  bad = __syncthreads_or(bad);
  float mx = -INFINITY;
  int amax = -1;
  lmin = INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (better(sm.wf[w], sm.wi[w], mx, amax)) {
      mx = sm.wf[w];
      amax = sm.wi[w];
    }
    lmin = fminf(lmin, static_cast<float>(sm.wd[w]));
  }
  // The cluster's blocks: block 0 merges every block's result (the same order-free reductions) and goes on.
  if (tid == 0) {
    sm.scan_max = mx;
    sm.scan_arg = amax;
    sm.scan_min = lmin;
    sm.scan_bad = bad;
  }
  cluster.sync();  // every block's result is published
  if (rank == 0) {
    for (int q = 1; q < kScanCtas; ++q) {
      const Smem* o = cluster.map_shared_rank(&sm, q);
      if (better(o->scan_max, o->scan_arg, mx, amax)) {
        mx = o->scan_max;
        amax = o->scan_arg;
      }
      lmin = fminf(lmin, o->scan_min);
      bad = bad || o->scan_bad;
    }
  }
  cluster.sync();  // block 0 has read the others' results: they may leave
  if (rank != 0) return;
  __syncthreads();
  if (bad) {
    finish(-1, kSampleNonFinite);
    return;
  }
  if (p.temperature == 0.0f || p.top_k == 1) {  // greedy (an all -inf row gives 0, as dsv4::argmax)
    finish(amax, kSampleOk);
    return;
  }
  if (!(mx > -INFINITY)) {  // no finite logit: nothing to sample (the CPU computes NaN probabilities)
    finish(-1, kSampleNonFinite);
    return;
  }

  // ---- the normalisation set ---------------------------------------------------------------------------------
  const int K = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;  // CPU: keep = top_k when top_k < vocab
  if (K > C && K < V) {  // top-k set larger than the candidates but not everything
    finish(-1, kSampleHostFallback);
    return;
  }
  const bool full_norm = K > C;  // K == V > C: S over the whole vocabulary

  // ---- b. candidates, sorted ---------------------------------------------------------------------------------
  const int32_t* cr = cand + static_cast<int64_t>(row) * C;
  // topk_rows emits the selected ids first, then -1: the valid entries are a prefix of length n_c.
  int n_c = 0;
  for (int j = tid; j < kCand; j += kThreads) {
    const int id = j < C ? cr[j] : -1;
    sm.keys[j] = id >= 0 ? cand_key(x[id], id) : ~0ull;
    if (id >= 0) n_c = j + 1;
  }
  if (tid == 0) sm.last = 0;
  __syncthreads();
  atomicMax(&sm.last, n_c);
  for (int k = 2; k <= kCand; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      __syncthreads();
      for (int q = tid; q < kCand / 2; q += kThreads) {
        const int i = 2 * j * (q / j) + (q % j);  // pair (i, i + j)
        const unsigned long long a = sm.keys[i], b = sm.keys[i + j];
        if ((a > b) == ((i & k) == 0)) {
          sm.keys[i] = b;
          sm.keys[i + j] = a;
        }
      }
    }
  }
  __syncthreads();
  n_c = sm.last;
  const int m = full_norm ? n_c : min(K, n_c);  // candidates inside the normalisation set (>= 1)
  const bool complete = !full_norm || n_c < C;  // they include every finite logit of the set

  // ---- c. weights and S --------------------------------------------------------------------------------------
  double w[kPer], wsum = 0.0;
  for (int e = 0; e < kPer; ++e) {
    const int j = kPer * tid + e;
    w[e] = j < m ? weight(x[sm.keys[j] & 0xffffffffull], mx, p.temperature) : 0.0;
    wsum += w[e];
  }
  // Whole-vocabulary chunk of this thread (used for S when full_norm, and for a whole-vocabulary draw).
  double csum = 0.0, cexcl = 0.0, S;
  if (full_norm) {
    const int chunk = (V + kThreads - 1) / kThreads;
    const int c0 = min(V, tid * chunk), c1 = min(V, c0 + chunk);
    for (int i = c0; i < c1; ++i) csum += weight(x[i], mx, p.temperature);
    cexcl = block_exclusive_scan(csum, sm, &S);
  } else {
    S = block_sum(wsum, sm);
  }

  // ---- d. probabilities, prefix sums, top-p, min-p -----------------------------------------------------------
  double pr[kPer], psum = 0.0;
  for (int e = 0; e < kPer; ++e) psum += (pr[e] = w[e] / S);
  double tot, acc = block_exclusive_scan(psum, sm, &tot);
  for (int e = 0; e < kPer; ++e) sm.incl[kPer * tid + e] = (acc += pr[e]);
  const double p0 = 1.0 / S;  // the top candidate's weight is exp(0) = 1
  __syncthreads();

  enum { kCandidates, kWhole, kHost };
  int mode = kCandidates, keep = m;
  if (p.top_p < 1.0f) {  // smallest prefix with mass >= top_p
    int f = INT_MAX;
    for (int e = 0; e < kPer; ++e) {
      const int j = kPer * tid + e;
      if (j < m && sm.incl[j] >= static_cast<double>(p.top_p)) f = min(f, j);
    }
    f = block_min_index(f, sm);
    if (f != INT_MAX)
      keep = f + 1;
    else if (!complete)
      mode = kHost;
  } else if (!complete) {
    mode = kWhole;  // so far everything is kept
  }
  if (p.min_p > 0.0f && mode != kHost) {  // first candidate below min_p * p_max ends the kept set
    const double thr = static_cast<double>(p.min_p) * p0;
    const int lim = mode == kWhole ? n_c : keep;
    int f = INT_MAX;
    for (int e = 0; e < kPer; ++e) {
      const int j = kPer * tid + e;
      if (j >= 1 && j < lim && pr[e] < thr) f = min(f, j);
    }
    f = block_min_index(f, sm);
    if (f != INT_MAX) {
      keep = f;
      mode = kCandidates;
    } else if (mode == kWhole && !(weight(lmin, mx, p.temperature) / S >= thr)) {
      mode = kHost;  // min-p stops somewhere past the candidates
    }
  }
  if (mode == kHost) {
    finish(-1, kSampleHostFallback);
    return;
  }

  // ---- e. the draw -------------------------------------------------------------------------------------------
  const double u = sample_uniform53(params[row].seed, params[row].step);
  if (mode == kCandidates) {
    const double r = u * sm.incl[keep - 1];
    int f = INT_MAX, g = -1;
    for (int e = 0; e < kPer; ++e) {
      const int j = kPer * tid + e;
      if (j < keep && r < sm.incl[j]) f = min(f, j);
      if (j < keep && pr[e] > 0.0) g = max(g, j);
    }
    f = block_min_index(f, sm);
    g = block_max_index(g, sm);  // rounding guard: the last kept candidate with mass
    const int pick = f != INT_MAX ? f : g;  // held by exactly one thread
    if (pick / kPer == tid) {
      out_token[row] = static_cast<int32_t>(sm.keys[pick] & 0xffffffffull);
      out_status[row] = kSampleOk;
    }
    return;
  }
  // Whole vocabulary, in id order: the chunk whose [cexcl, cexcl + csum) holds r (the last such chunk with
  // mass, robust to rounding), then the first id in it whose running sum exceeds r.
  const double r = u * S;
  const int t = block_max_index(csum > 0.0 && cexcl <= r ? tid : -1, sm);
  if (tid == t) {
    const int chunk = (V + kThreads - 1) / kThreads;
    const int c0 = min(V, tid * chunk), c1 = min(V, c0 + chunk);
    double run = cexcl;
    int pick = -1, lastpos = -1;
    for (int i = c0; i < c1; ++i) {
      const double wi = weight(x[i], mx, p.temperature);
      if (wi > 0.0) lastpos = i;
      run += wi;
      if (r < run) {
        pick = i;
        break;
      }
    }
    out_token[row] = pick >= 0 ? pick : lastpos;
    out_status[row] = kSampleOk;
  }
}

}  // namespace

size_t sample_workspace_bytes(int rows, int64_t vocab) {
  const int64_t C = std::min<int64_t>(kCand, std::max<int64_t>(vocab, 1));
  const size_t b = static_cast<size_t>(std::max(rows, 0)) * static_cast<size_t>(C) * sizeof(int32_t);
  return (b + 255) / 256 * 256;
}

void sample_rows(const float* logits, int rows, int64_t vocab, const SampleRowParams* params, int32_t* out_token,
                 int32_t* out_status, void* workspace, cudaStream_t stream, bool all_greedy) {
  if (vocab < 1 || vocab > (int64_t{1} << 24)) fail("glue::sample_rows: vocab ", vocab, " is not supported (1 .. 2^24)");
  if (rows < 0 || rows > (1 << 27)) fail("glue::sample_rows: ", rows, " rows is not supported (at most 2^27)");
  if (rows == 0) return;
  if (workspace == nullptr || params == nullptr || out_token == nullptr || out_status == nullptr)
    fail("glue::sample_rows: null device pointer");
  const int C = static_cast<int>(std::min<int64_t>(kCand, vocab));
  int32_t* cand = static_cast<int32_t*>(workspace);
  if (!all_greedy) cuda::topk_rows(logits, vocab, vocab, nullptr, rows, C, cand, stream);
  cuda::check(cuda::launch_cluster(sample_kernel, dim3(static_cast<unsigned>(rows) * kScanCtas), dim3(kThreads), 0,
                                   stream, kScanCtas, logits, vocab, C, params, cand, out_token, out_status),
              "sample_kernel launch");
}

}  // namespace dsv4::glue
