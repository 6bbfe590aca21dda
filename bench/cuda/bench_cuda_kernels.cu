// Benchmarks of the sparse-attention-path kernels (docs/KERNELS.md). Method: CUDA events around batches of
// launches, median of many batches, inputs rotated over several buffers so the working set exceeds L2, the
// device copy bandwidth (cudaMemcpyAsync D2D, bytes read + written) measured in the same run as the peer for
// memory-bound kernels. Prints one CSV line per case: kind,case,us,bytes,flops,metric,ratio.
// torch.topk is measured by bench/cuda/torch_topk_peer.py in the same script run (scripts/gpu/run_all.sh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"

using namespace dsv4;

namespace {

#define CK(x) cuda::check((x), #x)

constexpr size_t kRotateBytes = 256u << 20;  // >= 4x the H200's 60 MB L2

// Median over `reps` batches of `per_batch` calls of fn(i) (i = running call counter, for rotation).
double time_us(const std::function<void(int)>& fn, int reps = 30, int per_batch = 10) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  int counter = 0;
  for (int i = 0; i < 3; ++i) fn(counter++);  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < per_batch; ++i) fn(counter++);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / per_batch);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

template <typename T>
T* dalloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

__global__ void fill_normal(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    uint32_t g = h * 747796405u + 2891336453u;
    g ^= g >> 16; g *= 0x7feb352du; g ^= g >> 15;
    const float u1 = (h >> 8) * (1.0f / 16777216.0f) + 1e-7f, u2 = (g >> 8) * (1.0f / 16777216.0f);
    p[i] = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
  }
}
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, int mod) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
    p[i] = static_cast<uint8_t>(h % mod);
  }
}
__global__ void fill_index(int32_t* p, size_t n, uint32_t seed, int32_t range) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
    p[i] = static_cast<int32_t>(h % static_cast<uint32_t>(range));
  }
}

void line(const char* kind, const std::string& name, double us, double bytes, double flops, const char* metric,
          double ratio) {
  std::printf("%s,%s,%.2f,%.0f,%.0f,%s,%.3f\n", kind, name.c_str(), us, bytes, flops, metric, ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const cuda::DeviceConfig& dev = cuda::device_config();
  std::fprintf(stderr, "device: %s, %d SMs\n", dev.arch, dev.sm_count);

  // ---- peer: device copy bandwidth (read + write) ----
  const size_t copy_bytes = size_t(2) << 30;
  uint8_t* src = dalloc<uint8_t>(copy_bytes);
  uint8_t* dst = dalloc<uint8_t>(copy_bytes);
  CK(cudaMemset(src, 1, copy_bytes));
  const double copy_us = time_us([&](int) { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, 10, 2);
  const double copy_bw = 2.0 * copy_bytes / (copy_us * 1e-6);  // B/s
  line("copy", "d2d_2GiB", copy_us, 2.0 * copy_bytes, 0, "GB/s", copy_bw / 1e9);
  CK(cudaFree(src));
  CK(cudaFree(dst));

  // ---- top-k: rows x lengths x k, ratio = time / read floor (row bytes / copy bandwidth) ----
  for (int k : {512, 1024})
    for (int len : {8192, 65536, 262144})
      for (int rows : {1, 8, 64, 512}) {
        if (quick && rows > 8) continue;
        const size_t set_elems = size_t(rows) * len;
        const int sets = static_cast<int>(std::max<size_t>(1, std::min<size_t>(16, kRotateBytes / (set_elems * 4))));
        float* s = dalloc<float>(set_elems * sets);
        fill_normal<<<1024, 256>>>(s, set_elems * sets, 1234u + len + rows);
        int32_t* out = dalloc<int32_t>(size_t(rows) * k);
        const double us = time_us([&](int i) {
          cuda::topk_rows(s + (i % sets) * set_elems, len, len, nullptr, rows, k, out, nullptr);
        });
        const double bytes = 4.0 * set_elems;
        line("topk", "rows=" + std::to_string(rows) + " len=" + std::to_string(len) + " k=" + std::to_string(k), us,
             bytes, 0, "x_read_floor", us / (bytes / copy_bw * 1e6));
        CK(cudaFree(s));
        CK(cudaFree(out));
      }

  // ---- indexer decode: few queries over a long FP8 key cache (136 B rows), ratio = achieved / copy BW ----
  for (int64_t n_keys : {int64_t(65536), int64_t(262144)})
    for (int nq : {1, 4}) {
      const int64_t rb = 136;
      const size_t set_bytes = size_t(n_keys) * rb;
      const int sets = static_cast<int>(std::max<size_t>(1, std::min<size_t>(16, kRotateBytes / set_bytes)));
      uint8_t* keys = dalloc<uint8_t>(set_bytes * sets);
      fill_bytes<<<1024, 256>>>(keys, set_bytes * sets, 77u, 120);  // e4m3 codes < 0x78 and scales ~2^-7..
      float* q = dalloc<float>(size_t(nq) * 64 * 128);
      float* w = dalloc<float>(size_t(nq) * 64);
      float* out = dalloc<float>(size_t(nq) * n_keys);
      fill_normal<<<256, 256>>>(q, size_t(nq) * 64 * 128, 5u);
      fill_normal<<<16, 256>>>(w, size_t(nq) * 64, 6u);
      cuda::IndexerArgs a;
      a.q = q; a.w = w; a.n_keys = n_keys; a.row_bytes = rb; a.scores = out; a.score_stride = n_keys; a.n_queries = nq;
      const double us = time_us([&](int i) {
        cuda::IndexerArgs b = a;
        b.keys = keys + (i % sets) * set_bytes;
        cuda::indexer_scores_fp8(b, nullptr);
      });
      const double bytes = double(set_bytes) + 4.0 * nq * n_keys;
      const double flops = 2.0 * 64 * 128 * double(n_keys) * nq;
      line("indexer_decode", "q=" + std::to_string(nq) + " keys=" + std::to_string(n_keys), us, bytes, flops,
           "frac_copy_bw", bytes / (us * 1e-6) / copy_bw);
      CK(cudaFree(keys)); CK(cudaFree(q)); CK(cudaFree(w)); CK(cudaFree(out));
    }

  // ---- indexer prefill: many queries, causal, TFLOP/s ----
  {
    const int nq = quick ? 256 : 2048;
    const int64_t n_keys = 32768;
    uint8_t* keys = dalloc<uint8_t>(size_t(n_keys) * 136);
    fill_bytes<<<1024, 256>>>(keys, size_t(n_keys) * 136, 9u, 120);
    float* q = dalloc<float>(size_t(nq) * 64 * 128);
    float* w = dalloc<float>(size_t(nq) * 64);
    float* out = dalloc<float>(size_t(nq) * n_keys);
    fill_normal<<<256, 256>>>(q, size_t(nq) * 64 * 128, 5u);
    fill_normal<<<16, 256>>>(w, size_t(nq) * 64, 6u);
    cuda::IndexerArgs a;
    a.q = q; a.w = w; a.keys = keys; a.n_keys = n_keys; a.row_bytes = 136; a.scores = out; a.score_stride = n_keys;
    a.n_queries = nq;
    const double us = time_us([&](int) { cuda::indexer_scores_fp8(a, nullptr); }, 10, 2);
    const double flops = 2.0 * 64 * 128 * double(n_keys) * nq;
    line("indexer_prefill", "q=" + std::to_string(nq) + " keys=" + std::to_string(n_keys), us, 0, flops, "TFLOP/s",
         flops / (us * 1e-6) / 1e12);
    CK(cudaFree(keys)); CK(cudaFree(q)); CK(cudaFree(w)); CK(cudaFree(out));
  }

  // ---- sparse attention: fp8 rows (584 B), 640 slots (128 window + 512 selected) per query ----
  {
    const int64_t n_rows = 1 << 20;  // 584 MB pool, random gathers
    const int64_t rb = 584;
    uint8_t* kv = dalloc<uint8_t>(size_t(n_rows) * rb);
    fill_bytes<<<4096, 256>>>(kv, size_t(n_rows) * rb, 3u, 120);
    float* sink = dalloc<float>(64);
    fill_normal<<<1, 64>>>(sink, 64, 8u);
    for (int nq : {1, 8, 64, 2048}) {
      if (quick && nq > 64) continue;
      const int n_slots = 640;
      float* q = dalloc<float>(size_t(nq) * 64 * 512);
      float* out = dalloc<float>(size_t(nq) * 64 * 512);
      int32_t* slots = dalloc<int32_t>(size_t(nq) * n_slots * 4);
      fill_normal<<<1024, 256>>>(q, size_t(nq) * 64 * 512, 11u);
      fill_index<<<1024, 256>>>(slots, size_t(nq) * n_slots * 4, 12u, static_cast<int32_t>(n_rows));
      const size_t ws_bytes = cuda::sparse_attention_workspace_bytes(nq, n_slots);
      void* ws = dalloc<uint8_t>(ws_bytes);
      cuda::SparseAttentionArgs a;
      a.q = q; a.kv = kv; a.n_rows = n_rows; a.row_bytes = rb; a.format = cuda::KvRowFormat::kFP8;
      a.n_slots = n_slots; a.sink = sink; a.scale = 1.0f / std::sqrt(512.f); a.out = out; a.n_queries = nq;
      a.workspace = ws;
      const double us = time_us([&](int i) {
        cuda::SparseAttentionArgs b = a;
        b.slots = slots + size_t(i % 4) * nq * n_slots;  // rotate the gathered rows
        cuda::sparse_attention(b, nullptr);
      }, nq > 64 ? 10 : 30, nq > 64 ? 2 : 10);
      const double bytes = double(nq) * n_slots * rb + 2.0 * 4 * nq * 64 * 512;
      const double flops = 4.0 * 64 * 512 * double(n_slots) * nq;
      const std::string name = "q=" + std::to_string(nq) + " slots=640 fp8";
      if (nq <= 64)
        line("attn_decode", name, us, bytes, flops, "frac_copy_bw", bytes / (us * 1e-6) / copy_bw);
      else
        line("attn_prefill", name, us, bytes, flops, "TFLOP/s", flops / (us * 1e-6) / 1e12);
      CK(cudaFree(q)); CK(cudaFree(out)); CK(cudaFree(slots)); CK(cudaFree(ws));
    }
    CK(cudaFree(kv)); CK(cudaFree(sink));
  }
  return 0;
}
