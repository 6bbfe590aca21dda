// A device buffer and a CUDA error check for the glue tests (test_gpu_sample, test_glue_route): an error
// throws, naming the call, so the test fails instead of reading garbage.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dsv4::testing {

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t n) { ck(cudaMalloc(&p, std::max<size_t>(n, 1)), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

}  // namespace dsv4::testing
