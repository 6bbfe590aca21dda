// GpuModel against the CPU Model (the specification) on a fresh random checkpoint in the official layout,
// with the attention widths the kernels are specialized for (64 heads x 512, indexer 64 x 128).
// Two sequences of different lengths run batched on the GPU (prefill as decode steps, then decode); each
// runs alone on the CPU. The CPU f32-KV run of a model is greedy; every other run (CPU in another KV dtype,
// GPU) is teacher-forced with the CPU f32 run's tokens, so logits rows are comparable at every step even
// after a near-tie. Checked: per-step logits within a bound, argmax identical at every step (= greedy
// continuations identical) where the numerics allow it.
// Two models:
//   "selective": 16 experts top-2, hash layer, indexer top-16 of up to 100 entries. Its discrete choices
//     (router, indexer top-k) flip under any 2^-9 perturbation somewhere in 400 tokens (measured on the CPU
//     alone: f32 KV vs bf16 KV runs agree for 7 greedy tokens, logits differ by 1-2e-2 from step 0), so it
//     is compared only in exact mode (fp32 activations), where GPU and CPU compute the same function.
//   "continuous": the same widths with every selection keeping everything (2 experts top-2, index_topk 128
//     >= every entry count), so the function is continuous and the bf16-activation kernels get a bound
//     (CPU f32 vs bf16 KV on it: ~1e-3, greedy identical).
// SKIPs without a CUDA device. DSV4_GPU_ENGINE_TOKENS overrides the number of generated tokens (default 256).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/selection_margin.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "engine/gpu/gpu_model.h"
#include "engine/kv_state.h"
#include "engine/model.h"
#include "attention_width_model.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

using ::dsv4::testing::have_gpu;

constexpr int64_t kMaxLen = 1024;  // prompt 300 + 256 generated; context buckets 128 .. 1024

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
  return e ? std::max(2, std::atoi(e)) : 256;
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);  // first maximum: lowest index
}

// Greedy run of one sequence: logits[k] is the k-th logits row (k = 0 after the prompt), tokens[k] its argmax.
struct GreedyRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  std::vector<double> margin;  // CPU runs: the smallest selection gap of each forward (cpu/selection_margin.h)
};

// A CPU selection whose last selected and first unselected scores are closer than this (relative to the row's
// largest |score|) is a near tie: GPU and CPU scores differ by ~1e-7 .. 1e-6 of that in exact mode, so the GPU
// may choose the other side, after which the two runs compute different functions (and later choices with
// larger gaps may follow). Measured on the CPU for the selective model (cpu/selection_margin.h): the two seeds
// whose exact-mode comparison failed on the H200 (99198635697 in run 9, 115574677948 in run 17 of
// docs/PERFORMANCE.md) have gaps of 1.9e-7 and 3.7e-7; the seeds of runs 12 and 14, which passed, have
// smallest gaps of 8.9e-6 and 5.3e-6 over 2 x 256 steps (`tests/tools/selection_margins SEED` prints them).
// Steps from the first near tie on are not compared.
constexpr double kNearTie = 2e-6;

using testing::row_error;

class GpuEngine : public ::testing::Test {
 protected:
  static std::string dir_[2];  // [0] continuous, [1] selective
  static std::vector<std::vector<int32_t>> prompts_;
  // The CPU's activation format: fp32, EngineOptions::bf16_activations, or EngineOptions::act_quant.
  enum class CpuAct { kF32, kBf16, kE4m3 };
  static std::map<std::tuple<int, KvDtype, CpuAct, bool>, std::vector<GreedyRun>> cpu_;

  static void SetUpTestSuite() {
    if (!have_gpu()) return;
    const char* env = std::getenv("DSV4_TEST_SEED");  // set: repeat that run's models and prompts
    const uint64_t seed = env ? std::strtoull(env, nullptr, 10)
                              : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
    for (int sel = 0; sel < 2; ++sel) {
      dir_[sel] = (std::filesystem::temp_directory_path() /
                   ("dsv4_gpu_engine_" + std::to_string(seed % 1000000) + (sel ? "_sel" : "_cont"))).string();
      testing::write_gpu_engine_test_model(seed, sel == 1, dir_[sel]);
    }
    prompts_ = testing::gpu_engine_test_prompts(seed);
  }
  static void TearDownTestSuite() {
    for (const std::string& d : dir_)
      if (!d.empty()) std::filesystem::remove_all(d);
  }

  // CPU runs, each sequence alone. f32 KV with fp32 activations: greedy; other KV dtypes or activation formats:
  // teacher-forced with that run's tokens. nudged: every KV value moved by kKvNudge before it is rounded
  // (set_kv_encode_nudge; see kv_rounding_effect), and with act_quant every quantized activation too
  // (cpu::set_act_quant_nudge).
  static const std::vector<GreedyRun>& cpu(int sel, KvDtype kv, CpuAct act = CpuAct::kF32, bool nudged = false) {
    auto it = cpu_.find({sel, kv, act, nudged});
    if (it != cpu_.end()) return it->second;
    const std::vector<GreedyRun>* force =
        kv == KvDtype::kF32 && act == CpuAct::kF32 ? nullptr : &cpu(sel, KvDtype::kF32);
    EngineOptions eo;
    eo.kv_dtype = kv;
    eo.bf16_activations = act == CpuAct::kBf16;
    eo.act_quant = act == CpuAct::kE4m3;
    auto m = Model::load(dir_[sel], eo);
    const int64_t V = m->config().vocab_size;
    std::vector<GreedyRun> runs;
    cpu::selection_margin_track(true);
    if (nudged) set_kv_encode_nudge(kKvNudge);
    if (nudged && act == CpuAct::kE4m3) cpu::set_act_quant_nudge(kKvNudge);
    for (size_t i = 0; i < prompts_.size(); ++i) {
      GreedyRun r;
      auto s = m->new_sequence();
      std::vector<SeqChunk> b(1);
      b[0].seq = s.get();
      b[0].tokens = prompts_[i];
      for (int k = 0; k < n_generate(); ++k) {
        cpu::selection_margin_reset();
        auto out = m->forward(b);
        r.margin.push_back(cpu::selection_margin());
        r.logits.push_back(out[0].logits);
        r.tokens.push_back(argmax(out[0].logits.data(), V));
        b[0].tokens = {force ? (*force)[i].tokens[k] : r.tokens.back()};
      }
      runs.push_back(std::move(r));
    }
    set_kv_encode_nudge(0.f);
    cpu::set_act_quant_nudge(0.f);
    cpu::selection_margin_track(false);
    return cpu_[{sel, kv, act, nudged}] = std::move(runs);
  }
  static constexpr float kKvNudge = 0x1p-20f;
  static double kv_rounding_effect(const char* what, KvDtype kv);

  // Both sequences batched on the GPU, teacher-forced with `force`'s tokens (the CPU f32 greedy run).
  // stagger > 0: the second sequence joins `stagger` steps late (steps of one and two tokens, so several
  // graph keys), otherwise both start together.
  static std::vector<GreedyRun> gpu(int sel, const gpu::GpuOptions& opt, const std::vector<GreedyRun>& force,
                                    int stagger = 0) {
    auto m = gpu::GpuModel::load(dir_[sel], opt);
    const int64_t V = m->config().vocab_size;
    std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
    for (size_t i = 0; i < prompts_.size(); ++i) seqs.push_back(m->new_sequence());
    std::vector<GreedyRun> runs(prompts_.size());
    std::vector<size_t> fed(prompts_.size(), 0);  // prompt tokens fed so far (stagger only)
    if (stagger > 0) {
      // The first sequence alone for `stagger` single-token steps.
      for (int k = 0; k < stagger; ++k) {
        std::vector<gpu::GpuSeqChunk> b(1);
        b[0].seq = seqs[0].get();
        b[0].tokens = {prompts_[0][fed[0]++]};
        m->forward(b);
      }
    }
    std::vector<gpu::GpuSeqChunk> b(prompts_.size());
    for (size_t i = 0; i < prompts_.size(); ++i) {
      b[i].seq = seqs[i].get();
      b[i].tokens.assign(prompts_[i].begin() + static_cast<int64_t>(fed[i]), prompts_[i].end());
    }
    for (int k = 0; k < n_generate(); ++k) {
      auto out = m->forward(b);
      for (size_t i = 0; i < b.size(); ++i) {
        runs[i].logits.push_back(out[i].logits);
        runs[i].tokens.push_back(argmax(out[i].logits.data(), V));
        // The device's greedy draw must be the host argmax of the same logits.
        EXPECT_EQ(b[i].next_token, runs[i].tokens.back()) << "seq " << i << " step " << k << ": " << b[i].error;
        b[i].tokens = {force[i].tokens[k]};
      }
    }
    return runs;
  }

  // Max over steps of |a - b| / max |b| (rows computed from identical inputs: teacher forcing), and the
  // steps where the argmax differs. require_argmax: the argmax must be identical at every step (exact mode).
  // Without it the count is reported only: once the logits are within `bound` * max|b|, an argmax can differ
  // only where the CPU's top two logits are within 2 * bound * max|b|, so the bound is the assertion.
  // Steps from the CPU run's first near tie (kNearTie) on are not compared, and say so.
  static double compare(const char* what, const std::vector<GreedyRun>& g, const std::vector<GreedyRun>& c,
                        double bound, bool require_argmax) {
    double worst_all = 0;
    size_t most_compared = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      size_t differ = 0, first_differ = g[i].tokens.size();
      double worst = 0;
      size_t worst_k = 0, limit = g[i].logits.size();
      for (size_t k = 0; k < c[i].margin.size() && k < limit; ++k)
        if (c[i].margin[k] < kNearTie) {
          std::printf("%s seq %zu: near tie in the CPU reference at step %zu (selection gap %.2e < %.0e): steps %zu.. "
                      "not compared\n", what, i, k, c[i].margin[k], kNearTie, k);
          limit = k;
        }
      for (size_t k = 0; k < limit; ++k) {
        const double rel = row_error(g[i].logits[k], c[i].logits[k]);
        if (!(rel <= worst)) worst = rel, worst_k = k;  // NaN propagates into worst
        if (g[i].tokens[k] != c[i].tokens[k] && differ++ == 0) first_differ = k;
      }
      std::printf("%s seq %zu (prompt %zu): max logit error %.3e (step %zu), argmax differs at %zu of %zu steps"
                  " (first %zu)\n", what, i, prompts_[i].size(), worst, worst_k, differ, limit, first_differ);
      EXPECT_LE(worst, bound) << what << " seq " << i;
      if (require_argmax) {
        EXPECT_EQ(differ, 0u) << what << " seq " << i;
      }
      if (!(worst <= worst_all)) worst_all = worst;
      most_compared = std::max(most_compared, limit);
    }
    // Not vacuous: near ties early in both sequences (rare) leave too little compared; rerun with a new seed.
    EXPECT_GE(most_compared, std::min<size_t>(32, g.empty() ? 0 : g[0].logits.size()))
        << what << " near ties early in every sequence: too few steps compared";
    return worst_all;
  }

  // Chunked prefill of `chunk` tokens per step against the CPU (ChunkedPrefillMatchesCpu).
  static void chunked_prefill_matches_cpu(int chunk, const std::string& variant = {},
                                          const std::function<void(gpu::GpuOptions&)>& tweak = {});

  // Bitwise equality of two GPU runs.
  static void expect_identical(const char* what, const std::vector<GreedyRun>& a, const std::vector<GreedyRun>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      size_t differ = 0;
      for (size_t k = 0; k < a[i].logits.size(); ++k)
        if (std::memcmp(a[i].logits[k].data(), b[i].logits[k].data(), a[i].logits[k].size() * sizeof(float)))
          ++differ;
      std::printf("%s seq %zu: %zu of %zu logits rows differ\n", what, i, differ, a[i].logits.size());
      EXPECT_EQ(differ, 0u) << what << " seq " << i;
    }
  }
};
std::string GpuEngine::dir_[2];
std::vector<std::vector<int32_t>> GpuEngine::prompts_;
std::map<std::tuple<int, KvDtype, GpuEngine::CpuAct, bool>, std::vector<GreedyRun>> GpuEngine::cpu_;

// fp32 activations everywhere (glue linear and MoE): only summation order and cosf/expf ulps differ from
// the CPU, each ~1e-7 relative per operation (the attention and compressor kernels are tested to 1e-4 and
// 2e-5 of their references); 5e-4 leaves room for the growth through 4 layers and the softmaxes.
TEST_F(GpuEngine, ExactModeF32KvMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  const auto& c = cpu(1, KvDtype::kF32);
  compare("selective model, exact, f32 KV vs CPU f32 KV:", gpu(1, o, c), c, 5e-4, true);
}

// Exact mode on the continuous model (2 experts, top-k 128 >= every visible entry count): separates a fault
// in the kernel path from one in this configuration's plumbing (a top-k that keeps everything, -1 slots).
TEST_F(GpuEngine, ExactModeContinuousF32KvMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  const auto& c = cpu(0, KvDtype::kF32);
  compare("continuous model, exact, f32 KV vs CPU f32 KV:", gpu(0, o, c), c, 5e-4, true);
}

// KV formats that round (bf16, fp8). GPU and CPU round fp32 values that differ slightly (~1e-7 in exact
// mode, ~1e-3 with the bf16-activation kernels), so a value near a rounding boundary lands on the
// neighbouring code on one side: one code step, 2^-8 relative in bf16, 2^-4..2^-3 in e4m3. No maximum over
// hundreds of thousands of stored values can exclude that, so the bound is stated against the format's own
// effect: d_q = the CPU's distance between this KV dtype and f32 KV (every value moved by up to half a code
// step), and d_flip = the CPU's distance between two runs in this KV dtype whose values differ by a relative
// 2^-20 before rounding (a few values rounded the other way, what the GPU's fp32 values cause). d_q alone was
// not enough where the continuation is sensitive: seed 178651643202 (twenty-fourth session, run 146) gave the
// GPU 1.71e-2 at the last step against d_q = 1.84e-3, and the CPU's d_flip there is 1.71e-2 at the same step
// (tests/tools/kv_rounding_sensitivity). bound = base + 2 * max(d_q, d_flip). Only the continuous model is
// used: on the selective one a flipped code can flip an indexer or router choice, a jump no bound covers
// (measured on the H200, 2026-11-30: 0.19..0.64 with fp8 KV even in exact mode).
// The largest row error (row_error) of run against ref over every sequence and step (both teacher-forced with
// the same tokens).
double max_row_error(const std::vector<GreedyRun>& run, const std::vector<GreedyRun>& ref) {
  double d = 0;
  for (size_t i = 0; i < run.size(); ++i)
    for (size_t k = 0; k < run[i].logits.size(); ++k) d = std::max(d, row_error(run[i].logits[k], ref[i].logits[k]));
  return d;
}
// A CPU run in a rounding format (a KV dtype, or bf16 activations) against the fp32 CPU run: the format's own
// effect on the logits.
double format_effect(const char* what, const char* format, const std::vector<GreedyRun>& run,
                     const std::vector<GreedyRun>& f32_run) {
  const double d = max_row_error(run, f32_run);
  std::printf("%s: d_q (CPU, %s vs fp32) = %.3e\n", what, format, d);
  return d;
}
// max(d_q, d_flip) for this KV dtype on the continuous model (the comment above).
double GpuEngine::kv_rounding_effect(const char* what, KvDtype kv) {
  const double dq = format_effect(what, "this KV dtype", cpu(0, kv), cpu(0, KvDtype::kF32));
  const double df = max_row_error(cpu(0, kv, CpuAct::kF32, true), cpu(0, kv));
  std::printf("%s: d_flip (CPU, this KV dtype, values nudged by 2^-20 before rounding) = %.3e\n", what, df);
  return std::max(dq, df);
}

TEST_F(GpuEngine, ExactModeBf16Fp8KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  for (KvDtype kv : {KvDtype::kBF16, KvDtype::kFP8}) {
    const char* name = kv == KvDtype::kBF16 ? "continuous model, exact, bf16 KV vs CPU bf16 KV"
                                            : "continuous model, exact, fp8 KV vs CPU fp8 KV";
    const auto& f32 = cpu(0, KvDtype::kF32);
    const auto& c = cpu(0, kv);
    const double d_kv = kv_rounding_effect(name, kv);
    compare(name, gpu(0, test_options(kv, true), f32), c, 5e-4 + 2 * d_kv, false);
  }
}

// (These caught a real bug: cudalin::gemv left rows 4..15 of each tile unwritten when a block had fewer than
// four warps, i.e. for short K such as wq_b's q_lora_rank; fixed in gemv.cu with a regression case in
// tests/cuda_linear/test_gemv.cc. Kernels f32 / dense / bf16 pass on the H200 since, 2026-11-30.)
//
// The production path: FP8/MXFP4 GEMV and MoE kernels with 16-bit activations (f16 for the FP8 GEMVs by
// default, bf16 for the MoE; f16 rounds by <= 2^-12, so the bf16 analysis bounds both). Each bf16 rounding is
// <= 2^-9 relative with random sign, so one GEMV output moves by ~2^-9/sqrt(3) = 1.1e-3 in norm
// (docs/GEMM_MOE.md). Per layer about 8 such GEMVs feed the residual streams (wq_a, wq_b, wkv, wo_a, wo_b,
// indexer wq_b, shared expert, routed experts), 4 layers: ~sqrt(32) * 1.1e-3 = 6e-3 if independent; the
// bound 2e-2 allows 3x on top. Within that bound the argmax can differ only at near ties (measured on the
// H200 over 256 teacher-forced steps: 1-5 such steps per sequence), so the bound is the assertion; exact
// mode requires identical argmax everywhere.
TEST_F(GpuEngine, KernelsF32KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const auto& c = cpu(0, KvDtype::kF32);
  compare("continuous model, kernels, f32 KV vs CPU f32 KV:", gpu(0, test_options(KvDtype::kF32), c), c, 2e-2, false);
}

// The same with the FP8 GEMVs on bf16 activations (GpuOptions::f16_activations off; the default feeds them
// f16, whose rounding is 8x finer). As for the rounding KV formats below, the bound adds the format's own
// effect measured on the CPU (EngineOptions::bf16_activations, which rounds the input of every FP8 / MXFP4
// linear to bf16 as these kernels do): 2e-2 for the kernel path plus 2 d_a.
TEST_F(GpuEngine, KernelsBf16ActivationsF32KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const char* name = "continuous model, kernels with bf16 activations, f32 KV vs CPU f32 KV:";
  const auto& c = cpu(0, KvDtype::kF32);
  const double da = format_effect(name, "bf16 activations", cpu(0, KvDtype::kF32, CpuAct::kBf16), c);
  gpu::GpuOptions o = test_options(KvDtype::kF32);
  o.f16_activations = false;
  compare(name, gpu(0, o, c), c, 2e-2 + 2 * da, false);
}

// Dense FP8 GEMV kernels only (routed experts through the fp32 glue): isolates the MoE kernel's share.
TEST_F(GpuEngine, DenseKernelsF32KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  const auto& c = cpu(0, KvDtype::kF32);
  compare("continuous model, dense kernels, exact MoE, f32 KV vs CPU f32 KV:",
          gpu(0, test_options(KvDtype::kF32, false, true), c), c, 2e-2, false);
}

// Rounding KV formats with the kernels: the 2e-2 of the kernel path plus the KV-flip allowance above.
TEST_F(GpuEngine, KernelsBf16Fp8KvMatchCpu) {
  DSV4_REQUIRE_GPU();
  for (KvDtype kv : {KvDtype::kBF16, KvDtype::kFP8}) {
    const char* name = kv == KvDtype::kBF16 ? "continuous model, kernels, bf16 KV vs CPU bf16 KV"
                                            : "continuous model, kernels, fp8 KV vs CPU fp8 KV";
    const auto& f32 = cpu(0, KvDtype::kF32);
    const auto& c = cpu(0, kv);
    const double d_kv = kv_rounding_effect(name, kv);
    compare(name, gpu(0, test_options(kv), f32), c, 2e-2 + 2 * d_kv, false);
  }
}

// GpuOptions::act_quant against the CPU's EngineOptions::act_quant (DeepSeek's FP8 activations), token by token
// (GEMVs, graphs) and in chunks of 200 (dequantize + cuBLAS). The GEMVs read the e4m3 values exactly (bf16 holds
// them) and the routed experts run in fp32, so the GPU computes the CPU mode's function up to summation order
// (~1e-7 of an output; GpuKernelViews.ActQuantLinearsMatchCpu checks each linear view and the MoE to that) and
// wo_a's input (bf16 on the GPU, fp32 on the CPU). But that function is chaotic at the level of its own rounding:
// an activation within ~1e-7 of an e4m3 rounding boundary takes the other code (2^-4 relative) when its fp32 value
// moves by that much, the change flips codes in every later quantization, and within one token's four layers the
// logits move as far as quantizing at all moves them. Measured on the CPU alone (tests/tools/act_quant_sensitivity
// 147733608350, 2026-12-01): for the first forward of eight single tokens, act_quant against fp32 5.7e-2 .. 7.0e-2;
// every activation nudged by 2^-20 before act_quant: 0 for five tokens (no code flipped) and 5.3e-2 .. 5.9e-2 for
// three (some code flipped); by 2^-24: 0 for all. The GPU's fp32 values differ from the CPU's by ~2^-23 nearly
// everywhere, so some code always flips (H200, run 165: first-token GPU-to-CPU errors 5.6e-2 .. 9.9e-2; runs
// 164-166 over 256 steps 0.098 .. 0.120 against d_flip 0.079 .. 0.103 and d_aq 0.107 .. 0.117). So two implementations of
// act_quant agree only to its noise level, which d_flip (the CPU run against itself nudged by 2^-20) and d_aq (the
// CPU run against fp32 activations) both measure: bound = 5e-3 + 2 max(d_flip, d_aq), a check against gross
// errors (NaN, a wrong layer, garbage) only; the sharp checks are per operation (above, and GlueActQuant for the
// quantizer bit for bit).
TEST_F(GpuEngine, ActQuantMatchesCpuActQuant) {
  DSV4_REQUIRE_GPU();
  const auto& f32 = cpu(0, KvDtype::kF32);
  const auto& aq = cpu(0, KvDtype::kF32, CpuAct::kE4m3);
  const double d_aq = format_effect("continuous model, act_quant", "act_quant", aq, f32);
  const double d_flip = max_row_error(cpu(0, KvDtype::kF32, CpuAct::kE4m3, true), aq);
  std::printf("continuous model, act_quant vs CPU: d_flip (CPU, activations nudged by 2^-20 before act_quant) = %.3e\n",
              d_flip);
  for (int chunk : {0, 200}) {
    gpu::GpuOptions o = test_options(KvDtype::kF32);
    o.act_quant = true;
    o.prefill_chunk = chunk;
    const std::string what = "continuous model, act_quant, chunk " + std::to_string(chunk) + ", f32 KV vs CPU act_quant:";
    const std::vector<GreedyRun> g = gpu(0, o, f32);
    compare(what.c_str(), g, aq, 5e-3 + 2 * std::max(d_flip, d_aq), false);
    std::printf("%s against the fp32 CPU run %.3e (d_aq %.3e)\n", what.c_str(), max_row_error(g, f32), d_aq);
  }
}

// act_quant and exact_linear name two activation formats: refused at load, naming both.
TEST_F(GpuEngine, ActQuantWithExactLinearIsRefused) {
  DSV4_REQUIRE_GPU();
  gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  o.act_quant = true;
  try {
    gpu::GpuModel::load(dir_[0], o);
    FAIL() << "loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("act_quant and exact_linear"), std::string::npos) << e.what();
  }
}

// CUDA graphs replay exactly what eager launches compute: bit-identical logits, with the batch changing
// shape (one sequence alone for 40 steps, then both; prompts cross context buckets 128 and 256), in bf16 and
// fp8 KV (fp8 also switches the eager indexer to the same per-query kernel the graphs use).
TEST_F(GpuEngine, CudaGraphsMatchEagerBitwise) {
  DSV4_REQUIRE_GPU();
  const auto& c = cpu(1, KvDtype::kF32);
  for (KvDtype kv : {KvDtype::kBF16, KvDtype::kFP8}) {
    gpu::GpuOptions eager = test_options(kv), graphs = test_options(kv);
    eager.cuda_graphs = false;
    graphs.cuda_graphs = true;
    expect_identical(kv == KvDtype::kBF16 ? "selective model, kernels, bf16 KV, graphs vs eager"
                                          : "selective model, kernels, fp8 KV, graphs vs eager",
                     gpu(1, graphs, c, 40), gpu(1, eager, c, 40));
  }
}

// GpuOptions::overlap_branches (the CSA indexer and the shared expert on a second stream, forked and joined
// by events, also inside the captured graphs) computes exactly what one stream does; so do the window KV row
// on the third stream (kv_row_on_side), the slot lists on the branch streams (slots_on_branches), the shared
// expert joined only before the routed experts' w2 (shared_join_at_w2), the branch or the main stream at the
// greatest priority (priority_stream), with the timing events of branch_timeline, and (every two-stream run
// against the one-stream reference that has them off) with the top-k writing the slot lists (topk_writes_slots)
// and the index q's RoPE inside the scores kernel (index_rope_in_scores).
TEST_F(GpuEngine, TwoStreamsMatchOneStreamBitwise) {
  DSV4_REQUIRE_GPU();
  const auto& c = cpu(1, KvDtype::kF32);
  for (bool graphs : {true, false}) {
    gpu::GpuOptions one = test_options(KvDtype::kFP8), two = test_options(KvDtype::kFP8);
    one.overlap_branches = false;
    one.topk_writes_slots = false;  // the reference: the top-k's index list mapped by the slot-list kernel
    one.index_rope_in_scores = false;  // and the index q rotated by its own launch
    two.overlap_branches = true;
    two.kv_row_on_side = false;  // the window KV row's encode on the main stream
    two.shared_join_at_w2 = false;  // the shared expert joined before the routed experts' w1/w3
    two.priority_stream = gpu::GpuOptions::PriorityStream::kNone;  // every stream at the default priority
    one.cuda_graphs = two.cuda_graphs = graphs;
    const auto want = gpu(1, one, c, 40);
    expect_identical(graphs ? "selective model, kernels, fp8 KV, two streams vs one (graphs)"
                            : "selective model, kernels, fp8 KV, two streams vs one (eager)",
                     gpu(1, two, c, 40), want);
    two.kv_row_on_side = true;  // the window KV row's encode on the compressor's stream
    expect_identical(graphs ? "selective model, kernels, fp8 KV, KV row on the side, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, KV row on the side, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
    two.slots_on_branches = false;  // the slot lists on the main stream
    expect_identical(graphs ? "selective model, kernels, fp8 KV, slot lists on the main stream, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, slot lists on the main stream, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
    two.slots_on_branches = true;
    two.shared_join_at_w2 = true;  // the shared expert joined before the routed experts' w2
    expect_identical(graphs ? "selective model, kernels, fp8 KV, shared expert joined at w2, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, shared expert joined at w2, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
    two.priority_stream = gpu::GpuOptions::PriorityStream::kBranch;  // graphs: node priorities; the shared
                                                                       // expert on side2
    expect_identical(graphs ? "selective model, kernels, fp8 KV, branch stream prioritized, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, branch stream prioritized, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
    two.priority_stream = gpu::GpuOptions::PriorityStream::kMain;
    expect_identical(graphs ? "selective model, kernels, fp8 KV, main stream prioritized, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, main stream prioritized, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
    two.priority_stream = gpu::GpuOptions::PriorityStream::kBranch;
    two.branch_timeline = true;  // timing events at the joins (external event nodes in the graphs)
    expect_identical(graphs ? "selective model, kernels, fp8 KV, branch timeline events, vs one stream (graphs)"
                            : "selective model, kernels, fp8 KV, branch timeline events, vs one stream (eager)",
                     gpu(1, two, c, 40), want);
  }
}

// GpuOptions::index_all_when_short (no indexer scores where the top-k keeps every visible key) computes exactly
// what the scores and the top-k give: the continuous model (index_topk 128) runs contexts up to 556, in buckets
// of <= 512 positions (<= 128 columns: the selection without scores) and of 1024 (the top-k), in graphs and
// eagerly, one stream and two. The selective model (top-16, at least 32 columns) must never take the short path:
// there the option must change nothing (its selections differ from "every visible key").
TEST_F(GpuEngine, IndexAllWhenShortMatchesBitwise) {
  DSV4_REQUIRE_GPU();
  for (int sel : {0, 1}) {
    const auto& c = cpu(sel, KvDtype::kF32);
    for (bool graphs : {true, false}) {
      gpu::GpuOptions off = test_options(KvDtype::kFP8), on = off;
      on.index_all_when_short = true;
      off.index_all_when_short = false;
      off.cuda_graphs = on.cuda_graphs = graphs;
      for (bool two : {true, false}) {
        off.overlap_branches = on.overlap_branches = two;
        const std::string what = std::string(sel ? "selective" : "continuous") +
                                 " model, kernels, fp8 KV, indexer selection without scores when short, " +
                                 (two ? "two streams" : "one stream") + (graphs ? " (graphs)" : " (eager)");
        expect_identical(what.c_str(), gpu(sel, on, c, 40), gpu(sel, off, c, 40));  // first 40 steps staggered
      }
    }
  }
  // Exact mode (its own q and scores arithmetic, skipped the same way), bf16 KV, on the continuous model.
  gpu::GpuOptions off = test_options(KvDtype::kBF16, true), on = off;
  on.index_all_when_short = true;
  off.index_all_when_short = false;
  const auto& c = cpu(0, KvDtype::kF32);
  expect_identical("continuous model, exact, bf16 KV, indexer selection without scores when short",
                   gpu(0, on, c, 40), gpu(0, off, c, 40));
}

// Chunked prefill (GpuOptions::prefill_chunk): several tokens of a sequence per step, against the CPU.
// Chunks of 48 cut the 4- and 128-token compressor blocks and the 64-row window anywhere and widen the ring;
// chunks of 200 (above 64 tokens per step) take dequantize + cuBLAS for the linears and the grouped MoE
// prefill GEMM.
// Same functions as the token-by-token path, so the same bounds: exact mode on the selective model (5e-4,
// argmax identical at every step), kernels on the continuous model (2e-2).
// variant names what tweak changes in the options of both runs.
void GpuEngine::chunked_prefill_matches_cpu(int chunk, const std::string& variant,
                                            const std::function<void(gpu::GpuOptions&)>& tweak) {
  const std::string what = "chunked prefill " + std::to_string(chunk) + variant;
  gpu::GpuOptions exact = test_options(KvDtype::kF32, true);
  exact.prefill_chunk = chunk;
  if (tweak) tweak(exact);
  const auto& cs = cpu(1, KvDtype::kF32);
  compare(("selective model, exact, " + what + ", f32 KV vs CPU:").c_str(), gpu(1, exact, cs), cs, 5e-4, true);
  gpu::GpuOptions kern = test_options(KvDtype::kFP8);
  kern.prefill_chunk = chunk;
  if (tweak) tweak(kern);
  const auto& f32 = cpu(0, KvDtype::kF32);
  const auto& c8 = cpu(0, KvDtype::kFP8);
  const double d_kv = kv_rounding_effect("continuous model, fp8 KV", KvDtype::kFP8);
  compare(("continuous model, kernels, " + what + ", fp8 KV vs CPU fp8 KV:").c_str(), gpu(0, kern, f32), c8,
          2e-2 + 2 * d_kv, false);
}

TEST_F(GpuEngine, ChunkedPrefillMatchesCpu) {
  DSV4_REQUIRE_GPU();
  for (int chunk : {48, 200}) chunked_prefill_matches_cpu(chunk);
}

// GpuOptions::gemm_f32_linears off: the router's and weights_proj's fp32 glue linears also in steps of > 64
// tokens (the 200-token chunks); on (the default) they are cuBLAS in fp32 there.
TEST_F(GpuEngine, GlueF32LinearsChunkedPrefillMatchesCpu) {
  DSV4_REQUIRE_GPU();
  chunked_prefill_matches_cpu(200, " (glue f32 linears)", [](gpu::GpuOptions& o) { o.gemm_f32_linears = false; });
}

// GpuOptions::moe_prefill_f16 off: the routed experts of the 200-token chunks through the bf16 moe_prefill
// instead of moe_prefill_f16 (the default, in ChunkedPrefillMatchesCpu).
TEST_F(GpuEngine, MoePrefillBf16ChunkedPrefillMatchesCpu) {
  DSV4_REQUIRE_GPU();
  chunked_prefill_matches_cpu(200, " (bf16 MoE prefill)", [](gpu::GpuOptions& o) { o.moe_prefill_f16 = false; });
}

// GpuOptions::indexer_fp8_q (the CSA indexer's q in e4m3 on FP8 tensor cores, sm_90 only): the continuous model's
// top-k keeps every entry, so the scores' precision cannot change its output and the bounds above hold. Runs the
// kernel in the decode graphs (one query per CTA) and in the 200-token prefill chunks (four queries per CTA,
// queries_share_keys); exact mode turns the option off (the selective run is the plain exact path again).
TEST_F(GpuEngine, IndexerFp8QChunkedPrefillMatchesCpu) {
  DSV4_REQUIRE_GPU();
  if (!cuda::indexer_fp8_q_supported()) GTEST_SKIP() << "indexer_fp8_q needs compute capability 9.0";
  chunked_prefill_matches_cpu(200, " (indexer fp8 q)", [](gpu::GpuOptions& o) { o.indexer_fp8_q = true; });
}

// A prompt whose logits are all wanted, longer than the logits rows a step may carry (max_seqs + 512,
// MemoryPlan::step.logits_rows): with a prefill chunk of 1024 the scheduler cuts it into steps of 513 and 187
// tokens (engine/step_plan.h next_step's out_cap). Every row against the CPU's all-logits forward, exact mode.
TEST_F(GpuEngine, AllLogitsPromptLongerThanTheLogitsRows) {
  DSV4_REQUIRE_GPU();
  const std::vector<int32_t> prompt = testing::lcg_prompt(700, 77);
  EngineOptions eo;
  eo.kv_dtype = KvDtype::kF32;
  auto cm = Model::load(dir_[0], eo);
  const int64_t V = cm->config().vocab_size;
  auto cs = cm->new_sequence();
  std::vector<SeqChunk> cb(1);
  cb[0].seq = cs.get();
  cb[0].tokens = prompt;
  cb[0].all_logits = true;
  const std::vector<float> want = cm->forward(cb)[0].logits;
  gpu::GpuOptions o = test_options(KvDtype::kF32, true);
  o.max_seqs = 1;
  o.prefill_chunk = 1024;
  auto m = gpu::GpuModel::load(dir_[0], o);
  ASSERT_EQ(m->memory_plan().step.logits_rows, 1 + 512);
  auto gs = m->new_sequence();
  std::vector<gpu::GpuSeqChunk> gb(1);
  gb[0].seq = gs.get();
  gb[0].tokens = prompt;
  gb[0].all_logits = true;
  const std::vector<ChunkOutput> got = m->forward(gb);
  ASSERT_EQ(got[0].logits.size(), want.size());
  ASSERT_EQ(want.size(), prompt.size() * static_cast<size_t>(V));
  double worst = 0;
  for (size_t r = 0; r < prompt.size(); ++r) {
    const std::vector<float> a(got[0].logits.begin() + r * V, got[0].logits.begin() + (r + 1) * V);
    const std::vector<float> b(want.begin() + r * V, want.begin() + (r + 1) * V);
    worst = std::max(worst, testing::row_error(a, b));
  }
  std::printf("continuous model, exact, 700 all-logits rows in steps of 513 + 187 vs CPU: max logit error %.3e\n", worst);
  EXPECT_LE(worst, 5e-4);
  EXPECT_EQ(gs->length, 700);
}

// Sixteen sequences per step: the LM head then runs through cuBLAS on bf16 activations (>= 16 logits rows),
// inside the captured decode graphs. Each sequence against the CPU alone (continuous model, f32 KV,
// teacher-forced, the kernel path's bound) and graphs against eager launches bit for bit.
TEST_F(GpuEngine, BatchOf16MatchesCpuAndGraphsMatchEager) {
  DSV4_REQUIRE_GPU();
  constexpr int kSeqs = 16, kGen = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSeqs; ++i) prompts.push_back(testing::lcg_prompt(20 + 7 * i, 1000 + i));
  // CPU: greedy, each sequence alone.
  EngineOptions eo;
  eo.kv_dtype = KvDtype::kF32;
  auto cm = Model::load(dir_[0], eo);
  const int64_t V = cm->config().vocab_size;
  std::vector<GreedyRun> cpu_runs(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    auto sq = cm->new_sequence();
    std::vector<SeqChunk> b(1);
    b[0].seq = sq.get();
    b[0].tokens = prompts[i];
    for (int k = 0; k < kGen; ++k) {
      auto out = cm->forward(b);
      cpu_runs[i].logits.push_back(out[0].logits);
      cpu_runs[i].tokens.push_back(argmax(out[0].logits.data(), V));
      b[0].tokens = {cpu_runs[i].tokens.back()};
    }
  }
  auto gpu_runs = [&](bool graphs) {
    gpu::GpuOptions o = test_options(KvDtype::kF32);
    o.max_seqs = kSeqs;
    o.cuda_graphs = graphs;
    auto m = gpu::GpuModel::load(dir_[0], o);
    std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
    std::vector<gpu::GpuSeqChunk> b(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      seqs.push_back(m->new_sequence());
      b[i].seq = seqs.back().get();
      b[i].tokens = prompts[i];
    }
    std::vector<GreedyRun> runs(kSeqs);
    for (int k = 0; k < kGen; ++k) {
      auto out = m->forward(b);
      for (int i = 0; i < kSeqs; ++i) {
        runs[i].logits.push_back(out[i].logits);
        runs[i].tokens.push_back(argmax(out[i].logits.data(), V));
        EXPECT_EQ(b[i].next_token, runs[i].tokens.back()) << "seq " << i << " step " << k;
        b[i].tokens = {cpu_runs[i].tokens[k]};  // teacher forcing
      }
    }
    return runs;
  };
  const auto g = gpu_runs(true), e = gpu_runs(false);
  double worst = 0;
  int64_t differ = 0, rows_differ = 0;
  for (int i = 0; i < kSeqs; ++i)
    for (int k = 0; k < kGen; ++k) {
      rows_differ += std::memcmp(g[i].logits[k].data(), e[i].logits[k].data(), g[i].logits[k].size() * sizeof(float)) != 0;
      worst = std::max(worst, row_error(g[i].logits[k], cpu_runs[i].logits[k]));
      differ += g[i].tokens[k] != cpu_runs[i].tokens[k];
    }
  std::printf("continuous model, kernels, 16 sequences (cuBLAS head in graphs) vs CPU: max logit error %.3e, argmax "
              "differs at %lld of %d rows (near ties within the bound); graphs vs eager: %lld rows differ\n", worst,
              static_cast<long long>(differ), kSeqs * kGen, static_cast<long long>(rows_differ));
  EXPECT_LE(worst, 2e-2);
  EXPECT_EQ(rows_differ, 0);
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

// Decode throughput of this small test model (printed, not asserted: 4 layers, hidden 512), and the
// production loop's contract on it: logits stay on the device, each step yields a valid token.
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
      b[i].tokens = testing::lcg_prompt(64, 99 + i);
    }
    m->forward(b);
    const int steps = 128;
    const auto t0 = std::chrono::steady_clock::now();
    int bad = 0;
    for (int k = 0; k < steps; ++k) {
      for (auto& ch : b) ch.tokens = {static_cast<int32_t>(2 + k)}, ch.return_logits = false;
      m->forward(b);
      for (const auto& ch : b) bad += !ch.error.empty() || ch.next_token < 0 || ch.next_token >= m->config().vocab_size;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Graph replay over 128 steps with no logits leaving the device: every step draws a valid token.
    EXPECT_EQ(bad, 0) << "steps whose device draw was missing, out of range or non-finite";
    std::printf("decode (small test model, fp8 KV, batch %d): %.1f steps/s, %.1f tok/s, %.3f ms/step\n", batch,
                steps / s, steps * batch / s, 1e3 * s / steps);
  }
}

}  // namespace
}  // namespace dsv4
