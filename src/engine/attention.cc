// The attention sub-layer (spec 2.4): Q low-rank path, shared K=V window row, compressor and lightning
// indexer on compressed layers, sparse attention with sinks, inverse RoPE, grouped output projection.
// Every KV row a query reads, including rows of its own chunk, goes through the KV storage format first,
// so chunked prefill, decode and full prefill see identical values.
#include <cmath>
#include <cstring>

#include "backend/cpu/compressor.h"
#include "backend/cpu/indexer.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/norm_rope.h"
#include "backend/cpu/sparse_attention.h"
#include "backend/cpu/topk.h"
#include "core/numerics.h"
#include "engine/model.h"
#include "engine/plan.h"

namespace dsv4 {

using namespace cpu;

namespace {

// Runs one compressor branch over the batch: per sequence, tokens in order; each closed block becomes an
// entry (RMSNorm, RoPE at the block's first position, storage rounding) appended to `rows_of(state)`.
template <typename RowsOf, typename CompOf>
void run_compressor(const Model::Plan& plan, const CompressorWeights& w, const float* xn, int64_t D, float eps,
                    const std::vector<float>& inv_freq, const KvCodec& codec, CompOf comp_of, RowsOf rows_of) {
  const int64_t T = plan.T;
  const int64_t width = static_cast<int64_t>(w.wkv.rows);
  std::vector<float> kv(T * width), gate(T * width), pooled(w.head);
  linear(w.wkv, xn, T, kv.data());
  linear(w.wgate, xn, T, gate.data());
  for (const Model::Plan::Seq& s : plan.seqs) {
    for (int64_t i = 0; i < s.count; ++i) {
      const int64_t t = s.first + i, p = s.start + i;
      if (!compressor_push(comp_of(*s.state), p, &kv[t * width], &gate[t * width], w.ape.data(), pooled.data()))
        continue;
      rmsnorm(pooled.data(), w.norm.data(), w.head, eps, pooled.data());
      rope(pooled.data(), w.head, inv_freq, p + 1 - w.ratio);
      codec.encode(pooled.data(), rows_of(*s.state).append());
    }
  }
  (void)D;
}

void decode_rows(const PagedRows& rows, const KvCodec& codec, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows.size()) * codec.dim());
  for (int64_t i = 0; i < rows.size(); ++i) codec.decode(rows.row(i), out.data() + i * codec.dim());
}

}  // namespace

void Model::attention(const LayerWeights& L, const Plan& plan, const float* xn, float* out) const {
  const ModelConfig& c = config();
  const int li = L.index;
  const int64_t T = plan.T, D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t qlr = c.q_lora_rank, W = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<float>& inv_freq = L.ratio ? rope_compressed_ : rope_window_;
  const KvCodec& codec = *kv_codec_;

  // Q: qr = q_norm(wq_a x); q = wq_b qr, per-head unweighted RMSNorm, RoPE.
  std::vector<float> qr(T * qlr), q(T * H * hd);
  linear(L.wq_a, xn, T, qr.data());
  for (int64_t t = 0; t < T; ++t) rmsnorm(&qr[t * qlr], L.q_norm.data(), qlr, eps, &qr[t * qlr]);
  linear(L.wq_b, qr.data(), T, q.data());
#pragma omp parallel for if (T * H * hd >= (int64_t(1) << 16))
  for (int64_t th = 0; th < T * H; ++th) {
    float* qh = &q[th * hd];
    rmsnorm(qh, nullptr, hd, eps, qh);
    rope(qh, hd, inv_freq, plan.pos[th / H]);
  }
  // Window K=V row of each new token, as stored.
  // Encoded once: the bytes written to the ring are exactly the ones decoded for this chunk's queries.
  const size_t rb = codec.row_bytes();
  std::vector<float> kv(T * hd);
  std::vector<uint8_t> kv_bytes(T * rb);
  linear(L.wkv, xn, T, kv.data());
  for (int64_t t = 0; t < T; ++t) {
    float* r = &kv[t * hd];
    rmsnorm(r, L.kv_norm.data(), hd, eps, r);
    rope(r, hd, inv_freq, plan.pos[t]);
    codec.encode(r, &kv_bytes[t * rb]);
    codec.decode(&kv_bytes[t * rb], r);
  }

  // Compressed entries (and indexer keys) produced by this batch, appended before attention: entry j is
  // visible to queries at p >= j*ratio + ratio - 1, including the token that closes it.
  const int64_t Id = c.index_head_dim, IH = c.index_n_heads;
  std::vector<float> iq, iw;
  if (L.ratio) {
    run_compressor(plan, L.compressor, xn, D, eps, inv_freq, codec,
                   [&](SequenceState& s) -> CompressorState& { return s.layers[li].comp; },
                   [&](SequenceState& s) -> PagedRows& { return s.layers[li].entries; });
  }
  if (L.kind == AttnKind::kCSA) {
    run_compressor(plan, L.index_compressor, xn, D, eps, inv_freq, *index_codec_,
                   [&](SequenceState& s) -> CompressorState& { return s.layers[li].index_comp; },
                   [&](SequenceState& s) -> PagedRows& { return s.layers[li].index_keys; });
    iq.resize(T * IH * Id);
    iw.resize(T * IH);
    linear(L.index_wq_b, qr.data(), T, iq.data());
    for (int64_t th = 0; th < T * IH; ++th) rope(&iq[th * Id], Id, inv_freq, plan.pos[th / IH]);
    if (opt_.indexer_fp8_q) act_quant_e4m3(iq.data(), T * IH * Id, static_cast<int>(Id), iq.data());  // per head
    linear(L.index_weights_proj, xn, T, iw.data());
    const float ws = 1.0f / std::sqrt(static_cast<float>(IH));
    for (float& v : iw) v *= ws;
  }

  // Attention, per sequence: decode its cached rows once, then every query in parallel.
  std::vector<float> o(T * H * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const Plan::Seq& s : plan.seqs) {
    LayerState& st = s.state->layers[li];
    std::vector<float> ring(W * hd), entries, ikeys;
    for (int64_t p = std::max<int64_t>(0, s.start - W); p < s.start; ++p)
      codec.decode(&st.ring[(p % W) * rb], &ring[(p % W) * hd]);
    if (L.ratio) decode_rows(st.entries, codec, entries);
    if (L.kind == AttnKind::kCSA) decode_rows(st.index_keys, *index_codec_, ikeys);

#pragma omp parallel for schedule(dynamic) if (s.count >= 4)
    for (int64_t i = 0; i < s.count; ++i) {
      const int64_t t = s.first + i, p = s.start + i;
      std::vector<const float*> keys;
      for (int64_t wp = std::max<int64_t>(0, p - W + 1); wp <= p; ++wp)
        keys.push_back(wp < s.start ? &ring[(wp % W) * hd] : &kv[(s.first + wp - s.start) * hd]);
      const int64_t visible = L.ratio ? (p + 1) / L.ratio : 0;
      if (L.kind == AttnKind::kHCA) {
        for (int64_t j = 0; j < visible; ++j) keys.push_back(&entries[j * hd]);
      } else if (L.kind == AttnKind::kCSA && visible > 0) {
        std::vector<float> scores(visible);
        indexer_scores(&iq[t * IH * Id], &iw[t * IH], static_cast<int>(IH), static_cast<int>(Id), ikeys.data(),
                       visible, Id, scores.data());
        std::vector<int32_t> sel(c.index_topk);
        topk_row(scores.data(), visible, c.index_topk, sel.data());
        for (int32_t j : sel) keys.push_back(j >= 0 ? &entries[j * hd] : nullptr);
      }
      float* ot = &o[t * H * hd];
      sparse_attention(&q[t * H * hd], static_cast<int>(H), static_cast<int>(hd), keys.data(),
                       static_cast<int64_t>(keys.size()), L.attn_sink.data(), scale, ot);
      for (int64_t h = 0; h < H; ++h) rope(ot + h * hd, hd, inv_freq, p, /*inverse=*/true);
    }
    // The window keeps this chunk's last W rows.
    for (int64_t p = std::max(s.start, s.start + s.count - W); p < s.start + s.count; ++p)
      std::memcpy(&st.ring[(p % W) * rb], &kv_bytes[(s.first + p - s.start) * rb], rb);
  }

  // Grouped low-rank output: z_g = wo_a[g] · o_g (o_g = heads of group g), out = wo_b · z.
  const int64_t G = c.o_groups, olr = c.o_lora_rank, gin = H * hd / G;
  std::vector<float> z(T * G * olr);
  for (int64_t g = 0; g < G; ++g)
    linear_rows(L.wo_a, g * olr, olr, o.data() + g * gin, T, H * hd, z.data() + g * olr, G * olr);
  linear(L.wo_b, z.data(), T, out);
}

}  // namespace dsv4
