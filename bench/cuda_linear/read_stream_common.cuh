// Shared by bench_read_pattern.cu and bench_read_chain.cu (weight streams without arithmetic): the cp.async
// pieces of cudalin's stream.cuh ring, the event timer, and the device setup. Header-only, so that each bench
// also builds alone with `nvcc -O3 -std=c++20 -arch=sm_90a bench/cuda_linear/<bench>.cu` on the device.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../cuda_bench_util.h"

namespace dsv4::bench {

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Median over `reps` of (the time of `inner` calls f(0) .. f(inner - 1) on stream s) / inner, in us; one
// warm-up call first.
template <typename F>
double median_us(cudaStream_t s, int reps, int inner, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  f(0);
  ok(cudaStreamSynchronize(s), "warm-up");
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, s);
    for (int i = 0; i < inner; ++i) f(i);
    cudaEventRecord(b, s);
    ok(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    v.push_back(1e3 * ms / inner);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The current device, its SM count and properties, a non-blocking stream, and a 16-byte sink that the
// kernels write only when their XOR of the bytes hits a magic value (so the reads are kept).
struct StreamBench {
  int sms = 0;
  cudaDeviceProp prop{};
  cudaStream_t s = nullptr;
  uint32_t* sink = nullptr;
  StreamBench() {
    int dev = 0;
    ok(cudaGetDevice(&dev), "device");
    ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
    ok(cudaGetDeviceProperties(&prop, dev), "properties");
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    ok(cudaMalloc(&sink, 16), "sink");
  }
};

}  // namespace dsv4::bench
