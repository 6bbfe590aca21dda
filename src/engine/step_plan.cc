#include "engine/step_plan.h"

#include <algorithm>

namespace dsv4 {

bool next_step(const std::vector<StepChunk>& chunks, std::vector<int64_t>& done, int per_seq, int cap, Step& step) {
  step.seqs.clear();
  step.outs.clear();
  step.tokens = 0;
  done.resize(chunks.size(), 0);
  per_seq = std::max(1, per_seq);
  for (size_t b = 0; b < chunks.size(); ++b) {
    const StepChunk& ch = chunks[b];
    const int64_t take = std::min<int64_t>({ch.n_tokens - done[b], per_seq, cap - step.tokens});
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
