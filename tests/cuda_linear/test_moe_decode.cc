// cudalin::moe_decode against cpu::moe_forward (the engine's reference) and against a float64 model of the
// GPU numerics. Expert loads of 0, 1 and all tokens, an expert listed twice for one token, random routes.
// Bounds: the GPU rounds x (given as bf16 here, so exact) and h = silu(g)*u*w to bf16 before w2; relative
// rounding <= 2^-9 per h element with random signs gives ||err|| / ||ref|| ~ 2^-9/sqrt(3) ~ 1.1e-3 against the
// fp32 CPU path: we ask 5e-3. The float64 model rounds h the same way and takes the GPU's h wherever fp32
// error could round it either way (model_moe's gpu_h): no h element may lie outside that rule ("off the
// model"), and only fp32 summation remains. Run 28 (H200) measured at most 5.3e-7 in norm and 4.3e-7 of
// max |ref| per element over every printed case: we ask 4e-6 and 1e-5. The f16 path (ActFormat::kF16: x and h
// in f16, the weights converted exactly to f16) rounds h by <= 2^-12 instead: the same bounds hold.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "backend/cpu/moe.h"
#include "core/error.h"
#include "linear_test_util.h"
#include "moe_test_util.h"
#include "model/config.h"

namespace dsv4 {
namespace {

using namespace lintest;


void run_case(const cudalin::MoeShape& s, int T, Route route, float x_scale, bool accumulate, uint64_t salt,
              bool h16 = false, int e_lo = 119, int e_hi = 120) {
  SCOPED_TRACE(::testing::Message() << "hidden " << s.hidden << " inter " << s.inter << " E " << s.n_experts << " T "
                                    << T << " route " << int(route) << " x_scale " << x_scale << " f16 " << h16
                                    << " scales " << e_lo << ".." << e_hi);
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  Experts X = make_experts(rng, s, e_lo, e_hi);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  random_bf16(rng, size_t(T) * s.hidden, xf, xb);
  for (size_t i = 0; i < xf.size(); ++i) {
    if (h16) xb[i] = f32_to_f16(xf[i] * x_scale), xf[i] = f16_to_f32(xb[i]);
    else xb[i] = f32_to_bf16(xf[i] * x_scale), xf[i] = bf16_to_f32(xb[i]);
  }
  const cudalin::ActFormat act = h16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16;
  if (h16) {
    EXPECT_TRUE(cudalin::moe_scales_fit_f16(s, X.dev->p, nullptr)) << "scales " << e_lo << ".." << e_hi;
  }
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
  cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr, act);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = dout.download();
  if (!accumulate) {  // again on the same inputs: bit-identical (fixed reduction orders, counters back at zero)
    dout.poison();
    cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr, act);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> again = dout.download();
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << "moe_decode is not deterministic";
  }
  for (size_t i = 0; i < got.size(); ++i) got[i] -= prior[i];
  const std::vector<uint16_t> gpu_h = gpu_h_by_pair(ws.h, s, idx);
  cudalin::moe_workspace_destroy(ws);
  ASSERT_FALSE(gpu_h.empty()) << "copying the workspace's h back failed";

  // The engine's CPU MoE.
  const std::vector<double> cpu_d = cpu_moe(s, X, xf, T, idx, wts);
  // The model takes the GPU's h where its 16-bit rounding is ambiguous (model_moe): flips cost nothing.
  HStats hs;
  const std::vector<double> model = model_moe(s, X, xf, T, idx, wts, h16, &gpu_h, &hs);
  const std::vector<double> ones(model.size(), 1.0);
  const ErrStats ec = compare(got, cpu_d, ones), em = compare(got, model, ones);
  double maxref = 0;
  for (double v : model) maxref = std::max(maxref, std::fabs(v));
  std::printf("moe%s hidden=%d inter=%d E=%d T=%d route=%d: vs cpu::moe_forward %.3g, vs float64 model %.3g, "
              "max err/max|ref| %.3g; h: %lld ambiguous, %lld flipped, %lld off the model\n", h16 ? " f16" : "",
              s.hidden, s.inter, s.n_experts, T, int(route), ec.rel_norm, em.rel_norm,
              em.worst / std::max(maxref, 1e-300), static_cast<long long>(hs.ambiguous),
              static_cast<long long>(hs.flipped), static_cast<long long>(hs.off));
  EXPECT_EQ(em.non_finite, 0) << "unwritten or non-finite outputs";
  EXPECT_LE(ec.rel_norm, 5e-3);
  EXPECT_EQ(hs.off, 0) << "h elements outside the fp32 rounding rule (model_moe)";
  EXPECT_LE(em.rel_norm, 4e-6);
  EXPECT_LE(em.worst, 1e-5 * maxref);  // no element far off (a wrong row or token would be O(1))
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

// f16 activations (x and h in f16, MXFP4 -> e4m3 -> f16 weights with the scale multiplied in f16).
TEST(CudaMoeDecode, F16Activations) {
  DSV4_REQUIRE_GPU();
  for (int T : {1, 8, 17, 64}) run_case(small_shape(), T, Route::kRandom, 1.f, false, 700 + T, true);
  run_case(small_shape(), 9, Route::kLoads01All, 1.f, false, 720, true);
  run_case(small_shape(), 64, Route::kDuplicate, 1.f, false, 721, true);
  run_case(small_shape(), 5, Route::kRandom, 12.f, true, 722, true);
  cudalin::MoeShape s = small_shape();
  s.hidden = 1152, s.inter = 384;
  for (int ks : {1, 2, 8}) {
    cudalin::set_moe_ksplit(ks);
    run_case(s, 9, Route::kLoads01All, 1.f, false, 730 + ks, true);
  }
  cudalin::set_moe_ksplit(0);
  cudalin::MoeShape f;  // V4-Flash width, 10 experts
  f.n_experts = 10;
  run_case(f, 1, Route::kRandom, 1.f, false, 740, true);
}

// The f16 path at the edges of its exact scale range (UE8M0 104 = 2^-23 and 136 = 2^9): every product still an
// exact f16 (subnormals at the low end); and moe_scales_fit_f16 refuses bytes just outside, and NaN (255).
TEST(CudaMoeDecode, F16ScaleRange) {
  DSV4_REQUIRE_GPU();
  // x scaled so that g, u and h stay O(0.01 .. 10) (h must not underflow f16: that is the activations' range,
  // not the weights' conversion under test).
  run_case(small_shape(), 3, Route::kRandom, 1e4f, false, 750, true, 104, 106);
  run_case(small_shape(), 3, Route::kRandom, 1e-4f, false, 751, true, 134, 136);
  run_case(small_shape(), 3, Route::kRandom, 1e4f, false, 752, false, 104, 106);  // bf16 path, same weights' range
  for (int bad : {103, 137, 255}) {
    std::mt19937_64 rng(seed() ^ (760 + bad));
    cudalin::MoeShape s = small_shape();
    Experts X = make_experts(rng, s);
    // One scale byte of the last expert's w2 set to `bad`.
    std::vector<uint8_t> sc = X.w2.back().s;
    sc[sc.size() / 2] = uint8_t(bad);
    cudalin::DevExpert d;
    ok(cudaMemcpy(&d, X.dev->p + (s.n_experts - 1), sizeof d, cudaMemcpyDeviceToHost), "expert");
    ok(cudaMemcpy(const_cast<uint8_t*>(d.s2), sc.data(), sc.size(), cudaMemcpyHostToDevice), "scale");
    EXPECT_FALSE(cudalin::moe_scales_fit_f16(s, X.dev->p, nullptr)) << "scale byte " << bad;
    sc[sc.size() / 2] = 120;
    ok(cudaMemcpy(const_cast<uint8_t*>(d.s2), sc.data(), sc.size(), cudaMemcpyHostToDevice), "scale");
    EXPECT_TRUE(cudalin::moe_scales_fit_f16(s, X.dev->p, nullptr));
  }
}

// The kernels' alignment contract (16-byte weights, 4-byte scales; no unaligned path in their loop), which the
// loader checks per expert: an aligned set passes, and a pointer one byte (or, for weights, four bytes) off fails.
// Host only.
TEST(CudaMoeDecode, ExpertAlignment) {
  alignas(16) static uint8_t buf[64];
  const cudalin::DevExpert good{buf, buf + 16, buf + 32, buf + 4, buf + 48, buf + 8};
  EXPECT_TRUE(cudalin::moe_expert_aligned(good));
  for (int f = 0; f < 6; ++f) {
    cudalin::DevExpert e = good;
    const uint8_t** p[6] = {&e.w1, &e.s1, &e.w3, &e.s3, &e.w2, &e.s2};
    *p[f] += 1;
    EXPECT_FALSE(cudalin::moe_expert_aligned(e)) << "field " << f << " + 1";
    if (f % 2 == 0) {  // weights: 4-byte alignment is not enough
      *p[f] += 3;
      EXPECT_FALSE(cudalin::moe_expert_aligned(e)) << "field " << f << " + 4";
    }
  }
}

// The 8-warp block layout of the v2 kernels (set_moe_block_warps(8); the default is 4 warps per block).
TEST(CudaMoeDecode, EightWarpBlocks) {
  DSV4_REQUIRE_GPU();
  cudalin::set_moe_block_warps(8);
  for (int T : {1, 17, 64}) run_case(small_shape(), T, Route::kRandom, 1.f, false, 800 + T);
  run_case(small_shape(), 9, Route::kLoads01All, 1.f, false, 810, true);
  cudalin::MoeShape s = small_shape();
  s.hidden = 1152, s.inter = 384;
  for (int ks : {1, 8}) {
    cudalin::set_moe_ksplit(ks);
    run_case(s, 9, Route::kLoads01All, 1.f, false, 820 + ks);
  }
  cudalin::set_moe_ksplit(0);
  cudalin::set_moe_block_warps(4);
}

// The lean kernels (set_moe_lean: T <= 8 without activation prefetch, more blocks per SM, so other K splits;
// w1/w3 with a 3-stage ring): none (the default uses both at T = 1), each alone and both; both activation
// formats, every forced split on the short shape, 8-warp blocks, the V4-Flash width, and T = 9, where they do
// not apply.
TEST(CudaMoeDecode, LeanKernels) {
  DSV4_REQUIRE_GPU();
  const cudalin::MoeLean saved = cudalin::moe_lean();
  cudalin::set_moe_split({false});  // the lean kernels for every expert, not only the split's light ones
  int seed = 900;
  for (const cudalin::MoeLean lean : {cudalin::MoeLean{false, false, 0}, cudalin::MoeLean{false, true, 8},
                                      cudalin::MoeLean{true, false, 8}, cudalin::MoeLean{true, true, 8}}) {
    SCOPED_TRACE(std::string("lean w13 ") + (lean.w13 ? "on" : "off") + ", w2 " + (lean.w2 ? "on" : "off"));
    cudalin::set_moe_lean(lean);
    for (int T : {1, 3, 8, 9}) run_case(small_shape(), T, Route::kRandom, 1.f, false, seed++);
    run_case(small_shape(), 1, Route::kRandom, 1.f, false, seed++, true);
    run_case(small_shape(), 5, Route::kRandom, 12.f, true, seed++, true);
    cudalin::MoeShape s = small_shape();
    s.hidden = 1152, s.inter = 384;
    for (int ks : {1, 2, 4, 8}) {
      cudalin::set_moe_ksplit(ks);
      run_case(s, 2, Route::kLoads01All, 1.f, false, seed++, true);
    }
    cudalin::set_moe_ksplit(0);
    cudalin::set_moe_block_warps(8);
    run_case(small_shape(), 1, Route::kRandom, 1.f, false, seed++, true);
    cudalin::set_moe_block_warps(4);
    cudalin::MoeShape f;  // V4-Flash width, 10 experts
    f.n_experts = 10;
    run_case(f, 1, Route::kRandom, 1.f, false, seed++, true);
  }
  EXPECT_THROW(cudalin::set_moe_lean({true, true, 9}), dsv4::Error);
  cudalin::set_moe_lean(saved);
  cudalin::set_moe_split({});
}

// The n-tile cap (set_moe_max_ntiles): experts with more tokens than 8 x the cap stream their weights once per
// group of tokens (loads 0, 1 and all tokens; random routes), both activation formats, and the refusal of a
// cap that is not a power of two up to 8.
TEST(CudaMoeDecode, NtileCap) {
  DSV4_REQUIRE_GPU();
  int seed = 1000;
  for (int cap : {1, 2, 4, 8}) {
    SCOPED_TRACE("at most " + std::to_string(cap) + " n-tiles");
    cudalin::set_moe_max_ntiles(cap);
    for (int T : {9, 17, 40, 64}) run_case(small_shape(), T, Route::kLoads01All, 1.f, false, seed++);
    run_case(small_shape(), 64, Route::kRandom, 1.f, false, seed++, true);
    run_case(small_shape(), 33, Route::kRandom, 12.f, true, seed++, true);
  }
  cudalin::set_moe_max_ntiles(2);  // the default
  EXPECT_THROW(cudalin::set_moe_max_ntiles(3), dsv4::Error);
}

// The MoE decode grids sized to 1/2 and 1/8 of the resident slots (set_decode_wave_div): fewer K splits.
TEST(CudaMoeDecode, WaveDivisor) {
  DSV4_REQUIRE_GPU();
  int seed = 1100;
  for (int div : {2, 8}) {
    cudalin::set_decode_wave_div(div);
    for (int T : {1, 4, 17, 64}) run_case(small_shape(), T, Route::kRandom, 1.f, false, seed++, true);
    run_case(small_shape(), 9, Route::kLoads01All, 1.f, false, seed++);
    cudalin::MoeShape f;  // V4-Flash width, 10 experts
    f.n_experts = 10;
    run_case(f, 1, Route::kRandom, 1.f, false, seed++, true);
  }
  cudalin::set_decode_wave_div(1);
}

// The split by expert load (set_moe_split; f16 activations and 4-warp blocks, where it applies): light
// experts through the one-n-tile kernels, heavy ones through the kernels sized for T, the two w2 launches
// sharing the per-token combine. Loads 0, 1 and all tokens, an expert listed twice per token (also with T <=
// the light count, where the heavy launches are left out), random routes, both split points, T from 2 (the
// split's first) to 64, every forced K split on the short shape; T = 1 and bf16 activations, where it does not
// apply. And the same battery without the split (the default takes it up to 64 tokens).
TEST(CudaMoeDecode, SplitByExpertLoad) {
  DSV4_REQUIRE_GPU();
  int seed = 1200;
  // 2: light 2 / 8 / 16 pairs, lean light kernels up to 8 tokens only; 3: light 2, then 24 / 24 pairs; 4: the
  // default, lean light kernels up to 64 tokens (MoeSplit::lean_light_tokens; lean w1/w3 up to 128 pairs, so
  // T <= 21).
  for (int light : {0, 1, 2, 3, 4}) {
    SCOPED_TRACE(light ? "split configuration " + std::to_string(light) : std::string("no split"));
    cudalin::set_moe_split({light > 0, std::min(std::max(light, 1), 2), 64, light == 3 ? 24 : 8,
                            light == 3 ? 24 : light >= 2 ? 16 : 8, light == 4 ? 64 : 8});
    for (int T : {1, 2, 3, 8, 9, 17, 40, 64}) {
      run_case(small_shape(), T, Route::kRandom, 1.f, false, seed++, true);
      run_case(small_shape(), T, Route::kLoads01All, 1.f, T % 2 == 1, seed++, true);
    }
    run_case(small_shape(), 2, Route::kDuplicate, 1.f, false, seed++, true);
    run_case(small_shape(), 8, Route::kDuplicate, 1.f, false, seed++, true);
    run_case(small_shape(), 64, Route::kDuplicate, 1.f, false, seed++, true);
    run_case(small_shape(), 5, Route::kRandom, 12.f, true, seed++, true);
    run_case(small_shape(), 9, Route::kLoads01All, 1.f, false, seed++);  // bf16: no split
    cudalin::MoeShape s = small_shape();
    s.hidden = 1152, s.inter = 384;
    for (int ks : {1, 2, 4, 8}) {
      cudalin::set_moe_ksplit(ks);
      run_case(s, 4, Route::kLoads01All, 1.f, false, seed++, true);
      run_case(s, 33, Route::kLoads01All, 1.f, false, seed++, true);
    }
    cudalin::set_moe_ksplit(0);
    cudalin::MoeShape f;  // V4-Flash width, 10 experts
    f.n_experts = 10;
    run_case(f, 4, Route::kRandom, 1.f, false, seed++, true);
  }
  cudalin::set_moe_split({});
  EXPECT_THROW(cudalin::set_moe_split({true, 9}), dsv4::Error);
  EXPECT_THROW(cudalin::set_moe_split({true, 2, 65}), dsv4::Error);
  EXPECT_THROW(cudalin::set_moe_split({true, 2, 16, 0}), dsv4::Error);
  EXPECT_THROW(cudalin::set_moe_split({true, 2, 64, 8, 65}), dsv4::Error);
  EXPECT_THROW(cudalin::set_moe_split({true, 2, 64, 8, 16, 7}), dsv4::Error);
}

// A host node that sleeps 2 ms: the producer is still busy when the consumer's kernels are launched.
void CUDART_CB sleep_2ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

// out_ready: `out` (accumulate) is written on another stream by a producer that is still busy when moe_decode
// is called; moe_decode waits for the producer's event only before w2 (the engine's shared expert, joined late:
// GpuOptions::shared_join_at_w2). The result must equal the call with `out` ready beforehand, bit for bit,
// on every path: one token (one launch per matrix), the split by expert load (2-64 tokens), the v1 kernels
// (their combine kernel), eagerly and captured in a graph. Without the join, w2 would add the NaN poison.
TEST(CudaMoeDecode, OutReadyJoinsTheProducerBeforeW2) {
  DSV4_REQUIRE_GPU();
  const cudalin::MoeShape s = small_shape();
  std::mt19937_64 rng(seed() ^ 0x0DE4ull);
  Experts X = make_experts(rng, s);
  cudaStream_t main_s, prod_s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&prod_s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  for (int version : {2, 1})
    for (int T : {1, 5, 20})
      for (bool graph : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "v" << version << " T " << T << (graph ? " graph" : " eager"));
        cudalin::set_linear_kernel_version(version);
        std::vector<float> xf;
        std::vector<uint16_t> xb;
        random_bf16(rng, size_t(T) * s.hidden, xf, xb);
        const std::vector<int32_t> idx = make_routes(rng, Route::kRandom, T, s);
        std::vector<float> wts(idx.size()), prior(size_t(T) * s.hidden);
        std::uniform_real_distribution<float> wd(0.05f, 0.5f);
        for (auto& w : wts) w = wd(rng);
        std::normal_distribution<float> nd;
        for (auto& p : prior) p = nd(rng);
        DevBuf<uint16_t> dx(xb);
        DevBuf<int32_t> didx(idx);
        DevBuf<float> dw(wts), dprior(prior), want(prior.size()), got(prior.size());
        cudalin::MoeWorkspace ws = cudalin::moe_workspace_create(s, T);
        want.upload(prior);
        cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, want.p, true, ws, main_s);
        ASSERT_EQ(cudaStreamSynchronize(main_s), cudaSuccess);
        got.poison();
        auto step = [&] {  // the producer on prod_s, moe_decode on main_s joined through `ready`
          ASSERT_EQ(cudaEventRecord(ready, main_s), cudaSuccess);  // fork prod_s from main_s (needed in capture)
          ASSERT_EQ(cudaStreamWaitEvent(prod_s, ready, 0), cudaSuccess);
          ASSERT_EQ(cudaLaunchHostFunc(prod_s, sleep_2ms, nullptr), cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(got.p, dprior.p, prior.size() * sizeof(float), cudaMemcpyDeviceToDevice, prod_s),
                    cudaSuccess);
          ASSERT_EQ(cudaEventRecord(ready, prod_s), cudaSuccess);
          cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, got.p, true, ws, main_s, cudalin::ActFormat::kBf16,
                              ready);
        };
        if (graph) {
          cudaGraph_t g;
          cudaGraphExec_t ge;
          ASSERT_EQ(cudaStreamBeginCapture(main_s, cudaStreamCaptureModeRelaxed), cudaSuccess);
          step();
          ASSERT_EQ(cudaStreamEndCapture(main_s, &g), cudaSuccess) << "prod_s is not joined back";
          ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
          ASSERT_EQ(cudaGraphLaunch(ge, main_s), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(main_s), cudaSuccess);
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
        } else {
          step();
          ASSERT_EQ(cudaStreamSynchronize(main_s), cudaSuccess);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> a = want.download(), b = got.download();
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << "moe_decode with out_ready differs from moe_decode with out ready beforehand";
        cudalin::moe_workspace_destroy(ws);
      }
  cudalin::set_linear_kernel_version(2);
  cudaEventDestroy(ready);
  cudaStreamDestroy(prod_s);
  cudaStreamDestroy(main_s);
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
