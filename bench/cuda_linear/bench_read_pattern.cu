// How fast can the decode GEMV's weight stream be, whatever the arithmetic? Reads one weight matrix per launch
// through the GEMV's own mechanics (one warp per 16-row tile and K split, a per-warp cp.async ring of STAGES
// 2 KB chunks in shared memory, STAGES - 1 chunks in flight) and does nothing with the bytes but XOR them, in
// two layouts:
//   rows  : the checkpoint's row-major [N, K] FP8 matrix; chunk c of a tile is 16 pieces of 128 bytes, one per
//           row, K bytes apart (what cudalin::gemv reads; lane (g, t) copies rows g and g + 8 at 16t and 64 + 16t);
//   tiled : the same bytes laid out so that each chunk is 2 KB contiguous (a re-layout at load time).
// Next to a plain read kernel (grid-stride 16-byte loads) of the same bytes. Matrices are rotated through more
// than L2, so every launch reads DRAM. Prints a markdown table: us per launch and GB/s.
// Usage: bench_read_pattern [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "read_stream_common.cuh"

namespace {

using namespace dsv4::bench;

constexpr int kWarps = 8;  // per block, as the GEMV's default

template <int STAGES, bool TILED>
__global__ void __launch_bounds__(kWarps * 32) ring_read_kernel(const uint8_t* __restrict__ w, int64_t N, int64_t K,
                                                                int ks, uint32_t* sink) {
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + warp, tile = gw / ks, tiles = N / 16;
  if (tile >= tiles) return;
  const int split = static_cast<int>(gw % ks), C = static_cast<int>(K / 128);
  const int cb = static_cast<int>(int64_t(split) * C / ks), ce = static_cast<int>(int64_t(split + 1) * C / ks);
  const int n = ce - cb;
  uint4* mine = ring + warp * (STAGES * 128);
  auto issue = [&](int i) {
    const int64_t c = cb + i;
    uint4* slot = mine + (i % STAGES) * 128 + lane;  // piece p of the lanes at slot[32p .. 32p + 31], as stream.cuh
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint8_t* src;
      if constexpr (TILED) src = w + (tile * C + c) * 2048 + p * 512 + lane * 16;
      else src = w + (tile * 16 + g + 8 * (p >> 1)) * K + c * 128 + 16 * t + 64 * (p & 1);
      cp16(slot + 32 * p, src);
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n) issue(i);
    cp_commit();
  }
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    if (i + STAGES - 1 < n) issue(i + STAGES - 1);
    cp_commit();
    cp_wait<STAGES - 1>();
    const uint4* slot = mine + (i % STAGES) * 128 + lane;
#pragma unroll
    for (int p = 0; p < 4; ++p) acc ^= slot[32 * p].x ^ slot[32 * p].y ^ slot[32 * p].z ^ slot[32 * p].w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the reads; practically never true
}

__global__ void plain_read_kernel(const uint4* __restrict__ w, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(w + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

struct Shape {
  const char* name;
  int64_t N, K;
};

template <int STAGES, bool TILED>
void run_ring(cudaStream_t s, const Shape& sh, const std::vector<uint8_t*>& mats, uint32_t* sink, int sms, int reps,
              double plain_us) {
  const int smem = kWarps * STAGES * 2048;
  auto kernel = ring_read_kernel<STAGES, TILED>;
  ok(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
  int occ = 0;
  ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kWarps * 32, smem), "occupancy");
  // The GEMV's K split: the largest power of two (<= chunks) whose grid still fits one wave. Its register
  // bound gives the GEMV 2 blocks per SM; this kernel takes what its shared memory allows, at most 2.
  const int64_t tiles = sh.N / 16, C = sh.K / 128;
  const int per_sm = std::min(occ, 2);
  int ks = 1;
  while (ks * 2 <= C && (tiles * ks * 2 + kWarps - 1) / kWarps <= int64_t(per_sm) * sms) ks *= 2;
  const int blocks = static_cast<int>((tiles * ks + kWarps - 1) / kWarps);
  const double us = median_us(s, reps, 20, [&](int i) {
    kernel<<<blocks, kWarps * 32, smem, s>>>(mats[i % mats.size()], sh.N, sh.K, ks, sink);
  });
  ok(cudaGetLastError(), "ring_read_kernel");
  const double bytes = double(sh.N) * double(sh.K);
  std::printf("| %s [%lld x %lld] | %s | %d | %d | %d x %d | %.2f | %.0f | %.2f |\n", sh.name, (long long)sh.N,
              (long long)sh.K, TILED ? "tiled" : "rows", STAGES, ks, blocks, kWarps, us, bytes / us * 1e-3,
              plain_us / us);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 5 : 15;
  const StreamBench dev;
  const int sms = dev.sms;
  const cudaDeviceProp& prop = dev.prop;
  cudaStream_t s = dev.s;
  uint32_t* sink = dev.sink;
  // V4-Flash's FP8 GEMVs on the batch-1 chain (wq_b, wo_a per group x 8, wo_b) and two smaller ones.
  const Shape shapes[] = {{"wq_b", 32768, 1024}, {"wo_b", 4096, 8192}, {"square", 4096, 4096},
                          {"wq_a+wkv", 1536, 4096}, {"shared w2", 4096, 2048}};
  std::printf("%s, %d SMs, L2 %d MB\n\n", prop.name, sms, prop.l2CacheSize >> 20);
  std::printf("| matrix | layout | stages | K split | blocks x warps | us | GB/s | plain read / this |\n");
  std::printf("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  for (const Shape& sh : shapes) {
    const size_t bytes = size_t(sh.N) * size_t(sh.K);
    const size_t copies = std::max<size_t>(2, (size_t(prop.l2CacheSize) * 6 + bytes - 1) / bytes);
    std::vector<uint8_t*> mats(copies);
    for (auto& m : mats) {
      ok(cudaMalloc(&m, bytes), "matrix");
      ok(cudaMemset(m, 0x3C, bytes), "fill");
    }
    const double plain_us = median_us(s, reps, 20, [&](int i) {
      plain_read_kernel<<<sms * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(mats[i % copies]), int64_t(bytes / 16),
                                                sink);
    });
    std::printf("| %s [%lld x %lld] | plain read | - | - | %d x 8 | %.2f | %.0f | 1.00 |\n", sh.name, (long long)sh.N,
                (long long)sh.K, sms * 8, plain_us, double(bytes) / plain_us * 1e-3);
    run_ring<4, false>(s, sh, mats, sink, sms, reps, plain_us);
    run_ring<4, true>(s, sh, mats, sink, sms, reps, plain_us);
    run_ring<6, false>(s, sh, mats, sink, sms, reps, plain_us);
    run_ring<6, true>(s, sh, mats, sink, sms, reps, plain_us);
    run_ring<8, false>(s, sh, mats, sink, sms, reps, plain_us);
    run_ring<8, true>(s, sh, mats, sink, sms, reps, plain_us);
    for (auto m : mats) cudaFree(m);
  }
  return 0;
}
