// Helpers for the GPU tests: skip when no device, device buffers, poisoning, random data.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "gpu_available.h"
#include "core/error.h"

namespace dsv4::cuda_test {

using ::dsv4::testing::have_gpu;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) throw std::bad_alloc();
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) { dsv4::cuda::check(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    dsv4::cuda::check(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  // Fills every byte with 0x7b (int32 2071690107, float ~1.3e36): any element a kernel forgets is visible.
  void poison() { dsv4::cuda::check(cudaMemset(p_, 0x7b, n_ * sizeof(T)), "poison"); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// A fresh seed every run (the issue asks for fresh random inputs); printed so a failure can be replayed
// with DSV4_TEST_SEED.
inline uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("DSV4_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

}  // namespace dsv4::cuda_test
