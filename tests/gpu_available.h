// Whether a CUDA device is present, and the skip every GPU test starts with: GPU tests build everywhere
// (CI compiles them) and skip with a message on machines without a device.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace dsv4::testing {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace dsv4::testing

#define DSV4_REQUIRE_GPU()                                                            \
  do {                                                                                \
    if (!::dsv4::testing::have_gpu()) GTEST_SKIP() << "no CUDA device present";     \
  } while (0)
