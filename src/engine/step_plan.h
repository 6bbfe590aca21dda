// How a batch of sequence chunks becomes device steps (the GPU engine's scheduler within one forward call):
// each step takes up to `per_seq` next tokens of every chunk that has some, at most `cap` tokens in all,
// sequences in batch order, each sequence's tokens in position order. per_seq 1 gives decode steps (one
// token per sequence); larger values give prefill chunks. Pure host code, tested on the CPU
// (tests/unit/test_step_plan.cc); engine/gpu/gpu_model.cc runs the steps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4 {

// One chunk of the batch: a sequence (its state slot and current length) and its new tokens.
struct StepChunk {
  int slot = 0;
  int64_t length = 0;        // tokens the sequence had before this forward call
  const int32_t* tokens = nullptr;
  int64_t n_tokens = 0;
  bool all_logits = false;   // logits for every token, else only for the last
};

// A sequence's tokens in one step: `count` tokens from `tokens`, at positions start, start + 1, ...
struct StepSeq {
  int slot = 0;
  int64_t start = 0;
  const int32_t* tokens = nullptr;
  int count = 0;
  size_t chunk = 0;  // index in the batch
};

// A token of the step whose logits are needed.
struct StepOut {
  int row = 0;        // token index in the step (sequences back to back)
  size_t chunk = 0;
  int64_t index = 0;  // token index in the chunk
  bool last = false;  // the chunk's last token: the next token is drawn from it
};

struct Step {
  std::vector<StepSeq> seqs;
  std::vector<StepOut> outs;
  int tokens = 0;
  // A decode step: one token per sequence and logits for all of them (what the CUDA graphs capture).
  bool is_decode() const { return static_cast<int>(seqs.size()) == tokens && static_cast<int>(outs.size()) == tokens; }
};

// Fills `step` with the next step and advances `done` (tokens of each chunk already scheduled); returns
// false when every token is scheduled. per_seq >= 1, cap >= 1. out_cap >= 1: at most this many logits rows
// per step (the device's logits buffer); an all_logits chunk then takes fewer tokens (leaving a row for the
// last token of every later chunk that still has tokens), and a chunk whose last token finds no row left
// stops one token short; every step still makes progress.
bool next_step(const std::vector<StepChunk>& chunks, std::vector<int64_t>& done, int per_seq, int cap, Step& step,
               int out_cap = 1 << 30);

// Rows of the window ring when a step carries up to per_seq tokens of a sequence: window + per_seq - 1.
// A step writes its tokens' window rows (row = position % ring) before any of its queries reads, and a
// token at position p reads positions p - window + 1 .. p; with this many rows no write of the step lands
// on a row an earlier token of the same step still reads (the overwritten position is at most
// p0 + per_seq - 1 - ring = p0 - window < p0 - window + 1 for the step's first token p0).
int64_t ring_rows(int window, int per_seq);

}  // namespace dsv4
