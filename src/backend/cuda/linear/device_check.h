// Device checks shared by the launchers of src/backend/cuda/linear.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/linear/linear_cuda.h"

namespace dsv4::cudalin {

struct DeviceInfo {
  int cc = 0;        // 10 * major + minor
  int sm_count = 0;
};
DeviceInfo device_info();

// Throws dsv4::Error "CUDA error in <what>: <reason>" unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

}  // namespace dsv4::cudalin
