// Device checks shared by the launchers: supported compute capability, CUDA error reporting.
#include "backend/cuda/linear/device_check.h"

#include "core/error.h"

namespace dsv4::cudalin {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  // A refused launch also sets the runtime's last error; clear it (not sticky), so the next launch's
  // cudaGetLastError does not report this one under its own name.
  (void)cudaGetLastError();
  throw Error(str_cat("CUDA error in ", what, ": ", cudaGetErrorString(err)));
}

DeviceInfo device_info() {
  // Cached per device: the kernels are chosen by exact compute capability.
  static DeviceInfo cache[64];
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= 64) throw Error(str_cat("device ordinal ", dev, " out of range"));
  DeviceInfo& d = cache[dev];
  if (d.sm_count == 0) {
    int major = 0, minor = 0, sms = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    d.cc = major * 10 + minor;
    d.sm_count = sms;
  }
  return d;
}

void require_supported_device() {
  const DeviceInfo d = device_info();
  // Built ahead of time for sm_90a, sm_120a and sm_121a only (cmake/cuda.cmake); mma.sync bf16 exists on
  // all three, so they share the kernels.
  if (d.cc != 90 && d.cc != 120 && d.cc != 121)
    throw Error(str_cat("dsv4 CUDA GEMM kernels are built for sm_90, sm_120 and sm_121; this device is sm_", d.cc));
}

}  // namespace dsv4::cudalin
