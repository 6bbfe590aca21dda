// Attention of one query token over a gathered key set with per-head sinks (spec 2.4). K = V (MQA: one
// d-wide vector per key shared by all heads). For head h:
//   logit_i = (q_h · k_i) · scale,   p_i = exp(logit_i - m) / (Σ_j exp(logit_j - m) + exp(sink_h - m))
//   o_h = Σ_i p_i · k_i
// Keys whose slot is marked invalid are skipped; a query with no valid key returns 0 (the sink-only
// result: the sink has no value vector). Never produces NaN from masked slots.
#pragma once
#include <cstdint>

namespace dsv4::cpu {

// q: [H, d]; keys: n pointers to d-wide rows (nullptr = invalid slot); sink: [H]; out: [H, d].
void sparse_attention(const float* q, int H, int d, const float* const* keys, int64_t n, const float* sink,
                      float scale, float* out);

}  // namespace dsv4::cpu
