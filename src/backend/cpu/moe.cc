#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/selection_margin.h"
#include "core/error.h"

namespace dsv4::cpu {

static float score_fn(ScoreFunc f, float l) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: {
      const float sp = l > 20.0f ? l : std::log1p(std::exp(l));  // torch softplus threshold 20
      return std::sqrt(sp);
    }
    case ScoreFunc::kSigmoid: return 1.0f / (1.0f + std::exp(-l));
    case ScoreFunc::kSoftmax: return l;  // normalized per row below
  }
  return l;
}

void moe_route(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, const int32_t* token_ids,
               int32_t* idx, float* weights) {
  const int E = c.n_routed_experts, K = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(T) * E);
  linear(L.gate, x, T, logits.data());
  for (int64_t t = 0; t < T; ++t) {
    float* s = logits.data() + t * E;
    for (int e = 0; e < E; ++e) s[e] = score_fn(c.scoring_func, s[e]);
    if (c.scoring_func == ScoreFunc::kSoftmax) {
      const float mx = *std::max_element(s, s + E);
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(s[e] - mx));
      for (int e = 0; e < E; ++e) s[e] /= sum;
    }
    int32_t* sel = idx + t * K;
    if (L.hash) {
      const int32_t tok = token_ids[t];
      if (tok < 0 || tok >= c.vocab_size) fail("token id ", tok, " is outside the vocabulary (", c.vocab_size, ")");
      for (int k = 0; k < K; ++k) sel[k] = L.tid2eid[static_cast<size_t>(tok) * K + k];
    } else {
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      const float* b = L.gate_bias.data();
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t bb) {
        const float va = s[a] + b[a], vb = s[bb] + b[bb];
        return va > vb || (va == vb && a < bb);
      });
      std::copy(order.begin(), order.begin() + K, sel);
      if (selection_margin_tracking() && K < E) {  // the gap to the best unselected expert (selection_margin.h)
        float next = -INFINITY, scale = 0.0f;
        for (int e = K; e < E; ++e) next = std::max(next, s[order[e]] + b[order[e]]);
        for (int e = 0; e < E; ++e) scale = std::max(scale, std::fabs(s[e] + b[e]));
        note_selection_gap(s[order[K - 1]] + b[order[K - 1]], next, scale);
      }
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += s[sel[k]];
    for (int k = 0; k < K; ++k) {
      float w = s[sel[k]];
      if (c.norm_topk_prob) w /= (sum + 1e-20f);
      weights[t * K + k] = w * static_cast<float>(c.routed_scaling_factor);
    }
  }
}

void swiglu_expert(const ExpertWeights& e, const float* x, int64_t T, const float* row_weight, float limit,
                   float* out) {
  const int64_t I = e.w1.rows, D = e.w2.rows;
  std::vector<float> g(static_cast<size_t>(T * I)), u(g.size()), y(static_cast<size_t>(T * D));
  linear(e.w1, x, T, g.data());
  linear(e.w3, x, T, u.data());
  for (int64_t t = 0; t < T; ++t) {
    const float rw = row_weight ? row_weight[t] : 1.0f;
    for (int64_t i = 0; i < I; ++i) {
      float gi = g[t * I + i], ui = u[t * I + i];
      if (limit > 0.0f) {
        gi = std::min(gi, limit);
        ui = std::clamp(ui, -limit, limit);
      }
      g[t * I + i] = gi / (1.0f + std::exp(-gi)) * ui * rw;
    }
  }
  linear(e.w2, g.data(), T, y.data());
  for (size_t k = 0; k < y.size(); ++k) out[k] += y[k];
}

void moe_forward(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, const int32_t* idx,
                 const float* weights, float* out) {
  const int64_t D = c.hidden_size;
  const int K = c.num_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::fill(out, out + T * D, 0.0f);
  // Group (token, slot) pairs by expert, in token order, so every expert runs once over its rows.
  std::vector<std::vector<std::pair<int64_t, float>>> rows(static_cast<size_t>(c.n_routed_experts));
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) rows[idx[t * K + k]].push_back({t, weights[t * K + k]});
  std::vector<float> xs, ws, ys;
  for (int e = 0; e < c.n_routed_experts; ++e) {
    const auto& r = rows[e];
    if (r.empty()) continue;
    const int64_t n = static_cast<int64_t>(r.size());
    xs.resize(static_cast<size_t>(n * D));
    ws.resize(static_cast<size_t>(n));
    ys.assign(static_cast<size_t>(n * D), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      std::copy(x + r[i].first * D, x + (r[i].first + 1) * D, xs.begin() + i * D);
      ws[i] = r[i].second;
    }
    swiglu_expert(L.experts[e], xs.data(), n, ws.data(), limit, ys.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) out[r[i].first * D + d] += ys[i * D + d];
  }
  if (L.has_shared) swiglu_expert(L.shared, x, T, nullptr, limit, out);
}

}  // namespace dsv4::cpu
