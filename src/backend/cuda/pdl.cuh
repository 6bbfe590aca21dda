// Programmatic dependent launch (PDL, sm_90 and later; docs/GPU_ENGINE.md "Launch gaps").
//
// A kernel launched through launch() may be scheduled while the preceding kernel in the stream is still
// finishing, so its launch latency and block start-up overlap that kernel's tail instead of following it.
// The contract every such kernel keeps: pdl::enter() (or pdl::wait()) before its first global access that
// a preceding kernel may write or read; only constant data (weights) may be touched before. wait() returns
// once every preceding grid has completed and its memory is visible, so ordering stays transitive along the
// stream exactly as without PDL; trigger() lets the next PDL kernel be scheduled. Launched without the
// attribute (PDL off, or inside kernels that never see a PDL predecessor) both instructions are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/kernels.h"  // set_pdl, pdl_enabled

namespace dsv4::cuda {

namespace pdl {
__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// First statement of a kernel with no constant-data prologue: wait for the predecessor, then let the
// successor be scheduled (its blocks only wait for this grid, they never run ahead of it).
__device__ __forceinline__ void enter() {
  wait();
  trigger();
}
}  // namespace pdl

#ifdef __CUDACC__
// cudaLaunchKernelEx with the programmatic-serialization attribute when pdl_enabled(); returns its error.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
#endif

}  // namespace dsv4::cuda
