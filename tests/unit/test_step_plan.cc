// engine/step_plan: the GPU engine's split of a batch into steps, and the window-ring size that keeps a
// step's writes away from the rows its own queries read. Pure host code, so tested here on the CPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "engine/step_plan.h"

namespace dsv4 {
namespace {

uint64_t seed() {
  static const uint64_t s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  static bool printed = false;
  if (!printed) std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(s)), printed = true;
  return s;
}

TEST(StepPlan, DecodeBatchIsOneStepOfOneTokenPerSequence) {
  std::vector<int32_t> toks = {5, 6, 7, 8};
  std::vector<StepChunk> chunks;
  for (int i = 0; i < 4; ++i) chunks.push_back(StepChunk{3 - i, 100 + i, &toks[i], 1, false});
  std::vector<int64_t> done;
  Step s;
  ASSERT_TRUE(next_step(chunks, done, 1, 4, s));
  EXPECT_TRUE(s.is_decode());
  ASSERT_EQ(s.seqs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.seqs[i].slot, 3 - i);
    EXPECT_EQ(s.seqs[i].start, 100 + i);
    EXPECT_EQ(s.seqs[i].count, 1);
    EXPECT_EQ(s.outs[i].row, i);
    EXPECT_TRUE(s.outs[i].last);
  }
  EXPECT_FALSE(next_step(chunks, done, 1, 4, s));
}

// Every token scheduled once, in order, at its position; steps within cap, per_seq and the logits rows'
// bound; logits rows exactly the chunks' last tokens (every token with all_logits), pointing at the right
// step row.
TEST(StepPlan, RandomBatchesScheduleEveryTokenOnce) {
  std::mt19937_64 rng(seed());
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    const int per_seq = 1 + static_cast<int>(rng() % 300);
    const int cap = n + static_cast<int>(rng() % 400);
    // Logits rows per step: unbounded, or as the GPU engine sizes them (sequences + up to 512), or tight.
    const int out_cap = trial % 3 == 0 ? (1 << 30) : trial % 3 == 1 ? n + static_cast<int>(rng() % 512)
                                                                    : 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<int32_t>> toks(n);
    std::vector<StepChunk> chunks(n);
    for (int b = 0; b < n; ++b) {
      const int64_t len = rng() % 5 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 700);
      for (int64_t i = 0; i < len; ++i) toks[b].push_back(static_cast<int32_t>(b * 100000 + i));
      chunks[b] = StepChunk{b, static_cast<int64_t>(rng() % 5000), toks[b].data(), len, rng() % 4 == 0};
    }
    std::vector<int64_t> done, seen(n, 0), outs_seen(n, 0);
    Step s;
    int steps = 0;
    while (next_step(chunks, done, per_seq, cap, s, out_cap)) {
      ASSERT_LT(++steps, 100000);
      ASSERT_LE(s.tokens, cap);
      ASSERT_LE(static_cast<int>(s.outs.size()), out_cap);
      int row = 0;
      std::map<int, std::pair<size_t, int64_t>> token_at_row;  // step row -> (chunk, index)
      for (const StepSeq& q : s.seqs) {
        ASSERT_GE(q.count, 1);
        ASSERT_LE(q.count, per_seq);
        ASSERT_EQ(q.start, chunks[q.chunk].length + seen[q.chunk]) << "positions out of order";
        ASSERT_EQ(q.tokens, toks[q.chunk].data() + seen[q.chunk]);
        for (int j = 0; j < q.count; ++j) token_at_row[row + j] = {q.chunk, seen[q.chunk] + j};
        seen[q.chunk] += q.count;
        row += q.count;
      }
      ASSERT_EQ(row, s.tokens);
      int prev = -1;
      for (const StepOut& o : s.outs) {
        ASSERT_GT(o.row, prev);
        prev = o.row;
        ASSERT_EQ(token_at_row.at(o.row), std::make_pair(o.chunk, o.index));
        ASSERT_EQ(o.last, o.index == chunks[o.chunk].n_tokens - 1);
        ASSERT_TRUE(o.last || chunks[o.chunk].all_logits);
        ++outs_seen[o.chunk];
      }
    }
    for (int b = 0; b < n; ++b) {
      EXPECT_EQ(seen[b], chunks[b].n_tokens);
      EXPECT_EQ(outs_seen[b], chunks[b].all_logits ? chunks[b].n_tokens : 1);
    }
  }
}

// The logits-row bound (the GPU engine's logits buffer): an all_logits chunk of 1000 tokens goes in steps of
// at most 100 tokens at out_cap 100, leaving a row for the last token of the chunk behind it.
TEST(StepPlan, LogitsRowsBoundSplitsAllLogitsChunks) {
  std::vector<int32_t> a(1000, 7), b(50, 9);
  std::vector<StepChunk> chunks = {StepChunk{0, 0, a.data(), 1000, true}, StepChunk{1, 10, b.data(), 50, false}};
  std::vector<int64_t> done;
  Step s;
  ASSERT_TRUE(next_step(chunks, done, 512, 600, s, 100));
  ASSERT_EQ(s.seqs.size(), 2u);
  EXPECT_EQ(s.seqs[0].count, 99);  // one row left for b's last token
  EXPECT_EQ(s.seqs[1].count, 50);
  ASSERT_EQ(s.outs.size(), 100u);
  EXPECT_TRUE(s.outs.back().last);
  int steps = 1;
  while (next_step(chunks, done, 512, 600, s, 100)) {
    ASSERT_EQ(s.seqs.size(), 1u);
    EXPECT_LE(s.outs.size(), 100u);
    ++steps;
  }
  EXPECT_EQ(done[0], 1000);
  EXPECT_EQ(done[1], 50);
  EXPECT_EQ(steps, 11);  // 99 + 9 x 100 + 1
  // A chunk whose last token finds no row left stops one short: out_cap 1, two plain chunks of 3 tokens.
  std::vector<StepChunk> two = {StepChunk{0, 0, b.data(), 3, false}, StepChunk{1, 0, b.data(), 3, false}};
  std::vector<int64_t> d2;
  ASSERT_TRUE(next_step(two, d2, 8, 16, s, 1));
  ASSERT_EQ(s.seqs.size(), 2u);
  EXPECT_EQ(s.seqs[0].count, 3);
  EXPECT_EQ(s.seqs[1].count, 2);
  ASSERT_TRUE(next_step(two, d2, 8, 16, s, 1));
  EXPECT_EQ(s.seqs.size(), 1u);
  EXPECT_EQ(s.outs.size(), 1u);
  EXPECT_FALSE(next_step(two, d2, 8, 16, s, 1));
}

// Simulates the window ring across steps: each step first writes its tokens' rows (position % ring), then
// every token reads positions max(0, p - window + 1) .. p. Returns the number of reads that found another
// position's row.
int64_t ring_faults(int window, int per_seq, int64_t ring, int64_t n_tokens, std::mt19937_64& rng) {
  std::vector<int64_t> row(static_cast<size_t>(ring), -1);
  int64_t faults = 0, p0 = 0;
  while (p0 < n_tokens) {
    // Steps of 1 .. per_seq tokens (a scheduler may take fewer when cap is reached).
    const int64_t take = std::min<int64_t>(n_tokens - p0, 1 + static_cast<int64_t>(rng() % per_seq));
    for (int64_t p = p0; p < p0 + take; ++p) row[p % ring] = p;
    for (int64_t p = p0; p < p0 + take; ++p)
      for (int64_t wp = std::max<int64_t>(0, p - window + 1); wp <= p; ++wp) faults += row[wp % ring] != wp;
    p0 += take;
  }
  return faults;
}

TEST(StepPlan, RingRowsKeepEveryWindowReadIntact) {
  std::mt19937_64 rng(seed() + 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int window = 1 + static_cast<int>(rng() % 160);
    const int per_seq = 1 + static_cast<int>(rng() % 300);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 2000);
    EXPECT_EQ(ring_faults(window, per_seq, ring_rows(window, per_seq), n, rng), 0)
        << "window " << window << " per_seq " << per_seq << " tokens " << n;
  }
  // The test has teeth: a ring of only `window` rows breaks as soon as a step carries several tokens.
  int64_t faults = 0;
  for (int trial = 0; trial < 50; ++trial) faults += ring_faults(64, 48, 64, 1000, rng);
  EXPECT_GT(faults, 0);
  EXPECT_EQ(ring_rows(128, 1), 128);
  EXPECT_EQ(ring_rows(128, 0), 128);
  EXPECT_EQ(ring_rows(128, 256), 383);
}

}  // namespace
}  // namespace dsv4
