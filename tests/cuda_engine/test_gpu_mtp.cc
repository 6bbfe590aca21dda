// The GPU engine's MTP block (GpuModel::mtp_forward, GpuOptions::load_mtp) and pre-head streams
// (GpuSeqChunk::keep_streams) against the CPU Model's (Model::mtp_forward, SeqChunk::keep_streams), on a fresh random
// checkpoint at the kernels' attention widths with one MTP layer: two main layers (window + hash routing, CSA) and
// the MTP block (window only, as V4's), 2 experts top-2 and index_topk 128, so no selection can flip between the
// two paths (test_gpu_model.cc's "continuous" model). A 100-token prompt, then 6 decode steps, each followed by an
// MTP step on the main model's streams and the next token, teacher-forced with the CPU's greedy tokens; the GPU's
// MTP steps read the CPU's streams, so their error is the MTP block's own. Bounds as test_gpu_model's for the same
// configurations: exact mode (fp32 activations everywhere) 5e-4 of the largest logit, the kernels 2e-2; the
// streams 1e-4 / 2e-2 of their largest value. SKIPs without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "attention_width_model.h"
#include "core/error.h"
#include "engine/gpu/gpu_model.h"
#include "engine/model.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

using testing::row_error;

int32_t argmax(const std::vector<float>& v, int64_t row, int64_t n) {
  const float* p = v.data() + row * n;
  return static_cast<int32_t>(std::max_element(p, p + n) - p);
}

// One run: per step, the main logits (last row), the streams, and the MTP logits (every row).
struct MtpRun {
  std::vector<std::vector<float>> main_logits, streams, mtp_logits;
  std::vector<int32_t> tokens;  // the greedy token after each main step (CPU runs)
};

class GpuMtp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!dsv4::testing::have_gpu()) return;
    const char* env = std::getenv("DSV4_TEST_SEED");
    seed_ = env ? std::strtoull(env, nullptr, 10)
                : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed_));
    dir_ = (std::filesystem::temp_directory_path() / ("dsv4_gpu_mtp_" + std::to_string(seed_ % 1000000))).string();
    RandomCheckpointOptions o;
    o.seed = seed_;
    write_random_checkpoint(testing::attention_width_config({0, 4, 0}, 2, 128, 1), dir_, o);
    prompt_ = testing::lcg_prompt(100, static_cast<uint32_t>(seed_));
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static constexpr int kSteps = 6;

  static MtpRun cpu_run() {
    EngineOptions eo;
    eo.kv_dtype = KvDtype::kF32;
    auto m = Model::load(dir_, eo);
    const int64_t V = m->config().vocab_size;
    auto s = m->new_sequence();
    MtpRun r;
    std::vector<int32_t> feed = prompt_;
    for (int k = 0; k <= kSteps; ++k) {
      std::vector<SeqChunk> b(1);
      b[0].seq = s.get();
      b[0].tokens = feed;
      b[0].keep_streams = true;
      auto out = m->forward(b);
      const int32_t next = argmax(out[0].logits, 0, V);
      std::vector<MtpChunk> mb(1);
      mb[0].seq = s.get();
      mb[0].next_tokens.assign(feed.begin() + 1, feed.end());
      mb[0].next_tokens.push_back(next);
      mb[0].streams = out[0].streams;
      mb[0].all_logits = true;
      auto mo = m->mtp_forward(mb);
      r.main_logits.push_back(out[0].logits);
      r.streams.push_back(out[0].streams);
      r.mtp_logits.push_back(mo[0].logits);
      r.tokens.push_back(next);
      feed = {next};
    }
    return r;
  }

  // The same steps on the GPU, teacher-forced with the CPU run's tokens; the MTP steps take the CPU's streams.
  static MtpRun gpu_run(const gpu::GpuOptions& opt, const MtpRun& ref) {
    auto m = gpu::GpuModel::load(dir_, opt);
    auto s = m->new_sequence();
    MtpRun r;
    std::vector<int32_t> feed = prompt_;
    for (int k = 0; k <= kSteps; ++k) {
      std::vector<gpu::GpuSeqChunk> b(1);
      b[0].seq = s.get();
      b[0].tokens = feed;
      b[0].keep_streams = true;
      auto out = m->forward(b);
      EXPECT_EQ(out[0].streams.size(), ref.streams[k].size()) << "step " << k;
      std::vector<gpu::GpuMtpChunk> mb(1);
      mb[0].seq = s.get();
      mb[0].next_tokens.assign(feed.begin() + 1, feed.end());
      mb[0].next_tokens.push_back(ref.tokens[k]);
      mb[0].streams = ref.streams[k];
      mb[0].all_logits = true;
      auto mo = m->mtp_forward(mb);
      EXPECT_EQ(s->mtp_length, s->length) << "step " << k;
      r.main_logits.push_back(out[0].logits);
      r.streams.push_back(out[0].streams);
      r.mtp_logits.push_back(mo[0].logits);
      feed = {ref.tokens[k]};
    }
    return r;
  }

  static void compare(const char* what, const MtpRun& g, const MtpRun& c, double bound, double stream_bound) {
    const int64_t V = 1024;
    double main_err = 0, stream_err = 0, mtp_err = 0;
    for (size_t k = 0; k < c.main_logits.size(); ++k) {
      main_err = std::max(main_err, row_error(g.main_logits[k], c.main_logits[k]));
      stream_err = std::max(stream_err, row_error(g.streams[k], c.streams[k]));
      ASSERT_EQ(g.mtp_logits[k].size(), c.mtp_logits[k].size()) << what << " step " << k;
      const int64_t rows = static_cast<int64_t>(c.mtp_logits[k].size()) / V;
      for (int64_t i = 0; i < rows; ++i) {
        const std::vector<float> gr(g.mtp_logits[k].begin() + i * V, g.mtp_logits[k].begin() + (i + 1) * V);
        const std::vector<float> cr(c.mtp_logits[k].begin() + i * V, c.mtp_logits[k].begin() + (i + 1) * V);
        const double e = row_error(gr, cr);
        if (!(e <= mtp_err)) mtp_err = e;
      }
    }
    std::printf("%s main logits %.3e, streams %.3e, MTP logits %.3e (bounds %.0e / %.0e)\n", what, main_err,
                stream_err, mtp_err, bound, stream_bound);
    EXPECT_LE(main_err, bound) << what;
    EXPECT_LE(stream_err, stream_bound) << what;
    EXPECT_LE(mtp_err, bound) << what;
  }

  static gpu::GpuOptions options(bool exact) {
    gpu::GpuOptions o;
    o.kv_dtype = KvDtype::kF32;
    o.max_seqs = 1;
    o.max_model_len = 256;
    o.exact_linear = exact;
    o.load_mtp = true;
    return o;
  }

  static uint64_t seed_;
  static std::string dir_;
  static std::vector<int32_t> prompt_;
};
uint64_t GpuMtp::seed_ = 0;
std::string GpuMtp::dir_;
std::vector<int32_t> GpuMtp::prompt_;

TEST_F(GpuMtp, ExactModeMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const MtpRun c = cpu_run();
  compare("MTP, exact, f32 KV vs CPU:", gpu_run(options(true), c), c, 5e-4, 1e-4);
}

TEST_F(GpuMtp, KernelsMatchCpu) {
  DSV4_REQUIRE_GPU();
  const MtpRun c = cpu_run();
  compare("MTP, kernels, f32 KV vs CPU:", gpu_run(options(false), c), c, 2e-2, 2e-2);
}

// In chunks of 128 tokens: the prompt's main and MTP steps take all 100 tokens at once, through the paths of steps
// above 64 tokens (cuBLAS linears, the MoE prefill GEMM; h_proj in GEMVs of 64 rows).
TEST_F(GpuMtp, ChunkedKernelsMatchCpu) {
  DSV4_REQUIRE_GPU();
  const MtpRun c = cpu_run();
  gpu::GpuOptions o = options(false);
  o.prefill_chunk = 128;
  compare("MTP, kernels, chunks of 128, f32 KV vs CPU:", gpu_run(o, c), c, 2e-2, 2e-2);
}

TEST_F(GpuMtp, RefusesWithoutTheBlock) {
  DSV4_REQUIRE_GPU();
  gpu::GpuOptions o = options(false);
  o.load_mtp = false;
  auto m = gpu::GpuModel::load(dir_, o);
  auto s = m->new_sequence();
  std::vector<gpu::GpuMtpChunk> mb(1);
  mb[0].seq = s.get();
  mb[0].next_tokens = {5};
  mb[0].streams.assign(static_cast<size_t>(m->config().hc_mult) * m->config().hidden_size, 0.f);
  try {
    m->mtp_forward(mb);
    FAIL() << "mtp_forward ran without GpuOptions::load_mtp";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_mtp"), std::string::npos) << e.what();
  }
  // A checkpoint without an MTP layer refuses load_mtp at load.
  const std::string plain = dir_ + "_plain";
  RandomCheckpointOptions ro;
  ro.seed = seed_ + 1;
  write_random_checkpoint(testing::attention_width_config({0, 4}, 2, 128), plain, ro);
  try {
    gpu::GpuModel::load(plain, options(false));
    FAIL() << "load_mtp accepted a checkpoint without an MTP layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MTP layer"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(plain);
}

}  // namespace
}  // namespace dsv4
