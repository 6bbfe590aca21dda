// MXFP4 MoE prefill (cudalin::moe_prefill) at V4-Flash shapes (hidden 4096, inter 2048, 256 experts, top-6)
// with uniform random routing, against a bf16 cuBLAS batched GEMM of the same shapes run in the same process:
// cublasGemmStridedBatchedEx over all 256 experts with M = T*6/256 rows each, w1|w3 as one [4096, 4096]
// GEMM (bf16 out) then w2 [4096, 2048] (fp32 out) -- the same FLOPs as ours (6 * T*top_k * hidden * inter),
// with every expert exactly equally loaded (the best case for the peer) and its weights already bf16.
// Ours includes everything: permutation, both GEMMs with in-kernel dequantization, SwiGLU, combine; in bf16
// (moe_prefill on bf16 x) and in f16 (moe_prefill_f16 on fp32 x, its f16 cast included).
// Usage: bench_cuda_moe_prefill [--quick | --profile T]
//   --profile T: one bf16 and one f16 call at T tokens (heuristic tile width) and nothing else, for a profiler.
// DSV4_MOE_MIXED_TILES=0 / 1 in the environment: cudalin::set_moe_prefill_mixed_tiles (kernel 3 at tiles of 64
// runs each expert's last 1..32 rows at tile 32; on by default since run 167).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/linear/linear_cuda.h"
#include "../cuda_bench_util.h"

using namespace dsv4;

namespace {

using dsv4::bench::ok;
void okb(cublasStatus_t s, const char* w) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", w, int(s));
    std::exit(1);
  }
}

__device__ uint32_t hash32(size_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA6Bu;
  h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
  return h;
}
// mode 0: random bytes (packed e2m1); mode 1: UE8M0 scale bytes in [lo, lo+3]
__global__ void fill_u8(uint8_t* p, size_t n, uint32_t seed, int mode, int lo) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i, seed);
    p[i] = mode == 0 ? uint8_t(h) : uint8_t(lo + (h & 3));
  }
}
// bf16 uniform in [-amp, amp)
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = (hash32(i, seed) >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(u * amp));
  }
}

// fp32 uniform in [-amp, amp)
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = ((hash32(i, seed) >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f) * amp;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { cudaEventCreate(&a), cudaEventCreate(&b); }
  template <typename F>
  double median_us(int reps, F&& f) {
    std::vector<double> v;
    f();
    ok(cudaDeviceSynchronize(), "warmup");
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(a);
      f();
      cudaEventRecord(b);
      ok(cudaEventSynchronize(b), "timing");
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      v.push_back(1e3 * ms);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int profile_T = argc > 2 && std::strcmp(argv[1], "--profile") == 0 ? std::atoi(argv[2]) : 0;
  if (const char* m = std::getenv("DSV4_MOE_MIXED_TILES"); m && (*m == '0' || *m == '1')) {
    cudalin::set_moe_prefill_mixed_tiles(*m == '1');
    std::printf("mixed tiles %s (DSV4_MOE_MIXED_TILES=%s)\n", *m == '1' ? "on" : "off", m);
  }
  cudalin::MoeShape s;  // V4-Flash defaults: 4096, 2048, 256, 6, limit 10
  const int H = s.hidden, I = s.inter, E = s.n_experts, K = s.top_k;
  const int reps = quick ? 3 : 10;
  std::vector<int> Ts = {512, 2048, 8192};
  if (profile_T > 0 && profile_T <= 8192) Ts = {profile_T};
  const int maxT = 8192;

  // MXFP4 experts in one allocation.
  const size_t w13 = size_t(I) * H / 2, s13 = size_t(I) * H / 32, w2b = size_t(H) * I / 2, s2b = size_t(H) * I / 32;
  const size_t per = 2 * (w13 + s13) + w2b + s2b;
  uint8_t* wbuf;
  ok(cudaMalloc(&wbuf, per * E), "weights");
  std::vector<cudalin::DevExpert> hx(E);
  for (int e = 0; e < E; ++e) {
    uint8_t* b = wbuf + per * e;
    uint8_t *w1 = b, *sc1 = w1 + w13, *w3 = sc1 + s13, *sc3 = w3 + w13, *w2 = sc3 + s13, *sc2 = w2 + w2b;
    fill_u8<<<1024, 256>>>(w1, w13, 11 + e, 0, 0), fill_u8<<<1024, 256>>>(w3, w13, 12 + 7 * e, 0, 0);
    fill_u8<<<1024, 256>>>(w2, w2b, 13 + 5 * e, 0, 0);
    fill_u8<<<256, 256>>>(sc1, s13, 14 + e, 1, 116), fill_u8<<<256, 256>>>(sc3, s13, 15 + e, 1, 116);
    fill_u8<<<256, 256>>>(sc2, s2b, 16 + e, 1, 116);
    hx[e] = {w1, sc1, w3, sc3, w2, sc2};
  }
  ok(cudaGetLastError(), "fill");
  cudalin::DevExpert* dex;
  ok(cudaMalloc(&dex, sizeof(cudalin::DevExpert) * E), "experts");
  ok(cudaMemcpy(dex, hx.data(), sizeof(cudalin::DevExpert) * E, cudaMemcpyHostToDevice), "experts up");

  uint16_t* x;
  int32_t* didx;
  float *dw, *out, *x32;
  ok(cudaMalloc(&x, size_t(maxT) * H * 2), "x");
  ok(cudaMalloc(&x32, size_t(maxT) * H * 4), "x32");
  fill_f32<<<2048, 256>>>(x32, size_t(maxT) * H, 98, 1.f);
  ok(cudaMalloc(&didx, size_t(maxT) * K * 4), "idx");
  ok(cudaMalloc(&dw, size_t(maxT) * K * 4), "w");
  ok(cudaMalloc(&out, size_t(maxT) * H * 4), "out");
  fill_bf16<<<2048, 256>>>(x, size_t(maxT) * H, 99, 1.f);
  cudalin::MoePrefillWorkspace ws = cudalin::moe_prefill_workspace_create(s, maxT);

  // bf16 peer: W13 [E][2I][H], W2 [E][H][I], activations [E][M][H], h [E][M][2I] (bf16), y [E][M][H] fp32.
  uint16_t *pw13, *pw2, *px, *ph;
  float* py;
  const size_t Mmax = size_t(maxT) * K / E;
  ok(cudaMalloc(&pw13, size_t(E) * 2 * I * H * 2), "peer w13");
  ok(cudaMalloc(&pw2, size_t(E) * H * I * 2), "peer w2");
  ok(cudaMalloc(&px, size_t(E) * Mmax * H * 2), "peer x");
  ok(cudaMalloc(&ph, size_t(E) * Mmax * 2 * I * 2), "peer h");
  ok(cudaMalloc(&py, size_t(E) * Mmax * H * 4), "peer y");
  fill_bf16<<<4096, 256>>>(pw13, size_t(E) * 2 * I * H, 5, 0.05f);
  fill_bf16<<<4096, 256>>>(pw2, size_t(E) * H * I, 6, 0.05f);
  fill_bf16<<<4096, 256>>>(px, size_t(E) * Mmax * H, 7, 1.f);
  fill_bf16<<<4096, 256>>>(ph, size_t(E) * Mmax * 2 * I, 8, 1.f);
  ok(cudaDeviceSynchronize(), "init");
  cublasHandle_t hb;
  okb(cublasCreate(&hb), "cublasCreate");

  // Copy bandwidth (read + write) for the weight-read floor.
  double copy_bw;
  {
    const size_t n = size_t(1) << 30;
    void *a, *b;
    ok(cudaMalloc(&a, n), "copy a"), ok(cudaMalloc(&b, n), "copy b");
    Timer tm;
    const double us = tm.median_us(reps, [&] { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice); });
    copy_bw = 2.0 * n / (us * 1e-6);
    cudaFree(a), cudaFree(b);
    std::printf("copy bandwidth (D2D, read+write): %.0f GB/s\n", copy_bw * 1e-9);
  }

  std::mt19937_64 rng(1234);
  Timer tm;
  struct Row {
    int T, M;
    double ours, peer, peer1, peer2, sweep[3], sweep1[3];  // sweep1: pipeline 1 (cp.async ring)
    double f16, sweep16[3];                                 // moe_prefill_f16
    double k2, k2f16, sweep2f16[3];                         // GEMM kernel 2: bf16, f16 (heuristic), f16 per tile
    double k3, k3f16, sweep3f16[3];                         // GEMM kernel 3 (wgmma)
    double def, def16;                                      // the default kernel choice (by tile width)
  };
  std::vector<Row> rows;
  for (int T : Ts) {
    // Uniform random routing, top-6 distinct experts per token, weights 1/6.
    std::vector<int32_t> idx(size_t(T) * K);
    std::vector<int32_t> pe(E);
    for (int t = 0; t < T; ++t) {
      std::iota(pe.begin(), pe.end(), 0);
      for (int k = 0; k < K; ++k) {
        std::uniform_int_distribution<int> pick(k, E - 1);
        std::swap(pe[k], pe[pick(rng)]);
        idx[size_t(t) * K + k] = pe[k];
      }
    }
    std::vector<float> wts(idx.size(), 1.0f / K);
    ok(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), "idx up");
    ok(cudaMemcpy(dw, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice), "w up");
    Row r{};
    r.T = T, r.M = T * K / E;
    if (profile_T) {
      for (int kernel : {1, 2, 3}) {
        cudalin::set_moe_prefill_kernel(kernel);
        cudalin::moe_prefill(s, dex, x, didx, dw, T, out, false, ws, nullptr);
        cudalin::moe_prefill_f16(s, dex, x32, didx, dw, T, out, false, ws, nullptr);
      }
      ok(cudaDeviceSynchronize(), "profile calls");
      std::printf("profiled T=%d: one bf16 and one f16 call with each GEMM kernel\n", T);
      return 0;
    }
    auto f16 = [&] { cudalin::moe_prefill_f16(s, dex, x32, didx, dw, T, out, false, ws, nullptr); };
    auto bf16 = [&] { cudalin::moe_prefill(s, dex, x, didx, dw, T, out, false, ws, nullptr); };
    cudalin::set_moe_prefill_kernel(1);  // the kernel 1 rows first, then kernels 2 and 3, then the default
    r.ours = tm.median_us(reps, bf16);
    const int tn[3] = {32, 64, 128};
    for (int i = 0; i < 3; ++i) {
      cudalin::set_moe_prefill_tile_n(tn[i]);
      r.sweep[i] = tm.median_us(reps, bf16);
    }
    cudalin::set_moe_prefill_pipeline(1);
    for (int i = 0; i < 3; ++i) {
      cudalin::set_moe_prefill_tile_n(tn[i]);
      r.sweep1[i] = tm.median_us(reps, bf16);
    }
    cudalin::set_moe_prefill_pipeline(0);
    // The current kernel in f16 at each tile width and by heuristic, then in bf16 by heuristic.
    auto sweep = [&](double (&per_tile)[3], double& f16_us, double* bf16_us) {
      for (int i = 0; i < 3; ++i) {
        cudalin::set_moe_prefill_tile_n(tn[i]);
        per_tile[i] = tm.median_us(reps, f16);
      }
      cudalin::set_moe_prefill_tile_n(0);
      f16_us = tm.median_us(reps, f16);
      if (bf16_us) *bf16_us = tm.median_us(reps, bf16);
    };
    sweep(r.sweep16, r.f16, nullptr);  // kernel 1
    cudalin::set_moe_prefill_kernel(2);
    sweep(r.sweep2f16, r.k2f16, &r.k2);
    cudalin::set_moe_prefill_kernel(3);
    sweep(r.sweep3f16, r.k3f16, &r.k3);
    cudalin::set_moe_prefill_kernel(0);
    r.def = tm.median_us(reps, bf16);
    r.def16 = tm.median_us(reps, f16);
    ok(cudaGetLastError(), "ours");

    const int M = r.M;
    const float one = 1.f, zero = 0.f;
    auto g1 = [&] {
      okb(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, M, H, &one, pw13, CUDA_R_16BF, H,
                                     (long long)2 * I * H, px, CUDA_R_16BF, H, (long long)M * H, &zero, ph, CUDA_R_16BF,
                                     2 * I, (long long)M * 2 * I, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "peer gemm1");
    };
    auto g2 = [&] {
      okb(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, H, M, I, &one, pw2, CUDA_R_16BF, I, (long long)H * I,
                                     ph, CUDA_R_16BF, 2 * I, (long long)M * 2 * I, &zero, py, CUDA_R_32F, H,
                                     (long long)M * H, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "peer gemm2");
    };
    r.peer1 = tm.median_us(reps, g1);
    r.peer2 = tm.median_us(reps, g2);
    r.peer = tm.median_us(reps, [&] { g1(), g2(); });
    rows.push_back(r);
    std::printf("T=%d done: ours %.1f us (f16 %.1f), peer %.1f us\n", T, r.ours, r.f16, r.peer);
    std::fflush(stdout);
  }

  const double fp4_bytes = double(per) * E, bf16_bytes = double(E) * 3 * I * H * 2;
  std::printf("\nMoE prefill, V4-Flash (hidden %d, inter %d, %d experts, top-%d), uniform random routing; FLOPs = "
              "6 * T*top_k * hidden * inter; weight-read floor = MXFP4 bytes of all experts (%.2f GB) / copy bw\n",
              H, I, E, K, fp4_bytes * 1e-9);
  std::printf("Kernel 1 (set_moe_prefill_kernel(1)), bf16:\n| T | rows/expert | ours (us) | ours TFLOP/s | cuBLAS bf16 batched (us) | cuBLAS TFLOP/s | ours/cuBLAS "
              "speed | weight floor ours / bf16 (us) | tile 32 / 64 / 128 (us) | pipeline 1: tile 32 / 64 / 128 (us) | "
              "cuBLAS w13 / w2 (us) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string f16_rows, k2_rows, k3_rows, def_rows;
  for (const Row& r : rows) {
    const double flops = 6.0 * r.T * K * double(H) * I;
    std::printf("| %d | %d | %.1f | %.0f | %.1f | %.0f | %.2fx | %.0f / %.0f | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f "
                "| %.1f / %.1f |\n", r.T, r.M, r.ours, flops / r.ours * 1e-6, r.peer, flops / r.peer * 1e-6,
                r.peer / r.ours, fp4_bytes / copy_bw * 1e6, bf16_bytes / copy_bw * 1e6, r.sweep[0], r.sweep[1],
                r.sweep[2], r.sweep1[0], r.sweep1[1], r.sweep1[2], r.peer1, r.peer2);
    char line[256];
    std::snprintf(line, sizeof line, "| %d | %.1f | %.1f | %.0f | %.2fx | %.2fx | %.1f / %.1f / %.1f |\n", r.T, r.ours,
                  r.f16, flops / r.f16 * 1e-6, r.ours / r.f16, r.peer / r.f16, r.sweep16[0], r.sweep16[1], r.sweep16[2]);
    f16_rows += line;
    std::snprintf(line, sizeof line, "| %d | %.1f | %.1f | %.1f | %.0f | %.2fx | %.2fx | %.1f / %.1f / %.1f |\n", r.T,
                  r.f16, r.k2, r.k2f16, flops / r.k2f16 * 1e-6, r.f16 / r.k2f16, r.peer / r.k2f16, r.sweep2f16[0],
                  r.sweep2f16[1], r.sweep2f16[2]);
    k2_rows += line;
    std::snprintf(line, sizeof line, "| %d | %.1f | %.1f | %.1f | %.0f | %.2fx | %.2fx | %.1f / %.1f / %.1f |\n", r.T,
                  r.k2f16, r.k3, r.k3f16, flops / r.k3f16 * 1e-6, r.k2f16 / r.k3f16, r.peer / r.k3f16, r.sweep3f16[0],
                  r.sweep3f16[1], r.sweep3f16[2]);
    k3_rows += line;
    std::snprintf(line, sizeof line, "| %d | %.1f | %.1f | %.1f | %.0f | %.2fx | %.2fx |\n", r.T, r.ours, r.def, r.def16,
                  flops / r.def16 * 1e-6, r.ours / r.def16, r.peer / r.def16);
    def_rows += line;
  }
  std::printf("\nmoe_prefill_f16 (x fp32 -> f16 in the call, f16 weights and MMAs), same routes:\n| T | bf16 (us) | f16 (us) | "
              "f16 TFLOP/s | f16 speed-up | f16 / cuBLAS speed | f16 tile 32 / 64 / 128 (us) |\n"
              "|---|---|---|---|---|---|---|\n%s", f16_rows.c_str());
  std::printf("\nGEMM kernel 2 (set_moe_prefill_kernel(2): weights straight into MMA fragments), same routes:\n| T | "
              "kernel 1 f16 (us) | kernel 2 bf16 (us) | kernel 2 f16 (us) | kernel 2 f16 TFLOP/s | speed-up over kernel 1 "
              "f16 | / cuBLAS speed | kernel 2 f16 tile 32 / 64 / 128 (us) |\n|---|---|---|---|---|---|---|---|\n%s",
              k2_rows.c_str());
  std::printf("\nGEMM kernel 3 (set_moe_prefill_kernel(3): kernel 2 on wgmma, sm_90a), same routes:\n"
              "| T | kernel 2 f16 (us) | kernel 3 bf16 (us) | kernel 3 f16 (us) | kernel 3 f16 TFLOP/s | speed-up over "
              "kernel 2 f16 | / cuBLAS speed | kernel 3 f16 tile 32 / 64 / 128 (us) |\n|---|---|---|---|---|---|---|---|\n%s",
              k3_rows.c_str());
  std::printf("\nThe default (kernel 3 on compute capability 9.0, else kernel 2 for token tiles up to 64, kernel 1 at "
              "128); moe_prefill_f16 is the engine's path:\n"
              "| T | kernel 1 bf16 (us) | default bf16 (us) | default f16 (us) | f16 TFLOP/s | speed-up over kernel 1 bf16 "
              "| / cuBLAS speed |\n|---|---|---|---|---|---|---|\n%s", def_rows.c_str());
  cudalin::moe_prefill_workspace_destroy(ws);
  cublasDestroy(hb);
  return 0;
}
