// Shared by the CUDA benchmarks: a benchmark stops at the first CUDA error, naming the call.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace dsv4::bench {

inline void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace dsv4::bench
