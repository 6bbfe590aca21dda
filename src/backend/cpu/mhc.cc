#include "backend/cpu/mhc.h"

#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"

namespace dsv4::cpu {

static float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mixes[m] = (fn[m] · X) * rsqrt(mean(X²) + eps) for m < rows.
static void hc_mixes(const HcWeights& w, const HcParams& p, const float* h, int rows, float* mixes) {
  const int64_t nD = p.n * p.dim;
  double ss = 0.0;
  for (int64_t i = 0; i < nD; ++i) ss += static_cast<double>(h[i]) * h[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / nD) + p.norm_eps);
  for (int m = 0; m < rows; ++m) mixes[m] = dot(w.fn.data() + m * nD, h, nD) * r;
}

void sinkhorn(float* c, int n, int iters, float eps) {
  for (int j = 0; j < n; ++j) {  // row softmax, + eps
    float* row = c + j * n;
    float mx = row[0];
    for (int k = 1; k < n; ++k) mx = std::max(mx, row[k]);
    float s = 0.0f;
    for (int k = 0; k < n; ++k) s += (row[k] = std::exp(row[k] - mx));
    for (int k = 0; k < n; ++k) row[k] = row[k] / s + eps;
  }
  auto col_norm = [&]() {
    for (int k = 0; k < n; ++k) {
      float s = 0.0f;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      for (int j = 0; j < n; ++j) c[j * n + k] /= (s + eps);
    }
  };
  auto row_norm = [&]() {
    for (int j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int k = 0; k < n; ++k) s += c[j * n + k];
      for (int k = 0; k < n; ++k) c[j * n + k] /= (s + eps);
    }
  };
  col_norm();
  for (int it = 0; it < iters - 1; ++it) {
    row_norm();
    col_norm();
  }
}

void hc_pre(const HcWeights& w, const HcParams& p, const float* h, float* x, float* post, float* comb) {
  const int n = p.n;
  std::vector<float> mixes((2 + n) * n);
  hc_mixes(w, p, h, (2 + n) * n, mixes.data());
  std::vector<float> pre(n);
  for (int j = 0; j < n; ++j) {
    pre[j] = sigmoid(mixes[j] * w.scale[0] + w.base[j]) + p.hc_eps;
    post[j] = 2.0f * sigmoid(mixes[n + j] * w.scale[1] + w.base[n + j]);
  }
  for (int m = 0; m < n * n; ++m) comb[m] = mixes[2 * n + m] * w.scale[2] + w.base[2 * n + m];
  sinkhorn(comb, n, p.sinkhorn_iters, p.hc_eps);
  for (int64_t d = 0; d < p.dim; ++d) {
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += pre[j] * h[j * p.dim + d];
    x[d] = s;
  }
}

void hc_post(const HcParams& p, const float* y, const float* res, const float* post, const float* comb, float* out) {
  const int n = p.n;
  for (int k = 0; k < n; ++k) {
    float* o = out + k * p.dim;
    for (int64_t d = 0; d < p.dim; ++d) {
      float s = post[k] * y[d];
      for (int j = 0; j < n; ++j) s += comb[j * n + k] * res[j * p.dim + d];
      o[d] = s;
    }
  }
}

void hc_head(const HcWeights& w, const HcParams& p, const float* h, float* y) {
  const int n = p.n;
  std::vector<float> mixes(n), pre(n);
  hc_mixes(w, p, h, n, mixes.data());
  for (int j = 0; j < n; ++j) pre[j] = sigmoid(mixes[j] * w.scale[0] + w.base[j]) + p.hc_eps;
  for (int64_t d = 0; d < p.dim; ++d) {
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += pre[j] * h[j * p.dim + d];
    y[d] = s;
  }
}

}  // namespace dsv4::cpu
