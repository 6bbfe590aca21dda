// GpuModel against the CPU Model (the specification) on a fresh random checkpoint in the official layout,
// with the attention widths the kernels are specialized for (64 heads x 512, indexer 64 x 128).
// Two sequences of different lengths run batched on the GPU (prefill as decode steps, then greedy decode);
// each runs alone on the CPU. Checked: per-step logits within a bound, greedy continuations identical.
// Two models:
//   "selective": 16 experts top-2, hash layer, indexer top-16 of up to 100 entries. Its discrete choices
//     (router, indexer top-k) flip under any 2^-9 perturbation somewhere in 400 tokens (measured on the CPU
//     alone: f32 KV vs bf16 KV runs agree for 7 greedy tokens, logits differ by 1-2e-2 from step 0), so it
//     is compared only in exact mode (fp32 activations), where GPU and CPU compute the same function.
//   "continuous": the same widths with every selection keeping everything (2 experts top-2, index_topk 128
//     >= every entry count), so the function is continuous and the bf16-activation kernels get a bound
//     (CPU f32 vs bf16 KV on it: ~1e-3, greedy identical).
// SKIPs without a CUDA device. DSV4_GPU_ENGINE_TOKENS overrides the number of generated tokens (default 96).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/gpu/gpu_model.h"
#include "engine/model.h"
#include "attention_width_model.h"
#include "gpu_available.h"
#include "model/random_checkpoint.h"

namespace dsv4 {
namespace {

using ::dsv4::testing::have_gpu;

// Layers: 0 window + hash routing, 1 CSA, 2 HCA, 3 CSA. Window 64 so rings wrap; index_topk 16 so the
// indexer selects among up to ~100 entries; 128-token HCA blocks close three times in the longer sequence.
// "continuous": 2 experts top-2 and index_topk 128 (every selection keeps everything).
std::string config_for(bool selective) {
  return testing::attention_width_config({0, 4, 128, 4}, selective ? 16 : 2, selective ? 16 : 128);
}

constexpr int64_t kMaxLen = 512;

// Options of every comparison: both sequences held at once, positions for the longer prompt + generation.
gpu::GpuOptions test_options(KvDtype kv, bool exact_linear = false, bool exact_moe = false) {
  gpu::GpuOptions o;
  o.kv_dtype = kv;
  o.max_seqs = 2;
  o.max_model_len = kMaxLen;
  o.exact_linear = exact_linear;
  o.exact_moe = exact_moe;
  return o;
}

int n_generate() {
  const char* e = std::getenv("DSV4_GPU_ENGINE_TOKENS");
  return e ? std::max(2, std::atoi(e)) : 96;
}

std::vector<int32_t> prompt(int len, uint32_t seed) {
  std::vector<int32_t> p;
  uint32_t x = seed;
  for (int i = 0; i < len; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(2 + static_cast<int32_t>((x >> 8) % 1000));
  }
  return p;
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);  // first maximum: lowest index
}

// Greedy run of one sequence: logits[k] is the k-th logits row (k = 0 after the prompt), tokens[k] its argmax.
struct GreedyRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

class GpuEngine : public ::testing::Test {
 protected:
  static std::string dir_[2];  // [0] continuous, [1] selective
  static std::vector<std::vector<int32_t>> prompts_;
  static std::map<std::pair<int, KvDtype>, std::vector<GreedyRun>> cpu_;

  static void SetUpTestSuite() {
    if (!have_gpu()) return;
    const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
    for (int sel = 0; sel < 2; ++sel) {
      dir_[sel] = (std::filesystem::temp_directory_path() /
                   ("dsv4_gpu_engine_" + std::to_string(seed % 1000000) + (sel ? "_sel" : "_cont"))).string();
      RandomCheckpointOptions o;
      o.seed = seed + sel;
      write_random_checkpoint(config_for(sel == 1), dir_[sel], o);
    }
    prompts_ = {prompt(300, static_cast<uint32_t>(seed)), prompt(137, static_cast<uint32_t>(seed >> 20) + 7)};
  }
  static void TearDownTestSuite() {
    for (const std::string& d : dir_)
      if (!d.empty()) std::filesystem::remove_all(d);
  }

  static const std::vector<GreedyRun>& cpu(int sel, KvDtype kv) {
    auto it = cpu_.find({sel, kv});
    if (it != cpu_.end()) return it->second;
    EngineOptions eo;
    eo.kv_dtype = kv;
    auto m = Model::load(dir_[sel], eo);
    const int64_t V = m->config().vocab_size;
    std::vector<GreedyRun> runs;
    for (const auto& p : prompts_) {
      GreedyRun r;
      auto s = m->new_sequence();
      std::vector<SeqChunk> b(1);
      b[0].seq = s.get();
      b[0].tokens = p;
      for (int k = 0; k < n_generate(); ++k) {
        auto out = m->forward(b);
        r.logits.push_back(out[0].logits);
        r.tokens.push_back(argmax(out[0].logits.data(), V));
        b[0].tokens = {r.tokens.back()};
      }
      runs.push_back(std::move(r));
    }
    return cpu_[{sel, kv}] = std::move(runs);
  }

  // Both sequences batched on the GPU.
  static std::vector<GreedyRun> gpu(int sel, const gpu::GpuOptions& opt) {
    auto m = gpu::GpuModel::load(dir_[sel], opt);
    const int64_t V = m->config().vocab_size;
    std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
    std::vector<gpu::GpuSeqChunk> b(prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i) {
      seqs.push_back(m->new_sequence());
      b[i].seq = seqs.back().get();
      b[i].tokens = prompts_[i];
    }
    std::vector<GreedyRun> runs(prompts_.size());
    for (int k = 0; k < n_generate(); ++k) {
      auto out = m->forward(b);
      for (size_t i = 0; i < b.size(); ++i) {
        runs[i].logits.push_back(out[i].logits);
        runs[i].tokens.push_back(argmax(out[i].logits.data(), V));
        b[i].tokens = {runs[i].tokens.back()};
      }
    }
    return runs;
  }

  // Max |gpu - cpu| / max |cpu| over the logits rows computed from identical inputs, and the greedy
  // agreement length (tokens identical before the first mismatch).
  static void compare(const char* what, const std::vector<GreedyRun>& g, const std::vector<GreedyRun>& c, double bound,
                      bool require_greedy) {
    for (size_t i = 0; i < g.size(); ++i) {
      size_t agree = 0;
      while (agree < g[i].tokens.size() && g[i].tokens[agree] == c[i].tokens[agree]) ++agree;
      double worst = 0;
      size_t worst_k = 0;
      for (size_t k = 0; k < g[i].logits.size() && k <= agree; ++k) {
        double mx = 0, err = 0;
        for (size_t v = 0; v < c[i].logits[k].size(); ++v) {
          mx = std::max(mx, std::fabs(static_cast<double>(c[i].logits[k][v])));
          const double d = std::fabs(static_cast<double>(g[i].logits[k][v]) - c[i].logits[k][v]);
          err = std::isfinite(d) ? std::max(err, d) : INFINITY;  // std::max would drop a NaN
        }
        const double rel = err / std::max(mx, 1e-30);
        if (!(rel <= worst)) worst = rel, worst_k = k;  // NaN propagates into worst
      }
      std::printf("%s seq %zu (prompt %zu): max logit error %.3e (step %zu), greedy agreement %zu / %zu tokens\n",
                  what, i, prompts_[i].size(), worst, worst_k, agree, g[i].tokens.size());
      EXPECT_LE(worst, bound) << what << " seq " << i;
      if (require_greedy) {
        EXPECT_EQ(agree, g[i].tokens.size()) << what << " seq " << i;
      }
    }
  }
};
std::string GpuEngine::dir_[2];
std::vector<std::vector<int32_t>> GpuEngine::prompts_;
std::map<std::pair<int, KvDtype>, std::vector<GreedyRun>> GpuEngine::cpu_;

// fp32 activations everywhere (glue linear and MoE): only summation order and cosf/expf ulps differ from
// the CPU, each ~1e-7 relative per operation (the attention and compressor kernels are tested to 1e-4 and
// 2e-5 of their references); 5e-4 leaves room for the growth through 4 layers and the softmaxes.
TEST_F(GpuEngine, ExactModeF32KvMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  compare("selective model, exact, f32 KV vs CPU f32 KV:", gpu(1, o), cpu(1, KvDtype::kF32), 5e-4, true);
}

// Exact mode on the continuous model (2 experts, top-k 128 >= every visible entry count): separates a fault
// in the kernel path from one in this configuration's plumbing (a top-k that keeps everything, -1 slots).
TEST_F(GpuEngine, ExactModeContinuousF32KvMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  compare("continuous model, exact, f32 KV vs CPU f32 KV:", gpu(0, o), cpu(0, KvDtype::kF32), 5e-4, true);
}

// KNOWN FAILING (H200, 2026-11-30, two runs): max logit error 1.5e-4..2.7e-2 (bf16) and 0.19..0.64 (fp8)
// against the 5e-4 bound; greedy agreement 96/96 except one fp8 run (18/96). GPU and CPU fp32 rows differ by
// ~1e-7 and the few values on a rounding boundary round to neighbouring codes (one e4m3 step is 6-12%), which
// can then flip a router or indexer choice. The test needs the statistical form of tests/golden (share of
// rows above a bound) or identical pre-rounding arithmetic; redesign with device time.
//
// Exact mode with bf16 and fp8 KV on the selective model: the KV plumbing of every format (the FP8 indexer
// kernel included). Rounding to the KV format is discontinuous, but GPU and CPU round the same fp32 values,
// which differ by ~1e-7; a flip to the neighbouring code needs a value within 1e-7 of a rounding boundary.
TEST_F(GpuEngine, ExactModeBf16Fp8KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  for (KvDtype kv : {KvDtype::kBF16, KvDtype::kFP8}) {
    const gpu::GpuOptions o = test_options(kv, true);
    compare(kv == KvDtype::kBF16 ? "selective model, exact, bf16 KV vs CPU bf16 KV:"
                                 : "selective model, exact, fp8 KV vs CPU fp8 KV:",
            gpu(1, o), cpu(1, kv), 5e-4, true);
  }
}

// (These caught a real bug: cudalin::gemv left rows 4..15 of each tile unwritten when a block had fewer than
// four warps, i.e. for short K such as wq_b's q_lora_rank; fixed in gemv.cu with a regression case in
// tests/cuda_linear/test_gemv.cc. Kernels f32 / dense / bf16 pass on the H200 since, 2026-11-30.)
//
// The production path: FP8/MXFP4 GEMV and MoE kernels with bf16 activations. Each bf16 rounding is
// <= 2^-9 relative with random sign, so one GEMV output moves by ~2^-9/sqrt(3) = 1.1e-3 in norm
// (docs/GEMM_MOE.md). Per layer about 8 such GEMVs feed the residual streams (wq_a, wq_b, wkv, wo_a, wo_b,
// indexer wq_b, shared expert, routed experts), 4 layers: ~sqrt(32) * 1.1e-3 = 6e-3 if independent; the
// bound 2e-2 allows 3x on top. Discrete choices (router top-k, indexer top-k, greedy argmax) can flip only
// on near ties; the greedy check requires that none flipped.
TEST_F(GpuEngine, KernelsF32KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32);
  compare("continuous model, kernels, f32 KV vs CPU f32 KV:", gpu(0, o), cpu(0, KvDtype::kF32), 2e-2, true);
}

// Dense FP8 GEMV kernels only (routed experts through the fp32 glue): isolates the MoE kernel's share.
TEST_F(GpuEngine, DenseKernelsF32KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32, false, true);
  compare("continuous model, dense kernels, exact MoE, f32 KV vs CPU f32 KV:", gpu(0, o), cpu(0, KvDtype::kF32), 2e-2,
          true);
}

TEST_F(GpuEngine, KernelsBf16KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kBF16);
  const auto g = gpu(0, o);
  compare("continuous model, kernels, bf16 KV vs CPU bf16 KV:", g, cpu(0, KvDtype::kBF16), 2e-2, true);
  compare("continuous model, kernels, bf16 KV vs CPU f32 KV (information):", g, cpu(0, KvDtype::kF32), 1e9, false);
}

// KNOWN FAILING (H200, 2026-11-30): like ExactModeBf16Fp8KvMatchCpu, fp8 rounding flips of near-boundary
// values break the maximum-error bound; needs the statistical form of tests/golden.
// FP8 KV: the stored e4m3 values are 2^-3-relative steps, so a 1e-3 perturbation of a KV value moves it to
// the neighbouring code with probability ~1e-3 / 2^-4 per value; the error bound is the same 2e-2 but the
// greedy check is the real test here.
TEST_F(GpuEngine, KernelsFp8KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kFP8);
  compare("continuous model, kernels, fp8 KV vs CPU fp8 KV:", gpu(0, o), cpu(0, KvDtype::kFP8), 2e-2, true);
}

TEST_F(GpuEngine, RefusesWhenTooLarge) {
  DSV4_REQUIRE_GPU();
  gpu::GpuOptions o;
  o.max_seqs = 64;
  o.max_model_len = int64_t(1) << 40;
  try {
    gpu::GpuModel::load(dir_[0], o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

// Decode throughput of this small test model (not a performance claim: 4 layers, hidden 512).
TEST_F(GpuEngine, DecodeThroughputSmallModel) {
  DSV4_REQUIRE_GPU();
  for (int batch : {1, 2}) {
    gpu::GpuOptions o;
    o.kv_dtype = KvDtype::kFP8;
    o.max_seqs = batch;
    o.max_model_len = kMaxLen;
    auto m = gpu::GpuModel::load(dir_[1], o);
    std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
    std::vector<gpu::GpuSeqChunk> b(batch);
    for (int i = 0; i < batch; ++i) {
      seqs.push_back(m->new_sequence());
      b[i].seq = seqs.back().get();
      b[i].tokens = prompt(64, 99 + i);
    }
    m->forward(b);
    const int steps = 128;
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < steps; ++k) {
      for (auto& ch : b) ch.tokens = {static_cast<int32_t>(2 + k)};
      m->forward(b);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("decode (small test model, fp8 KV, batch %d): %.1f steps/s, %.1f tok/s, %.3f ms/step\n", batch,
                steps / s, steps * batch / s, 1e3 * s / steps);
  }
}

}  // namespace
}  // namespace dsv4
