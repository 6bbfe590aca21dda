// glue::linear on BF16 weights (the streaming path for cols % 256 == 0, the generic path otherwise) and on
// FP8 weights, against a float64 reference on fresh random inputs; outputs poisoned before each launch,
// row offsets (row_begin) and token counts around the 8-token pass.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "core/numerics.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  cuda::check(cudaMalloc(&p, std::max<size_t>(16, v.size() * sizeof(T))), "malloc");
  cuda::check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy");
  return p;
}

TEST(GlueLinear, Bf16MatchesFloat64) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case { int64_t rows, cols, row_begin, T; };
  const Case cases[] = {{1, 256, 0, 1},   {37, 512, 3, 3},     {1024, 4096, 0, 8}, {64, 4096, 7, 9},
                        {5, 768, 0, 17},  {129, 300, 1, 2},    {16, 1280, 0, 64},  {3, 2304, 2, 1}};
  for (const Case& c : cases) {
    const int64_t R = c.rows + c.row_begin;
    std::vector<uint16_t> w(static_cast<size_t>(R * c.cols));
    for (auto& v : w) v = f32_to_bf16(nd(rng) * 0.05f);
    std::vector<float> x(static_cast<size_t>(c.T * c.cols));
    for (auto& v : x) v = nd(rng);
    glue::Weight gw;
    gw.fmt = glue::WFormat::kBF16;
    gw.rows = R;
    gw.cols = c.cols;
    uint16_t* dw = upload(w);
    float* dx = upload(x);
    gw.w = reinterpret_cast<const uint8_t*>(dw);
    float* dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dy, c.T * c.rows * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(dy, 0xff, c.T * c.rows * sizeof(float)), cudaSuccess);  // NaN poison
    glue::linear(gw, c.row_begin, c.rows, dx, c.T, c.cols, dy, c.rows, nullptr);
    std::vector<float> y(static_cast<size_t>(c.T * c.rows));
    ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    double worst = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t r = 0; r < c.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double p = static_cast<double>(bf16_to_f32(w[(c.row_begin + r) * c.cols + k])) * x[t * c.cols + k];
          ref += p;
          mag += std::fabs(p);
        }
        const double err = std::fabs(y[t * c.rows + r] - ref) / std::max(mag, 1e-30);
        worst = std::isfinite(err) && err <= worst ? worst : (std::isfinite(err) ? err : INFINITY);
      }
    // fp32 accumulation over <= 4096 terms: |error| <= ~cols * 2^-24 * sum|w x|, in practice far less.
    std::printf("rows %lld cols %lld row_begin %lld T %lld: max |err| / sum|w x| = %.3e\n",
                static_cast<long long>(c.rows), static_cast<long long>(c.cols), static_cast<long long>(c.row_begin),
                static_cast<long long>(c.T), worst);
    EXPECT_LE(worst, 1e-5);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
  }
}

}  // namespace
}  // namespace dsv4
