// Benchmarks of the compressor and mHC kernels (docs/KERNELS.md, "Compressor and mHC"): CUDA events, median of
// 30 batches of 10 launches, inputs rotated over buffer sets totalling >= 256 MB (the H200 L2 is 50 MB), and
// the device copy bandwidth (cudaMemcpyAsync D2D, read + write bytes) measured in the same run.
// Prints "| kernel | case | us | GB/s | of copy bw |" rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/kernels_compressor_mhc.h"
#include "../cuda_bench_util.h"

using namespace dsv4::cuda;

namespace {

using dsv4::bench::ok;

template <typename T>
T* dalloc(size_t n) {
  T* p = nullptr;
  ok(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  ok(cudaMemset(p, 0, n * sizeof(T)), "memset");
  return p;
}

// Small deterministic values (no NaN) so the kernels do real work.
__global__ void fill_kernel(float* p, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = scale * (static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f);
}
float* dfloats(size_t n, float scale) {
  float* p = dalloc<float>(n);
  fill_kernel<<<1024, 256>>>(p, n, scale);
  ok(cudaGetLastError(), "fill");
  return p;
}

// Median over 30 batches of 10 launches of launch(i) (i rotates the input set), in microseconds per launch.
double time_us(const std::function<void(int)>& launch, int sets) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) launch(i % sets);
  ok(cudaDeviceSynchronize(), "warmup");
  std::vector<float> t;
  int k = 0;
  for (int r = 0; r < 30; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < 10; ++i) launch(k++ % sets);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 100.f);  // us per launch
  }
  ok(cudaGetLastError(), "bench launch");
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

int sets_for(double set_bytes) { return std::clamp(static_cast<int>(256e6 / set_bytes) + 1, 1, 16); }

double g_copy_gbs = 0;
std::vector<std::string> g_rows;
void report(const char* kernel, const std::string& cas, double us, double bytes) {
  const double gbs = bytes / us * 1e-3;
  char line[256];
  std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.0f | %.2f |", kernel, cas.c_str(), us, gbs, gbs / g_copy_gbs);
  std::printf("%s\n", line);
  std::fflush(stdout);
  g_rows.push_back(line);
}

void bench_copy() {
  const size_t n = size_t(1) << 30;
  char *src, *dst;
  ok(cudaMalloc(&src, n), "copy src");
  ok(cudaMalloc(&dst, n), "copy dst");
  const double us = time_us([&](int) { cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice); }, 1);
  g_copy_gbs = 2.0 * n / us * 1e-3;
  std::printf("copy bandwidth (read + write): %.0f GB/s\n", g_copy_gbs);
  cudaFree(src);
  cudaFree(dst);
}

// Prefill: one sequence of T tokens from position 0 (every block closes in the launch). Decode: n_seqs
// sequences, one token each, every one closing a block (the heaviest decode step).
void bench_compressor(int ratio, int head, bool decode, int n) {
  const int W = (ratio == 4 ? 2 : 1) * head;
  const int T = n;  // tokens: prefill T, decode one per sequence
  const int n_seqs = decode ? n : 1;
  const int rope = head == 512 ? 64 : 0, blk = head == 512 ? 64 : 128;
  const size_t rb = compressor_row_bytes(KvRowFormat::kFP8, head, rope, blk);
  const size_t stf = compressor_state_floats(ratio, head);
  const int64_t entries = decode ? n_seqs : T / ratio;
  // Bytes a perfect kernel moves: token rows (kv + gate) once, entries written, and for decode the state rows
  // the closing block reads (ratio - 1 open rows, plus prev half for overlap) and the prev half it writes.
  double bytes = 2.0 * T * W * 4 + entries * rb;
  if (decode) bytes += n_seqs * (2.0 * (ratio - 1) * W * 4 + (ratio == 4 ? 2 * 2.0 * ratio * head * 4 : 0));
  const double set_bytes = 2.0 * T * W * 4 + (decode ? n_seqs * stf * 4.0 : 0);
  const int sets = sets_for(set_bytes);
  std::vector<float*> kv(sets), gate(sets), state(sets);
  for (int s = 0; s < sets; ++s) {
    kv[s] = dfloats(size_t(T) * W, 1.f);
    gate[s] = dfloats(size_t(T) * W, 2.f);
    state[s] = dfloats(size_t(n_seqs) * stf, 1.f);
  }
  float* ape = dfloats(size_t(ratio) * W, 0.5f);
  float* norm = dfloats(head, 1.f);
  float* freq = dfloats(32, 0.01f);
  uint8_t* out = dalloc<uint8_t>(entries * rb + rb);
  std::vector<int32_t> first(n_seqs), cnt(n_seqs, decode ? 1 : T);
  std::vector<int64_t> start(n_seqs), of(n_seqs);
  for (int s = 0; s < n_seqs; ++s) {
    first[s] = decode ? s : 0;
    start[s] = decode ? int64_t(1000 + s) * ratio + ratio - 1 : 0;
    of[s] = decode ? s : 0;
  }
  int32_t *dfirst = dalloc<int32_t>(n_seqs), *dcnt = dalloc<int32_t>(n_seqs);
  int64_t *dstart = dalloc<int64_t>(n_seqs), *dof = dalloc<int64_t>(n_seqs);
  cudaMemcpy(dfirst, first.data(), n_seqs * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dcnt, cnt.data(), n_seqs * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dstart, start.data(), n_seqs * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(dof, of.data(), n_seqs * 8, cudaMemcpyHostToDevice);
  CompressorArgs a;
  a.ratio = ratio; a.head = head; a.row_stride = W; a.ape = ape; a.norm = norm; a.inv_freq = freq;
  a.n_seqs = n_seqs; a.seq_first = dfirst; a.seq_count = dcnt; a.seq_start = dstart; a.max_count = decode ? 1 : T;
  a.out = out; a.out_row_bytes = rb; a.out_first = dof; a.fp8_rope_dims = rope; a.fp8_scale_block = blk;
  const double us = time_us([&](int s) {
    a.kv = kv[s]; a.gate = gate[s]; a.state = state[s];
    compressor(a, nullptr);
  }, sets);
  std::string cas = "ratio=" + std::to_string(ratio) + " head=" + std::to_string(head) +
                    (decode ? " decode seqs=" : " prefill T=") + std::to_string(n) + " fp8";
  report("compressor", cas, us, bytes);
  for (int s = 0; s < sets; ++s) cudaFree(kv[s]), cudaFree(gate[s]), cudaFree(state[s]);
  cudaFree(ape); cudaFree(norm); cudaFree(freq); cudaFree(out);
  cudaFree(dfirst); cudaFree(dcnt); cudaFree(dstart); cudaFree(dof);
}

// The small inputs (base, scale), the outputs and the workspace of hc_pre / hc_head with `mix` mixes for T
// tokens of dim D, in an HcArgs whose h / fn (and prev_*) the caller sets; freed with it.
struct HcBuffers {
  float *base, *scale, *x, *post, *comb;
  void* ws;
  HcBuffers(int mix, int T, int64_t D)
      : base(dfloats(mix, 0.5f)), scale(dfloats(3, 1.f)), x(dalloc<float>(size_t(T) * D)),
        post(dalloc<float>(T * 4)), comb(dalloc<float>(T * 16)), ws(dalloc<uint8_t>(hc_workspace_bytes(T, D))) {}
  ~HcBuffers() { cudaFree(base); cudaFree(scale); cudaFree(x); cudaFree(post); cudaFree(comb); cudaFree(ws); }
  HcArgs args(int T, int64_t D) const {
    HcArgs a;
    a.n_tokens = T; a.dim = D; a.base = base; a.scale = scale; a.x = x; a.post = post; a.comb = comb; a.workspace = ws;
    return a;
  }
};

// hc_pre (head=false) or hc_head: bytes = h + fn + x (+ post, comb).
void bench_hc(bool head, int T, int64_t D) {
  const int mix = head ? 4 : 24;
  const double set_bytes = 4.0 * T * 4 * D + 4.0 * mix * 4 * D;
  const double bytes = set_bytes + 4.0 * T * D + (head ? 0 : 4.0 * T * 20);
  const int sets = sets_for(set_bytes);
  std::vector<float*> h(sets), fn(sets);
  for (int s = 0; s < sets; ++s) h[s] = dfloats(size_t(T) * 4 * D, 1.f), fn[s] = dfloats(size_t(mix) * 4 * D, 0.02f);
  const HcBuffers buf(mix, T, D);
  HcArgs a = buf.args(T, D);
  const double us = time_us([&](int s) {
    a.h = h[s]; a.fn = fn[s];
    if (head) hc_head(a, nullptr);
    else hc_pre(a, nullptr);
  }, sets);
  report(head ? "hc_head" : "hc_pre", "T=" + std::to_string(T) + " D=" + std::to_string(D), us, bytes);
  for (int s = 0; s < sets; ++s) cudaFree(h[s]), cudaFree(fn[s]);
}

// The previous sub-layer's hc_post followed by hc_pre (HcArgs::prev_*: above 8 tokens hc_post's own launch,
// then the tensor-core path), as a prefill sub-layer boundary runs them. bytes = y + res + h written + x (+ fn,
// post, comb): the one-pass floor.
void bench_post_pre(int T, int64_t D) {
  const double set_bytes = 4.0 * T * D * 5 + 4.0 * 24 * 4 * D;
  const double bytes = set_bytes + 4.0 * T * D * 5 + 4.0 * T * 40;
  const int sets = sets_for(set_bytes);
  std::vector<float*> y(sets), res(sets);
  for (int s = 0; s < sets; ++s) y[s] = dfloats(size_t(T) * D, 1.f), res[s] = dfloats(size_t(T) * 4 * D, 1.f);
  float* fn = dfloats(size_t(24) * 4 * D, 0.02f);
  float* ppost = dfloats(T * 4, 1.f);
  float* pcomb = dfloats(T * 16, 0.3f);
  float* h = dalloc<float>(size_t(T) * 4 * D);
  const HcBuffers buf(24, T, D);
  HcArgs a = buf.args(T, D);
  a.h = h; a.fn = fn; a.prev_post = ppost; a.prev_comb = pcomb;
  const double us = time_us([&](int s) {
    a.prev_y = y[s], a.prev_res = res[s];
    hc_pre(a, nullptr);
  }, sets);
  report("hc_post + hc_pre", "T=" + std::to_string(T) + " D=" + std::to_string(D), us, bytes);
  for (int s = 0; s < sets; ++s) cudaFree(y[s]), cudaFree(res[s]);
  cudaFree(fn); cudaFree(ppost); cudaFree(pcomb); cudaFree(h);
}

void bench_post(int T, int64_t D) {
  const double set_bytes = 4.0 * T * D * 5 + 4.0 * T * 20;
  const double bytes = set_bytes + 4.0 * T * 4 * D;
  const int sets = sets_for(set_bytes);
  std::vector<float*> y(sets), res(sets);
  for (int s = 0; s < sets; ++s) y[s] = dfloats(size_t(T) * D, 1.f), res[s] = dfloats(size_t(T) * 4 * D, 1.f);
  float* post = dfloats(T * 4, 1.f);
  float* comb = dfloats(T * 16, 0.3f);
  float* out = dalloc<float>(size_t(T) * 4 * D);
  const double us = time_us([&](int s) { hc_post(T, D, 4, y[s], res[s], post, comb, out, nullptr); }, sets);
  report("hc_post", "T=" + std::to_string(T) + " D=" + std::to_string(D), us, bytes);
  for (int s = 0; s < sets; ++s) cudaFree(y[s]), cudaFree(res[s]);
  cudaFree(post); cudaFree(comb); cudaFree(out);
}

}  // namespace

// --hc-only T D: hc_pre with T tokens of dim D alone (for Nsight Compute; run_compressor_mhc.sh MHC_NCU).
// --compressor-only RATIO HEAD T: the compressor's prefill of T tokens alone (CMP_NCU).
int main(int argc, char** argv) {
  device_config();
  if (argc > 3 && std::string(argv[1]) == "--hc-only") {
    bench_hc(false, std::atoi(argv[2]), std::atoll(argv[3]));
    for (const std::string& r : g_rows) std::printf("%s\n", r.c_str());
    return 0;
  }
  if (argc > 4 && std::string(argv[1]) == "--compressor-only") {
    bench_compressor(std::atoi(argv[2]), std::atoi(argv[3]), false, std::atoi(argv[4]));
    for (const std::string& r : g_rows) std::printf("%s\n", r.c_str());
    return 0;
  }
  bench_copy();
  std::printf("| kernel | case | us | GB/s | of copy bw |\n| --- | --- | ---: | ---: | ---: |\n");
  for (int T : {4096, 16384}) {
    bench_compressor(4, 512, false, T);
    bench_compressor(128, 512, false, T);
    bench_compressor(4, 128, false, T);
  }
  for (int n : {64, 128, 1024}) {
    bench_compressor(4, 512, true, n);
    bench_compressor(128, 512, true, n);
    bench_compressor(4, 128, true, n);
  }
  for (int T : {1, 64, 256, 2048}) bench_hc(false, T, 7168);
  for (int T : {2048, 8192}) bench_hc(false, T, 4096);  // V4-Flash width: a prefill chunk of 2048, and 8192
  for (int T : {1, 256}) bench_hc(true, T, 7168);
  bench_hc(true, 2048, 4096);
  for (int T : {1, 64, 256, 2048}) bench_post(T, 7168);
  bench_post_pre(2048, 4096);
  std::printf("\ncopy bandwidth (read + write): %.0f GB/s\n| kernel | case | us | GB/s | of copy bw |\n"
              "| --- | --- | ---: | ---: | ---: |\n", g_copy_gbs);
  for (const std::string& r : g_rows) std::printf("%s\n", r.c_str());
  return 0;
}
