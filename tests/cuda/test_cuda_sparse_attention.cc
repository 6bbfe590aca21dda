// cuda::sparse_attention against a float64 dense reference restricted to the valid keys (and against
// cpu::sparse_attention), on the fp8 / bf16 / f32 KV layouts, for the -1 patterns of spec F3 and for CUDA
// graph replay with changing lengths (F7), for each arithmetic (cuda::AttnPrecision).
//
// Error bounds (docs/KERNELS.md, "Sparse attention"). Write z_i = sum_c qt_c k_ic for the base-2 logit of key
// i, qt = q * scale * log2(e), and let v = k (K = V). The fp8 and bf16 rows are exact in bf16, so the
// tensor-core kernels round only qt and the probabilities P:
//  * qt -> qt~ with |qt~_c - qt_c| <= u_q |qt_c| (kSplitBf16: hi + lo, u_q = 2^-16; kBf16: u_q = 2^-8), and
//    the fp32 tensor-core accumulation of z (<= 32 dependent adds, each <= 2^-23 of sum |qt k|) adds 2^-18:
//    |z~_i - z_i| <= eta := (u_q + 2^-18) max_i sum_c |qt_c k_ic|.
//  * softmax: p~_i / p_i lies in [2^-2eta, 2^2eta] (the sink's logit is exact and has no value row), so
//    |sum_i (p~_i - p_i) v_i| <= (2^(2 eta) - 1) max|v|.
//  * P is rounded to bf16 (hi + lo for kSplitBf16) for the P V product while l sums the fp32 p~: error
//    <= u_p max|v| (u_p = u_q); the fp32 accumulation of P V, exp2f and the split-K combine add < 2^-17 max|v|.
//  => |o - o_ref| <= (2^(2 eta) - 1 + u_p + 2^-17) max|v| + 1e-7, max|v| over the query's valid rows.
// kSplitBf16 is checked against the exact float64 reference with that bound. For kBf16 the q rounding term
// (eta ~ 0.16 here: a worst case that says nothing) is removed by checking against the float64 reference
// computed from the same bf16-rounded qt~ (emulated bit-exactly on the host), leaving eta = 2^-18 sum|qt~ k|
// and the 2^-8 rounding of P; its distance to the exact reference is printed. kFp32 (CUDA-core fp32, also
// used for f32 rows) keeps the 1e-4 * max(1, max|o|) bound. Measured errors are printed per case.
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/sparse_attention.h"
#include "cuda_test_util.h"
#include "engine/kv_state.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;
constexpr int H = cuda::kAttnHeads, D = cuda::kAttnDim;

struct Problem {
  KvDtype dtype;
  int n_rows, n_q, n_slots;
  std::vector<float> q, sink, rows;  // rows: decoded (what every reader sees)
  std::vector<uint8_t> kv;           // encoded rows
  int64_t row_bytes;
  std::vector<int32_t> slots, valid_len;
};

cuda::KvRowFormat format_of(KvDtype d) {
  return d == KvDtype::kF32 ? cuda::KvRowFormat::kF32
         : d == KvDtype::kBF16 ? cuda::KvRowFormat::kBF16 : cuda::KvRowFormat::kFP8;
}

Problem make_problem(std::mt19937_64& rng, KvDtype dtype, int n_rows, int n_q, int n_slots) {
  Problem p{dtype, n_rows, n_q, n_slots, {}, {}, {}, {}, 0, {}, {}};
  KvCodec codec(dtype, D, 64, 64);
  p.row_bytes = static_cast<int64_t>(codec.row_bytes());
  std::normal_distribution<float> nd(0.f, 1.f);
  p.q.resize(static_cast<size_t>(n_q) * H * D);
  for (float& x : p.q) x = 2.f * nd(rng);  // logits of a few units: a peaked but not one-hot softmax
  p.sink.resize(H);
  for (float& x : p.sink) x = nd(rng);
  p.sink[5] = -INFINITY;  // a padding head
  p.rows.resize(static_cast<size_t>(n_rows) * D);
  p.kv.resize(static_cast<size_t>(n_rows) * p.row_bytes);
  std::vector<float> x(D);
  for (int r = 0; r < n_rows; ++r) {
    for (float& v : x) v = nd(rng);
    codec.encode(x.data(), p.kv.data() + static_cast<size_t>(r) * p.row_bytes);
    codec.decode(p.kv.data() + static_cast<size_t>(r) * p.row_bytes, p.rows.data() + static_cast<size_t>(r) * D);
  }
  std::uniform_int_distribution<int> idx(0, n_rows - 1);
  p.slots.resize(static_cast<size_t>(n_q) * n_slots);
  for (int32_t& s : p.slots) s = idx(rng);
  p.valid_len.assign(n_q, n_slots);
  return p;
}

// -1 patterns by query: 0 all valid; 1 first 64 slots -1; 2 all -1; 3 scattered -1 / out-of-range indices;
// 4 valid_len shorter than the row; 5 only the last slot valid; then repeating.
void apply_patterns(Problem& p, std::mt19937_64& rng) {
  std::bernoulli_distribution drop(0.3);
  for (int qi = 0; qi < p.n_q; ++qi) {
    int32_t* s = p.slots.data() + static_cast<size_t>(qi) * p.n_slots;
    switch (qi % 6) {
      case 1: for (int i = 0; i < std::min(64, p.n_slots); ++i) s[i] = -1; break;
      case 2: for (int i = 0; i < p.n_slots; ++i) s[i] = -1; break;
      case 3:
        for (int i = 0; i < p.n_slots; ++i)
          if (drop(rng)) s[i] = (i & 1) ? -1 : p.n_rows + i;
        break;
      case 4: p.valid_len[qi] = p.n_slots / 3; break;
      case 5: for (int i = 0; i + 1 < p.n_slots; ++i) s[i] = -7; break;
      default: break;
    }
  }
}

bool slot_valid(const Problem& p, int qi, int i) {
  const int32_t s = p.slots[static_cast<size_t>(qi) * p.n_slots + i];
  return i < p.valid_len[qi] && s >= 0 && s < p.n_rows;
}

float round_bf16(float x) {  // round to nearest even, as __floats2bfloat162_rn (finite x)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Ref {
  std::vector<double> out;  // [H, D]
  double eta_sum = 0;       // max over heads and valid keys of sum_c |qt_c k_c| (base-2 logit units)
  double vmax = 0;          // max |v| over the valid rows
};

// float64 dense attention over the valid keys only, with the sink in the denominator, in base 2 with
// qt = q * scale * log2 e. bf16_q: qt is the kernel's bf16 rounding of the fp32 product (kBf16 emulation).
Ref reference64(const Problem& p, int qi, float scale, bool bf16_q = false) {
  Ref r;
  r.out.assign(static_cast<size_t>(H) * D, 0.0);
  const double log2e = 1.4426950408889634;
  const float qscale_f = scale * 1.4426950408889634f;  // the kernel's fp32 factor
  std::vector<double> qt(D), logit;
  std::vector<const float*> keys;
  for (int i = 0; i < p.n_slots; ++i)
    if (slot_valid(p, qi, i)) {
      const float* k = p.rows.data() + static_cast<size_t>(p.slots[static_cast<size_t>(qi) * p.n_slots + i]) * D;
      keys.push_back(k);
      for (int c = 0; c < D; ++c) r.vmax = std::max(r.vmax, static_cast<double>(std::fabs(k[c])));
    }
  for (int h = 0; h < H; ++h) {
    const float* qh = p.q.data() + (static_cast<size_t>(qi) * H + h) * D;
    for (int c = 0; c < D; ++c)
      qt[c] = bf16_q ? static_cast<double>(round_bf16(qh[c] * qscale_f)) : static_cast<double>(qh[c]) * scale * log2e;
    logit.clear();
    for (const float* k : keys) {
      double d = 0, a = 0;
      for (int c = 0; c < D; ++c) {
        d += qt[c] * k[c];
        a += std::fabs(qt[c] * k[c]);
      }
      logit.push_back(d);
      r.eta_sum = std::max(r.eta_sum, a);
    }
    const double sink = p.sink[h] == -INFINITY ? -INFINITY : p.sink[h] * log2e;
    double m = sink;
    for (double l : logit) m = std::max(m, l);
    if (m == -INFINITY) continue;  // nothing valid and a -inf sink
    double den = sink == -INFINITY ? 0.0 : std::exp2(sink - m);
    for (size_t i = 0; i < logit.size(); ++i) {
      const double w = std::exp2(logit[i] - m);
      den += w;
      for (int c = 0; c < D; ++c) r.out[static_cast<size_t>(h) * D + c] += w * keys[i][c];
    }
    for (int c = 0; c < D; ++c) r.out[static_cast<size_t>(h) * D + c] /= den;
  }
  return r;
}

struct DeviceProblem {
  DeviceBuffer<float> q, sink, out;
  DeviceBuffer<uint8_t> kv, ws;
  DeviceBuffer<int32_t> slots, valid_len;
  cuda::SparseAttentionArgs args;
  explicit DeviceProblem(const Problem& p, cuda::AttnPrecision prec = cuda::AttnPrecision::kSplitBf16)
      : q(p.q.size()), sink(H), out(p.q.size()), kv(p.kv.size()),
        ws(cuda::sparse_attention_workspace_bytes(p.n_q, p.n_slots)), slots(p.slots.size()), valid_len(p.n_q) {
    q.upload(p.q);
    sink.upload(p.sink);
    kv.upload(p.kv);
    slots.upload(p.slots);
    valid_len.upload(p.valid_len);
    args.q = q.get();
    args.kv = kv.get();
    args.n_rows = p.n_rows;
    args.row_bytes = p.row_bytes;
    args.format = format_of(p.dtype);
    args.slots = slots.get();
    args.valid_len = valid_len.get();
    args.n_slots = p.n_slots;
    args.sink = sink.get();
    args.scale = 1.0f / std::sqrt(static_cast<float>(D));
    args.out = out.get();
    args.n_queries = p.n_q;
    args.workspace = ws.get();
    args.precision = prec;
  }
};

const char* precision_name(cuda::AttnPrecision pr) {
  return pr == cuda::AttnPrecision::kSplitBf16 ? "split-bf16" : pr == cuda::AttnPrecision::kBf16 ? "bf16" : "fp32";
}

struct ErrStats {
  double max_ratio = 0;      // max over queries of err / tol
  double max_err = 0;        // max |gpu - reference the bound applies to|
  double max_err_exact = 0;  // max |gpu - exact float64 reference|
  double max_rel_exact = 0;  // ... relative to max(1, max|o|) (the 1e-4 measure of the fp32 kernel)
};

void compare(const Problem& p, const std::vector<float>& got, int qi, const std::string& what, cuda::AttnPrecision pr,
             ErrStats* st = nullptr, bool check_cpu = true) {
  SCOPED_TRACE(what + " query " + std::to_string(qi) + " pattern " + std::to_string(qi % 6) + " precision " +
               precision_name(pr));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Ref exact = reference64(p, qi, scale);
  const bool emulate = pr == cuda::AttnPrecision::kBf16;
  const Ref emu = emulate ? reference64(p, qi, scale, true) : Ref{};
  const Ref& ref = emulate ? emu : exact;
  double max_err = 0, max_ref = 0, max_err_exact = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const float g = got[static_cast<size_t>(qi) * H * D + i];
    ASSERT_TRUE(std::isfinite(g)) << "non-finite output at " << i;
    max_err = std::max(max_err, std::fabs(g - ref.out[i]));
    max_err_exact = std::max(max_err_exact, std::fabs(g - exact.out[i]));
    max_ref = std::max(max_ref, std::fabs(exact.out[i]));
  }
  double tol;
  if (pr == cuda::AttnPrecision::kFp32) {
    tol = 1e-4 * std::max(1.0, max_ref);
  } else {
    const double u = pr == cuda::AttnPrecision::kSplitBf16 ? std::ldexp(1.0, -16) : std::ldexp(1.0, -8);
    const double u_q = pr == cuda::AttnPrecision::kSplitBf16 ? u : 0.0;  // kBf16: q rounding is in the reference
    const double eta = (u_q + std::ldexp(1.0, -18)) * ref.eta_sum;
    tol = (std::exp2(2 * eta) - 1 + u + std::ldexp(1.0, -17)) * ref.vmax + 1e-7;
  }
  EXPECT_LE(max_err, tol) << "max |gpu - f64 ref| " << max_err << " (bound " << tol << ")";
  if (st) {
    st->max_ratio = std::max(st->max_ratio, max_err / tol);
    st->max_err = std::max(st->max_err, max_err);
    st->max_err_exact = std::max(st->max_err_exact, max_err_exact);
    st->max_rel_exact = std::max(st->max_rel_exact, max_err_exact / std::max(1.0, max_ref));
  }
  // Empty rows (pattern 2, and pattern 4 with valid_len 0) must be exactly the sink-only result 0.
  if (qi % 6 == 2) {
    EXPECT_EQ(max_ref, 0.0);
    EXPECT_EQ(max_err, 0.0);
  }
  if (!check_cpu) return;
  // And the CPU reference (the engine's definition) agrees on the same inputs.
  std::vector<const float*> keys(p.n_slots);
  for (int i = 0; i < p.n_slots; ++i)
    keys[i] = slot_valid(p, qi, i)
                  ? p.rows.data() + static_cast<size_t>(p.slots[static_cast<size_t>(qi) * p.n_slots + i]) * D
                  : nullptr;
  std::vector<float> cpu_out(static_cast<size_t>(H) * D);
  cpu::sparse_attention(p.q.data() + static_cast<size_t>(qi) * H * D, H, D, keys.data(), p.n_slots,
                        p.sink.data(), scale, cpu_out.data());
  double cpu_err = 0;
  for (size_t i = 0; i < cpu_out.size(); ++i)
    cpu_err = std::max(cpu_err, std::fabs(static_cast<double>(cpu_out[i]) - exact.out[i]));
  EXPECT_LE(cpu_err, 1e-4 * std::max(1.0, max_ref));
}

const cuda::AttnPrecision kPrecisions[] = {cuda::AttnPrecision::kSplitBf16, cuda::AttnPrecision::kBf16,
                                           cuda::AttnPrecision::kFp32};

// The kernels that serve fp8 rows in the tensor-core precisions on this device, by DSV4_ATTN_KERNEL (which each
// sparse_attention call reads): attn_mma_kernel everywhere, the wgmma kernel on compute capability 9.0. nullptr:
// the default choice by shape. bf16 / f32 rows have one kernel per precision.
std::vector<const char*> fp8_kernels() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major == 9 && minor == 0) return {"mma", "wgmma"};
  return {"mma"};
}
// Sets DSV4_ATTN_KERNEL for its lifetime (nullptr: unset, the default choice).
struct KernelChoice {
  explicit KernelChoice(const char* k) {
    if (k) setenv("DSV4_ATTN_KERNEL", k, 1);
    else unsetenv("DSV4_ATTN_KERNEL");
  }
  ~KernelChoice() { unsetenv("DSV4_ATTN_KERNEL"); }
};

// One problem, launched with every precision (once for f32 rows) and, for fp8 rows, every kernel; prints the
// measured errors.
// Many-query runs compare queries 0-11 (every pattern twice) and every 5th one after (the float64 reference
// costs ~40 ms per query and precision on the host).
void run_and_check(KvDtype dtype, int n_q, int n_slots, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p = make_problem(rng, dtype, 3000, n_q, n_slots);
  apply_patterns(p, rng);
  bool cpu_checked = false;
  for (cuda::AttnPrecision pr : kPrecisions) {
    if (dtype == KvDtype::kF32 && pr != cuda::AttnPrecision::kFp32) continue;
    const bool many = dtype == KvDtype::kFP8 && pr != cuda::AttnPrecision::kFp32;
    for (const char* kernel : many ? fp8_kernels() : std::vector<const char*>{nullptr}) {
      const KernelChoice choice(kernel);
      DeviceProblem d(p, pr);
      d.out.poison();
      cuda::sparse_attention(d.args, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = d.out.download();
      const std::string what = std::string(kv_dtype_name(dtype)) + " n_q=" + std::to_string(n_q) +
                               " n_slots=" + std::to_string(n_slots) + (kernel ? std::string(" ") + kernel : "");
      ErrStats st;
      for (int qi = 0; qi < n_q; ++qi)
        if (qi < 12 || qi % 5 == 0) compare(p, got, qi, what, pr, &st, !cpu_checked);
      cpu_checked = true;
      std::printf("[errors] %-34s %-10s max|err| %.3g (bound ratio %.3g), vs exact f64 %.3g (rel %.3g)\n",
                  what.c_str(), precision_name(pr), st.max_err, st.max_ratio, st.max_err_exact, st.max_rel_exact);
    }
  }
}

TEST(CudaSparseAttention, DecodeAllLayouts) {
  DSV4_REQUIRE_GPU();
  for (KvDtype dt : {KvDtype::kFP8, KvDtype::kBF16, KvDtype::kF32})
    for (int n_q : {1, 6, 12})  // few queries: split-K + combine
      run_and_check(dt, n_q, 640, cuda_test::test_seed() + n_q);
}

TEST(CudaSparseAttention, OddSlotCounts) {
  DSV4_REQUIRE_GPU();
  for (int n_slots : {0, 1, 15, 17, 31, 32, 33, 64, 129, 1153}) run_and_check(KvDtype::kFP8, 6, n_slots, cuda_test::test_seed() + n_slots);
}

TEST(CudaSparseAttention, PrefillManyQueries) {
  DSV4_REQUIRE_GPU();
  run_and_check(KvDtype::kFP8, 300, 640, cuda_test::test_seed() + 99);  // >= 2 x SMs: no split
  run_and_check(KvDtype::kBF16, 300, 200, cuda_test::test_seed() + 98);
}

// F7: replay one captured graph 100 times with new device-side valid lengths; each replay must be bitwise
// equal to an eager launch with the same inputs and close to the float64 reference (each tensor-core precision).
TEST(CudaSparseAttention, GraphReplayWithChangingLengths) {
  DSV4_REQUIRE_GPU();
  for (const char* kernel : fp8_kernels()) {
    for (cuda::AttnPrecision pr : {cuda::AttnPrecision::kSplitBf16, cuda::AttnPrecision::kBf16}) {
      SCOPED_TRACE(kernel);
      const KernelChoice choice(kernel);
      std::mt19937_64 rng(cuda_test::test_seed() + 7);
      Problem p = make_problem(rng, KvDtype::kFP8, 3000, 6, 640);
      apply_patterns(p, rng);
      DeviceProblem d(p, pr);
      DeviceBuffer<float> eager(p.q.size());
      cudaStream_t st;
      CUDA_OK(cudaStreamCreate(&st));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      cuda::sparse_attention(d.args, st);
      CUDA_OK(cudaStreamEndCapture(st, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      cuda::SparseAttentionArgs ea = d.args;
      ea.out = eager.get();
      std::uniform_int_distribution<int> len(0, 640);
      for (int it = 0; it < 100; ++it) {
        for (int& v : p.valid_len) v = len(rng);
        d.valid_len.upload(p.valid_len);
        d.out.poison();
        CUDA_OK(cudaGraphLaunch(exec, st));
        cuda::sparse_attention(ea, st);
        CUDA_OK(cudaStreamSynchronize(st));
        const auto g = d.out.download(), e = eager.download();
        ASSERT_EQ(0, std::memcmp(g.data(), e.data(), g.size() * 4))
            << "replay " << it << " differs from eager (" << precision_name(pr) << ")";
        if (it % 10 == 0)
          for (int qi = 0; qi < p.n_q; ++qi) compare(p, g, qi, "graph replay " + std::to_string(it), pr, nullptr, false);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(st);
    }
  }
}

// Callers size the workspace once for their largest batch: smaller batches must never need more.
TEST(CudaSparseAttention, WorkspaceCoversSmallerBatches) {
  DSV4_REQUIRE_GPU();
  for (int n_slots : {0, 32, 640, 4224}) {
    const size_t cap = cuda::sparse_attention_workspace_bytes(512, n_slots);
    for (int nq = 1; nq <= 512; ++nq)
      for (int ns : {n_slots / 3, n_slots - 1, n_slots})
        ASSERT_LE(cuda::sparse_attention_workspace_bytes(nq, ns), cap) << nq << " queries, " << ns << " slots";
  }
}

TEST(CudaSparseAttention, UnsupportedShapeFailsLoudly) {
  DSV4_REQUIRE_GPU();
  cuda::SparseAttentionArgs a;
  a.n_queries = 1;
  a.format = cuda::KvRowFormat::kFP8;
  a.row_bytes = 500;  // below 584
  EXPECT_THROW(cuda::sparse_attention(a, nullptr), Error);
}

}  // namespace
}  // namespace dsv4
