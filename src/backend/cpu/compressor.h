// The KV compressor (spec 2.4): gated softmax pooling of every `ratio` consecutive tokens into one entry.
//   ratio 128 (HCA): entry j = Σ_{t in block j} softmax_t(score_t) ⊙ kv_t, per channel, width `head`.
//   ratio 4 (CSA, "overlap"): projections are 2·head wide; entry j pools 8 rows per channel: the first
//     half [0, head) of block j-1's rows and the second half [head, 2·head) of block j's rows. Block 0
//     has no predecessor: those rows have kv = 0 and score = -inf (weight 0).
//   score_t = wgate·x_t + ape[t mod ratio]. The caller then applies RMSNorm, RoPE at position j·ratio,
//   and the KV storage rounding.
// The state holds the rows of the open block (and the Ca half of the previous block for overlap), so
// prefill in chunks of any size and token-by-token decode give the same entries.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4::cpu {

struct CompressorState {
  int ratio = 0;
  int head = 0;
  bool overlap = false;          // ratio == 4
  int filled = 0;                // rows of the open block received so far
  bool have_prev = false;        // overlap: previous block's Ca rows are valid
  std::vector<float> kv, score;            // open block: [ratio, width], width = (overlap ? 2 : 1) * head
  std::vector<float> prev_kv, prev_score;  // overlap: previous block's Ca half, [ratio, head]

  void init(int ratio, int head);
  int width() const { return (overlap ? 2 : 1) * head; }
};

// Feeds one token (its projected kv row and its gate row, both `width` wide, ape not yet added) at block
// row `pos % ratio`. When the token closes a block, writes the pooled `head`-wide entry into `pooled` and
// returns true.
bool compressor_push(CompressorState& s, int64_t pos, const float* kv_row, const float* gate_row, const float* ape,
                     float* pooled);

}  // namespace dsv4::cpu
