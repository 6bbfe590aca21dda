// The engine's views of real checkpoint weights through the two kernel families agree: cudalin::gemv /
// moe_decode (bf16 activations) against glue::linear / moe_exact (fp32 activations) on activations that are
// exactly bf16, so only fp32 summation order (and, for the MoE, the bf16 rounding of h) differs. And the
// GpuOptions::act_quant path of each view against the CPU's act_quant linears and experts.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "core/numerics.h"
#include "engine/gpu/device_weights.h"
#include "engine/model.h"
#include "attention_width_model.h"
#include "gpu_available.h"
#include "model/random_checkpoint.h"

namespace dsv4 {
namespace {

using ::dsv4::testing::have_gpu;



template <typename T>
T* dev(const std::vector<T>& v) {
  T* p = nullptr;
  cuda::check(cudaMalloc(&p, v.size() * sizeof(T)), "malloc");
  cuda::check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy");
  return p;
}
template <typename T>
std::vector<T> host(const T* p, size_t n) {
  std::vector<T> v(n);
  cuda::check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "copy");
  return v;
}
// max |a - b| / max |b|; any non-finite value (an output left at its NaN poison) makes it infinite.
// (std::max(e, NaN) keeps e, which once hid unwritten gemv rows here.)
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    e = std::max(e, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return e / std::max(m, 1e-30);
}

// A random checkpoint at the kernels' attention widths (layers of ratio 0 and 4, 16 experts) in a temporary
// directory named `name` (removed again with the object), loaded on the CPU with `eo` and uploaded, and a GEMV
// workspace.
struct ViewsModel {
  std::string dir;
  std::unique_ptr<Model> m;
  gpu::DeviceWeights w;
  cudalin::Workspace ws;
  ViewsModel(const char* name, uint64_t seed, const EngineOptions& eo)
      : dir((std::filesystem::temp_directory_path() / name).string()) {
    RandomCheckpointOptions ro;
    ro.seed = seed;
    write_random_checkpoint(testing::attention_width_config({0, 4}, 16, 16), dir, ro);
    m = Model::load(dir, eo);
    w.upload(m->weights(), m->config(), false);
    ws = cudalin::workspace_create();
  }
  ~ViewsModel() {
    cudalin::workspace_destroy(ws);
    std::filesystem::remove_all(dir);
  }
};

TEST(GpuKernelViews, GemvAndMoeMatchGlue) {
  DSV4_REQUIRE_GPU();
  ViewsModel v("dsv4_gpu_views", 3, EngineOptions{});
  const auto& m = v.m;
  const gpu::DeviceWeights& w = v.w;
  cudalin::Workspace& ws = v.ws;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int T = 2;
  auto check_linear = [&](const char* name, const gpu::DevLinear& L) {
    std::vector<float> xf(T * L.cols);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(nd(rng)), xf[i] = bf16_to_f32(xb[i]);
    float* dxf = dev(xf);
    uint16_t* dxb = dev(xb);
    std::vector<float> nanv(T * L.rows, NAN);
    float* y1 = dev(nanv);
    float* y2 = dev(nanv);
    glue::linear(L.g, 0, L.rows, dxf, T, L.cols, y1, L.rows, nullptr);
    cudalin::gemv(L.d, dxb, L.cols, T, y2, L.rows, ws, nullptr);
    cuda::check(cudaDeviceSynchronize(), "sync");
    const double r = rel(host(y2, nanv.size()), host(y1, nanv.size()));
    std::printf("gemv vs glue %-12s [%lld x %lld]: %.3e\n", name, (long long)L.rows, (long long)L.cols, r);
    EXPECT_LE(r, 1e-4) << name;
    cudaFree(dxf), cudaFree(dxb), cudaFree(y1), cudaFree(y2);
  };
  for (int li = 0; li < 2; ++li) {
    const gpu::DevLayer& L = w.layers[li];
    check_linear("wq_a", L.wq_a);
    check_linear("wq_b", L.wq_b);
    check_linear("wkv", L.wkv);
    check_linear("wo_b", L.wo_b);
    check_linear("shared w1", L.sh_w1);
    // The stacked uploads (wq_a | wkv, w1 | w3) as one weight; the lines above check their row views.
    ASSERT_GT(L.wq_a_wkv.rows, 0);
    check_linear("wq_a|wkv", L.wq_a_wkv);
    if (L.sh_w13.rows) check_linear("shared w1|w3", L.sh_w13);
    check_linear("shared w2", L.sh_w2);
    if (li == 1) check_linear("index wq_b", L.index_wq_b);
    // MoE: routed experts through moe_decode vs moe_exact.
    const ModelConfig& c = m->config();
    const int D = c.hidden_size, I = c.moe_intermediate_size, K = c.num_experts_per_tok, E = c.n_routed_experts;
    std::vector<float> xf(T * D);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(nd(rng)), xf[i] = bf16_to_f32(xb[i]);
    std::vector<int32_t> idx = {3, 11, 11, 0};
    std::vector<float> wts = {0.7f, 0.8f, 1.1f, 0.4f};
    float* dxf = dev(xf);
    uint16_t* dxb = dev(xb);
    int32_t* didx = dev(idx);
    float* dw = dev(wts);
    std::vector<float> nanv(T * D, NAN), hb(T * K * I);
    float *y1 = dev(nanv), *y2 = dev(nanv), *h = dev(hb);
    glue::moe_exact(L.experts_exact, D, I, K, static_cast<float>(c.swiglu_limit), dxf, didx, dw, T, h, y1, false,
                    nullptr);
    cudalin::MoeShape shape{D, I, E, K, static_cast<float>(c.swiglu_limit)};
    cudalin::MoeWorkspace mw = cudalin::moe_workspace_create(shape, T);
    cudalin::moe_decode(shape, L.experts, dxb, didx, dw, T, y2, false, mw, nullptr);
    cuda::check(cudaDeviceSynchronize(), "sync");
    const double r = rel(host(y2, nanv.size()), host(y1, nanv.size()));
    std::printf("moe_decode vs moe_exact layer %d: %.3e\n", li, r);
    EXPECT_LE(r, 5e-3);
    cudalin::moe_workspace_destroy(mw);
  }
}

// GpuOptions::act_quant's pieces on the same views: each FP8 linear as the engine's `lin` runs it in that mode
// (glue::act_quant_rows into the bf16 copy, then cudalin::gemv) against cpu::linear_rows on a LinearWeight with
// act = kE4m3 (what EngineOptions::act_quant sets), and the routed experts through glue::moe_exact with x and h
// quantized against cpu::swiglu_expert on those weights. Both sides quantize the same fp32 x bit for bit
// (GlueActQuant), so only summation order differs (and, for the MoE, h's expf: an h code within ~1e-6 of a
// rounding boundary may flip, one e4m3 step of one element); without the quantization on either side the error
// would be the e4m3 rounding itself, ~2^-5 of an output.
TEST(GpuKernelViews, ActQuantLinearsMatchCpu) {
  DSV4_REQUIRE_GPU();
  EngineOptions eo;
  eo.act_quant = true;
  ViewsModel v("dsv4_gpu_views_aq", 5, eo);
  const auto& m = v.m;
  const gpu::DeviceWeights& w = v.w;
  cudalin::Workspace& ws = v.ws;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int T = 3;
  auto check_linear = [&](const char* name, const gpu::DevLinear& L, const LinearWeight& hw) {
    ASSERT_EQ(hw.act, LinearWeight::ActInput::kE4m3) << name;
    std::vector<float> xf(T * L.cols);
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = nd(rng) * (i % 7 == 0 ? 8.f : 1.f);
    float* dxf = dev(xf);
    uint16_t* dxb = dev(std::vector<uint16_t>(xf.size(), 0x7fc1));
    std::vector<float> nanv(T * L.rows, NAN);
    float* y = dev(nanv);
    glue::act_quant_rows(dxf, L.cols, T, L.cols, nullptr, 0, dxb, L.cols, nullptr);
    cudalin::gemv(L.d, dxb, L.cols, T, y, L.rows, ws, nullptr);
    std::vector<float> want(nanv.size());
    cpu::linear_rows(hw, 0, L.rows, xf.data(), T, L.cols, want.data(), L.rows);
    std::vector<float> plain(nanv.size());  // the same linear without the quantization, for scale
    LinearWeight hf = hw;
    hf.act = LinearWeight::ActInput::kF32;
    cpu::linear_rows(hf, 0, L.rows, xf.data(), T, L.cols, plain.data(), L.rows);
    const double r = rel(host(y, nanv.size()), want), r_plain = rel(plain, want);
    std::printf("act_quant gemv vs cpu %-10s [%lld x %lld]: %.3e (unquantized x: %.3e)\n", name, (long long)L.rows,
                (long long)L.cols, r, r_plain);
    EXPECT_LE(r, 1e-5) << name;
    EXPECT_GE(r_plain, 1e-3) << name << ": the quantization should matter";
    cudaFree(dxf), cudaFree(dxb), cudaFree(y);
  };
  for (int li = 0; li < 2; ++li) {
    const gpu::DevLayer& L = w.layers[li];
    const LayerWeights& H = m->weights().layers[li];
    check_linear("wq_a", L.wq_a, H.wq_a);
    check_linear("wq_b", L.wq_b, H.wq_b);
    check_linear("wkv", L.wkv, H.wkv);
    check_linear("wo_b", L.wo_b, H.wo_b);
    check_linear("shared w1", L.sh_w1, H.shared.w1);
    check_linear("shared w2", L.sh_w2, H.shared.w2);
    if (li == 1) check_linear("index wq_b", L.index_wq_b, H.index_wq_b);
    const ModelConfig& c = m->config();
    const int D = c.hidden_size, I = c.moe_intermediate_size, K = c.num_experts_per_tok;
    const float limit = static_cast<float>(c.swiglu_limit);
    std::vector<float> xf(T * D);
    for (float& v : xf) v = nd(rng);
    std::vector<int32_t> idx(T * K);
    std::vector<float> wts(T * K);
    for (int i = 0; i < T * K; ++i) idx[i] = (i * 5 + 3) % c.n_routed_experts, wts[i] = 0.3f + 0.1f * i;
    // x quantized by the caller, as GpuModel::Impl::ffn does; h inside moe_exact.
    float* dx = dev(xf);
    float* dxq = dev(std::vector<float>(xf.size(), NAN));
    int32_t* didx = dev(idx);
    float* dw = dev(wts);
    float* y = dev(std::vector<float>(T * D, NAN));
    float* h = dev(std::vector<float>(static_cast<size_t>(T) * K * I, NAN));
    glue::act_quant_rows(dx, D, T, D, dxq, D, nullptr, 0, nullptr);
    glue::moe_exact(L.experts_exact, D, I, K, limit, dxq, didx, dw, T, h, y, false, nullptr, true);
    cuda::check(cudaDeviceSynchronize(), "sync");
    std::vector<float> want(T * D, 0.f);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        cpu::swiglu_expert(H.experts[idx[t * K + k]], xf.data() + t * D, 1, &wts[t * K + k], limit,
                           want.data() + t * D);
    const double r = rel(host(y, want.size()), want);
    std::printf("act_quant moe_exact vs cpu swiglu_expert layer %d: %.3e\n", li, r);
    EXPECT_LE(r, 3e-3);
    cudaFree(dx), cudaFree(dxq), cudaFree(didx), cudaFree(dw), cudaFree(y), cudaFree(h);
  }
}

}  // namespace
}  // namespace dsv4
