// The record behind commit 7a43921 (eighteenth session): cuda::mhc::sinkhorn_lane's 4-term sums changed from two
// dependent butterfly shuffle rounds to three independent shuffles and the same pairwise adds. This emulates the
// 16 lanes of one 4x4 matrix on the CPU, both forms, with the same float operations in the same order, and
// checks that every result is bit for bit the same. The device's expf and IEEE division are the same calls in
// both forms, so the host's exp and '/' stand in for them.
// Run: g++ -O2 -ffp-contract=off -o /tmp/sinkhorn_sum_order tools/check/sinkhorn_sum_order.cc &&
//      /tmp/sinkhorn_sum_order        (2026-12-01, this machine: "0 of 200000 matrices differ")
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace {
using F = float;
constexpr int kL = 16;

// Before: max and sums as two butterfly rounds (xor 1 then 2 for rows, 4 then 8 for columns).
void butterfly(F* c, int iters, F eps) {
  F a[kL], b[kL], e[kL];
  for (int l = 0; l < kL; ++l) a[l] = fmaxf(c[l], c[l ^ 1]);
  for (int l = 0; l < kL; ++l) b[l] = fmaxf(a[l], a[l ^ 2]);
  for (int l = 0; l < kL; ++l) e[l] = std::exp(c[l] - b[l]);
  for (int l = 0; l < kL; ++l) a[l] = e[l] + e[l ^ 1];
  for (int l = 0; l < kL; ++l) b[l] = a[l] + a[l ^ 2];
  for (int l = 0; l < kL; ++l) c[l] = e[l] / b[l] + eps;
  auto step = [&](int m1, int m2) {
    F t[kL], u[kL];
    for (int l = 0; l < kL; ++l) t[l] = c[l] + c[l ^ m1];
    for (int l = 0; l < kL; ++l) u[l] = t[l] + t[l ^ m2];
    for (int l = 0; l < kL; ++l) c[l] /= (u[l] + eps);
  };
  step(4, 8);
  for (int it = 0; it < iters - 1; ++it) step(1, 2), step(4, 8);
}

// After: each lane takes its three partners' values at once, then (v + a) + (b + c) (sum4_lanes).
void three_shuffles(F* c, int iters, F eps) {
  auto sum4 = [](const F* v, int l, int m1, int m2) { return (v[l] + v[l ^ m1]) + (v[l ^ m2] + v[l ^ m1 ^ m2]); };
  F mx[kL], e[kL], n[kL];
  for (int l = 0; l < kL; ++l) mx[l] = fmaxf(fmaxf(c[l], c[l ^ 1]), fmaxf(c[l ^ 2], c[l ^ 3]));
  for (int l = 0; l < kL; ++l) e[l] = std::exp(c[l] - mx[l]);
  for (int l = 0; l < kL; ++l) n[l] = e[l] / sum4(e, l, 1, 2) + eps;
  std::memcpy(c, n, sizeof n);
  auto step = [&](int m1, int m2) {
    F s[kL];
    for (int l = 0; l < kL; ++l) s[l] = sum4(c, l, m1, m2) + eps;
    for (int l = 0; l < kL; ++l) c[l] /= s[l];
  };
  step(4, 8);
  for (int it = 0; it < iters - 1; ++it) step(1, 2), step(4, 8);
}
}  // namespace

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<F> nd(0, 3);
  long differ = 0, n = 0;
  for (int trial = 0; trial < 200000; ++trial, ++n) {
    F a[kL], b[kL];
    for (int l = 0; l < kL; ++l) a[l] = b[l] = trial % 7 == 0 ? std::round(nd(rng)) : nd(rng) * (1 + trial % 5);
    butterfly(a, 20, 1e-6f);
    three_shuffles(b, 20, 1e-6f);
    differ += std::memcmp(a, b, sizeof a) != 0;
  }
  std::printf("%ld of %ld matrices differ\n", differ, n);
  return differ != 0;
}
