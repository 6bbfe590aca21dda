// The block loop (spec 2.1-2.3, 2.6, 2.7): embedding into hc_mult streams, per layer mHC pre -> norm ->
// attention -> mHC post and mHC pre -> norm -> MoE -> mHC post, then hc_head, final norm and LM head.
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cpu/mhc.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/norm_rope.h"
#include "core/error.h"
#include "core/numerics.h"
#include "engine/model.h"
#include "engine/plan.h"

namespace dsv4 {

using namespace cpu;

namespace {
HcParams hc_params(const ModelConfig& c) {
  return {c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps),
          static_cast<float>(c.rms_norm_eps)};
}
}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const EngineOptions& opt) {
  std::unique_ptr<Model> m(new Model());
  m->ck_ = Checkpoint::open(dir);
  m->w_ = bind_weights(*m->ck_);
  m->opt_ = opt;
  if (opt.act_quant && opt.bf16_activations)
    fail("EngineOptions: act_quant and bf16_activations are two different activation formats; choose one");
  if (opt.act_quant || opt.bf16_activations) {
    // act_quant: every FP8 / MXFP4 linear but wo_a (the reference keeps it in bf16); bf16_activations: every one
    // (the GPU's GEMVs read 16-bit copies of all their inputs). BF16 linears are left as they are.
    using A = LinearWeight::ActInput;
    const A mode = opt.act_quant ? A::kE4m3 : A::kBf16;
    auto q = [mode](LinearWeight& w) {
      if (w.fmt != WeightFormat::kBF16) w.act = mode;
    };
    for (LayerWeights& L : m->w_.layers) {
      for (LinearWeight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_b, &L.index_wq_b, &L.e_proj, &L.h_proj}) q(*w);
      if (opt.bf16_activations) q(L.wo_a);
      for (LinearWeight* w : {&L.shared.w1, &L.shared.w2, &L.shared.w3}) q(*w);
      for (ExpertWeights& e : L.experts)
        for (LinearWeight* w : {&e.w1, &e.w2, &e.w3}) q(*w);
    }
  }
  const ModelConfig& c = m->config();
  m->rope_window_ = rope_inv_freq(c, false);
  m->rope_compressed_ = rope_inv_freq(c, true);
  m->kv_codec_ = std::make_unique<KvCodec>(opt.kv_dtype, c.head_dim, c.rope_head_dim, 64);
  m->index_codec_ = std::make_unique<KvCodec>(opt.kv_dtype, c.index_head_dim > 0 ? c.index_head_dim : 64, 0,
                                              c.index_head_dim > 0 ? c.index_head_dim : 64);
  m->kv_pool_ = std::make_unique<PagePool>(m->kv_codec_->row_bytes(), opt.page_rows);
  m->index_pool_ = std::make_unique<PagePool>(m->index_codec_->row_bytes(), opt.page_rows);
  return m;
}

std::unique_ptr<SequenceState> Model::new_sequence() const {
  const ModelConfig& c = config();
  auto s = std::make_unique<SequenceState>();
  for (int i = 0; i < c.num_layers_total(); ++i) {
    s->layers.emplace_back(kv_pool_.get(), index_pool_.get());
    LayerState& L = s->layers.back();
    L.ring.assign(static_cast<size_t>(c.sliding_window) * kv_codec_->row_bytes(), 0);
    const int r = c.compress_ratio(i);
    if (r) L.comp.init(r, c.head_dim);
    if (r == 4) L.index_comp.init(4, c.index_head_dim);
  }
  return s;
}

double Model::kv_bytes_per_token() const {
  const ModelConfig& c = config();
  double b = 0;
  for (int i = 0; i < c.num_layers_total(); ++i) {
    const int r = c.compress_ratio(i);
    if (r) b += static_cast<double>(kv_codec_->row_bytes()) / r;
    if (r == 4) b += static_cast<double>(index_codec_->row_bytes()) / 4;
  }
  return b;
}

size_t Model::kv_row_bytes() const { return kv_codec_->row_bytes(); }

size_t Model::kv_fixed_bytes_per_sequence() const {
  auto s = new_sequence();
  return s->fixed_bytes();
}

void Model::block(int layer, const Plan& plan, float* h) const {
  const ModelConfig& c = config();
  const LayerWeights& L = w_.layers[layer];
  const HcParams hp = hc_params(c);
  const int64_t T = plan.T, D = c.hidden_size, n = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> x(T * D), y(T * D), post(T * n), comb(T * n * n), res(T * n * D);

  const bool par = T * n * D >= (int64_t(1) << 16);  // fork/join only when there is enough work
  auto hc_pre_all = [&](const HcWeights& hw, const std::vector<float>& norm_w) {
#pragma omp parallel for if (par)
    for (int64_t t = 0; t < T; ++t) {
      hc_pre(hw, hp, h + t * n * D, x.data() + t * D, post.data() + t * n, comb.data() + t * n * n);
      rmsnorm(x.data() + t * D, norm_w.data(), D, eps, x.data() + t * D);
    }
  };
  auto hc_post_all = [&]() {
    std::memcpy(res.data(), h, sizeof(float) * T * n * D);
#pragma omp parallel for if (par)
    for (int64_t t = 0; t < T; ++t)
      hc_post(hp, y.data() + t * D, res.data() + t * n * D, post.data() + t * n, comb.data() + t * n * n,
              h + t * n * D);
  };

  hc_pre_all(L.hc_attn, L.attn_norm);
  attention(L, plan, x.data(), y.data());
  hc_post_all();

  hc_pre_all(L.hc_ffn, L.ffn_norm);
  std::vector<int32_t> idx(T * c.num_experts_per_tok);
  std::vector<float> wts(idx.size());
  moe_route(c, L, x.data(), T, plan.token.data(), idx.data(), wts.data());
  moe_forward(c, L, x.data(), T, idx.data(), wts.data(), y.data());
  hc_post_all();
}

void Model::logits_rows(const HcWeights& hc_head_w, const std::vector<float>& norm, const float* h, int64_t rows,
                        float* logits) const {
  const ModelConfig& c = config();
  const HcParams hp = hc_params(c);
  const int64_t D = c.hidden_size;
  std::vector<float> y(rows * D);
  for (int64_t r = 0; r < rows; ++r) {
    hc_head(hc_head_w, hp, h + r * c.hc_mult * D, y.data() + r * D);
    rmsnorm(y.data() + r * D, norm.data(), D, static_cast<float>(c.rms_norm_eps), y.data() + r * D);
  }
  linear(w_.head, y.data(), rows, logits);
}

ChunkOutput Model::chunk_logits(const HcWeights& hc_head_w, const std::vector<float>& norm, const float* h,
                                int64_t first, int64_t count, bool all_logits) const {
  const ModelConfig& c = config();
  ChunkOutput o;
  o.rows = all_logits ? count : 1;
  o.logits.resize(o.rows * c.vocab_size);
  logits_rows(hc_head_w, norm, h + (first + count - o.rows) * c.hc_mult * c.hidden_size, o.rows, o.logits.data());
  return o;
}

static void embed_rows(const LinearWeight& embed, const std::vector<int32_t>& tokens, int64_t vocab, float* out) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab)
      fail("token id ", tokens[t], " at input position ", t, " is outside the vocabulary [0, ", vocab, ")");
    dequant_row(embed, tokens[t], out + t * embed.cols);
  }
}

std::vector<ChunkOutput> Model::forward(std::vector<SeqChunk>& batch) const {
  const ModelConfig& c = config();
  const int64_t D = c.hidden_size, n = c.hc_mult, V = c.vocab_size;
  Plan plan;
  for (SeqChunk& ch : batch) {
    if (!ch.seq) fail("forward: chunk without a sequence");
    if (ch.tokens.empty()) fail("forward: empty chunk");
    if (ch.seq->layers.size() != static_cast<size_t>(c.num_layers_total()))
      fail("forward: sequence state belongs to another model");
    plan.add(ch.seq, ch.tokens, ch.seq->length);
  }
  // Embedding, copied into the hc_mult streams.
  std::vector<float> e(plan.T * D), h(plan.T * n * D);
  embed_rows(w_.embed, plan.token, V, e.data());
  for (int64_t t = 0; t < plan.T; ++t)
    for (int64_t j = 0; j < n; ++j) std::memcpy(&h[(t * n + j) * D], &e[t * D], sizeof(float) * D);

  for (int layer = 0; layer < c.num_hidden_layers; ++layer) block(layer, plan, h.data());

  std::vector<ChunkOutput> out(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const Plan::Seq& s = plan.seqs[b];
    out[b] = chunk_logits(w_.hc_head, w_.norm, h.data(), s.first, s.count, batch[b].all_logits);
    if (batch[b].keep_streams)
      out[b].streams.assign(h.begin() + s.first * n * D, h.begin() + (s.first + s.count) * n * D);
    s.state->length += s.count;
  }
  return out;
}

std::vector<ChunkOutput> Model::mtp_forward(std::vector<MtpChunk>& batch) const {
  const ModelConfig& c = config();
  if (c.num_nextn_predict_layers < 1) fail(ck_->dir(), ": the checkpoint has no MTP layer (num_nextn_predict_layers = 0)");
  const int layer = c.num_hidden_layers;  // mtp.0
  const LayerWeights& L = w_.layers[layer];
  const int64_t D = c.hidden_size, n = c.hc_mult, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Plan plan;
  for (MtpChunk& ch : batch) {
    if (ch.next_tokens.empty() || ch.streams.size() != ch.next_tokens.size() * n * D)
      fail("mtp_forward: streams must be [tokens, hc_mult, hidden] for the given next tokens");
    plan.add(ch.seq, ch.next_tokens, ch.seq->mtp_length);
  }
  // x = e_proj(enorm(embed(next))) broadcast to the streams + h_proj(hnorm(h_j)) per stream.
  std::vector<float> e(plan.T * D), ep(plan.T * D), hs(plan.T * n * D), hp(plan.T * n * D), h(plan.T * n * D);
  embed_rows(w_.embed, plan.token, V, e.data());
  for (int64_t t = 0; t < plan.T; ++t) rmsnorm(&e[t * D], L.enorm.data(), D, eps, &e[t * D]);
  linear(L.e_proj, e.data(), plan.T, ep.data());
  int64_t row = 0;
  for (MtpChunk& ch : batch)
    for (size_t k = 0; k < ch.streams.size(); k += D, ++row)
      rmsnorm(&ch.streams[k], L.hnorm.data(), D, eps, &hs[row * D]);
  linear(L.h_proj, hs.data(), plan.T * n, hp.data());
  for (int64_t t = 0; t < plan.T; ++t)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < D; ++d) h[(t * n + j) * D + d] = ep[t * D + d] + hp[(t * n + j) * D + d];

  block(layer, plan, h.data());

  std::vector<ChunkOutput> out(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const Plan::Seq& s = plan.seqs[b];
    out[b] = chunk_logits(L.hc_head, L.norm, h.data(), s.first, s.count, batch[b].all_logits);
    s.state->mtp_length += s.count;
  }
  return out;
}

}  // namespace dsv4
