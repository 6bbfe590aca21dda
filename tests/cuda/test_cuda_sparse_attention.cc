// cuda::sparse_attention against a float64 dense reference restricted to the valid keys (and against
// cpu::sparse_attention), on the fp8 / bf16 / f32 KV layouts, for the -1 patterns of spec F3 and for CUDA
// graph replay with changing lengths (F7).
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

// float64 dense attention over the valid keys only, with the sink in the denominator.
std::vector<double> reference64(const Problem& p, int qi, float scale) {
  std::vector<double> out(static_cast<size_t>(H) * D, 0.0);
  for (int h = 0; h < H; ++h) {
    const float* qh = p.q.data() + (static_cast<size_t>(qi) * H + h) * D;
    std::vector<double> logit;
    std::vector<const float*> keys;
    for (int i = 0; i < p.n_slots; ++i) {
      if (!slot_valid(p, qi, i)) continue;
      const float* k = p.rows.data() + static_cast<size_t>(p.slots[static_cast<size_t>(qi) * p.n_slots + i]) * D;
      double d = 0;
      for (int c = 0; c < D; ++c) d += static_cast<double>(qh[c]) * k[c];
      logit.push_back(d * scale);
      keys.push_back(k);
    }
    double m = p.sink[h];
    for (double l : logit) m = std::max(m, l);
    if (m == -INFINITY) continue;  // nothing valid and a -inf sink
    double den = p.sink[h] == -INFINITY ? 0.0 : std::exp(p.sink[h] - m);
    for (size_t i = 0; i < logit.size(); ++i) {
      const double w = std::exp(logit[i] - m);
      den += w;
      for (int c = 0; c < D; ++c) out[static_cast<size_t>(h) * D + c] += w * keys[i][c];
    }
    for (int c = 0; c < D; ++c) out[static_cast<size_t>(h) * D + c] /= den;
  }
  return out;
}

struct DeviceProblem {
  DeviceBuffer<float> q, sink, out;
  DeviceBuffer<uint8_t> kv, ws;
  DeviceBuffer<int32_t> slots, valid_len;
  cuda::SparseAttentionArgs args;
  explicit DeviceProblem(const Problem& p)
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
  }
};

void compare(const Problem& p, const std::vector<float>& got, int qi, const std::string& what) {
  SCOPED_TRACE(what + " query " + std::to_string(qi) + " pattern " + std::to_string(qi % 6));
  const std::vector<double> ref = reference64(p, qi, 1.0f / std::sqrt(static_cast<float>(D)));
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float g = got[static_cast<size_t>(qi) * H * D + i];
    ASSERT_TRUE(std::isfinite(g)) << "non-finite output at " << i;
    max_err = std::max(max_err, std::fabs(g - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  EXPECT_LE(max_err, 1e-4 * std::max(1.0, max_ref)) << "max |gpu - f64 ref| " << max_err;
  // Empty rows (pattern 2, and pattern 4 with valid_len 0) must be exactly the sink-only result 0.
  if (qi % 6 == 2) {
    EXPECT_EQ(max_ref, 0.0);
    EXPECT_EQ(max_err, 0.0);
  }
  // And the CPU reference (the engine's definition) agrees on the same inputs.
  std::vector<const float*> keys(p.n_slots);
  for (int i = 0; i < p.n_slots; ++i)
    keys[i] = slot_valid(p, qi, i)
                  ? p.rows.data() + static_cast<size_t>(p.slots[static_cast<size_t>(qi) * p.n_slots + i]) * D
                  : nullptr;
  std::vector<float> cpu_out(static_cast<size_t>(H) * D);
  cpu::sparse_attention(p.q.data() + static_cast<size_t>(qi) * H * D, H, D, keys.data(), p.n_slots,
                        p.sink.data(), 1.0f / std::sqrt(static_cast<float>(D)), cpu_out.data());
  double cpu_err = 0;
  for (size_t i = 0; i < cpu_out.size(); ++i)
    cpu_err = std::max(cpu_err, std::fabs(static_cast<double>(cpu_out[i]) - ref[i]));
  EXPECT_LE(cpu_err, 1e-4 * std::max(1.0, max_ref));
}

void run_and_check(KvDtype dtype, int n_q, int n_slots, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p = make_problem(rng, dtype, 3000, n_q, n_slots);
  apply_patterns(p, rng);
  DeviceProblem d(p);
  d.out.poison();
  cuda::sparse_attention(d.args, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = d.out.download();
  const std::string what = std::string(kv_dtype_name(dtype)) + " n_q=" + std::to_string(n_q) +
                           " n_slots=" + std::to_string(n_slots);
  for (int qi = 0; qi < n_q; ++qi) compare(p, got, qi, what);
}

TEST(CudaSparseAttention, DecodeAllLayouts) {
  DSV4_REQUIRE_GPU();
  for (KvDtype dt : {KvDtype::kFP8, KvDtype::kBF16, KvDtype::kF32})
    for (int n_q : {1, 6, 12})  // few queries: split-K + combine
      run_and_check(dt, n_q, 640, cuda_test::test_seed() + n_q);
}

TEST(CudaSparseAttention, OddSlotCounts) {
  DSV4_REQUIRE_GPU();
  for (int n_slots : {1, 15, 17, 64, 129, 1153}) run_and_check(KvDtype::kFP8, 6, n_slots, cuda_test::test_seed() + n_slots);
}

TEST(CudaSparseAttention, PrefillManyQueries) {
  DSV4_REQUIRE_GPU();
  run_and_check(KvDtype::kFP8, 300, 640, cuda_test::test_seed() + 99);  // >= 2 x SMs: no split
  run_and_check(KvDtype::kBF16, 300, 200, cuda_test::test_seed() + 98);
}

// F7: replay one captured graph 100 times with new device-side valid lengths; each replay must be bitwise
// equal to an eager launch with the same inputs and close to the float64 reference.
TEST(CudaSparseAttention, GraphReplayWithChangingLengths) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 7);
  Problem p = make_problem(rng, KvDtype::kFP8, 3000, 6, 640);
  apply_patterns(p, rng);
  DeviceProblem d(p);
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
    ASSERT_EQ(0, std::memcmp(g.data(), e.data(), g.size() * 4)) << "replay " << it << " differs from eager";
    if (it % 10 == 0)
      for (int qi = 0; qi < p.n_q; ++qi) compare(p, g, qi, "graph replay " + std::to_string(it));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
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
