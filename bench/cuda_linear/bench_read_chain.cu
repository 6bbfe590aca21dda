// What one kernel per matrix costs a batch-1 decode step, whatever the arithmetic: a layer's weight matrices
// (the batch-1 chain's FP8 GEMVs and MoE reads at V4-Flash width) are read one after the other, each read
// depending on the previous one as a GEMV depends on its input, in three ways:
//   launches      : one kernel per matrix in a CUDA graph, without programmatic dependent launch;
//   launches+PDL  : the same with PDL, each kernel issuing its weight prologue (STAGES - 1 chunks per warp)
//                   before griddepcontrol.wait, as cudalin::gemv does;
//   persistent    : one kernel for the whole chain, every block resident; before each matrix a block issues
//                   its prologue, then waits until every block has finished the previous matrix (an arrival
//                   counter per matrix, release / acquire), then streams its share.
// Every warp streams its contiguous range of 2 KB chunks through a cp.async ring of STAGES chunks in shared
// memory, the GEMV's mechanics (bench_read_pattern.cu: this pattern reads as fast as a plain read kernel). The
// bytes are XORed, nothing else. Prints us per layer and the fraction of the copy bandwidth (D2D, read + write)
// reached, which is what the batch-1 goal (60% of the weight floor) is measured against.
// Usage: bench_read_chain [--layers N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "read_stream_common.cuh"

namespace {

using namespace dsv4::bench;

constexpr int kWarps = 8, kStages = 4, kChunk = 2048, kMaxMats = 64;

struct Chain {
  const uint8_t* mat[kMaxMats];
  int64_t chunks[kMaxMats];
  int n;
};

__device__ __forceinline__ void wait_ring() { cp_wait<kStages - 1>(); }

// Warp gw of nw streams chunks [gw * n / nw, (gw + 1) * n / nw) of w: prologue() issues the first kStages - 1,
// rest() the others (the ring as in cudalin's stream_warp; lane pieces at slot[32p + lane]).
struct WarpStream {
  const uint8_t* w;
  int64_t c0, n;
  uint4* ring;
  int lane;
  __device__ void issue(int64_t i) {
    uint4* slot = ring + (i % kStages) * 128 + lane;
    const uint8_t* src = w + (c0 + i) * kChunk + lane * 16;
#pragma unroll
    for (int p = 0; p < 4; ++p) cp16(slot + 32 * p, src + p * 512);
  }
  __device__ void prologue() {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (i < n) issue(i);
      cp_commit();
    }
  }
  __device__ uint32_t rest() {
    uint32_t acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kStages - 1 < n) issue(i + kStages - 1);
      cp_commit();
      wait_ring();
      const uint4* slot = ring + (i % kStages) * 128 + lane;
#pragma unroll
      for (int p = 0; p < 4; ++p) acc ^= slot[32 * p].x ^ slot[32 * p].y ^ slot[32 * p].z ^ slot[32 * p].w;
    }
    return acc;
  }
};

__device__ __forceinline__ WarpStream warp_stream(const uint8_t* w, int64_t chunks, uint4* ring) {
  const int warp = threadIdx.x >> 5;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + warp, nw = int64_t(gridDim.x) * kWarps;
  const int64_t c0 = gw * chunks / nw, c1 = (gw + 1) * chunks / nw;
  return WarpStream{w, c0, c1 - c0, ring + warp * (kStages * 128), static_cast<int>(threadIdx.x & 31)};
}

// One matrix per launch. PDL: the prologue before griddepcontrol.wait, the trigger right after it.
template <bool PDL>
__global__ void __launch_bounds__(kWarps * 32) read_one_kernel(const uint8_t* __restrict__ w, int64_t chunks,
                                                               uint32_t* sink) {
  extern __shared__ uint4 ring[];
  WarpStream s = warp_stream(w, chunks, ring);
  s.prologue();
  if constexpr (PDL) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  const uint32_t acc = s.rest();
  if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the reads; practically never true
}

// The whole chain in one launch (every block resident: the host sizes the grid by occupancy). Matrix i waits
// for counters[i - 1] == gridDim.x; counters are zero before the launch.
__global__ void __launch_bounds__(kWarps * 32) read_chain_kernel(Chain c, int* counters, uint32_t* sink) {
  extern __shared__ uint4 ring[];
  uint32_t acc = 0;
  for (int i = 0; i < c.n; ++i) {
    WarpStream s = warp_stream(c.mat[i], c.chunks[i], ring);
    s.prologue();
    if (i > 0) {
      if (threadIdx.x == 0) {
        int seen;
        do {
          asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counters + i - 1) : "memory");
        } while (seen < static_cast<int>(gridDim.x));
      }
      __syncthreads();
    }
    acc ^= s.rest();
    __syncthreads();  // every warp of the block is done with matrix i (and its ring slots)
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counters + i) : "memory");
    }
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

double copy_bandwidth(cudaStream_t s) {
  const size_t n = size_t(1) << 30;
  void *a, *b;
  ok(cudaMalloc(&a, n), "copy src");
  ok(cudaMalloc(&b, n), "copy dst");
  const double us = median_us(s, 9, 1, [&](int) { ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s), "copy"); });
  cudaFree(a), cudaFree(b);
  return 2.0 * double(n) / us * 1e-3;  // GB/s, read + write
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 8;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--layers") == 0) layers = std::max(1, std::min(8, std::atoi(argv[i + 1])));
  const StreamBench dev;
  const int sms = dev.sms;
  const cudaDeviceProp& prop = dev.prop;
  cudaStream_t s = dev.s;
  uint32_t* sink = dev.sink;
  const double bw = copy_bandwidth(s);

  // One layer's matrices on the batch-1 chain (V4-Flash width; MB = 2^20 bytes rounded to whole chunks): the
  // FP8 wq_a | wkv [1536 x 4096], wq_b [32768 x 1024], wo_a (8 x [1024 x 4096]), wo_b [4096 x 8192], the six
  // routed experts' MXFP4 w1 | w3 (6 x 2 x [2048 x 4096] / 2 + scales) and w2, the shared expert's FP8 w1 | w3
  // and w2. The same order every layer; each layer its own copies (> L2 in all), so every read is from DRAM.
  const double mb[] = {6.0, 32.0, 32.0, 32.0, 25.5, 12.75, 16.0, 8.0};
  const int per_layer = sizeof(mb) / sizeof(mb[0]);
  std::vector<uint8_t*> bufs;
  Chain chain{};
  chain.n = layers * per_layer;
  double bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < per_layer; ++i) {
      const int64_t chunks = static_cast<int64_t>(mb[i] * 1048576.0 / kChunk);
      uint8_t* p;
      ok(cudaMalloc(&p, size_t(chunks) * kChunk), "matrix");
      ok(cudaMemset(p, 0x3C, size_t(chunks) * kChunk), "fill");
      bufs.push_back(p);
      chain.mat[l * per_layer + i] = p;
      chain.chunks[l * per_layer + i] = chunks;
      bytes += double(chunks) * kChunk;
    }
  int* counters;
  ok(cudaMalloc(&counters, kMaxMats * sizeof(int)), "counters");

  const int smem = kWarps * kStages * kChunk;
  int occ_one = 0, occ_chain = 0;
  ok(cudaFuncSetAttribute(read_one_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  ok(cudaFuncSetAttribute(read_one_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  ok(cudaFuncSetAttribute(read_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_one, read_one_kernel<true>, kWarps * 32, smem), "occupancy");
  ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_chain, read_chain_kernel, kWarps * 32, smem), "occupancy");
  // Two blocks of 8 warps per SM, as the decode GEMV (its registers allow two).
  const int blocks = sms * std::min(2, std::min(occ_one, occ_chain));

  auto graph_of = [&](auto&& body) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    body();
    ok(cudaStreamEndCapture(s, &g), "end capture");
    ok(cudaGraphInstantiate(&e, g, 0), "instantiate");
    cudaGraphDestroy(g);
    return e;
  };
  auto launches = [&](bool pdl) {
    for (int i = 0; i < chain.n; ++i) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(blocks);
      cfg.blockDim = dim3(kWarps * 32);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = s;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = pdl ? 1 : 0;
      ok(pdl ? cudaLaunchKernelEx(&cfg, read_one_kernel<true>, chain.mat[i], chain.chunks[i], sink)
             : cudaLaunchKernelEx(&cfg, read_one_kernel<false>, chain.mat[i], chain.chunks[i], sink),
         "read_one_kernel");
    }
  };
  cudaGraphExec_t g_plain = graph_of([&] { launches(false); });
  cudaGraphExec_t g_pdl = graph_of([&] { launches(true); });
  cudaGraphExec_t g_chain = graph_of([&] {
    ok(cudaMemsetAsync(counters, 0, kMaxMats * sizeof(int), s), "zero counters");
    read_chain_kernel<<<blocks, kWarps * 32, smem, s>>>(chain, counters, sink);
  });

  std::printf("%s, %d SMs, L2 %d MB, copy bandwidth %.0f GB/s (D2D, read + write); %d layers of %d matrices, "
              "%.1f MB per layer; grids of %d blocks x %d warps, rings of %d x %d KB\n\n",
              prop.name, sms, prop.l2CacheSize >> 20, bw, layers, per_layer, bytes / layers / 1048576.0, blocks,
              kWarps, kStages, kChunk / 1024);
  std::printf("| chain | us per layer | GB/s | of copy bandwidth |\n| --- | ---: | ---: | ---: |\n");
  const double floor_us = bytes / layers / bw * 1e-3;
  std::printf("| floor (bytes / copy bandwidth) | %.1f | %.0f | 1.00 |\n", floor_us, bw);
  const std::pair<const char*, cudaGraphExec_t> rows[] = {
      {"one launch per matrix", g_plain}, {"one launch per matrix, PDL", g_pdl}, {"persistent, counters", g_chain}};
  for (const auto& row : rows) {
    const cudaGraphExec_t g = row.second;
    const double us = median_us(s, 15, 1, [&](int) { ok(cudaGraphLaunch(g, s), "graph launch"); }) / layers;
    std::printf("| %s | %.1f | %.0f | %.2f |\n", row.first, us, bytes / layers / us * 1e-3, floor_us / us);
  }
  for (auto p : bufs) cudaFree(p);
  return 0;
}
