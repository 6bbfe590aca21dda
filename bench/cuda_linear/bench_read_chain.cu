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
// --gaps: the layer's weight-free kernels between the reads as well (hc_pre, q_norm, heads norm + attention +
// combine, hc_pre + router), each modelled as one thread's chain of dependent DRAM loads (pointer chasing
// through 128 MB) plus a spin, so that DRAM traffic beside it slows it as it would slow the real kernels. Rows:
// gaps alone, weights alone, both as PDL launches (today's engine), the same with an L2 prefetch of the next
// matrix on a side stream during each gap, and one persistent kernel in which block 0 runs each gap while the
// other blocks fill their rings for the next matrix (and, in the last row, prefetch the rest of it to L2):
// how much of the weight-free time a persistent kernel could hide (docs/NOTES.md, "Toward the batch-1 goal").
// Usage: bench_read_chain [--layers N] [--gaps]
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

// Arrival counters of the persistent kernels: the calling thread spins until *c >= target (acquire), or adds
// one after its block's stores (release).
__device__ __forceinline__ void spin_until(const int* c, int target) {
  int seen;
  do asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(c) : "memory"); while (seen < target);
}
__device__ __forceinline__ void arrive(int* c) { asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(c) : "memory"); }

// The whole chain in one launch (every block resident: the host sizes the grid by occupancy). Matrix i waits
// for counters[i - 1] == gridDim.x; counters are zero before the launch.
__global__ void __launch_bounds__(kWarps * 32) read_chain_kernel(Chain c, int* counters, uint32_t* sink) {
  extern __shared__ uint4 ring[];
  uint32_t acc = 0;
  for (int i = 0; i < c.n; ++i) {
    WarpStream s = warp_stream(c.mat[i], c.chunks[i], ring);
    s.prologue();
    if (i > 0) {
      if (threadIdx.x == 0) spin_until(counters + i - 1, gridDim.x);
      __syncthreads();
    }
    acc ^= s.rest();
    __syncthreads();  // every warp of the block is done with matrix i (and its ring slots)
    if (threadIdx.x == 0) arrive(counters + i);
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

// ---- --gaps: the weight-free kernels between the reads.
struct Gap {
  int loads = 0;          // dependent DRAM loads (0: no gap before this read)
  long long spin_ns = 0;  // then a spin of this long
  uint32_t start = 0;     // where the pointer chase starts
};

// One thread: `loads` dependent loads through L2 (chase[i] is the next index; 128 MB, so they miss), then a spin.
__device__ uint32_t run_gap(const uint32_t* __restrict__ chase, const Gap& g) {
  uint32_t i = g.start;
  for (int l = 0; l < g.loads; ++l) i = __ldcg(chase + i);
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < g.spin_ns);
  return i;
}

// A gap as its own launch (one warp, PDL: it waits for the read before it and lets the next read's prologue in).
__global__ void gap_kernel(const uint32_t* chase, Gap g, uint32_t* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0 && run_gap(chase, g) == 0xFFFFFFFFu) sink[1] = 1;
}

// Sends bytes [0, n) of w to L2, 128-byte lines strided over the grid.
__global__ void l2_prefetch_kernel(const uint8_t* w, int64_t n) {
  for (int64_t o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 128; o < n; o += int64_t(gridDim.x) * blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(w + o));
}

constexpr int kMaxSteps = 64;
struct GapChain {
  const uint8_t* mat[kMaxSteps];
  int64_t chunks[kMaxSteps];
  Gap gap[kMaxSteps];  // the gap before read i (loads 0: none)
  int n;
};

// The persistent form: read i waits for gap i (run by block 0 once read i - 1 is done everywhere) or, without a
// gap, for read i - 1; every block issues its ring prologue for read i before it waits, and with PREFETCH the
// blocks other than 0 also send the rest of their share of read i to L2 during the gap. counters[0, n): reads
// done (per block), counters[n, 2n): gaps done; zero before the launch.
template <bool PREFETCH>
__global__ void __launch_bounds__(kWarps * 32) read_gaps_kernel(GapChain c, int* counters, const uint32_t* chase,
                                                                uint32_t* sink) {
  extern __shared__ uint4 ring[];
  uint32_t acc = 0;
  auto wait_for = [&](const int* ctr, int target) {
    if (threadIdx.x == 0) spin_until(ctr, target);
    __syncthreads();
  };
  for (int i = 0; i < c.n; ++i) {
    WarpStream s = warp_stream(c.mat[i], c.chunks[i], ring);
    s.prologue();
    const bool gap = c.gap[i].loads > 0;
    if (gap && PREFETCH && blockIdx.x > 0 && s.lane < kChunk / 128)  // one 128-byte line per lane of a chunk
      for (int64_t k = kStages - 1; k < s.n; ++k)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(s.w + (s.c0 + k) * kChunk + s.lane * 128));
    if (gap) {
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (i > 0) spin_until(counters + i - 1, gridDim.x);
        acc ^= run_gap(chase, c.gap[i]);
        arrive(counters + c.n + i);
      }
      wait_for(counters + c.n + i, 1);
    } else if (i > 0) {
      wait_for(counters + i - 1, gridDim.x);
    }
    acc ^= s.rest();
    __syncthreads();
    if (threadIdx.x == 0) arrive(counters + i);
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

// Captures body() on stream s into an executable graph.
template <typename F>
cudaGraphExec_t graph_of(cudaStream_t s, F&& body) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
  body();
  ok(cudaStreamEndCapture(s, &g), "end capture");
  ok(cudaGraphInstantiate(&e, g, 0), "instantiate");
  cudaGraphDestroy(g);
  return e;
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic dependent launch where pdl.
template <typename... KArgs, typename... Args>
void launch_on(cudaStream_t s, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, int smem, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  ok(cudaLaunchKernelEx(&cfg, kernel, args...), "launch");
}

// --gaps (see the top of the file). The weight-free kernels of a layer, in order, before the read they precede:
// hc_pre before wq_a | wkv, q_norm before wq_b, heads norm/RoPE + attention + combine before wo_a, hc_pre + router
// before w1 | w3; durations set to about their Nsight Compute sums in run 114 (9.9, 3.1, 14.5, 18.2 us) with
// the loads unloaded (~0.7 us each).
void run_gaps(cudaStream_t s, uint32_t* sink, const Chain& chain, int layers, int per_layer, int blocks, int smem,
              double bytes, double bw, const cudaDeviceProp& prop, int sms) {
  const Gap layer_gaps[] = {{5, 6500, 0}, {2, 1700, 0}, {6, 10300, 0}, {0, 0, 0}, {8, 12600, 0}, {0, 0, 0}};
  static_assert(sizeof(layer_gaps) / sizeof(layer_gaps[0]) == 6, "one entry per read of the --gaps layer");
  // The chase: one random cycle through 32M indices (128 MB), so each dependent load misses L2.
  const uint32_t n_chase = 1u << 25;
  std::vector<uint32_t> perm(n_chase), next(n_chase);
  for (uint32_t i = 0; i < n_chase; ++i) perm[i] = i;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint32_t i = n_chase - 1; i > 0; --i) {  // Fisher-Yates with xorshift
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(perm[i], perm[x % (i + 1)]);
  }
  for (uint32_t i = 0; i < n_chase; ++i) next[perm[i]] = perm[(i + 1) % n_chase];
  uint32_t* chase;
  ok(cudaMalloc(&chase, size_t(n_chase) * 4), "chase");
  ok(cudaMemcpy(chase, next.data(), size_t(n_chase) * 4, cudaMemcpyHostToDevice), "chase upload");
  GapChain gc{};
  gc.n = chain.n;
  for (int i = 0; i < chain.n; ++i) {
    gc.mat[i] = chain.mat[i];
    gc.chunks[i] = chain.chunks[i];
    gc.gap[i] = layer_gaps[i % per_layer];
    gc.gap[i].start = perm[(uint64_t(i) * 2654435761u) % n_chase];
  }
  int* counters;
  ok(cudaMalloc(&counters, 2 * kMaxSteps * sizeof(int)), "counters");
  ok(cudaFuncSetAttribute(read_gaps_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  ok(cudaFuncSetAttribute(read_gaps_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  for (auto k : {read_gaps_kernel<false>, read_gaps_kernel<true>}) {  // every block must be resident (it spins)
    int occ = 0;
    ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, kWarps * 32, smem), "occupancy");
    if (blocks > occ * sms) {
      std::fprintf(stderr, "bench_read_chain --gaps: %d blocks, but only %d x %d resident\n", blocks, occ, sms);
      std::exit(1);
    }
  }
  cudaStream_t side;
  ok(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "side stream");
  cudaEvent_t fork, join;
  ok(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "event");
  ok(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "event");
  // What the launch rows capture: gaps and / or reads as PDL launches; with prefetch, a side stream sends each
  // read's matrix to L2 from the start of the gap before it.
  auto launches = [&](bool with_gaps, bool with_reads, bool prefetch) {
    for (int i = 0; i < chain.n; ++i) {
      if (with_gaps && gc.gap[i].loads > 0) {
        if (prefetch) {
          ok(cudaEventRecord(fork, s), "fork");
          ok(cudaStreamWaitEvent(side, fork, 0), "fork");
          l2_prefetch_kernel<<<64, 256, 0, side>>>(chain.mat[i], chain.chunks[i] * kChunk);
        }
        launch_on(s, true, gap_kernel, dim3(1), dim3(32), 0, static_cast<const uint32_t*>(chase), gc.gap[i], sink);
      }
      if (with_reads)
        launch_on(s, true, read_one_kernel<true>, dim3(blocks), dim3(kWarps * 32), smem, chain.mat[i], chain.chunks[i],
                  sink);
    }
    if (prefetch) {
      ok(cudaEventRecord(join, side), "join");
      ok(cudaStreamWaitEvent(s, join, 0), "join");
    }
  };
  const std::pair<const char*, cudaGraphExec_t> rows[] = {
      {"gaps alone (PDL launches)", graph_of(s, [&] { launches(true, false, false); })},
      {"weights alone (PDL launches)", graph_of(s, [&] { launches(false, true, false); })},
      {"gaps and weights, PDL launches (the engine today)", graph_of(s, [&] { launches(true, true, false); })},
      {"the same, next matrix to L2 on a side stream during each gap", graph_of(s, [&] { launches(true, true, true); })},
      {"persistent: block 0 runs the gaps, the others fill their rings",
       graph_of(s, [&] {
         ok(cudaMemsetAsync(counters, 0, 2 * kMaxSteps * sizeof(int), s), "zero counters");
         read_gaps_kernel<false><<<blocks, kWarps * 32, smem, s>>>(gc, counters, chase, sink);
       })},
      {"persistent, and the rest of the next matrix to L2 during each gap",
       graph_of(s, [&] {
         ok(cudaMemsetAsync(counters, 0, 2 * kMaxSteps * sizeof(int), s), "zero counters");
         read_gaps_kernel<true><<<blocks, kWarps * 32, smem, s>>>(gc, counters, chase, sink);
       })},
  };
  std::printf("%s, %d SMs, L2 %d MB, copy bandwidth %.0f GB/s (D2D, read + write); %d layers of %d reads, %.1f MB "
              "per layer, and 4 weight-free gaps per layer (dependent loads + spin); grids of %d blocks x %d warps\n\n",
              prop.name, sms, prop.l2CacheSize >> 20, bw, layers, per_layer, bytes / layers / 1048576.0, blocks, kWarps);
  std::printf("| chain | us per layer | weight bytes / copy bandwidth over this |\n| --- | ---: | ---: |\n");
  const double floor_us = bytes / layers / bw * 1e-3;
  std::printf("| floor (weight bytes / copy bandwidth) | %.1f | 1.00 |\n", floor_us);
  for (const auto& row : rows) {
    const cudaGraphExec_t g = row.second;
    const double us = median_us(s, 15, 1, [&](int) { ok(cudaGraphLaunch(g, s), "graph launch"); }) / layers;
    std::printf("| %s | %.1f | %.2f |\n", row.first, us, floor_us / us);
  }
  cudaFree(chase);
  cudaFree(counters);
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 8;
  bool gaps = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) layers = std::max(1, std::min(8, std::atoi(argv[++i])));
    else if (std::strcmp(argv[i], "--gaps") == 0) gaps = true;
    else {
      std::fprintf(stderr, "bench_read_chain: unknown argument %s (usage: [--layers N] [--gaps])\n", argv[i]);
      return 2;
    }
  }
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
  const std::vector<double> mb = gaps ? std::vector<double>{6.0, 32.0, 32.0, 32.0, 25.5, 12.75}  // no shared expert
                                      : std::vector<double>{6.0, 32.0, 32.0, 32.0, 25.5, 12.75, 16.0, 8.0};
  const int per_layer = static_cast<int>(mb.size());
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

  auto launches = [&](bool pdl) {
    for (int i = 0; i < chain.n; ++i)
      launch_on(s, pdl, pdl ? read_one_kernel<true> : read_one_kernel<false>, dim3(blocks), dim3(kWarps * 32), smem,
                chain.mat[i], chain.chunks[i], sink);
  };
  cudaGraphExec_t g_plain = graph_of(s, [&] { launches(false); });
  cudaGraphExec_t g_pdl = graph_of(s, [&] { launches(true); });
  cudaGraphExec_t g_chain = graph_of(s, [&] {
    ok(cudaMemsetAsync(counters, 0, kMaxMats * sizeof(int), s), "zero counters");
    read_chain_kernel<<<blocks, kWarps * 32, smem, s>>>(chain, counters, sink);
  });

  if (gaps) {
    run_gaps(s, sink, chain, layers, per_layer, blocks, smem, bytes, bw, prop, sms);
    for (auto p : bufs) cudaFree(p);
    return 0;
  }
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
