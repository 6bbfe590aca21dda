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
// cudaLaunchKernelEx with thread-block clusters of cluster_x CTAs along x (0: no cluster attribute) and the
// programmatic-serialization attribute when pdl_enabled(); returns its error.
template <typename... KArgs, typename... Args>
cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
// The same without clusters.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  return launch_cluster(kernel, grid, block, smem, stream, 0u, std::forward<Args>(args)...);
}
#endif

}  // namespace dsv4::cuda
