// Token sampling on the GPU: the same rule as the CPU sampler (engine/sampler.{h,cc}) for a batch of logit
// rows, one launch, per-row parameters in device memory. CUDA-graph safe: asynchronous on `stream`, no
// allocation, no host synchronisation, no host branching on device data (rows and vocab are host values).
//
// Rule (engine/sampler.cc): temperature, then top-k, top-p (smallest prefix of the sorted candidates with
// mass >= top_p), min-p (keep p >= min_p * p_max), then a draw. Candidates sorted by logit desc, id asc.
// Greedy (temperature == 0 or top_k == 1): the largest logit, lowest id among equal maxima (dsv4::argmax).
// Probabilities p_i = exp((l_i - max) / T) / S in double, S summed in double over the top-k set (top_k > 0)
// or over the whole vocabulary. The draw is distributed exactly like the CPU's (same kept set, same
// probabilities up to double rounding); the random numbers differ (counter-based, see sample_uniform53).
//
// Status per row (out_status):
//   0 ok: out_token is the sample.
//   1 a NaN or +inf logit, or (non-greedy) no finite logit at all: out_token = -1 (the CPU throws).
//   2 needs the host sampler (out_token = -1): the kept set reaches past the GPU's candidates, i.e. the top
//     C = min(2048, vocab) logits, and is not the whole vocabulary. That is: 2048 < top_k < vocab; or
//     (top_k == 0 or >= vocab, more than C finite logits) the top-p prefix needs more than the C candidates
//     (their mass < top_p), or top_p == 1 and min-p keeps every candidate but not every finite logit.
//     Nothing is ever silently truncated. When the kept set is the whole vocabulary (top_k == 0 or
//     >= vocab, top_p == 1, min_p == 0 or keeping every finite logit) the GPU draws over the whole
//     vocabulary itself (plain temperature sampling needs no fallback).
//   3 invalid parameters (what dsv4::validate rejects): out_token = -1.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsv4::glue {

struct SampleRowParams {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;         // the row's random stream ...
  uint64_t step = 0;         // ... and position in it: one uniform per (seed, step)
};
static_assert(sizeof(SampleRowParams) == 32, "SampleRowParams is copied to the device as is");

enum SampleStatus : int32_t { kSampleOk = 0, kSampleNonFinite = 1, kSampleHostFallback = 2, kSampleBadParams = 3 };

// Bytes of `workspace` sample_rows needs (256-byte multiple): the candidate lists, rows * min(2048, vocab) int32.
size_t sample_workspace_bytes(int rows, int64_t vocab);

// logits: device [rows, vocab] fp32, contiguous. params: device [rows]. out_token, out_status: device [rows].
// workspace: device, >= sample_workspace_bytes(rows, vocab) bytes. Supported: 1 <= vocab <= 2^24, 0 <= rows <= 2^27.
// all_greedy: the caller knows every row is greedy (temperature 0 or top_k 1): the candidate search is
// skipped (the greedy path never reads it), saving one top-k over the vocabulary per row.
void sample_rows(const float* logits, int rows, int64_t vocab, const SampleRowParams* params, int32_t* out_token,
                 int32_t* out_status, void* workspace, cudaStream_t stream, bool all_greedy = false);

// The counter-based generator: splitmix64 finalizer over (seed, step), then the top 53 bits as a double in
// [0, 1). Row draw: r = u * total, the first kept candidate whose inclusive cumulative mass exceeds r wins.
constexpr uint64_t sample_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr double sample_uniform53(uint64_t seed, uint64_t step) {
  return static_cast<double>(sample_mix64(sample_mix64(seed) ^ step) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace dsv4::glue
