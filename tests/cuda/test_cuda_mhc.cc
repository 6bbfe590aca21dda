// cuda::hc_pre / hc_post / hc_head against cpu::hc_pre / hc_post / hc_head, and the device Sinkhorn against a
// float64 Sinkhorn. Fresh random inputs every run, outputs poisoned before each launch.
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/mhc.h"
#include "backend/cpu/norm_rope.h"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "core/numerics.h"
#include "cuda_test_util.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;
constexpr int N = 4;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, const char* what) {
  double mx = 0;
  for (float v : want) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "]";
    ASSERT_NEAR(got[i], want[i], rel * mx + 1e-7) << what << "[" << i << "]";
  }
}

HcWeights random_weights(std::mt19937_64& rng, int mix, int64_t dim, int n_scale) {
  std::normal_distribution<float> nd(0.f, 1.f);
  HcWeights w;
  w.fn.resize(static_cast<size_t>(mix) * N * dim);
  for (float& v : w.fn) v = 0.02f * nd(rng);
  w.base.resize(mix);
  for (float& v : w.base) v = 0.5f * nd(rng);
  w.scale.resize(n_scale);
  for (float& v : w.scale) v = 0.5f + 0.3f * nd(rng);
  return w;
}

// On the device: random hc_pre (or hc_head) weights, an RMSNorm weight, and the previous sub-layer's y, res,
// post and comb for T tokens (the inputs of a fused hc_post, HcArgs::prev_*).
struct PostInputs {
  PostInputs(std::mt19937_64& rng, int T, int64_t D, bool head)
      : w(random_weights(rng, head ? N : (2 + N) * N, D, head ? 1 : 3)),
        y(T * D), res(T * N * D), post(T * N), comb(T * N * N), fn(w.fn.size()), base(w.base.size()),
        scale(w.scale.size()), nw(D) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> hy(T * D), hres(T * N * D), hpost(T * N), hcomb(T * N * N), hnw(D);
    for (float& v : hy) v = nd(rng);
    for (float& v : hres) v = nd(rng);
    for (float& v : hpost) v = 2.0f / (1.0f + std::exp(-nd(rng)));
    for (float& v : hcomb) v = std::fabs(nd(rng)) * 0.5f;
    for (float& v : hnw) v = 1.0f + 0.3f * nd(rng);
    y.upload(hy); res.upload(hres); post.upload(hpost); comb.upload(hcomb); nw.upload(hnw);
    fn.upload(w.fn); base.upload(w.base); scale.upload(w.scale);
  }
  // a's weights and norm weight; with fused, a's prev_* too.
  void fill(cuda::HcArgs& a, bool fused) const {
    a.fn = fn.get(), a.base = base.get(), a.scale = scale.get(), a.norm_w = nw.get();
    if (fused) a.prev_y = y.get(), a.prev_res = res.get(), a.prev_post = post.get(), a.prev_comb = comb.get();
  }
  HcWeights w;
  DeviceBuffer<float> y, res, post, comb, fn, base, scale, nw;
};

// fused: also the following RMSNorm (HcArgs::norm_w) and the bf16 copy of x (HcArgs::xb), against
// cpu::rmsnorm after the CPU hc_pre / hc_head.
void run_pre(int T, int64_t D, bool head, uint64_t seed, bool fused = false) {
  SCOPED_TRACE(std::string(head ? "hc_head" : "hc_pre") + " T=" + std::to_string(T) + " D=" + std::to_string(D) +
               (fused ? " fused norm + bf16 + f16" : ""));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int mix = head ? N : (2 + N) * N;
  HcWeights w = random_weights(rng, mix, D, head ? 1 : 3);
  std::vector<float> h(static_cast<size_t>(T) * N * D);
  for (size_t i = 0; i < h.size(); ++i) h[i] = nd(rng) * (1.0f + (i / D) % 3);  // streams of different scale
  DeviceBuffer<float> dh(h.size()), dfn(w.fn.size()), dbase(w.base.size()), dscale(w.scale.size());
  DeviceBuffer<float> dx(static_cast<size_t>(T) * D), dpost(T * N), dcomb(T * N * N);
  DeviceBuffer<uint8_t> ws(cuda::hc_workspace_bytes(T, D));
  dh.upload(h); dfn.upload(w.fn); dbase.upload(w.base); dscale.upload(w.scale);
  std::vector<float> nw(D);
  for (float& v : nw) v = 1.0f + 0.3f * nd(rng);
  DeviceBuffer<float> dnw(D);
  DeviceBuffer<uint16_t> dxb(static_cast<size_t>(T) * D), dxh(static_cast<size_t>(T) * D);
  dnw.upload(nw);
  dx.poison(); dpost.poison(); dcomb.poison(); ws.poison(); dxb.poison(); dxh.poison();
  cuda::HcArgs a;
  a.n_tokens = T; a.dim = D; a.h = dh.get(); a.fn = dfn.get(); a.base = dbase.get(); a.scale = dscale.get();
  a.x = dx.get(); a.post = dpost.get(); a.comb = dcomb.get(); a.workspace = ws.get();
  if (fused) a.norm_w = dnw.get(), a.xb = dxb.get(), a.xh = dxh.get();
  if (head) cuda::hc_head(a, nullptr);
  else cuda::hc_pre(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gx = dx.download(), gp = dpost.download(), gc = dcomb.download();
  const std::vector<uint16_t> gxb = dxb.download(), gxh = dxh.download();
  cpu::HcParams p;
  p.dim = D;
  std::vector<float> x(D), post(N), comb(N * N);
  for (int t = 0; t < T; ++t) {
    SCOPED_TRACE("token " + std::to_string(t));
    const float* ht = h.data() + static_cast<size_t>(t) * N * D;
    if (head) cpu::hc_head(w, p, ht, x.data());
    else cpu::hc_pre(w, p, ht, x.data(), post.data(), comb.data());
    if (fused) {
      cpu::rmsnorm(x.data(), nw.data(), D, p.norm_eps, x.data());
      for (int64_t d = 0; d < D; ++d) {  // bf16 of the GPU's own x, round to nearest even
        const uint16_t u = f32_to_bf16(gx[t * D + d]);
        ASSERT_EQ(gxb[t * D + d], u) << "xb[" << t << ", " << d << "]";
        ASSERT_EQ(gxh[t * D + d], f32_to_f16(gx[t * D + d])) << "xh[" << t << ", " << d << "]";
      }
    }
    expect_close(std::vector<float>(gx.begin() + t * D, gx.begin() + (t + 1) * D), x, 2e-5, "x");
    if (!head) {
      expect_close(std::vector<float>(gp.begin() + t * N, gp.begin() + (t + 1) * N), post, 2e-5, "post");
      expect_close(std::vector<float>(gc.begin() + t * N * N, gc.begin() + (t + 1) * N * N), comb, 2e-5, "comb");
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CudaMhc, Pre) {
  DSV4_REQUIRE_GPU();
  const uint64_t s = cuda_test::test_seed() + 200;
  run_pre(1, 7168, false, s);
  run_pre(5, 4096, false, s + 1);
  run_pre(8, 4096, false, s + 4);  // the last token count of the decode mix kernel
  run_pre(9, 4096, false, s + 5);  // the first of the tensor-core path (mhc_prefill.cu)
  run_pre(77, 7168, false, s + 2);
  run_pre(300, 96, false, s + 3);  // K = 384: 6 chunks of 64 k, fewer than the split wants
}

// The tensor-core path's tile and split boundaries: 16-token groups, 64-token CTAs, the K split (up to one
// wave of CTAs), a K range of one chunk (D = 32), and a chunk of many tiles. The 2e-5 bound would fail plain
// TF32 (mixes off by ~1e-3 relative).
TEST(CudaMhc, PrefillTileBoundaries) {
  DSV4_REQUIRE_GPU();
  const uint64_t s = cuda_test::test_seed() + 500;
  int i = 0;
  for (int T : {16, 17, 63, 64, 65, 129}) run_pre(T, 4096, false, s + i++);
  run_pre(40, 32, false, s + i++);
  run_pre(1000, 4096, false, s + i++);
  run_pre(1000, 4096, false, s + i++, true);
  run_pre(129, 4096, true, s + i++);
  run_pre(65, 32, true, s + i++, true);
}

TEST(CudaMhc, PreAndHeadWithFusedNormAndBf16) {
  DSV4_REQUIRE_GPU();
  const uint64_t s = cuda_test::test_seed() + 400;
  run_pre(1, 4096, false, s, true);
  run_pre(1, 7168, false, s + 1, true);
  run_pre(65, 4096, false, s + 2, true);
  run_pre(300, 96, false, s + 3, true);
  run_pre(1, 4096, true, s + 4, true);
  run_pre(17, 7168, true, s + 5, true);
}

TEST(CudaMhc, Head) {
  DSV4_REQUIRE_GPU();
  const uint64_t s = cuda_test::test_seed() + 300;
  run_pre(1, 7168, true, s);
  run_pre(40, 4096, true, s + 1);
  run_pre(3, 32, true, s + 2);
}

TEST(CudaMhc, Post) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 400);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto [T, D] : {std::pair<int, int64_t>{1, 7168}, {33, 4096}, {7, 12}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " D=" + std::to_string(D));
    std::vector<float> y(T * D), res(T * N * D), post(T * N), comb(T * N * N);
    for (float& v : y) v = nd(rng);
    for (float& v : res) v = nd(rng);
    for (float& v : post) v = 2.0f / (1.0f + std::exp(-nd(rng)));
    for (float& v : comb) v = std::fabs(nd(rng)) * 0.5f;
    DeviceBuffer<float> dy(y.size()), dr(res.size()), dp(post.size()), dc(comb.size()), dout(res.size());
    dy.upload(y); dr.upload(res); dp.upload(post); dc.upload(comb);
    dout.poison();
    cuda::hc_post(T, D, N, dy.get(), dr.get(), dp.get(), dc.get(), dout.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = dout.download();
    cpu::HcParams p;
    p.dim = D;
    std::vector<float> want(res.size());
    for (int t = 0; t < T; ++t)
      cpu::hc_post(p, &y[t * D], &res[t * N * D], &post[t * N], &comb[t * N * N], &want[t * N * D]);
    expect_close(got, want, 1e-6, "out");
  }
}

// hc_pre / hc_head with the previous hc_post fused in front (HcArgs::prev_*) against the two launches it
// replaces: h, x, post and comb bit for bit (the decode mix kernel up to 8 tokens; above, hc_post's own launch
// then the tensor-core path, at T = 65 and 130 with 64-token tiles ending inside the batch; D = 96 puts the
// decode kernel's 128-wide chunks across stream boundaries).
TEST(CudaMhc, FusedPostMatchesSeparateLaunches) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 500);
  for (bool head : {false, true})
    for (auto [T, D] : {std::pair<int, int64_t>{1, 4096}, {5, 7168}, {8, 96}, {9, 4096}, {2, 32}, {65, 4096},
                        {130, 96}, {17, 32}, {300, 7168}}) {
      SCOPED_TRACE(std::string(head ? "hc_head" : "hc_pre") + " T=" + std::to_string(T) + " D=" + std::to_string(D));
      const PostInputs in(rng, T, D, head);
      std::vector<std::vector<float>> out[2];
      for (int fused = 0; fused < 2; ++fused) {
        DeviceBuffer<float> dh(static_cast<size_t>(T) * N * D), dx(static_cast<size_t>(T) * D), dpo(T * N),
            dco(T * N * N);
        DeviceBuffer<uint8_t> ws(cuda::hc_workspace_bytes(T, D));
        dh.poison(); dx.poison(); dpo.poison(); dco.poison(); ws.poison();
        cuda::HcArgs a;
        a.n_tokens = T; a.dim = D; a.h = dh.get(); a.x = dx.get(); a.post = dpo.get(); a.comb = dco.get();
        a.workspace = ws.get();
        in.fill(a, fused);
        if (!fused) cuda::hc_post(T, D, N, in.y.get(), in.res.get(), in.post.get(), in.comb.get(), dh.get(), nullptr);
        if (head) cuda::hc_head(a, nullptr);
        else cuda::hc_pre(a, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        out[fused] = {dh.download(), dx.download()};
        if (!head) out[fused].push_back(dpo.download()), out[fused].push_back(dco.download());
      }
      const char* names[] = {"h", "x", "post", "comb"};
      for (size_t i = 0; i < out[0].size(); ++i)
        EXPECT_EQ(0, std::memcmp(out[0][i].data(), out[1][i].data(), out[0][i].size() * sizeof(float)))
            << names[i] << " differs between the fused and the separate hc_post";
    }
}

// One token with HcArgs::counter: hc_pre / hc_head as one kernel (the last block finishes) must equal the two
// launches bit for bit (h, x, post, comb and the bf16 / f16 copies), with and without the fused hc_post, on
// every D path, three launches in a row (the counter re-arms itself: it must read 0 after each).
TEST(CudaMhc, OneTokenKernelMatchesTwoLaunches) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 600);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (bool head : {false, true})
    for (int64_t D : {32, 96, 4096, 7168})
      for (bool fused : {false, true}) {
        SCOPED_TRACE(std::string(head ? "hc_head" : "hc_pre") + " D=" + std::to_string(D) +
                     (fused ? " with the fused hc_post" : ""));
        const PostInputs in(rng, 1, D, head);
        std::vector<float> h(N * D);
        for (float& v : h) v = nd(rng);
        DeviceBuffer<int> counter(1);
        ASSERT_EQ(cudaMemset(counter.get(), 0, sizeof(int)), cudaSuccess);
        std::vector<std::vector<uint8_t>> want;
        for (int run = 0; run < 4; ++run) {  // run 0: two launches; 1..3: one kernel
          DeviceBuffer<float> dh(h.size()), dx(D), dpo(N), dco(N * N);
          DeviceBuffer<uint16_t> dxb(D), dxh(D);
          DeviceBuffer<uint8_t> ws(cuda::hc_workspace_bytes(1, D));
          dh.upload(h);
          dx.poison(); dpo.poison(); dco.poison(); dxb.poison(); dxh.poison(); ws.poison();
          cuda::HcArgs a;
          a.n_tokens = 1; a.dim = D; a.h = dh.get(); a.x = dx.get(); a.post = dpo.get(); a.comb = dco.get();
          a.workspace = ws.get(); a.xb = dxb.get(); a.xh = dxh.get();
          in.fill(a, fused);
          if (run > 0) a.counter = counter.get();
          if (head) cuda::hc_head(a, nullptr);
          else cuda::hc_pre(a, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          auto bytes = [](const auto& v) {
            const auto* p = reinterpret_cast<const uint8_t*>(v.data());
            return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
          };
          std::vector<std::vector<uint8_t>> got = {bytes(dh.download()), bytes(dx.download()), bytes(dxb.download()),
                                                   bytes(dxh.download())};
          if (!head) got.push_back(bytes(dpo.download())), got.push_back(bytes(dco.download()));
          if (run == 0) {
            want = got;
            continue;
          }
          const char* names[] = {"h", "x", "xb", "xh", "post", "comb"};
          for (size_t i = 0; i < want.size(); ++i)
            EXPECT_EQ(want[i], got[i]) << names[i] << " differs between one kernel (launch " << run
                                       << ") and two launches";
          EXPECT_EQ(counter.download()[0], 0) << "the counter is not re-armed after launch " << run;
        }
      }
}

// float64 Sinkhorn with the same steps as cpu::sinkhorn.
void sinkhorn64(double* c, int iters, double eps) {
  for (int j = 0; j < N; ++j) {
    double mx = c[j * N];
    for (int k = 1; k < N; ++k) mx = std::max(mx, c[j * N + k]);
    double s = 0;
    for (int k = 0; k < N; ++k) s += (c[j * N + k] = std::exp(c[j * N + k] - mx));
    for (int k = 0; k < N; ++k) c[j * N + k] = c[j * N + k] / s + eps;
  }
  auto cols = [&] {
    for (int k = 0; k < N; ++k) {
      double s = 0;
      for (int j = 0; j < N; ++j) s += c[j * N + k];
      for (int j = 0; j < N; ++j) c[j * N + k] /= (s + eps);
    }
  };
  auto rows = [&] {
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < N; ++k) s += c[j * N + k];
      for (int k = 0; k < N; ++k) c[j * N + k] /= (s + eps);
    }
  };
  cols();
  for (int i = 0; i < iters - 1; ++i) rows(), cols();
}

TEST(CudaMhc, SinkhornAgainstFloat64) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 500);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int M = 4096;
  std::vector<float> logits(M * N * N);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = nd(rng) * (i < 16 * 16 ? 30.f : 3.f);  // some near one-hot
  DeviceBuffer<float> dl(logits.size()), dc(logits.size());
  dl.upload(logits);
  dc.poison();
  cuda::hc_sinkhorn(dl.get(), dc.get(), M, 20, 1e-6f, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dc.download();
  double worst = 0;
  for (int m = 0; m < M; ++m) {
    double c[N * N];
    for (int i = 0; i < N * N; ++i) c[i] = logits[m * N * N + i];
    sinkhorn64(c, 20, 1e-6);
    float cf[N * N];
    for (int i = 0; i < N * N; ++i) cf[i] = logits[m * N * N + i];
    cpu::sinkhorn(cf, N, 20, 1e-6f);
    for (int i = 0; i < N * N; ++i) {
      worst = std::max(worst, std::fabs(got[m * N * N + i] - c[i]));
      ASSERT_NEAR(got[m * N * N + i], c[i], 1e-5) << "matrix " << m << " entry " << i;
      ASSERT_NEAR(got[m * N * N + i], cf[i], 1e-5) << "matrix " << m << " entry " << i << " (cpu fp32)";
    }
  }
  std::printf("sinkhorn: max |gpu fp32 - float64| = %.3g\n", worst);
}

TEST(CudaMhc, UnsupportedShapesFailLoudly) {
  DSV4_REQUIRE_GPU();
  cuda::HcArgs a;
  a.n_tokens = 1; a.dim = 7200;
  try {
    cuda::hc_pre(a, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim=7200"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv4
