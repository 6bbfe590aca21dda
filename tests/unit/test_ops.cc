// CPU operations against independent computations: YaRN frequencies from transformers, Sinkhorn in
// float64, top-k ties and sentinels, compressor blocks against the direct formula, attention against a
// float64 dense reference, and the KV storage formats.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/compressor.h"
#include "backend/cpu/mhc.h"
#include "backend/cpu/norm_rope.h"
#include "backend/cpu/selection_margin.h"
#include "backend/cpu/sparse_attention.h"
#include "backend/cpu/topk.h"
#include "core/numerics.h"
#include "engine/kv_state.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "core/error.h"
#include "test_util.h"

namespace dsv4 {
namespace {

TEST(Rope, YarnAndPlainFrequenciesMatchTransformers) {
  std::ifstream in(testing::fixture("golden/mixed/golden.json"));
  auto meta = nlohmann::json::parse(in);
  ModelConfig c = load_config(testing::fixture("golden/mixed/config.json"));
  auto main = cpu::rope_inv_freq(c, false), comp = cpu::rope_inv_freq(c, true);
  auto want_main = meta["inv_freq_main"].get<std::vector<float>>();
  auto want_comp = meta["inv_freq_compress"].get<std::vector<float>>();
  ASSERT_EQ(main.size(), want_main.size());
  ASSERT_EQ(comp.size(), want_comp.size());
  for (size_t i = 0; i < main.size(); ++i) EXPECT_NEAR(main[i], want_main[i], 2e-7 * want_main[i]) << i;
  for (size_t i = 0; i < comp.size(); ++i) EXPECT_NEAR(comp[i], want_comp[i], 2e-7 * want_comp[i]) << i;
  EXPECT_NE(main, comp);  // YaRN changes the low frequencies of compressed layers
}

TEST(Rope, InverseUndoesForwardAndPairsAreInterleaved) {
  std::vector<float> f = {0.5f};
  float x[4] = {7, 9, 1, 0};  // only the last 2 values rotate
  cpu::rope(x, 4, f, 3);
  EXPECT_EQ(x[0], 7);
  EXPECT_EQ(x[1], 9);
  EXPECT_NEAR(x[2], std::cos(1.5f), 1e-6);
  EXPECT_NEAR(x[3], std::sin(1.5f), 1e-6);
  cpu::rope(x, 4, f, 3, true);
  EXPECT_NEAR(x[2], 1.0f, 1e-6);
  EXPECT_NEAR(x[3], 0.0f, 1e-6);
}

// Sinkhorn written out in float64 straight from the spec (section 2.3).
std::vector<double> sinkhorn64(std::vector<double> c, int n, int iters, double eps) {
  for (int j = 0; j < n; ++j) {
    double mx = -1e300, s = 0;
    for (int k = 0; k < n; ++k) mx = std::max(mx, c[j * n + k]);
    for (int k = 0; k < n; ++k) s += std::exp(c[j * n + k] - mx);
    for (int k = 0; k < n; ++k) c[j * n + k] = std::exp(c[j * n + k] - mx) / s + eps;
  }
  auto cols = [&] {
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      for (int j = 0; j < n; ++j) c[j * n + k] /= s + eps;
    }
  };
  cols();
  for (int it = 0; it < iters - 1; ++it) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += c[j * n + k];
      for (int k = 0; k < n; ++k) c[j * n + k] /= s + eps;
    }
    cols();
  }
  return c;
}

TEST(Mhc, SinkhornMatchesFloat64AndIsDoublyStochastic) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 4;
    std::vector<float> c(n * n);
    std::vector<double> c64(n * n);
    for (int i = 0; i < n * n; ++i) c64[i] = c[i] = nd(rng);
    cpu::sinkhorn(c.data(), n, 20, 1e-6f);
    auto ref = sinkhorn64(c64, n, 20, 1e-6);
    for (int i = 0; i < n * n; ++i) EXPECT_NEAR(c[i], ref[i], 2e-6) << "trial " << trial << " entry " << i;
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      EXPECT_NEAR(s, 1.0, 1e-5);  // columns normalized last
    }
  }
}

TEST(Mhc, PostUsesTheTransposeOfComb) {
  cpu::HcParams p{2, 1, 1, 0.0f, 1e-6f};
  const float y[1] = {10}, res[2] = {1, 100}, post[2] = {0, 0};
  const float comb[4] = {0.25f, 0.75f, 0.5f, 0.5f};  // comb[j][k]
  float out[2];
  cpu::hc_post(p, y, res, post, comb, out);
  EXPECT_FLOAT_EQ(out[0], 0.25f * 1 + 0.5f * 100);  // h'_0 = Σ_j comb[j][0] res_j
  EXPECT_FLOAT_EQ(out[1], 0.75f * 1 + 0.5f * 100);
}

TEST(TopK, TiesGoToTheLowestIndex) {
  std::vector<float> s = {1, 5, 3, 5, 5, 0, 5};
  int32_t out[3];
  cpu::topk_row(s.data(), 7, 3, out);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  EXPECT_EQ(out[2], 4);
}

TEST(TopK, FewerValidThanKPadsWithMinusOneAndSkipsNanAndNegInf) {
  std::vector<float> s = {-INFINITY, 2, NAN, -1, -INFINITY};
  int32_t out[4];
  cpu::topk_row(s.data(), 5, 4, out);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  EXPECT_EQ(out[2], -1);
  EXPECT_EQ(out[3], -1);
  int32_t empty[2];
  cpu::topk_row(s.data(), 0, 2, empty);
  EXPECT_EQ(empty[0], -1);
  EXPECT_EQ(empty[1], -1);
}

TEST(TopK, ManyExactTiesSelectTheKLowestIndices) {
  std::vector<float> s(10000, 0.5f);
  s[9999] = 1.0f;
  std::vector<int32_t> out(512);
  cpu::topk_row(s.data(), static_cast<int64_t>(s.size()), 512, out.data());
  for (int i = 0; i < 511; ++i) EXPECT_EQ(out[i], i);
  EXPECT_EQ(out[511], 9999);
}

// The selection-gap probe (test instrumentation of the GPU-vs-CPU comparisons): the gap between the last
// selected and the first unselected score over the row's largest |score|, the smallest since the reset; 0 for
// an exact tie across the cut; nothing when every valid entry is selected or tracking is off.
TEST(TopK, SelectionGapProbe) {
  std::vector<float> s = {1.0f, 5.0f, 3.0f, 4.0f, -INFINITY};
  int32_t out[3];
  cpu::topk_row(s.data(), 5, 2, out);  // tracking off
  EXPECT_TRUE(std::isinf(cpu::selection_margin()));
  cpu::selection_margin_track(true);
  cpu::topk_row(s.data(), 5, 2, out);  // selected 5, 4; first unselected 3; the row's largest |score| 5
  EXPECT_DOUBLE_EQ(cpu::selection_margin(), (4.0 - 3.0) / 5.0);
  cpu::topk_row(s.data(), 5, 3, out);  // selected 5, 4, 3; next 1: a wider gap leaves the minimum alone
  EXPECT_DOUBLE_EQ(cpu::selection_margin(), 0.2);
  cpu::selection_margin_reset();
  cpu::topk_row(s.data(), 5, 4, out);  // every valid entry selected: no cut, no gap
  EXPECT_TRUE(std::isinf(cpu::selection_margin()));
  std::vector<float> tie = {2.0f, 7.0f, 2.0f};
  cpu::topk_row(tie.data(), 3, 2, out);
  EXPECT_EQ(cpu::selection_margin(), 0.0);
  cpu::selection_margin_track(false);
  cpu::topk_row(s.data(), 5, 2, out);
  EXPECT_TRUE(std::isinf(cpu::selection_margin()));
}

// The compressor's streaming state against the direct formula over the whole sequence (spec 2.4).
void check_compressor(int ratio, int head, int tokens) {
  const bool overlap = ratio == 4;
  const int W = (overlap ? 2 : 1) * head;
  std::mt19937 rng(ratio);
  std::normal_distribution<float> nd;
  std::vector<float> kv(tokens * W), gate(tokens * W), ape(ratio * W);
  for (auto& v : kv) v = nd(rng);
  for (auto& v : gate) v = 2 * nd(rng);
  for (auto& v : ape) v = nd(rng);
  cpu::CompressorState st;
  st.init(ratio, head);
  std::vector<std::vector<float>> got;
  std::vector<float> pooled(head);
  for (int p = 0; p < tokens; ++p) {
    if (cpu::compressor_push(st, p, &kv[p * W], &gate[p * W], ape.data(), pooled.data())) got.push_back(pooled);
    else EXPECT_NE((p + 1) % ratio, 0) << "block closing at " << p << " produced no entry";
  }
  ASSERT_EQ(static_cast<int>(got.size()), tokens / ratio);
  for (int j = 0; j < tokens / ratio; ++j)
    for (int c = 0; c < head; ++c) {
      std::vector<std::pair<double, double>> rows;  // (score, kv)
      if (overlap && j > 0)
        for (int r = 0; r < ratio; ++r) {
          const int t = (j - 1) * ratio + r;
          rows.push_back({gate[t * W + c] + ape[r * W + c], kv[t * W + c]});
        }
      const int off = overlap ? head : 0;
      for (int r = 0; r < ratio; ++r) {
        const int t = j * ratio + r;
        rows.push_back({gate[t * W + off + c] + ape[r * W + off + c], kv[t * W + off + c]});
      }
      double mx = -1e300, den = 0, num = 0;
      for (auto& [s, v] : rows) mx = std::max(mx, s);
      for (auto& [s, v] : rows) {
        den += std::exp(s - mx);
        num += std::exp(s - mx) * v;
      }
      ASSERT_NEAR(got[j][c], num / den, 1e-5) << "ratio " << ratio << " entry " << j << " channel " << c;
    }
}

TEST(Compressor, OverlapRatio4MatchesDirectFormulaAcrossBlockBoundaries) { check_compressor(4, 16, 4 * 9 + 3); }
TEST(Compressor, Ratio128MatchesDirectFormulaOverSeveralBlocks) { check_compressor(128, 8, 128 * 3 + 5); }

TEST(Compressor, OutOfOrderTokenIsAnError) {
  cpu::CompressorState st;
  st.init(4, 2);
  std::vector<float> row(4, 0.0f), ape(16, 0.0f), out(2);
  EXPECT_THROW(cpu::compressor_push(st, 1, row.data(), row.data(), ape.data(), out.data()), Error);
}

// Attention over gathered rows against a float64 dense computation restricted to the valid rows.
TEST(SparseAttention, MatchesFloat64WithInvalidSlotsAnywhereAndEmptyRows) {
  const int H = 3, d = 16, n = 40;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> q(H * d), keys(n * d), sink(H), out(H * d);
  for (auto& v : q) v = nd(rng);
  for (auto& v : keys) v = nd(rng);
  for (auto& v : sink) v = nd(rng);
  for (int pattern = 0; pattern < 4; ++pattern) {
    std::vector<const float*> ptr(n);
    for (int i = 0; i < n; ++i) {
      bool valid = pattern == 0 ? true : pattern == 1 ? i >= 16 : pattern == 2 ? (i % 3 == 1) : false;
      ptr[i] = valid ? &keys[i * d] : nullptr;
    }
    out.assign(H * d, NAN);  // poisoned
    cpu::sparse_attention(q.data(), H, d, ptr.data(), n, sink.data(), 0.25f, out.data());
    for (int h = 0; h < H; ++h) {
      double den = std::exp(static_cast<double>(sink[h]));
      std::vector<double> acc(d, 0.0);
      for (int i = 0; i < n; ++i) {
        if (!ptr[i]) continue;
        double l = 0;
        for (int c = 0; c < d; ++c) l += static_cast<double>(q[h * d + c]) * keys[i * d + c];
        const double e = std::exp(l * 0.25);
        den += e;
        for (int c = 0; c < d; ++c) acc[c] += e * keys[i * d + c];
      }
      for (int c = 0; c < d; ++c) {
        ASSERT_TRUE(std::isfinite(out[h * d + c]));
        EXPECT_NEAR(out[h * d + c], acc[c] / den, 1e-5) << "pattern " << pattern << " head " << h;
      }
    }
  }
  // A -inf sink with nothing valid: zeros, not NaN.
  std::vector<float> neg(H, -INFINITY);
  std::vector<const float*> none(n, nullptr);
  cpu::sparse_attention(q.data(), H, d, none.data(), n, neg.data(), 0.25f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(KvCodec, Fp8LayoutIs584BytesAndRoundTripIsBounded) {
  KvCodec fp8(KvDtype::kFP8, 512, 64, 64);
  EXPECT_EQ(fp8.row_bytes(), 584u);
  EXPECT_EQ(KvCodec(KvDtype::kBF16, 512, 64, 64).row_bytes(), 1024u);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> x(512), y(512);
  for (int i = 0; i < 512; ++i) x[i] = nd(rng) * (i < 64 ? 1000.0f : i < 128 ? 1e-3f : 1.0f);
  y = x;
  fp8.round_trip(y.data());
  for (int b = 0; b < 7; ++b) {
    float amax = 0;
    for (int i = b * 64; i < (b + 1) * 64; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (int i = b * 64; i < (b + 1) * 64; ++i)  // e4m3: 3 mantissa bits; subnormal step 2^-9 of the scale
      EXPECT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i]) / 16 + amax / 131072) << "dim " << i;
  }
  for (int i = 448; i < 512; ++i) EXPECT_EQ(y[i], round_bf16(x[i])) << "RoPE dim " << i << " is stored as bf16";
  std::vector<uint8_t> a(584), b2(584);
  fp8.encode(x.data(), a.data());
  fp8.encode(x.data(), b2.data());
  EXPECT_EQ(a, b2);
  EXPECT_THROW(KvCodec(KvDtype::kFP8, 100, 64, 64), Error);  // 36 non-RoPE dims: not a multiple of 64
}

// set_kv_encode_nudge (test instrumentation): a value just below a bf16 rounding midpoint goes to the upper
// code while the nudge is set, every value is untouched in f32 KV, and 0 restores the plain rounding.
TEST(KvCodec, EncodeNudgeFlipsValuesNearARoundingBoundary) {
  KvCodec bf16(KvDtype::kBF16, 64, 0, 64), f32(KvDtype::kF32, 64, 0, 64);
  std::vector<float> x(64, 1.0f);
  x[0] = 1.0f + 0x1p-8f - 0x1p-23f;  // 1 ulp (fp32) below the midpoint of bf16's 1 and 1 + 2^-7
  std::vector<float> y = x, z = x, w = x;
  bf16.round_trip(y.data());
  EXPECT_EQ(y[0], 1.0f);
  set_kv_encode_nudge(0x1p-20f);
  bf16.round_trip(z.data());
  f32.round_trip(w.data());
  set_kv_encode_nudge(0.f);
  EXPECT_EQ(z[0], 1.0f + 0x1p-7f);
  EXPECT_EQ(z[1], 1.0f);  // far from a boundary: the same code
  EXPECT_EQ(w, x);
  std::vector<float> v = x;
  bf16.round_trip(v.data());
  EXPECT_EQ(v, y);
}

TEST(KvCodec, UnknownDtypeNameIsAnError) {
  EXPECT_EQ(parse_kv_dtype("fp8"), KvDtype::kFP8);
  try {
    parse_kv_dtype("fp4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown value 'fp4'"), std::string::npos);
  }
}

TEST(PagedRows, TruncateReturnsPagesToThePool) {
  PagePool pool(8, 4);
  {
    PagedRows rows(&pool);
    for (int i = 0; i < 10; ++i) rows.append()[0] = static_cast<uint8_t>(i);
    EXPECT_EQ(pool.pages_in_use(), 3u);
    EXPECT_EQ(rows.row(9)[0], 9);
    rows.truncate(4);
    EXPECT_EQ(pool.pages_in_use(), 1u);
    rows.append()[0] = 42;
    EXPECT_EQ(rows.row(4)[0], 42);
  }
  EXPECT_EQ(pool.pages_in_use(), 0u);
}

}  // namespace
}  // namespace dsv4
