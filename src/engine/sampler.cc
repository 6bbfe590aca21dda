#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace dsv4 {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    fail("temperature must be a finite number >= 0 (got ", p.temperature, ")");
  if (p.top_k < 0) fail("top_k must be >= 0 (got ", p.top_k, ")");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p must be in (0, 1] (got ", p.top_p, ")");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("min_p must be in [0, 1] (got ", p.min_p, ")");
}

static void check_finite(const float* logits, int64_t vocab) {
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]) || logits[i] == INFINITY)
      fail("non-finite logit at token ", i, ": refusing to sample (see failure mode F1)");
}

int32_t argmax(const float* logits, int64_t vocab) {
  check_finite(logits, vocab);
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature == 0.0f) return argmax(logits, vocab);
  check_finite(logits, vocab);
  // Candidates sorted by logit (desc, id asc for ties).
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = ids.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = static_cast<size_t>(p_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), better);
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  const double mx = logits[ids[0]];
  std::vector<double> prob(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[ids[i]] - mx) / p_.temperature));
  for (double& v : prob) v /= sum;
  if (p_.top_p < 1.0f) {  // smallest prefix with mass >= top_p
    double acc = 0.0;
    size_t k = 0;
    while (k < keep) {
      acc += prob[k++];
      if (acc >= p_.top_p) break;
    }
    keep = k;
  }
  if (p_.min_p > 0.0f) {  // drop tokens below min_p times the top probability
    size_t k = 1;
    while (k < keep && prob[k] >= p_.min_p * prob[0]) ++k;
    keep = k;
  }
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    if (r < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace dsv4
