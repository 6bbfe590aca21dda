// Benchmarks of the decode GEMV, the MXFP4 MoE decode and the prefill GEMM against the bandwidth floor
// (bytes that must be read / the device-to-device copy bandwidth measured in the same run) and against
// cuBLAS bf16. Prints a markdown table. Usage: bench_cuda_linear [--quick | --diag | --moe-nt | --f16-ab | --profile]
// (--diag: DRAM vs L2-resident rows of the batch-1 kernels and the lean MoE kernels; --moe-nt: the MoE decode
// rows with the n-tile count capped at 8, 4, 2, 1 (cudalin::set_moe_max_ntiles) and split by expert load).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/linear/linear_cuda.h"
#include "../cuda_bench_util.h"
#include "read_stream_common.cuh"  // median_us

using namespace dsv4;

namespace {

using dsv4::bench::ok;

// Random bytes on the device (hash of the index); FP8 NaN codes replaced, scale bytes kept in [lo, lo+7].
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed, int mode, int lo) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA6Bu;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    uint8_t b = uint8_t(h);
    if (mode == 1 && (b & 0x7F) == 0x7F) b = 0x7E;  // e4m3
    if (mode == 2) b = uint8_t(lo + (h & 7));       // ue8m0 scale
    p[i] = b;
  }
}
void fill(uint8_t* p, size_t n, uint32_t seed, int mode, int lo = 0) {
  fill_kernel<<<2048, 256>>>(p, n, seed, mode, lo);
  ok(cudaGetLastError(), "fill");
}

cudaStream_t g_s = nullptr;  // every timed launch goes to this stream (graph capture needs a non-legacy stream)

struct Timer {
  cudaEvent_t a, b;
  Timer() { cudaEventCreate(&a), cudaEventCreate(&b); }
  template <typename F>
  double median_us(int reps, int inner, F&& f) {  // median over reps of (time of `inner` calls) / inner
    return dsv4::bench::median_us(g_s, reps, inner, f);
  }
  // The same `inner` calls captured once in a CUDA graph, replayed: kernel time without CPU launch gaps.
  // -1 when capture fails.
  template <typename F>
  double median_graph_us(int reps, int inner, F&& f) {
    f(0);
    ok(cudaDeviceSynchronize(), "warmup");
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (cudaStreamBeginCapture(g_s, cudaStreamCaptureModeRelaxed) != cudaSuccess) return -1;
    try {
      for (int i = 0; i < inner; ++i) f(i);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "graph capture: %s\n", e.what());
    }
    if (cudaStreamEndCapture(g_s, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
      cudaGetLastError();
      if (g) cudaGraphDestroy(g);
      return -1;
    }
    std::vector<double> v;
    ok(cudaGraphLaunch(ge, g_s), "graph warmup");
    ok(cudaStreamSynchronize(g_s), "graph warmup");
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(a, g_s);
      cudaGraphLaunch(ge, g_s);
      cudaEventRecord(b, g_s);
      ok(cudaEventSynchronize(b), "graph timing");
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      v.push_back(1e3 * ms / inner);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

struct Row {
  std::string what;
  double v1_us, us, graph_us, bytes, floor_us, peer_us;  // us: current kernels, back-to-back launches
  double nopdl_us = -1;  // v2 in a graph without programmatic dependent launch
};
std::vector<Row> rows_out;
double g_copy_bw = 0;  // bytes/s

void print_rows() {
  std::printf("\n| case | v1 launches (us) | v2 launches (us) | v2 graph (us) | v2 graph, no PDL (us) | floor (us) | "
              "%% floor launches | %% floor graph | GB/s graph | peer (us) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  auto f = [](double v) { return v > 0 ? std::to_string(v).substr(0, 6) : std::string("-"); };
  for (const Row& r : rows_out)
    std::printf("| %s | %s | %s | %s | %s | %.2f | %.0f%% | %s | %s | %s |\n", r.what.c_str(), f(r.v1_us).c_str(), f(r.us).c_str(),
                f(r.graph_us).c_str(), f(r.nopdl_us).c_str(), r.floor_us, 100.0 * r.floor_us / r.us,
                r.graph_us > 0 ? (std::to_string(int(100.0 * r.floor_us / r.graph_us + 0.5)) + "%").c_str() : "-",
                r.graph_us > 0 ? std::to_string(int(r.bytes / r.graph_us * 1e-3)).c_str() : "-", f(r.peer_us).c_str());
}

// Times f: v1 kernels with launches, v2 with launches, v2 in a graph, v2 in a graph without PDL (the last
// into g_nopdl); v1 skipped when !with_v1.
double g_nopdl = -1;
template <typename F>
void time3(Timer& t, int reps, int inner, bool with_v1, F&& f, double& v1, double& v2, double& gr) {
  v1 = -1;
  if (with_v1) {
    cudalin::set_linear_kernel_version(1);
    v1 = t.median_us(reps, inner, f);
    cudalin::set_linear_kernel_version(2);
  }
  v2 = t.median_us(reps, inner, f);
  gr = t.median_graph_us(reps, inner, f);
  cudalin::set_linear_pdl(false);
  g_nopdl = t.median_graph_us(reps, inner, f);
  cudalin::set_linear_pdl(true);
}

void bench_copy() {
  const size_t n = size_t(1) << 30;
  void *a, *b;
  ok(cudaMalloc(&a, n), "malloc"), ok(cudaMalloc(&b, n), "malloc");
  fill(static_cast<uint8_t*>(a), n, 1, 0);
  Timer t;
  const double us = t.median_us(10, 1, [&](int) { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_s); });
  g_copy_bw = 2.0 * n / (us * 1e-6);
  std::printf("copy bandwidth (read+write of 1 GiB D2D): %.0f GB/s\n", g_copy_bw * 1e-9);
  cudaFree(a), cudaFree(b);
}

cudalin::ActFormat g_act = cudalin::ActFormat::kBf16;  // activations of the FP8 GEMV rows (--f16-ab)
std::string g_moe_tag;  // appended to the MoE rows' names (--diag: which lean kernels)

// resident: one weight, read again by every call, so it stays in L2 (what the kernel costs without DRAM).
void bench_gemv(bool fp4, int64_t N, int64_t K, const std::vector<int>& Ts, bool quick, bool peer_and_v1 = true,
                const std::string& tag = "", bool resident = false) {
  const size_t wbytes = fp4 ? N * K / 2 : N * K, sbytes = fp4 ? N * K / 32 : ((N + 127) / 128) * ((K + 127) / 128);
  const int R = resident ? 1 : int(std::clamp<size_t>((size_t(400) << 20) / (wbytes + sbytes), 2, 64));  // > 6x L2
  const int inner = resident ? 16 : R;
  uint8_t *w, *s;
  ok(cudaMalloc(&w, wbytes * R), "malloc"), ok(cudaMalloc(&s, sbytes * R), "malloc");
  fill(w, wbytes * R, 7, fp4 ? 0 : 1);
  fill(s, sbytes * R, 9, 2, fp4 ? 118 : 112);
  uint16_t* x;
  float* y;
  ok(cudaMalloc(&x, 64 * K * 2), "malloc"), ok(cudaMalloc(&y, 64 * N * 4), "malloc");
  fill(reinterpret_cast<uint8_t*>(x), 64 * K * 2, 3, 0);
  // x: normal(0,1) values in bf16.
  std::vector<uint16_t> hx(64 * K);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : hx) {
    float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = uint16_t(u >> 16);
  }
  ok(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "x");
  cudalin::Workspace ws = cudalin::workspace_create();
  // bf16 peer: cuBLAS on a bf16 copy of the same weight (2 bytes per weight), rotated the same way when it fits.
  const size_t bbytes = size_t(N) * K * 2;
  const int RB = int(std::clamp<size_t>((size_t(400) << 20) / bbytes, 2, 32));
  uint16_t* wb;
  ok(cudaMalloc(&wb, bbytes * RB), "malloc");
  for (int r = 0; r < (peer_and_v1 ? RB : 0); ++r)
    cudalin::dequant_to_bf16({fp4 ? WeightFormat::kFP4 : WeightFormat::kFP8Block, N, K, w + (r % R) * wbytes, s + (r % R) * sbytes, false},
                             wb + size_t(r) * N * K, nullptr);
  Timer t;
  for (int T : Ts) {
    double v1, us, gr;
    time3(t, quick ? 5 : 15, inner, peer_and_v1, [&](int i) {
      cudalin::DevWeight d{fp4 ? WeightFormat::kFP4 : WeightFormat::kFP8Block, N, K, w + (i % R) * wbytes, s + (i % R) * sbytes, false};
      cudalin::gemv(d, x, K, T, y, N, ws, g_s, fp4 ? cudalin::ActFormat::kBf16 : g_act);
    }, v1, us, gr);
    const double peer = peer_and_v1 ? t.median_us(quick ? 5 : 15, RB, [&](int i) {
      cudalin::gemm_bf16(x, T, wb + size_t(i) * N * K, N, K, y, g_s);
    }) : -1;
    const double bytes = double(wbytes + sbytes) + 2.0 * T * K + 4.0 * T * N;
    char name[160];
    std::snprintf(name, sizeof name, "gemv %s [%lld x %lld] T=%d%s", fp4 ? "MXFP4" : "FP8", (long long)N, (long long)K, T,
                  tag.c_str());
    rows_out.push_back({name, v1, us, gr, bytes, bytes / g_copy_bw * 1e6, peer, g_nopdl});
    std::printf("%s: v1 %.2f us, v2 %.2f us, v2 graph %.2f us (%.0f GB/s), no PDL %.2f us, cuBLAS bf16 %.2f us\n", name,
                v1, us, gr, bytes / gr * 1e-3, g_nopdl, peer);
  }
  ok(cudaDeviceSynchronize(), "gemv bench");
  cudalin::workspace_destroy(ws);
  cudaFree(w), cudaFree(s), cudaFree(x), cudaFree(y), cudaFree(wb);
}

// alias: every expert id points at expert 0's weights (13 MB, L2-resident): the kernels' cost without DRAM.
void bench_moe(bool quick, bool sweep = false, bool alias = false) {
  cudalin::MoeShape sh;  // V4-Flash: hidden 4096, inter 2048, 256 experts, top-6, clamp 10
  const size_t w13 = size_t(sh.inter) * sh.hidden / 2, s13 = size_t(sh.inter) * sh.hidden / 32;
  const size_t w2 = size_t(sh.hidden) * sh.inter / 2, s2 = size_t(sh.hidden) * sh.inter / 32;
  const size_t per = 2 * (w13 + s13) + w2 + s2;
  uint8_t* base;
  ok(cudaMalloc(&base, per * sh.n_experts), "malloc experts");
  fill(base, per * sh.n_experts, 11, 0);
  std::vector<cudalin::DevExpert> ex(sh.n_experts);
  for (int e = 0; e < sh.n_experts; ++e) {
    uint8_t* p = base + per * e;
    ex[e] = {p, p + w13, p + w13 + s13, p + 2 * w13 + s13, p + 2 * (w13 + s13), p + 2 * (w13 + s13) + w2};
    fill(p + w13, s13, 12 + e, 2, 118), fill(p + 2 * w13 + s13, s13, 13 + e, 2, 118), fill(p + 2 * (w13 + s13) + w2, s2, 14 + e, 2, 118);
  }
  if (alias)
    for (auto& e : ex) e = ex[0];
  cudalin::DevExpert* dex;
  ok(cudaMalloc(&dex, ex.size() * sizeof(ex[0])), "malloc"), ok(cudaMemcpy(dex, ex.data(), ex.size() * sizeof(ex[0]), cudaMemcpyHostToDevice), "ex");
  uint16_t* x;
  float *w, *out;
  ok(cudaMalloc(&x, 64 * sh.hidden * 2), "malloc"), ok(cudaMalloc(&w, 64 * 6 * 4), "malloc"), ok(cudaMalloc(&out, 64 * sh.hidden * 4), "malloc");
  std::vector<uint16_t> hx(64 * sh.hidden, 0x3F80);  // 1.0
  std::mt19937 rng(3);
  for (auto& v : hx) v = uint16_t(0x3F00 + (rng() & 0xFF)) ^ uint16_t((rng() & 1) << 15);
  ok(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "x");
  std::vector<float> hw(64 * 6, 0.25f);
  ok(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "w");
  cudalin::MoeWorkspace ws = cudalin::moe_workspace_create(sh, 64);
  const int R = 16;  // routing tables rotated so the experts' 3.4 GB, not L2, is what is read
  int32_t* idx;
  ok(cudaMalloc(&idx, size_t(R) * 64 * 6 * 4), "malloc");
  for (int mode = 0; mode < 2; ++mode)
    for (int T : {1, 4, 16, 64}) {
      if (mode == 1 && T == 1) continue;
      if (sweep && (mode == 1 || T > 4)) continue;
      std::vector<int32_t> h(size_t(R) * T * 6);
      double uniq = 0;
      for (int r = 0; r < R; ++r) {
        std::set<int> u;
        std::vector<int> shared(6);
        for (int k = 0; k < 6; ++k) shared[k] = (r * 37 + k * 41) % 256;
        for (int t = 0; t < T; ++t) {
          std::vector<int> perm(256);
          for (int e = 0; e < 256; ++e) perm[e] = e;
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int k = 0; k < 6; ++k) h[(size_t(r) * T + t) * 6 + k] = mode == 0 ? perm[k] : shared[k], u.insert(h[(size_t(r) * T + t) * 6 + k]);
        }
        uniq += double(u.size()) / R;
      }
      ok(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "idx");
      Timer t;
      const int maxks = sweep ? 8 : 0;
      for (int ks = sweep ? 1 : 0; ks <= maxks; ks = ks ? 2 * ks : 1) {
        cudalin::set_moe_ksplit(ks);
        double v1, us, gr;
        time3(t, quick ? 5 : 15, R, !sweep && g_act == cudalin::ActFormat::kBf16, [&](int i) {  // v1: bf16 only
          cudalin::moe_decode(sh, dex, x, idx + size_t(i) * T * 6, w, T, out, false, ws, g_s, g_act);
        }, v1, us, gr);
        const double bytes = uniq * per + T * sh.hidden * 2.0 + T * sh.hidden * 4.0;
        char name[160];
        std::snprintf(name, sizeof name, "moe MXFP4 T=%d %s (%.1f experts)%s%s", T, mode == 0 ? "random top-6" : "same 6 experts",
                      uniq, sweep ? (" ks=" + std::to_string(ks)).c_str() : "",
                      (std::string(g_act == cudalin::ActFormat::kF16 ? " f16" : "") + (alias ? " L2-resident" : "") +
                       g_moe_tag).c_str());
        rows_out.push_back({name, v1, us, gr, bytes, bytes / g_copy_bw * 1e6, -1, g_nopdl});
        std::printf("%s: v1 %.2f us, v2 %.2f us, v2 graph %.2f us (%.0f GB/s), no PDL %.2f us\n", name, v1, us, gr,
                    bytes / gr * 1e-3, g_nopdl);
        if (!sweep) break;
      }
      cudalin::set_moe_ksplit(0);
    }
  ok(cudaDeviceSynchronize(), "moe bench");
  cudalin::moe_workspace_destroy(ws);
  cudaFree(base), cudaFree(dex), cudaFree(x), cudaFree(w), cudaFree(out), cudaFree(idx);
}

void bench_prefill(bool fp4, int64_t M, int64_t N, int64_t K) {
  const size_t wbytes = fp4 ? N * K / 2 : N * K, sbytes = fp4 ? N * K / 32 : ((N + 127) / 128) * ((K + 127) / 128);
  uint8_t *w, *s;
  uint16_t *wb, *x;
  float* y;
  ok(cudaMalloc(&w, wbytes), "m"), ok(cudaMalloc(&s, sbytes), "m"), ok(cudaMalloc(&wb, N * K * 2), "m");
  ok(cudaMalloc(&x, M * K * 2), "m"), ok(cudaMalloc(&y, M * N * 4), "m");
  fill(w, wbytes, 21, fp4 ? 0 : 1), fill(s, sbytes, 22, 2, 118);
  cudalin::DevWeight d{fp4 ? WeightFormat::kFP4 : WeightFormat::kFP8Block, N, K, w, s, false};
  cudalin::dequant_to_bf16(d, wb, nullptr);
  std::vector<uint16_t> hx(M * K);
  std::mt19937 rng(1);
  for (auto& v : hx) v = uint16_t(0x3F00 + (rng() & 0xFF)) ^ uint16_t((rng() & 1) << 15);
  ok(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "x");
  Timer t;
  const double deq = t.median_us(10, 5, [&](int) { cudalin::dequant_to_bf16(d, wb, g_s); });
  const double gemm = t.median_us(10, 5, [&](int) { cudalin::gemm_bf16(x, M, wb, N, K, y, g_s); });
  const double flops = 2.0 * M * N * K;
  char name[160];
  std::snprintf(name, sizeof name, "prefill %s M=%lld [%lld x %lld]: dequant+bf16 GEMM = %.0f TFLOP/s", fp4 ? "MXFP4" : "FP8",
                (long long)M, (long long)N, (long long)K, flops / (deq + gemm) * 1e-6);
  rows_out.push_back({name, -1, deq + gemm, -1, double(wbytes + sbytes) + 2.0 * M * K + 4.0 * M * N,
                      (double(wbytes + sbytes) + 2.0 * M * K + 4.0 * M * N) / g_copy_bw * 1e6, gemm});
  std::printf("%s (dequant %.1f us, GEMM %.1f us = %.0f TFLOP/s)\n", name, deq, gemm, flops / gemm * 1e-6);
  ok(cudaDeviceSynchronize(), "prefill bench");
  cudaFree(w), cudaFree(s), cudaFree(wb), cudaFree(x), cudaFree(y);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp p;
  ok(cudaGetDeviceProperties(&p, 0), "props");
  std::printf("device: %s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
  ok(cudaStreamCreate(&g_s), "stream");
  if (argc > 1 && std::strcmp(argv[1], "--profile") == 0) {  // a few launches for ncu
    g_copy_bw = 4.2e12;
    g_act = cudalin::ActFormat::kF16;  // the engine's activations (the FP8 GEMV and the MoE kernels it runs)
    bench_gemv(false, 4096, 4096, {1}, true, false, " profile");
    bench_gemv(true, 2048, 4096, {1}, true, false, " profile");
    bench_moe(true, false);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--diag") == 0) {  // DRAM-read vs L2-resident cost of the batch-1 kernels
    bench_copy();
    g_act = cudalin::ActFormat::kF16;
    for (bool res : {false, true}) {
      const char* tag = res ? " f16 L2-resident" : " f16";
      bench_gemv(false, 4096, 4096, {1, 4}, true, false, tag, res);
      bench_gemv(false, 32768, 1024, {1}, true, false, tag, res);
      bench_gemv(false, 1536, 4096, {1}, true, false, tag, res);
    }
    // MoE rows: without the lean kernels, lean w2, lean w1/w3 and w2 (the default at one token); each for up
    // to 8 tokens, so the T = 4 rows show whether the lean kernels should reach further.
    const cudalin::MoeLean lean_default = cudalin::moe_lean();
    cudalin::set_moe_split({false});  // the rows of one kernel choice each
    const std::pair<cudalin::MoeLean, const char*> leans[] = {{{false, false, 0}, " lean off"},
                                                             {{false, true, 8}, " lean w2"},
                                                             {{true, true, 8}, " lean w13+w2"}};
    for (const auto& [lean, tag] : leans) {
      cudalin::set_moe_lean(lean);
      g_moe_tag = tag;
      for (bool alias : {false, true}) bench_moe(true, false, alias);
    }
    cudalin::set_moe_lean(lean_default);
    cudalin::set_moe_split({});
    g_moe_tag.clear();
    print_rows();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--moe-nt") == 0) {  // the MoE decode rows with the n-tile count capped
    bench_copy();
    g_act = cudalin::ActFormat::kF16;
    cudalin::set_moe_split({false});  // the cap rows without the split (the default up to 64 tokens)
    for (int nt : {8, 4, 2, 1}) {
      cudalin::set_moe_max_ntiles(nt);
      g_moe_tag = ", at most " + std::to_string(nt) + " n-tiles";
      bench_moe(true);
    }
    cudalin::set_moe_max_ntiles(2);  // the default
    for (int light : {1, 2}) {  // the split by expert load (set_moe_split), light 8 pairs above 8 tokens
      cudalin::set_moe_split({true, light, 64, 8, 8});
      g_moe_tag = ", split at " + std::to_string(light) + " pairs";
      bench_moe(true);
    }
    for (int wide : {16, 24}) {  // light above 8 tokens up to `wide` pairs
      cudalin::set_moe_split({true, 2, 64, wide, wide});
      g_moe_tag = ", split at 2 / " + std::to_string(wide) + " pairs";
      bench_moe(true);
    }
    cudalin::set_moe_split({true, 2, 64, 8, 16, 64});  // the default with lean light kernels above 8 tokens
    g_moe_tag = ", default split, lean light to 64 tokens";
    bench_moe(true);
    cudalin::set_moe_split({});  // the default (light 2 / 8 / 16 pairs)
    g_moe_tag = ", default split";
    bench_moe(true);
    g_moe_tag.clear();
    print_rows();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--f16-ab") == 0) {  // FP8 GEMVs of a V4-Flash layer: bf16 vs f16 activations
    bench_copy();
    const std::pair<int64_t, int64_t> shapes[] = {{1536, 4096}, {32768, 1024}, {8192, 1024}, {4096, 8192},
                                                  {4096, 4096}, {4096, 2048}};
    for (const auto& [n, k] : shapes)
      for (auto act : {cudalin::ActFormat::kBf16, cudalin::ActFormat::kF16}) {
        g_act = act;
        bench_gemv(false, n, k, {1, 4, 16}, true, false, act == cudalin::ActFormat::kF16 ? " f16" : " bf16");
      }
    for (auto act : {cudalin::ActFormat::kBf16, cudalin::ActFormat::kF16}) {  // MoE decode (scales 2^-9: f16 exact)
      g_act = act;
      bench_moe(true);
    }
    print_rows();
    return 0;
  }
  try {
    bench_copy();
    const std::vector<int> Ts = {1, 4, 16, 64};
    bench_gemv(false, 4096, 4096, Ts, quick);
    bench_gemv(false, 1024, 4096, Ts, quick);   // wq_a
    bench_gemv(false, 4096, 8192, {1, 16}, quick);  // wo_b
    bench_gemv(false, 32768, 1024, {1, 16}, quick);  // wq_b
    bench_gemv(true, 2048, 4096, Ts, quick);    // expert w1 / w3
    bench_gemv(true, 4096, 2048, Ts, quick);    // expert w2
    // Sweep of the v2 K-split knob at batch 1 (graph timing is the number to read; 'auto' rows are above).
    for (int ks : {1, 2, 4, 8, 16, 32}) {
      cudalin::set_gemv_ksplit(ks);
      const std::string tag = " ks=" + std::to_string(ks);
      bench_gemv(false, 4096, 4096, {1}, true, false, tag);
      bench_gemv(false, 1024, 4096, {1}, true, false, tag);
      bench_gemv(true, 2048, 4096, {1}, true, false, tag);
      bench_gemv(true, 4096, 2048, {1}, true, false, tag);
    }
    cudalin::set_gemv_ksplit(0);
    bench_moe(quick);
    bench_moe(true, true);
    bench_prefill(false, 4096, 4096, 4096);
    bench_prefill(false, 8192, 4096, 8192);
    bench_prefill(true, 4096, 2048, 4096);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench failed: %s\n", e.what());
    print_rows();
    return 1;
  }
  print_rows();
  return 0;
}
