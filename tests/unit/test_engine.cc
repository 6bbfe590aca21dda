// Engine behaviour on the embedded default model: sampling, state rollback, MTP step, routing rules.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/cpu/moe.h"
#include "engine/memory_plan.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "model/random_checkpoint.h"
#include "core/error.h"
#include "engine_feed.h"
#include "test_util.h"

namespace dsv4 {
namespace {

class DefaultModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("engine");
    write_random_checkpoint(default_model_config_json(), dir_->str(), RandomCheckpointOptions{});
  }
  static void TearDownTestSuite() { delete dir_; }
  static testing::TempDir* dir_;

  static std::vector<float> run(const Model& m, SequenceState& s, const std::vector<int32_t>& toks, bool all = true) {
    std::vector<SeqChunk> b(1);
    b[0].seq = &s;
    b[0].tokens = toks;
    b[0].all_logits = all;
    return m.forward(b)[0].logits;
  }
};
testing::TempDir* DefaultModel::dir_ = nullptr;

TEST_F(DefaultModel, WriterIsDeterministic) {
  testing::TempDir other("engine2");
  write_random_checkpoint(default_model_config_json(), other.str(), RandomCheckpointOptions{});
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    auto a = testing::read_file<uint8_t>(dir_->str() + "/" + f), b = testing::read_file<uint8_t>(other.str() + "/" + f);
    EXPECT_EQ(a, b) << f;
  }
}

TEST_F(DefaultModel, RollbackRestoresTheExactState) {
  auto m = Model::load(dir_->str());
  auto s = m->new_sequence();
  std::vector<int32_t> prefix, a, b;
  for (int i = 0; i < 150; ++i) prefix.push_back((i * 37 + 11) % 129280);
  for (int i = 0; i < 21; ++i) a.push_back((i * 101 + 3) % 129280), b.push_back((i * 7 + 5) % 129280);
  run(*m, *s, prefix);
  SequenceSnapshot snap = s->snapshot();
  auto la = run(*m, *s, a);
  s->restore(snap);
  EXPECT_EQ(run(*m, *s, a), la) << "replaying after a rollback must give the same logits";
  s->restore(snap);
  auto lb = run(*m, *s, b);
  auto fresh = m->new_sequence();
  run(*m, *fresh, prefix);
  EXPECT_EQ(run(*m, *fresh, b), lb) << "rolled-back state must equal a state that never saw the rejected tokens";
  EXPECT_EQ(s->length, 171);
}

// EngineOptions::act_quant (DeepSeek's act_quant before the FP8 / MXFP4 linears): a per-token operation, so a
// prompt fed whole or in chunks gives bit-identical logits. Against fp32 activations it moves the logits by
// about the e4m3 rounding: 2^-4 relative per activation at most, ~2^-4 / sqrt(3) = 3.6% in norm per linear
// output with random signs, through the layers' linears. On the default model the router and the indexer
// turn any such perturbation into different choices (an O(1) jump), so the bound is checked on a continuous
// variant: every expert selected (n_routed_experts = top-k) and an indexer top-k above every entry count.
TEST_F(DefaultModel, ActQuantIsPerTokenAndMovesLogitsByTheE4m3Rounding) {
  nlohmann::json cfg = nlohmann::json::parse(default_model_config_json());
  cfg["n_routed_experts"] = cfg["num_experts_per_tok"];
  cfg["index_topk"] = 4096;
  testing::TempDir cont("engine_continuous");
  write_random_checkpoint(cfg.dump(), cont.str(), RandomCheckpointOptions{});
  EngineOptions q;
  q.act_quant = true;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 53 + 17) % 129280);
  for (const std::string& dir : {dir_->str(), cont.str()}) {
    auto m = Model::load(dir, q), plain = Model::load(dir);
    auto whole = m->new_sequence();
    const std::vector<float> a = run(*m, *whole, ids);
    const std::vector<float> b = testing::all_logits_in_chunks(*m, ids, 7);
    EXPECT_EQ(a, b) << "act_quant logits depend on the chunking";
    auto ps = plain->new_sequence();
    const std::vector<float> p = run(*plain, *ps, ids);
    ASSERT_EQ(a.size(), p.size());
    double d2 = 0, p2 = 0;
    for (size_t i = 0; i < a.size(); ++i) d2 += (double(a[i]) - p[i]) * (double(a[i]) - p[i]), p2 += double(p[i]) * p[i];
    const double rel = std::sqrt(d2 / p2);
    std::printf("%s model: act_quant vs fp32 activations, ||logit difference|| / ||logits|| = %.3e\n",
                dir == cont.str() ? "continuous" : "default", rel);
    EXPECT_GT(rel, 0.0) << "act_quant changed nothing";
    if (dir == cont.str()) {
      EXPECT_LT(rel, 0.1);  // measured 7.4e-2; a wrong block scale moves it by O(1)
    }
  }
}

// EngineOptions::indexer_fp8_q (the indexer's q in e4m3 per head, the CPU reference of the GPU option): per token,
// so chunking cannot change the logits; where the indexer's top-k keeps every entry the scores' precision cannot
// matter, so the logits equal the fp32-q run's; with a top-k of 2 (the default model over 60 tokens: up to 15
// entries) the scores choose, and the option must reach them: some logits move.
TEST_F(DefaultModel, IndexerFp8QIsPerTokenAndOnlyMovesTheSelection) {
  EngineOptions q;
  q.indexer_fp8_q = true;
  std::vector<int32_t> ids;
  for (int i = 0; i < 60; ++i) ids.push_back((i * 53 + 17) % 129280);
  for (int topk : {4096, 2}) {
    nlohmann::json cfg = nlohmann::json::parse(default_model_config_json());
    cfg["index_topk"] = topk;
    testing::TempDir dir("engine_indexer_fp8_q");
    write_random_checkpoint(cfg.dump(), dir.str(), RandomCheckpointOptions{});
    auto m = Model::load(dir.str(), q), plain = Model::load(dir.str());
    auto whole = m->new_sequence();
    const std::vector<float> a = run(*m, *whole, ids);
    const std::vector<float> b = testing::all_logits_in_chunks(*m, ids, 7);
    EXPECT_EQ(a, b) << "indexer_fp8_q logits depend on the chunking (top-k " << topk << ")";
    auto ps = plain->new_sequence();
    const std::vector<float> p = run(*plain, *ps, ids);
    ASSERT_EQ(a.size(), p.size());
    size_t moved = 0;
    for (size_t i = 0; i < a.size(); ++i) moved += a[i] != p[i];
    std::printf("index_topk %d: indexer_fp8_q moved %zu of %zu logits\n", topk, moved, a.size());
    if (topk == 4096) EXPECT_EQ(moved, 0u) << "the top-k keeps everything, yet q's precision changed the logits";
    else EXPECT_GT(moved, 0u) << "indexer_fp8_q did not reach the indexer's choices";
  }
}

// EngineOptions::bf16_activations (the reference of the GPU's bf16-activation mode): also per token, so chunking
// does not change the logits; it changes them against fp32; and it refuses to combine with act_quant.
TEST_F(DefaultModel, Bf16ActivationsArePerTokenAndExclusiveWithActQuant) {
  EngineOptions o;
  o.bf16_activations = true;
  auto m = Model::load(dir_->str(), o), plain = Model::load(dir_->str());
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 53 + 17) % 129280);
  auto whole = m->new_sequence();
  const std::vector<float> a = run(*m, *whole, ids);
  const std::vector<float> b = testing::all_logits_in_chunks(*m, ids, 5);
  EXPECT_EQ(a, b) << "bf16-activation logits depend on the chunking";
  auto ps = plain->new_sequence();
  EXPECT_NE(a, run(*plain, *ps, ids)) << "bf16_activations changed nothing";
  o.act_quant = true;
  EXPECT_THROW(Model::load(dir_->str(), o), Error);
}

TEST_F(DefaultModel, MtpStepRunsOnTheMainStreamsAndIsChunkInvariant) {
  auto m = Model::load(dir_->str());
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 13 + 1) % 129280);
  auto s = m->new_sequence();
  std::vector<SeqChunk> b(1);
  b[0] = {s.get(), toks, false, true};
  auto out = m->forward(b);
  const int64_t D = m->config().hidden_size, n = m->config().hc_mult;
  ASSERT_EQ(out[0].streams.size(), toks.size() * n * D);
  // MTP over positions 0..38 with next tokens 1..39, all at once and in two pieces.
  std::vector<int32_t> next(toks.begin() + 1, toks.end());
  std::vector<float> streams(out[0].streams.begin(), out[0].streams.end() - n * D);
  std::vector<MtpChunk> one(1);
  one[0] = {s.get(), next, streams, true};
  auto whole = m->mtp_forward(one)[0].logits;
  auto s2 = m->new_sequence();
  s2->length = s->length;
  std::vector<float> pieces;
  for (size_t start : {size_t(0), size_t(17)}) {
    size_t end = start == 0 ? 17 : next.size();
    std::vector<MtpChunk> c(1);
    c[0].seq = s2.get();
    c[0].next_tokens.assign(next.begin() + start, next.begin() + end);
    c[0].streams.assign(streams.begin() + start * n * D, streams.begin() + end * n * D);
    c[0].all_logits = true;
    auto l = m->mtp_forward(c)[0].logits;
    pieces.insert(pieces.end(), l.begin(), l.end());
  }
  EXPECT_EQ(whole, pieces);
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(s->mtp_length, 39);
}

TEST_F(DefaultModel, OutOfVocabularyTokenIsAnErrorNotACrash) {
  auto m = Model::load(dir_->str());
  auto s = m->new_sequence();
  std::vector<SeqChunk> b(1);
  b[0].seq = s.get();
  b[0].tokens = {0, 129280};
  try {
    m->forward(b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 129280"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->length, 0) << "a rejected request must not advance the sequence";
}

TEST_F(DefaultModel, HashLayersRouteByTokenIdAndOthersByScorePlusBias) {
  auto m = Model::load(dir_->str());
  const ModelConfig& c = m->config();
  const LayerWeights& hash = m->weights().layers[0];
  ASSERT_TRUE(hash.hash);
  std::vector<float> x(2 * c.hidden_size, 0.1f);
  std::vector<int32_t> ids = {5, 77}, idx(2 * c.num_experts_per_tok);
  std::vector<float> w(idx.size());
  cpu::moe_route(c, hash, x.data(), 2, ids.data(), idx.data(), w.data());
  for (int k = 0; k < c.num_experts_per_tok; ++k) {
    EXPECT_EQ(idx[k], hash.tid2eid[5 * c.num_experts_per_tok + k]);
    EXPECT_EQ(idx[c.num_experts_per_tok + k], hash.tid2eid[77 * c.num_experts_per_tok + k]);
  }
  float sum = 0;
  for (int k = 0; k < c.num_experts_per_tok; ++k) sum += w[k];
  EXPECT_NEAR(sum, c.routed_scaling_factor, 1e-5);  // normalized, then scaled
}

TEST(Sampler, GreedyAndFiltersThatLeaveOneCandidate) {
  std::vector<float> l = {0.1f, 3.0f, 2.9f, -1.0f};
  EXPECT_EQ(argmax(l.data(), 4), 1);
  for (SamplingParams p : {SamplingParams{1.0f, 1, 1.0f, 0.0f, 7}, SamplingParams{1.0f, 0, 1e-6f, 0.0f, 7},
                           SamplingParams{1.0f, 0, 1.0f, 1.0f, 7}}) {
    Sampler s(p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l.data(), 4), 1);
  }
}

TEST(Sampler, SeedDeterminesTheDrawsAndFrequenciesFollowSoftmax) {
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  Sampler a({1.0f, 0, 1.0f, 0.0f, 42}), b({1.0f, 0, 1.0f, 0.0f, 42});
  std::map<int, int> count;
  for (int i = 0; i < 8000; ++i) {
    int x = a.sample(l.data(), 3);
    EXPECT_EQ(x, b.sample(l.data(), 3));
    count[x]++;
  }
  EXPECT_NEAR(count[0] / 8000.0, 0.125, 0.02);
  EXPECT_NEAR(count[1] / 8000.0, 0.25, 0.02);
  EXPECT_NEAR(count[2] / 8000.0, 0.625, 0.02);
}

TEST(Sampler, NonFiniteLogitsAndBadParametersAreErrors) {
  std::vector<float> l = {0.0f, NAN};
  EXPECT_THROW(argmax(l.data(), 2), Error);  // never silently token 0 (failure mode F1)
  EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, -2, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.0f, 1.5f, 0}), Error);
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

TEST_F(DefaultModel, MemoryPlanCountsEveryByteAndRefusesWhatDoesNotFit) {
  auto m = Model::load(dir_->str(), EngineOptions{KvDtype::kFP8});
  const ModelConfig& c = m->config();
  MemoryPlan p = plan_memory(*m, gpu_step_capacity(2, 1, c.sliding_window));
  EXPECT_EQ(p.step.step_tokens, 2);
  EXPECT_EQ(p.step.ring_rows, c.sliding_window);
  EXPECT_EQ(p.kv_fixed_per_sequence, m->kv_fixed_bytes_per_sequence());
  EXPECT_EQ(p.weights, m->checkpoint().total_bytes());
  // On the device: no MTP layer, the BF16 norms as float, the expert tables.
  EXPECT_EQ(p.device_weights, device_weight_bytes(m->weights(), c.num_hidden_layers));
  EXPECT_GT(p.device_weights, 0u);
  // With the MTP block (GpuOptions::load_mtp): at least its stored bytes more (its BF16 norms go up as float), at
  // most those doubled plus its experts' pointer tables.
  ASSERT_GE(c.num_nextn_predict_layers, 1);
  const MemoryPlan pm = plan_memory(*m, gpu_step_capacity(2, 1, c.sliding_window), true);
  const size_t mtp_stored = p.weights_by_component.at("mtp block");
  EXPECT_GE(pm.device_weights - p.device_weights, mtp_stored);
  EXPECT_LE(pm.device_weights - p.device_weights,
            2 * mtp_stored + static_cast<size_t>(c.n_routed_experts) * kDeviceExpertTableBytes);
  size_t sum = 0;
  for (const auto& [comp, b] : p.weights_by_component) sum += b;
  EXPECT_EQ(sum, p.weights);
  // Default config: CSA layers 1 and 3, HCA layer 2; fp8 rows of 128 dims (64 non-RoPE) = 64+128+1 -> 200 B,
  // indexer keys 128 + 1 -> 136 B.
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 2 * (200.0 / 4 + 136.0 / 4) + 200.0 / 128);
  const size_t need = p.total(100000, 2);
  EXPECT_NO_THROW(check_fits(p, 100000, 2, need, "test device"));
  try {
    check_fits(p, 100000, 2, need - 1, "test device");
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("does not fit on test device"), std::string::npos) << w;
    EXPECT_NE(w.find("tokens per sequence fit (--max-model-len)"), std::string::npos) << w;
  }
  EXPECT_LT(p.max_context(2, need - 1), 100000);
  EXPECT_GE(p.max_context(2, need), 100000 - 1);
  EXPECT_EQ(p.max_context(1, p.device_weights / 2), 0);
  for (size_t dev : {need - 1, need + 12345, need * 3}) {  // the largest context that fits, exactly
    const int64_t n = p.max_context(2, dev);
    EXPECT_LE(p.total(n, 2), dev);
    EXPECT_GT(p.total(n + 1, 2), dev);
  }

  // Chunked prefill (GpuModel: steps of max_seqs + chunk tokens, the window ring widened by chunk - 1 rows):
  // the workspace holds at least the logits rows and the indexer's score rows (context / 4 floats per token),
  // and the per-sequence state the wider rings.
  const MemoryPlan q = plan_memory(*m, gpu_step_capacity(2, 8192, c.sliding_window));
  EXPECT_EQ(q.step.step_tokens, 8194);
  EXPECT_EQ(q.step.ring_rows, c.sliding_window + 8191);
  EXPECT_EQ(q.kv_fixed_per_sequence,
            p.kv_fixed_per_sequence + size_t{8191} * m->kv_row_bytes() * static_cast<size_t>(c.num_layers_total()));
  EXPECT_EQ(p.step.logits_rows, 2);
  EXPECT_EQ(q.step.logits_rows, 2 + kPrefillLogitsRows);  // an all_logits chunk goes in steps of 512 rows
  EXPECT_GE(q.workspace - p.workspace, size_t{kPrefillLogitsRows} * static_cast<size_t>(c.vocab_size) * 4);
  EXPECT_GE(q.workspace_per_context, 8194.0);
  EXPECT_EQ(q.workspace_at(1 << 20) - q.workspace, static_cast<size_t>(std::ceil(q.workspace_per_context * (1 << 20))));
  const size_t qneed = q.total(1 << 20, 2);
  EXPECT_GE(qneed - p.total(1 << 20, 2), size_t{8192} << 20);  // score rows: 8192 tokens x 1 MiB
  try {
    check_fits(q, 1 << 20, 2, qneed - 1, "test device");
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("for steps of 8194 tokens"), std::string::npos) << w;
    EXPECT_NE(w.find("a smaller prefill chunk shrinks the workspace"), std::string::npos) << w;
  }
  try {  // the weights fit, the workspace does not
    check_fits(q, 1 << 20, 2, q.device_weights + q.workspace / 2, "test device");
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("leave no room for context; a smaller prefill chunk shrinks the workspace; fewer sequences"),
              std::string::npos) << w;
  }
}

}  // namespace
}  // namespace dsv4
