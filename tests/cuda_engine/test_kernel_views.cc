// The engine's views of real checkpoint weights through the two kernel families agree: cudalin::gemv /
// moe_decode (bf16 activations) against glue::linear / moe_exact (fp32 activations) on activations that are
// exactly bf16, so only fp32 summation order (and, for the MoE, the bf16 rounding of h) differs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

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

TEST(GpuKernelViews, GemvAndMoeMatchGlue) {
  DSV4_REQUIRE_GPU();
  const std::string dir = (std::filesystem::temp_directory_path() / "dsv4_gpu_views").string();
  RandomCheckpointOptions ro;
  ro.seed = 3;
  write_random_checkpoint(testing::attention_width_config({0, 4}, 16, 16), dir, ro);
  auto m = Model::load(dir);
  gpu::DeviceWeights w;
  w.upload(m->weights(), m->config(), false);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int T = 2;
  cudalin::Workspace ws = cudalin::workspace_create();
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
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4
