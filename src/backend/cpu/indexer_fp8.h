// Lightning-indexer scores over keys stored as FP8 (the cache layout of KvCodec(kFP8, d, 0, d)): each key row
// holds d e4m3 bytes followed by one UE8M0 scale byte (2^(e-127)); rows are `row_bytes` apart. The keys are
// decoded exactly (e4m3 value * scale) and scored with indexer_scores; keys t >= n_visible score -inf
// (causal prefill: n_visible = (p + 1) / 4).
#pragma once
#include <cstdint>

namespace dsv4::cpu {

void indexer_scores_fp8(const float* q, const float* w, int H, int d, const uint8_t* keys, int64_t n,
                        int64_t row_bytes, int64_t n_visible, float* scores);

// The same over MXFP4 key rows (d = 128): d/2 bytes of e2m1 pairs (element 2i in the LOW nibble of byte i)
// followed by d/32 UE8M0 scales, one per 32 consecutive elements (68 B for d = 128); rows `row_bytes` apart.
// k[t][i] = e2m1(nibble i) * 2^(scale[i / 32] - 127); plain loops, fp32 sums in the order of indexer_scores.
void indexer_scores_mxfp4(const float* q, const float* w, int H, int d, const uint8_t* keys, int64_t n,
                          int64_t row_bytes, int64_t n_visible, float* scores);

}  // namespace dsv4::cpu
