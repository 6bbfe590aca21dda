// The token-level view of one ragged batch: every new token with its sequence and absolute position.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model.h"

namespace dsv4 {

struct Model::Plan {
  struct Seq {
    SequenceState* state = nullptr;
    int64_t first = 0;  // index of its first token in the batch
    int64_t count = 0;  // new tokens
    int64_t start = 0;  // position of its first new token
  };
  int64_t T = 0;
  std::vector<int32_t> token;  // [T]
  std::vector<int64_t> pos;    // [T]
  std::vector<int32_t> seq;    // [T] -> index in seqs
  std::vector<Seq> seqs;

  void add(SequenceState* s, const std::vector<int32_t>& tokens, int64_t start) {
    Seq q{s, T, static_cast<int64_t>(tokens.size()), start};
    for (size_t i = 0; i < tokens.size(); ++i) {
      token.push_back(tokens[i]);
      pos.push_back(start + static_cast<int64_t>(i));
      seq.push_back(static_cast<int32_t>(seqs.size()));
    }
    T += q.count;
    seqs.push_back(q);
  }
};

}  // namespace dsv4
