// Benchmarks of the sparse-attention-path kernels (docs/KERNELS.md). Method: CUDA events around batches of
// launches, median of many batches, inputs rotated over several buffers so the working set exceeds L2, the
// device copy bandwidth (cudaMemcpyAsync D2D, bytes read + written) measured in the same run as the peer for
// memory-bound kernels. Prints one CSV line per case: kind,case,us,bytes,flops,metric,ratio.
// torch.topk is measured by bench/cuda/torch_topk_peer.py in the same script run (scripts/gpu/run_all.sh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

using namespace dsv4;

namespace {

#define CK(x) cuda::check((x), #x)

constexpr size_t kRotateBytes = 256u << 20;  // >= 4x the H200's 60 MB L2

// Median over `reps` runs of batch() on `stream`, each timed by events around it, per call (a batch makes
// `per_batch` calls).
double median_per_call_us(const std::function<void()>& batch, cudaStream_t stream, int reps, int per_batch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, stream));
    batch();
    CK(cudaEventRecord(b, stream));
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

// Median over `reps` batches of `per_batch` calls of fn(i) (i = running call counter, for rotation).
double time_us(const std::function<void(int)>& fn, int reps = 30, int per_batch = 10) {
  int counter = 0;
  for (int i = 0; i < 3; ++i) fn(counter++);  // warm-up
  CK(cudaDeviceSynchronize());
  return median_per_call_us([&] { for (int i = 0; i < per_batch; ++i) fn(counter++); }, nullptr, reps, per_batch);
}

// The same median, over replays of a CUDA graph of `per_batch` calls fn(i, stream) captured on `stream`: the
// engine's view of a short kernel (eager back-to-back launches time the launch rate instead). Every replay runs
// the same i, so the rotation covers only the calls inside one graph.
double time_graph_us(const std::function<void(int, cudaStream_t)>& fn, int reps = 30, int per_batch = 10) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_batch; ++i) fn(i, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));  // warm-up
  CK(cudaStreamSynchronize(st));
  const double us = median_per_call_us([&] { CK(cudaGraphLaunch(ge, st)); }, st, reps, per_batch);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  return us;
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
__global__ void affine(float* p, size_t n, float a, float b) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = a * p[i] + b;
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

// The launch floor of the few-row top-k shapes: a kernel that only waits for its predecessor (PDL), launched like
// the top-k kernels (clusters of C CTAs of 256 threads), so the top-k rows can be read as floor + selection.
__global__ void empty_cluster_kernel() { cuda::pdl::enter(); }

void line(const char* kind, const std::string& name, double us, double bytes, double flops, const char* metric,
          double ratio) {
  std::printf("%s,%s,%.2f,%.0f,%.0f,%s,%.3f\n", kind, name.c_str(), us, bytes, flops, metric, ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  // --quick: fewer / smaller cases; --attn: copy peer + attention only; --topk: copy peer + top-k only;
  // --attn-profile[=VARIANT]: one attention prefill variant (default "split-bf16 t2"; a name from the variants
  // below), 4096 queries, for a profiler.
  bool quick = false, attn_only = false, indexer_only = false, attn_profile = false, topk_only = false;
  int topk_case[3] = {0, 0, 0};
  const char* attn_profile_variant = "split-bf16 t2";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--attn") == 0) attn_only = true;
    if (std::strncmp(argv[i], "--attn-profile", 14) == 0) {
      attn_only = attn_profile = true;
      if (argv[i][14] == '=') attn_profile_variant = argv[i] + 15;
    }
    if (std::strcmp(argv[i], "--indexer") == 0) indexer_only = true;  // copy peer + indexer rows only
    if (std::strcmp(argv[i], "--topk") == 0) topk_only = true;        // copy peer + top-k rows only
    // --topk-case=ROWS,LEN,K: that one top-k shape (both kernels), e.g. for a profiler.
    if (std::strncmp(argv[i], "--topk-case=", 12) == 0 &&
        std::sscanf(argv[i] + 12, "%d,%d,%d", &topk_case[0], &topk_case[1], &topk_case[2]) == 3)
      topk_only = true;
  }
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
  if (!attn_only && !indexer_only && !topk_case[0])
    for (int C : {1, 2, 8})
      for (int rows : {1, 8}) {
        const double us = time_us([&](int) {
          CK(cuda::launch_cluster(empty_cluster_kernel, dim3(rows * C), dim3(256), 0, nullptr, C));
        });
        const std::string name =
            "empty kernel (PDL wait only) rows=" + std::to_string(rows) + " C=" + std::to_string(C);
        line("launch", name, us, 0, 0, "us", us);
      }
  // "narrow": scores 10 + 0.01 x normal, so two coarse bins (sign, exponent, 2 mantissa bits: [8, 10), [10, 12))
  // hold the whole row: the resident kernel's pivot bin overflows its gather buffer from 8K entries per CTA and
  // the exact fallback runs (few rows only; torch.topk is not run on them).
  if (!attn_only && !indexer_only)
  for (const bool narrow : {false, true})
  for (int k : {512, 1024})
    for (int len : {2048, 4096, 8192, 16384, 32768, 65536, 262144})
      for (int rows : {1, 8, 64, 512}) {
        if (quick && rows > 8) continue;
        if (narrow && (rows > 8 || k != 512 || len > 65536 || len == 8192 || len == 32768)) continue;
        if (topk_case[0] && (rows != topk_case[0] || len != topk_case[1] || k != topk_case[2] || narrow)) continue;
        const size_t set_elems = size_t(rows) * len;
        const int sets = static_cast<int>(std::max<size_t>(1, std::min<size_t>(16, kRotateBytes / (set_elems * 4))));
        float* s = dalloc<float>(set_elems * sets);
        fill_normal<<<1024, 256>>>(s, set_elems * sets, 1234u + len + rows);
        if (narrow) affine<<<1024, 256>>>(s, set_elems * sets, 0.01f, 10.f);
        int32_t* out = dalloc<int32_t>(size_t(rows) * k);
        for (const char* kernel : {"default", "stream", "resident", "small"}) {  // DSV4_TOPK_KERNEL
          if (std::strcmp(kernel, "resident") == 0 && len > 65536) continue;  // streams either way
          if (std::strcmp(kernel, "small") == 0 && len > 4096) continue;      // the default choice either way
          if (std::strcmp(kernel, "default") == 0) unsetenv("DSV4_TOPK_KERNEL");
          else setenv("DSV4_TOPK_KERNEL", kernel, 1);
          const double us = time_us([&](int i) {
            cuda::topk_rows(s + (i % sets) * set_elems, len, len, nullptr, rows, k, out, nullptr);
          });
          const double bytes = 4.0 * set_elems;
          line("topk", "rows=" + std::to_string(rows) + " len=" + std::to_string(len) + " k=" + std::to_string(k) +
                           " " + kernel + (narrow ? " narrow" : ""),
               us, bytes, 0, "x_read_floor", us / (bytes / copy_bw * 1e6));
        }
        unsetenv("DSV4_TOPK_KERNEL");
        CK(cudaFree(s));
        CK(cudaFree(out));
      }

  // ---- indexer (scripts/gpu/run_indexer.sh runs --indexer: copy peer + these rows only) ----
  // Decode: nq queries of different sequences, each over its own n_keys keys (per-query key_offset, or a
  // block table of 64-row blocks handed out in shuffled order), keys rotated over sets totalling >= 256 MB.
  // bytes = key rows + scores written; ratio = achieved bytes/s / copy bandwidth (read + write).
  // Prefill: 4096 queries at positions 61440..65535 over 16K keys, causal (query p sees (p+1)/4 keys);
  // flops = 2 * 64 * 128 * visible keys. "exact_q" rows run the older kernel (q as bf16 hi + lo) for comparison.
  if (topk_only) return 0;
  if (!attn_only) {
    // rope: with IndexerArgs::rope_cs (32 pairs per query, as the engine's CSA layers pass them).
    auto indexer_decode = [&](int nq, int64_t n_keys, cuda::IndexerKeyFormat fmt, bool paged, bool exact,
                              bool f8q = false, int64_t row_bytes = 0, bool rope = false) {
      const bool fp4 = fmt == cuda::IndexerKeyFormat::kMXFP4;
      const int64_t rb = row_bytes ? row_bytes : fp4 ? 68 : 136, bs = 64;
      const int64_t per_q = paged ? (n_keys + bs - 1) / bs * bs : n_keys;
      const size_t set_bytes = size_t(nq) * per_q * rb;
      const int sets = static_cast<int>(std::max<size_t>(1, std::min<size_t>(16, kRotateBytes / set_bytes)));
      uint8_t* keys = dalloc<uint8_t>(set_bytes * sets);
      fill_bytes<<<4096, 256>>>(keys, set_bytes * sets, 77u, 120);  // e4m3 codes < 0x78 and scales ~2^-7..
      float* q = dalloc<float>(size_t(nq) * 64 * 128);
      float* w = dalloc<float>(size_t(nq) * 64);
      float* out = dalloc<float>(size_t(nq) * n_keys);
      fill_normal<<<256, 256>>>(q, size_t(nq) * 64 * 128, 5u);
      fill_normal<<<16, 256>>>(w, size_t(nq) * 64, 6u);
      const int max_blocks = static_cast<int>(per_q / bs);
      std::vector<int64_t> offs(nq);
      std::vector<int32_t> table(size_t(nq) * max_blocks);
      for (int s = 0; s < nq; ++s) offs[s] = int64_t(s) * per_q;
      for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
      std::shuffle(table.begin(), table.end(), std::mt19937(7));
      int64_t* doffs = dalloc<int64_t>(nq);
      int32_t* dtable = dalloc<int32_t>(table.size());
      CK(cudaMemcpy(doffs, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      float2* dcs = nullptr;  // rope: any unit factors will do for timing
      if (rope) {
        std::vector<float2> cs_host(size_t(nq) * 32);
        for (size_t i = 0; i < cs_host.size(); ++i) cs_host[i] = make_float2(std::cos(0.1f * i), std::sin(0.1f * i));
        dcs = dalloc<float2>(cs_host.size());
        CK(cudaMemcpy(dcs, cs_host.data(), cs_host.size() * sizeof(float2), cudaMemcpyHostToDevice));
      }
      cuda::IndexerArgs a;
      a.q = q; a.w = w; a.n_keys = n_keys; a.row_bytes = rb; a.scores = out; a.score_stride = n_keys; a.n_queries = nq;
      a.format = fmt; a.exact_q = exact; a.fp8_q = f8q;
      if (rope) { a.rope_cs = dcs; a.rope_n_freq = 32; }
      if (paged) { a.block_table = dtable; a.max_blocks = max_blocks; a.block_size = static_cast<int>(bs); }
      else a.key_offset = doffs;
      auto call = [&](int i, cudaStream_t st) {
        cuda::IndexerArgs b = a;
        b.keys = keys + (i % sets) * set_bytes;
        cuda::indexer_scores_fp8(b, st);
      };
      // The engine's decode rows (<= 4096 keys) in a graph, as the engine runs them; the rest eager, as before.
      const bool graph = nq * n_keys <= 4096;
      const double us = graph ? time_graph_us(call) : time_us([&](int i) { call(i, nullptr); });
      const double bytes = double(nq) * n_keys * rb + 4.0 * nq * n_keys;
      const double flops = 2.0 * 64 * 128 * double(n_keys) * nq;
      line(exact ? "indexer_decode_exact_q" : f8q ? "indexer_decode_fp8_q" : "indexer_decode",
           "q=" + std::to_string(nq) + " keys=" + std::to_string(n_keys) + (fp4 ? " mxfp4" : " fp8") +
               (paged ? " paged64" : "") + (row_bytes ? " rb" + std::to_string(row_bytes) : "") +
               (rope ? " rope" : "") + (graph ? " graph" : ""),
           us, bytes, flops, "frac_copy_bw", bytes / (us * 1e-6) / copy_bw);
      CK(cudaFree(keys)); CK(cudaFree(q)); CK(cudaFree(w)); CK(cudaFree(out)); CK(cudaFree(doffs)); CK(cudaFree(dtable));
      CK(cudaFree(dcs));
    };
    using F = cuda::IndexerKeyFormat;
    // The engine's decode rows (one query, context / 4 keys: contexts 512 / 8K / 16K), without and with the RoPE
    // on load: there the kernel is mostly its prologue (q staged and converted by every CTA).
    for (int64_t n_keys : {int64_t(128), int64_t(2048), int64_t(4096)})
      for (bool rope : {false, true}) {
        indexer_decode(1, n_keys, F::kFP8, false, false, false, 0, rope);
        if (cuda::indexer_fp8_q_supported()) indexer_decode(1, n_keys, F::kFP8, false, false, true, 0, rope);
      }
    for (int nq : {1, 8, 64})
      for (int64_t n_keys : {int64_t(8192), int64_t(65536), int64_t(262144)}) {
        if (quick && nq * n_keys > 8 * 65536) continue;
        indexer_decode(nq, n_keys, F::kFP8, false, false);
      }
    indexer_decode(64, 65536, F::kFP8, true, false);
    indexer_decode(8, 262144, F::kFP8, true, false);
    for (int nq : {1, 64})
      for (int64_t n_keys : {int64_t(65536), int64_t(262144)}) indexer_decode(nq, n_keys, F::kMXFP4, false, false);
    indexer_decode(1, 65536, F::kFP8, false, true);
    indexer_decode(1, 262144, F::kFP8, false, true);
    indexer_decode(64, 65536, F::kFP8, false, true);
    if (cuda::indexer_fp8_q_supported()) {  // the FP8 tensor-core kernel (q quantized to e4m3 per head)
      for (int nq : {1, 8, 64})
        for (int64_t n_keys : {int64_t(8192), int64_t(65536), int64_t(262144)}) {
          if (quick && nq * n_keys > 8 * 65536) continue;
          indexer_decode(nq, n_keys, F::kFP8, false, false, true);
        }
      indexer_decode(64, 65536, F::kFP8, true, false, true);
      // 144-byte rows (a multiple of 16: the kernel's 16-byte copy granule; the cache stores 136)
      indexer_decode(1, 262144, F::kFP8, false, false, true, 144);
      indexer_decode(8, 262144, F::kFP8, false, false, true, 144);
      indexer_decode(64, 65536, F::kFP8, false, false, true, 144);
    }

    auto indexer_prefill = [&](cuda::IndexerKeyFormat fmt, bool exact, bool f8q = false, int64_t row_bytes = 0) {
      const bool fp4 = fmt == cuda::IndexerKeyFormat::kMXFP4;
      const int nq = quick ? 512 : 4096;
      const int64_t n_keys = 16384, rb = row_bytes ? row_bytes : fp4 ? 68 : 136;
      uint8_t* keys = dalloc<uint8_t>(size_t(n_keys) * rb);
      fill_bytes<<<1024, 256>>>(keys, size_t(n_keys) * rb, 9u, 120);
      float* q = dalloc<float>(size_t(nq) * 64 * 128);
      float* w = dalloc<float>(size_t(nq) * 64);
      float* out = dalloc<float>(size_t(nq) * n_keys);
      fill_normal<<<256, 256>>>(q, size_t(nq) * 64 * 128, 5u);
      fill_normal<<<16, 256>>>(w, size_t(nq) * 64, 6u);
      std::vector<int32_t> vis(nq);
      double visible = 0;
      for (int s = 0; s < nq; ++s) {
        const int64_t p = 4 * n_keys - nq + s;
        vis[s] = static_cast<int32_t>((p + 1) / 4);
        visible += vis[s];
      }
      int32_t* dvis = dalloc<int32_t>(nq);
      CK(cudaMemcpy(dvis, vis.data(), vis.size() * 4, cudaMemcpyHostToDevice));
      cuda::IndexerArgs a;
      a.q = q; a.w = w; a.keys = keys; a.n_keys = n_keys; a.row_bytes = rb; a.scores = out; a.score_stride = n_keys;
      a.n_queries = nq; a.n_visible = dvis; a.format = fmt; a.exact_q = exact; a.fp8_q = f8q;
      const double us = time_us([&](int) { cuda::indexer_scores_fp8(a, nullptr); }, 10, 2);
      const double flops = 2.0 * 64 * 128 * visible;
      line(exact ? "indexer_prefill_exact_q" : f8q ? "indexer_prefill_fp8_q" : "indexer_prefill",
           "q=" + std::to_string(nq) + " keys=" + std::to_string(n_keys) + " causal" + (fp4 ? " mxfp4" : " fp8") +
               (row_bytes ? " rb" + std::to_string(row_bytes) : ""), us,
           0, flops, "TFLOP/s", flops / (us * 1e-6) / 1e12);
      CK(cudaFree(keys)); CK(cudaFree(q)); CK(cudaFree(w)); CK(cudaFree(out)); CK(cudaFree(dvis));
    };
    indexer_prefill(F::kFP8, false);
    indexer_prefill(F::kMXFP4, false);
    indexer_prefill(F::kFP8, true);
    if (cuda::indexer_fp8_q_supported()) {
      indexer_prefill(F::kFP8, false, true);
      indexer_prefill(F::kFP8, false, true, 144);
    }
  }
  if (indexer_only) return 0;

  // ---- sparse attention: fp8 rows (584 B), 640 slots (128 window + 512 selected) per query, each precision.
  // The gathered rows, q and out rotate over enough sets that one pass touches >= 256 MB (random rows of a
  // 584 MB pool), so every call reads from DRAM. bytes = rows read + q + out; flops = 4 * 64 * 512 * slots.
  // Rows "attn_decode" (metric: fraction of copy bandwidth) and "attn_prefill" (TFLOP/s); report.py shows both.
  {
    const int64_t n_rows = 1 << 20;
    const int64_t rb = 584;
    uint8_t* kv = dalloc<uint8_t>(size_t(n_rows) * rb);
    fill_bytes<<<4096, 256>>>(kv, size_t(n_rows) * rb, 3u, 120);  // finite e4m3 codes, scales 2^-127..2^-8
    float* sink = dalloc<float>(64);
    fill_normal<<<1, 64>>>(sink, 64, 8u);
    // Variants: precision x kernel (DSV4_ATTN_KERNEL) x head tiles per CTA of the mma kernel
    // (DSV4_ATTN_HEAD_TILES), both read by each call; fp32 has neither. The wgmma rows need compute capability 9.0.
    struct Variant { cuda::AttnPrecision prec; const char* kernel; const char* tiles; const char* name; };
    const Variant variants[] = {{cuda::AttnPrecision::kSplitBf16, "mma", "2", "split-bf16 t2"},
                                {cuda::AttnPrecision::kSplitBf16, "mma", "1", "split-bf16 t1"},
                                {cuda::AttnPrecision::kSplitBf16, "wgmma", "2", "split-bf16 wgmma"},
                                {cuda::AttnPrecision::kBf16, "mma", "2", "bf16 t2"},
                                {cuda::AttnPrecision::kBf16, "mma", "1", "bf16 t1"},
                                {cuda::AttnPrecision::kBf16, "wgmma", "2", "bf16 wgmma"},
                                {cuda::AttnPrecision::kFp32, "mma", "2", "fp32"}};
    const bool has_wgmma = dev.major == 9 && dev.minor == 0;
    // 2048 queries x 192 slots: an HCA layer of a 2048-token prefill chunk at 8K context (128 window + 64 compressed).
    for (int nq : {1, 8, 64, 4096, 2048}) {
      if (quick && nq > 64) continue;
      if (attn_profile && nq != 4096) continue;
      const int n_slots = nq == 2048 ? 192 : 640;
      const size_t qe = size_t(nq) * 64 * 512;
      const double set_bytes = double(nq) * n_slots * rb + 8.0 * qe;
      const int sets = static_cast<int>(std::max(1.0, std::min(1024.0, std::ceil(double(kRotateBytes) / set_bytes))));
      float* q = dalloc<float>(qe * sets);
      float* out = dalloc<float>(qe * sets);
      int32_t* slots = dalloc<int32_t>(size_t(nq) * n_slots * sets);
      fill_normal<<<1024, 256>>>(q, qe * sets, 11u);
      fill_index<<<1024, 256>>>(slots, size_t(nq) * n_slots * sets, 12u, static_cast<int32_t>(n_rows));
      const size_t ws_bytes = cuda::sparse_attention_workspace_bytes(nq, n_slots);
      void* ws = dalloc<uint8_t>(ws_bytes);
      for (const Variant& var : variants) {
        if (attn_profile && std::strcmp(var.name, attn_profile_variant) != 0) continue;
        if (!has_wgmma && std::strcmp(var.kernel, "wgmma") == 0) continue;
        setenv("DSV4_ATTN_HEAD_TILES", var.tiles, 1);
        setenv("DSV4_ATTN_KERNEL", var.kernel, 1);
        cuda::SparseAttentionArgs a;
        a.kv = kv; a.n_rows = n_rows; a.row_bytes = rb; a.format = cuda::KvRowFormat::kFP8;
        a.n_slots = n_slots; a.sink = sink; a.scale = 1.0f / std::sqrt(512.f); a.n_queries = nq;
        a.workspace = ws; a.precision = var.prec;
        const bool big = nq > 64;
        const double us = time_us([&](int i) {
          cuda::SparseAttentionArgs b = a;
          const int k = i % sets;
          b.slots = slots + size_t(k) * nq * n_slots;
          b.q = q + size_t(k) * qe;
          b.out = out + size_t(k) * qe;
          cuda::sparse_attention(b, nullptr);
        }, attn_profile ? 1 : big ? 10 : 50, attn_profile ? 1 : big ? 2 : 20);
        const double bytes = double(nq) * n_slots * rb + 2.0 * 4 * qe;
        const double flops = 4.0 * 64 * 512 * double(n_slots) * nq;
        const std::string name = "q=" + std::to_string(nq) + " slots=" + std::to_string(n_slots) + " fp8 " + var.name;
        if (!big)
          line("attn_decode", name, us, bytes, flops, "frac_copy_bw", bytes / (us * 1e-6) / copy_bw);
        else
          line("attn_prefill", name, us, bytes, flops, "TFLOP/s", flops / (us * 1e-6) / 1e12);
      }
      CK(cudaFree(q)); CK(cudaFree(out)); CK(cudaFree(slots)); CK(cudaFree(ws));
    }
    unsetenv("DSV4_ATTN_HEAD_TILES");
    unsetenv("DSV4_ATTN_KERNEL");
    CK(cudaFree(kv)); CK(cudaFree(sink));
  }
  return 0;
}
