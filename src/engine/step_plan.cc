#include "engine/step_plan.h"

#include <algorithm>
#include <vector>

namespace dsv4 {

bool next_step(const std::vector<StepChunk>& chunks, std::vector<int64_t>& done, int per_seq, int cap, Step& step,
               int out_cap) {
  step.seqs.clear();
  step.outs.clear();
  step.tokens = 0;
  done.resize(chunks.size(), 0);
  per_seq = std::max(1, per_seq);
  out_cap = std::max(1, out_cap);
  // An all_logits chunk leaves a row for the last token of every later chunk that still has tokens, so a
  // long one cannot hold the others' next tokens back.
  std::vector<int64_t> later_last(chunks.size() + 1, 0);
  for (size_t b = chunks.size(); b-- > 0;)
    later_last[b] = later_last[b + 1] + (!chunks[b].all_logits && done[b] < chunks[b].n_tokens ? 1 : 0);
  for (size_t b = 0; b < chunks.size(); ++b) {
    const StepChunk& ch = chunks[b];
    const int64_t left = ch.n_tokens - done[b];
    int64_t take = std::min<int64_t>({left, per_seq, cap - step.tokens});
    const int64_t rows_left = out_cap - static_cast<int64_t>(step.outs.size());
    if (ch.all_logits) take = std::min(take, rows_left - later_last[b + 1]);
    else if (take == left && rows_left <= 0) --take;  // the last token's row goes to a later step
    if (take <= 0) continue;
    step.seqs.push_back(StepSeq{ch.slot, ch.length + done[b], ch.tokens + done[b], static_cast<int>(take), b});
    for (int64_t j = 0; j < take; ++j) {
      const int64_t i = done[b] + j;
      const bool last = i == ch.n_tokens - 1;
      if (ch.all_logits || last) step.outs.push_back(StepOut{step.tokens + static_cast<int>(j), b, i, last});
    }
    step.tokens += static_cast<int>(take);
    done[b] += take;
  }
  return !step.seqs.empty();
}

int64_t ring_rows(int window, int per_seq) { return window + std::max(1, per_seq) - 1; }

}  // namespace dsv4
