// Feeding token ids to the CPU engine in the tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/model.h"

namespace dsv4::testing {

// `ids` fed to a new sequence of m in pieces of `chunk` tokens: the logits of every token, concatenated.
inline std::vector<float> all_logits_in_chunks(const Model& m, const std::vector<int32_t>& ids, size_t chunk) {
  auto seq = m.new_sequence();
  std::vector<float> all;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    std::vector<SeqChunk> b(1);
    b[0].seq = seq.get();
    b[0].tokens.assign(ids.begin() + i, ids.begin() + std::min(ids.size(), i + chunk));
    b[0].all_logits = true;
    const std::vector<float> l = std::move(m.forward(b)[0].logits);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

}  // namespace dsv4::testing
