// cudalin::moe_decode against cpu::moe_forward (the engine's reference) and against a float64 model of the
// GPU numerics. Expert loads of 0, 1 and all tokens, an expert listed twice for one token, random routes.
// Bounds: the GPU rounds x (given as bf16 here, so exact) and h = silu(g)*u*w to bf16 before w2; relative
// rounding <= 2^-9 per h element with random signs gives ||err|| / ||ref|| ~ 2^-9/sqrt(3) ~ 1.1e-3 against the
// fp32 CPU path: we ask 5e-3. Against the float64 model that rounds h the same way, only fp32 summation and
// rare one-ulp bf16 rounding flips remain: we ask 2e-4.
#include <algorithm>
#include <numeric>

#include "backend/cpu/moe.h"
#include "linear_test_util.h"
#include "model/config.h"

namespace dsv4 {
namespace {

using namespace lintest;

struct Experts {
  std::vector<HostWeight> w1, w2, w3;
  std::vector<ExpertWeights> views;
  std::vector<std::unique_ptr<DevBuf<uint8_t>>> bufs;
  std::unique_ptr<DevBuf<cudalin::DevExpert>> dev;
};

const uint8_t* up(Experts& X, const std::vector<uint8_t>& v) {
  X.bufs.push_back(std::make_unique<DevBuf<uint8_t>>(v));
  return X.bufs.back()->p;
}

Experts make_experts(std::mt19937_64& rng, const cudalin::MoeShape& s) {
  Experts X;
  // Scales 2^-8 .. 2^-7: |W| <= 0.05, so g, u ~ O(1) for unit activations and the clamp at 10 is reached
  // only sometimes (it is exercised by the large-activation case below).
  for (int e = 0; e < s.n_experts; ++e) {
    X.w1.push_back(random_fp4(rng, s.inter, s.hidden, 119, 120));
    X.w3.push_back(random_fp4(rng, s.inter, s.hidden, 119, 120));
    X.w2.push_back(random_fp4(rng, s.hidden, s.inter, 119, 120));
  }
  std::vector<cudalin::DevExpert> d(s.n_experts);
  for (int e = 0; e < s.n_experts; ++e) {
    bind(X.w1[e]), bind(X.w2[e]), bind(X.w3[e]);
    X.views.push_back({X.w1[e].view, X.w2[e].view, X.w3[e].view});
    d[e] = {up(X, X.w1[e].w), up(X, X.w1[e].s), up(X, X.w3[e].w), up(X, X.w3[e].s), up(X, X.w2[e].w), up(X, X.w2[e].s)};
  }
  X.dev = std::make_unique<DevBuf<cudalin::DevExpert>>(d);
  return X;
}

// float64 model of the GPU numerics (h rounded to bf16 before w2).
std::vector<double> model_moe(const cudalin::MoeShape& s, const Experts& X, const std::vector<float>& x, int T,
                              const std::vector<int32_t>& idx, const std::vector<float>& wts) {
  std::vector<double> out(size_t(T) * s.hidden, 0.0);
  std::vector<std::vector<float>> W1(s.n_experts), W2(s.n_experts), W3(s.n_experts);
  for (int e = 0; e < s.n_experts; ++e)
    W1[e] = dequant(X.w1[e].view), W2[e] = dequant(X.w2[e].view), W3[e] = dequant(X.w3[e].view);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < s.top_k; ++k) {
      const int e = idx[t * s.top_k + k];
      std::vector<float> h(s.inter);
#pragma omp parallel for
      for (int i = 0; i < s.inter; ++i) {
        double g = 0, u = 0;
        for (int d = 0; d < s.hidden; ++d) {
          g += double(x[size_t(t) * s.hidden + d]) * W1[e][size_t(i) * s.hidden + d];
          u += double(x[size_t(t) * s.hidden + d]) * W3[e][size_t(i) * s.hidden + d];
        }
        const double L = s.swiglu_limit;
        if (L > 0) g = std::min(g, L), u = std::clamp(u, -L, L);
        h[i] = round_bf16(float(g / (1.0 + std::exp(-g)) * u * wts[t * s.top_k + k]));
      }
#pragma omp parallel for
      for (int d = 0; d < s.hidden; ++d) {
        double y = 0;
        for (int i = 0; i < s.inter; ++i) y += double(h[i]) * W2[e][size_t(d) * s.inter + i];
        out[size_t(t) * s.hidden + d] += y;
      }
    }
  return out;
}

enum class Route { kRandom, kLoads01All, kDuplicate };

std::vector<int32_t> make_routes(std::mt19937_64& rng, Route r, int T, const cudalin::MoeShape& s) {
  std::vector<int32_t> idx(size_t(T) * s.top_k);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> perm(s.n_experts);
    std::iota(perm.begin(), perm.end(), 0);
    if (r == Route::kLoads01All) perm.erase(perm.begin(), perm.begin() + 3);  // 0: all, 1: one, 2: none
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < s.top_k; ++k) idx[t * s.top_k + k] = perm[k];
    if (r == Route::kLoads01All) {
      idx[t * s.top_k + 0] = 0;            // expert 0: every token
      if (t == T / 2) idx[t * s.top_k + 1] = 1;  // expert 1: exactly one token; expert 2: none
    }
    if (r == Route::kDuplicate) idx[t * s.top_k + 0] = idx[t * s.top_k + 1] = 5;  // listed twice per token
  }
  return idx;
}

void run_case(const cudalin::MoeShape& s, int T, Route route, float x_scale, bool accumulate, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << "hidden " << s.hidden << " inter " << s.inter << " E " << s.n_experts << " T "
                                    << T << " route " << int(route) << " x_scale " << x_scale);
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  Experts X = make_experts(rng, s);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  random_bf16(rng, size_t(T) * s.hidden, xf, xb);
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i] * x_scale), xf[i] = bf16_to_f32(xb[i]);
  const std::vector<int32_t> idx = make_routes(rng, route, T, s);
  std::vector<float> wts(idx.size());
  std::uniform_real_distribution<float> wd(0.05f, 0.5f);
  for (auto& w : wts) w = wd(rng);

  DevBuf<uint16_t> dx(xb);
  DevBuf<int32_t> didx(idx);
  DevBuf<float> dw(wts), dout(size_t(T) * s.hidden);
  std::vector<float> prior(size_t(T) * s.hidden, 0.f);
  if (accumulate) {
    std::normal_distribution<float> nd;
    for (auto& p : prior) p = nd(rng);
    dout.upload(prior);
  } else {
    dout.poison();
  }
  cudalin::MoeWorkspace ws = cudalin::moe_workspace_create(s, T);
  ok(cudaMemset(ws.h, 0xFF, size_t(T) * s.top_k * s.inter * 2), "poison h");
  ok(cudaMemset(ws.ybuf, 0xFF, size_t(T) * s.top_k * s.hidden * 4), "poison ybuf");
  cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = dout.download();
  if (!accumulate) {  // again on the same inputs: bit-identical (fixed reduction orders, counters back at zero)
    dout.poison();
    cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> again = dout.download();
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << "moe_decode is not deterministic";
  }
  for (size_t i = 0; i < got.size(); ++i) got[i] -= prior[i];
  cudalin::moe_workspace_destroy(ws);

  // The engine's CPU MoE.
  ModelConfig c;
  c.hidden_size = s.hidden, c.n_routed_experts = s.n_experts, c.num_experts_per_tok = s.top_k;
  c.moe_intermediate_size = s.inter, c.swiglu_limit = s.swiglu_limit;
  LayerWeights L;
  L.experts = X.views;
  L.has_shared = false;
  std::vector<float> cpu_out(size_t(T) * s.hidden);
  cpu::moe_forward(c, L, xf.data(), T, idx.data(), wts.data(), cpu_out.data());
  const std::vector<double> cpu_d(cpu_out.begin(), cpu_out.end());
  const std::vector<double> model = model_moe(s, X, xf, T, idx, wts);
  const std::vector<double> ones(model.size(), 1.0);
  const ErrStats ec = compare(got, cpu_d, ones), em = compare(got, model, ones);
  double maxref = 0;
  for (double v : model) maxref = std::max(maxref, std::fabs(v));
  std::printf("moe hidden=%d inter=%d E=%d T=%d route=%d: vs cpu::moe_forward %.3g, vs float64 model %.3g, "
              "max err/max|ref| %.3g\n", s.hidden, s.inter, s.n_experts, T, int(route), ec.rel_norm, em.rel_norm,
              em.worst / std::max(maxref, 1e-300));
  EXPECT_EQ(em.non_finite, 0) << "unwritten or non-finite outputs";
  EXPECT_LE(ec.rel_norm, 5e-3);
  EXPECT_LE(em.rel_norm, 2e-4);
  EXPECT_LE(em.worst, 2e-3 * maxref);  // no element far off (a wrong row or token would be O(1))
}

cudalin::MoeShape small_shape() {
  cudalin::MoeShape s;
  s.hidden = 1024, s.inter = 512, s.n_experts = 16, s.top_k = 6, s.swiglu_limit = 10.f;
  return s;
}

TEST(CudaMoeDecode, RandomRoutes) {
  DSV4_REQUIRE_GPU();
  for (int T : {1, 3, 8, 17, 64}) run_case(small_shape(), T, Route::kRandom, 1.f, false, 10 + T);
}

TEST(CudaMoeDecode, ExpertLoadsZeroOneAll) {
  DSV4_REQUIRE_GPU();
  for (int T : {2, 9, 64}) run_case(small_shape(), T, Route::kLoads01All, 1.f, false, 100 + T);
}

TEST(CudaMoeDecode, ExpertListedTwicePerToken) {
  DSV4_REQUIRE_GPU();
  run_case(small_shape(), 64, Route::kDuplicate, 1.f, false, 200);  // expert 5 gets 128 rows > 64
}

TEST(CudaMoeDecode, ClampAndAccumulate) {
  DSV4_REQUIRE_GPU();
  run_case(small_shape(), 5, Route::kRandom, 12.f, true, 300);  // |g|, |u| past the clamp at 10
}

// Every K split of the v2 kernels (w13: K = hidden, w2: K = inter; 8 / ks row tiles per block) with chunks
// that do not divide among the splits: hidden 1152 = 9 chunks, inter 384 = 3 chunks.
TEST(CudaMoeDecode, AllSplits) {
  DSV4_REQUIRE_GPU();
  cudalin::MoeShape s = small_shape();
  s.hidden = 1152, s.inter = 384;
  for (int ks : {1, 2, 4, 8}) {
    cudalin::set_moe_ksplit(ks);
    run_case(s, 9, Route::kLoads01All, 1.f, false, 500 + ks);
    run_case(s, 1, Route::kRandom, 1.f, false, 510 + ks);
  }
  cudalin::set_moe_ksplit(0);
}

TEST(CudaMoeDecode, Version1) {
  DSV4_REQUIRE_GPU();
  cudalin::set_linear_kernel_version(1);
  run_case(small_shape(), 17, Route::kLoads01All, 1.f, false, 600);
  run_case(small_shape(), 5, Route::kRandom, 12.f, true, 601);
  cudalin::set_linear_kernel_version(2);
}

TEST(CudaMoeDecode, FullFlashWidth) {
  DSV4_REQUIRE_GPU();
  cudalin::MoeShape s;  // hidden 4096, inter 2048 (V4-Flash); 10 experts keep the CPU reference quick
  s.n_experts = 10;
  run_case(s, 4, Route::kLoads01All, 1.f, false, 400);
}

}  // namespace
}  // namespace dsv4
