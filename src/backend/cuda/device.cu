// Device gate: kernels are chosen by exact compute capability (SM120 != SM121 != SM90), never by family.
#include <mutex>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace dsv4::cuda {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(err));
}

namespace {
bool g_pdl = true;
}
void set_pdl(bool on) { g_pdl = on; }
bool pdl_enabled() { return g_pdl; }

const DeviceConfig& device_config() {
  // One config per process for the current device (the engine pins one device per process).
  static DeviceConfig cfg;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    cfg.major = p.major;
    cfg.minor = p.minor;
    cfg.sm_count = p.multiProcessorCount;
    cfg.smem_optin = p.sharedMemPerBlockOptin;
    if (p.major == 9 && p.minor == 0) cfg.arch = "sm_90a";
    else if (p.major == 12 && p.minor == 0) cfg.arch = "sm_120a";
    else if (p.major == 12 && p.minor == 1) cfg.arch = "sm_121a";
    else
      fail("CUDA backend: device '", p.name, "' has compute capability ", p.major, ".", p.minor,
           "; the kernels are built for sm_90a, sm_120a and sm_121a only");
    // Every kernel is sized for 99 KB of shared memory per block (the SM12x limit).
    if (cfg.smem_optin < 99u * 1024u)
      fail("CUDA backend: device '", p.name, "' allows only ", cfg.smem_optin,
           " B of shared memory per block; the kernels need 101376 B");
  });
  return cfg;
}

}  // namespace dsv4::cuda
