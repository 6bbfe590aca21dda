// Device checks shared by the launchers of src/backend/cuda/linear.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/linear/linear_cuda.h"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cudalin {

struct DeviceInfo {
  int cc = 0;        // 10 * major + minor
  int sm_count = 0;
};
DeviceInfo device_info();

// Throws dsv4::Error "CUDA error in <what>: <reason>" unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Launch with programmatic dependent launch when enabled (cuda::set_pdl, backend/cuda/pdl.cuh): the kernel
// may start while the preceding kernel in the stream finishes and must griddepcontrol.wait before reading
// its results. 256 threads, as every kernel here.
#ifdef __CUDACC__
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, int smem, cudaStream_t s, Args&&... args) {
  check_cuda(cuda::launch(kernel, grid, dim3(256), static_cast<size_t>(smem), s, std::forward<Args>(args)...),
             "kernel launch");
}
// The same with `threads` per block.
template <typename... KArgs, typename... Args>
void launch_pdl_threads(void (*kernel)(KArgs...), dim3 grid, int threads, int smem, cudaStream_t s, Args&&... args) {
  check_cuda(cuda::launch(kernel, grid, dim3(threads), static_cast<size_t>(smem), s, std::forward<Args>(args)...),
             "kernel launch");
}
#endif

}  // namespace dsv4::cudalin
