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

#ifdef __CUDACC__
// Launch with programmatic dependent launch when enabled (cuda::set_pdl, backend/cuda/pdl.cuh): the kernel
// may start while the preceding kernel in the stream finishes and must griddepcontrol.wait before reading
// its results.
template <typename... KArgs, typename... Args>
void launch_pdl_threads(void (*kernel)(KArgs...), dim3 grid, int threads, int smem, cudaStream_t s, Args&&... args) {
  check_cuda(cuda::launch(kernel, grid, dim3(threads), static_cast<size_t>(smem), s, std::forward<Args>(args)...),
             "kernel launch");
}

// The blocks a decode grid may use at `blocks_per_sm` resident blocks per SM: one wave, or 1 / N of it
// (set_decode_wave_div; gemv.cu). Both the GEMV and the MoE decode split pickers size their grids with it.
int wave_blocks(int blocks_per_sm);

// Resident blocks per SM of a kernel at `threads` threads and `smem` dynamic bytes (after opting in to > 48 KB).
// Throws when the kernel cannot be resident at all (its launches would fail).
template <typename K>
int blocks_per_sm(K* kernel, int threads, int smem) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), "occupancy");
  if (n < 1) check_cuda(cudaErrorInvalidConfiguration, "occupancy: no block of this kernel fits an SM");
  return n;
}
#endif

}  // namespace dsv4::cudalin
