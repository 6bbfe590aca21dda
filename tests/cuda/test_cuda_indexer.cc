// cuda::indexer_scores_fp8 against cpu::indexer_scores_fp8 (keys in the KvCodec fp8 layout, 136 B rows):
// decode (few queries over a long key cache) and causal prefill (query at position p sees t < (p+1)/4).
#include <cmath>
#include <string>

#include "backend/cpu/indexer_fp8.h"
#include "cuda_test_util.h"
#include "engine/kv_state.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;
constexpr int H = cuda::kIndexerHeads, Dk = cuda::kIndexerDim;

void run_and_check(int n_q, int64_t n_keys, bool causal, uint64_t seed) {
  SCOPED_TRACE("n_q=" + std::to_string(n_q) + " n_keys=" + std::to_string(n_keys) + (causal ? " causal" : ""));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  KvCodec codec(KvDtype::kFP8, Dk, 0, Dk);
  const int64_t rb = static_cast<int64_t>(codec.row_bytes());
  std::vector<uint8_t> keys(static_cast<size_t>(n_keys) * rb);
  std::vector<float> x(Dk);
  std::uniform_real_distribution<float> mag(0.05f, 20.f);
  for (int64_t t = 0; t < n_keys; ++t) {
    const float m = mag(rng);  // per-key magnitudes differ, so per-key scales differ
    for (float& v : x) v = m * nd(rng);
    codec.encode(x.data(), keys.data() + t * rb);
  }
  std::vector<float> q(static_cast<size_t>(n_q) * H * Dk), w(static_cast<size_t>(n_q) * H);
  for (float& v : q) v = nd(rng);
  for (float& v : w) v = nd(rng) * 0.01f;
  std::vector<int32_t> vis(n_q);
  std::uniform_int_distribution<int64_t> pos(0, 4 * n_keys + 3);
  for (int s = 0; s < n_q; ++s) vis[s] = causal ? static_cast<int32_t>((pos(rng) + 1) / 4) : static_cast<int32_t>(n_keys);
  if (causal && n_q > 2) { vis[0] = 0; vis[1] = static_cast<int32_t>(n_keys); }

  const int64_t stride = n_keys + 5;
  DeviceBuffer<uint8_t> dk(keys.size());
  DeviceBuffer<float> dq(q.size()), dw(w.size()), dout(static_cast<size_t>(n_q) * stride);
  DeviceBuffer<int32_t> dvis(n_q);
  dk.upload(keys); dq.upload(q); dw.upload(w); dvis.upload(vis);
  dout.poison();
  cuda::IndexerArgs a;
  a.q = dq.get(); a.w = dw.get(); a.keys = dk.get(); a.n_keys = n_keys; a.row_bytes = rb;
  a.n_visible = dvis.get(); a.scores = dout.get(); a.score_stride = stride; a.n_queries = n_q;
  cuda::indexer_scores_fp8(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dout.download();
  std::vector<float> want(n_keys);
  for (int s = 0; s < n_q; ++s) {
    cpu::indexer_scores_fp8(q.data() + static_cast<size_t>(s) * H * Dk, w.data() + static_cast<size_t>(s) * H, H, Dk,
                            keys.data(), n_keys, rb, vis[s], want.data());
    double max_abs = 0;
    for (int64_t t = 0; t < n_keys; ++t)
      if (std::isfinite(want[t])) max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[t])));
    for (int64_t t = 0; t < n_keys; ++t) {
      const float g = got[static_cast<size_t>(s) * stride + t];
      if (!std::isfinite(want[t])) {
        ASSERT_EQ(g, want[t]) << "query " << s << " key " << t << " must be -inf (invisible)";
        continue;
      }
      ASSERT_TRUE(std::isfinite(g)) << "query " << s << " key " << t;
      // fp32 sums of 64 x 128 products in another order: relative to the row's largest score.
      ASSERT_NEAR(g, want[t], 1e-4 * max_abs + 1e-6) << "query " << s << " key " << t;
    }
  }
}

TEST(CudaIndexer, Decode) {
  DSV4_REQUIRE_GPU();
  run_and_check(1, 100000, false, cuda_test::test_seed());
  run_and_check(4, 7777, false, cuda_test::test_seed() + 1);
  run_and_check(2, 1, false, cuda_test::test_seed() + 2);
}

TEST(CudaIndexer, CausalPrefill) {
  DSV4_REQUIRE_GPU();
  run_and_check(64, 4096, true, cuda_test::test_seed() + 3);
  run_and_check(300, 1000, true, cuda_test::test_seed() + 4);
}

TEST(CudaIndexer, UnsupportedShapeFailsLoudly) {
  DSV4_REQUIRE_GPU();
  cuda::IndexerArgs a;
  a.n_queries = 1;
  a.n_keys = 10;
  a.score_stride = 10;
  a.row_bytes = 100;
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
}

}  // namespace
}  // namespace dsv4
