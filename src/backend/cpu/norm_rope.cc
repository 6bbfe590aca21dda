#include "backend/cpu/norm_rope.h"

#include <algorithm>
#include <cmath>

namespace dsv4::cpu {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
  }
}

std::vector<float> rope_inv_freq(double theta, int rope_dim, const YarnConfig& yarn) {
  const int half = rope_dim / 2;
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) f[i] = static_cast<float>(1.0 / std::pow(theta, (2.0 * i) / rope_dim));
  if (!yarn.enabled || yarn.factor <= 1.0) return f;
  // YaRN (DeepSeek's variant, identical to transformers' `_compute_yarn_parameters` with truncate=True):
  // dims below `low` keep their frequency, dims above `high` are divided by `factor`, linear ramp between.
  auto corr_dim = [&](double rotations) {
    return rope_dim * std::log(yarn.original_max_position_embeddings / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = std::max(std::floor(corr_dim(yarn.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(yarn.beta_slow)), static_cast<double>(rope_dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const float ramp = static_cast<float>(std::clamp((i - low) / (high - low), 0.0, 1.0));
    const float extrap = 1.0f - ramp;  // weight of the original frequency
    const float interp = f[i] / static_cast<float>(yarn.factor);
    f[i] = interp * (1.0f - extrap) + f[i] * extrap;
  }
  return f;
}

std::vector<float> rope_inv_freq(const ModelConfig& c, bool compressed_layer) {
  if (!compressed_layer) return rope_inv_freq(c.rope_theta, c.rope_head_dim, YarnConfig{});
  return rope_inv_freq(c.compress_rope_theta, c.rope_head_dim, c.yarn);
}

void rope(float* x, int64_t n, const std::vector<float>& inv_freq, int64_t pos, bool inverse) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  float* r = x + (n - 2 * half);
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(angle);
    const float s = inverse ? -std::sin(angle) : std::sin(angle);
    const float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = b * c + a * s;
  }
}

}  // namespace dsv4::cpu
