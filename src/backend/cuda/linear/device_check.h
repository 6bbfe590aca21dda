// Device checks shared by the launchers of src/backend/cuda/linear.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/linear/linear_cuda.h"

namespace dsv4::cudalin {

struct DeviceInfo {
  int cc = 0;        // 10 * major + minor
  int sm_count = 0;
};
DeviceInfo device_info();

// Throws dsv4::Error "CUDA error in <what>: <reason>" unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Launch with programmatic dependent launch when enabled (set_linear_pdl): the kernel may start while the
// preceding kernel in the stream finishes and must griddepcontrol.wait before reading its results.
bool linear_pdl();
#ifdef __CUDACC__
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, int smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = linear_pdl() ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), "kernel launch");
}
#endif

}  // namespace dsv4::cudalin
