// Shared helpers of the GEMM/MoE GPU tests: skip without a device, device buffers, NaN poisoning, random
// weights in the official formats, float64 references and the error report.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "core/numerics.h"
#include "gpu_available.h"
#include "model/weights.h"

namespace dsv4::lintest {

using ::dsv4::testing::have_gpu;

inline void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { ok(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc"); }
  DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { upload(v); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  void upload(const std::vector<T>& v) { ok(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    ok(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  void poison() { ok(cudaMemset(p, 0xFF, n * sizeof(T)), "poison"); }  // 0xFFFFFFFF is a NaN float
};

// A fresh seed each run (printed; DSV4_TEST_SEED replays one).
inline uint64_t seed() {
  static const uint64_t s = [] {
    const char* e = std::getenv("DSV4_TEST_SEED");
    const uint64_t v = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}

// Host copy of a weight in its checkpoint layout, plus the LinearWeight view the CPU reference reads.
struct HostWeight {
  std::vector<uint8_t> w, s;
  LinearWeight view;
};

// FP8 e4m3: every code except the two NaNs (so zeros, subnormals and +-448 all occur); UE8M0 tile scales
// drawn from [e_lo, e_hi], or f32 tile scales (the Flash-Base layout) when f32_scale.
inline HostWeight random_fp8(std::mt19937_64& rng, int64_t rows, int64_t cols, int e_lo, int e_hi, bool f32_scale) {
  HostWeight h;
  h.w.resize(rows * cols);
  for (auto& b : h.w) {
    do b = static_cast<uint8_t>(rng()); while ((b & 0x7F) == 0x7F);
  }
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  std::uniform_int_distribution<int> ed(e_lo, e_hi);
  if (f32_scale) {
    h.s.resize(sr * sc * 4);
    std::uniform_real_distribution<float> fd(0.5f, 2.0f);
    for (int64_t i = 0; i < sr * sc; ++i) {
      const float v = std::ldexp(fd(rng), ed(rng) - 127);
      std::memcpy(h.s.data() + 4 * i, &v, 4);
    }
  } else {
    h.s.resize(sr * sc);
    for (auto& b : h.s) b = static_cast<uint8_t>(ed(rng));
  }
  h.view.name = "fp8";
  h.view.fmt = WeightFormat::kFP8Block;
  h.view.rows = rows, h.view.cols = cols;
  h.view.scale_is_f32 = f32_scale;
  return h;
}

// MXFP4: every e2m1 code in both nibbles; UE8M0 per-32 scales from [e_lo, e_hi].
inline HostWeight random_fp4(std::mt19937_64& rng, int64_t rows, int64_t cols, int e_lo, int e_hi) {
  HostWeight h;
  h.w.resize(rows * cols / 2);
  for (auto& b : h.w) b = static_cast<uint8_t>(rng());
  h.s.resize(rows * cols / 32);
  std::uniform_int_distribution<int> ed(e_lo, e_hi);
  for (auto& b : h.s) b = static_cast<uint8_t>(ed(rng));
  h.view.name = "fp4";
  h.view.fmt = WeightFormat::kFP4;
  h.view.rows = rows, h.view.cols = cols;
  return h;
}

inline void bind(HostWeight& h) {
  h.view.w = h.w.data();
  h.view.scale = h.s.data();
}

// 16-bit activations: normal(0, 1) rounded to bf16 or f16 (the GEMV's ActFormat::kF16); both the floats and
// the 16-bit codes are returned.
inline void random_act16(std::mt19937_64& rng, size_t n, std::vector<float>& f, std::vector<uint16_t>& b, bool f16) {
  std::normal_distribution<float> nd(0.f, 1.f);
  f.resize(n), b.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = nd(rng);
    b[i] = f16 ? f32_to_f16(v) : f32_to_bf16(v);
    f[i] = f16 ? f16_to_f32(b[i]) : bf16_to_f32(b[i]);
  }
}
inline void random_bf16(std::mt19937_64& rng, size_t n, std::vector<float>& f, std::vector<uint16_t>& b) {
  random_act16(rng, n, f, b, false);
}
inline void random_f16(std::mt19937_64& rng, size_t n, std::vector<float>& f, std::vector<uint16_t>& b) {
  random_act16(rng, n, f, b, true);
}

// Dequantized weight through the CPU reference's own dequant_row.
inline std::vector<float> dequant(const LinearWeight& w) {
  std::vector<float> W(w.rows * w.cols);
#pragma omp parallel for
  for (int64_t r = 0; r < w.rows; ++r) cpu::dequant_row(w, r, W.data() + r * w.cols);
  return W;
}

// ref[t, r] = sum_k x[t,k] W[r,k] and abs[t, r] = sum_k |x W| in float64.
inline void ref_gemm(const std::vector<float>& W, int64_t rows, int64_t cols, const std::vector<float>& x, int T,
                     std::vector<double>& ref, std::vector<double>& abs) {
  ref.assign(size_t(T) * rows, 0.0), abs.assign(size_t(T) * rows, 0.0);
#pragma omp parallel for collapse(2)
  for (int t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0;
      const float* w = W.data() + r * cols;
      const float* xt = x.data() + int64_t(t) * cols;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(xt[k]) * double(w[k]);
        s += p, a += std::fabs(p);
      }
      ref[size_t(t) * rows + r] = s, abs[size_t(t) * rows + r] = a;
    }
}

struct ErrStats {
  double rel_norm = 0;   // ||got - ref|| / ||ref||
  double worst = 0;      // max |got - ref| / abs  (abs = sum |terms|, the elementwise error scale)
  int64_t non_finite = 0;
};
inline ErrStats compare(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& abs) {
  ErrStats e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++e.non_finite;
      continue;
    }
    const double d = double(got[i]) - ref[i];
    num += d * d, den += ref[i] * ref[i];
    if (abs[i] > 0) e.worst = std::max(e.worst, std::fabs(d) / abs[i]);
    else if (d != 0) e.worst = INFINITY;
  }
  e.rel_norm = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

}  // namespace dsv4::lintest
