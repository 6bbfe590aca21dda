// glue::route (the MoE router on precomputed logits) against the CPU router (cpu::moe_route).
//   Every E in {8, 16, 256, 384} (384: the shared-memory path) x K in {1, 6, 8} x T in {1, 7, 64} x score
//   function (sqrtsoftplus, sigmoid, softmax) x norm_topk x biased top-k / hash table, plus E = 6144 (the
//   largest accepted) and the error for E = 6145. Rows of random logits, logits quantized to 2 or 4 values
//   (many exact ties), rows with NaN, +inf and -inf logits, all-NaN and all -inf rows; biases random, zero
//   or quantized. Outputs are poisoned (idx -7, weights NaN) before every launch. Fresh seed per run
//   (printed; DSV4_TEST_SEED=<n> repeats one).
//   The reference: route_ref below, the CPU router's arithmetic line for line on one row of logits, with
//   the kernel's order for NaN keys (last, lowest index first) where std::partial_sort's comparator in
//   cpu::moe_route has no defined order. On rows of finite logits it must equal cpu::moe_route bit for bit
//   (driven through a BF16 identity gate, exact for finite inputs).
//   Expert ids must match exactly. Weights cannot be bit-identical: CUDA's expf / log1pf (2 / 1 ulp) are
//   not glibc's, and the softmax denominator is a tree on the GPU, a serial sum on the CPU. Each weight is
//   checked against a bound derived per row (weight_bound), a few ulp (tens for unnormalized softmax).
//   Ids are only well defined when float error cannot reorder the keys, so rows where two distinct keys
//   around the top K lie within twice the bound of each other are redrawn (counted and printed); exact ties
//   from identical (logit, bias) pairs stay, since they are exact ties on both sides.
// SKIPs without a CUDA device.
#include "backend/cuda/glue/glue.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/moe.h"
#include "core/error.h"
#include "core/numerics.h"
#include "cuda_engine/dev_buf.h"
#include "gpu_available.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsv4 {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kUlp = 0x1p-23;  // relative size of one ulp (upper bound)

using testing::ck;
using testing::DevBuf;

// cpu/moe.cc's score_fn.
float score_fn(int f, float l) {
  if (f == 0) return std::sqrt(l > 20.0f ? l : std::log1p(std::exp(l)));
  if (f == 1) return 1.0f / (1.0f + std::exp(-l));
  return l;
}

// route_better of the kernel: key descending, lower index among equal keys, NaN after every number.
bool key_before(float va, int a, float vb, int b) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return a < b;
}

struct RefRow {
  std::vector<int32_t> idx;
  std::vector<float> w;
  std::vector<double> bound;  // |gpu - ref| <= bound (absolute) per weight
  bool well_conditioned = true;
};

// Relative bound (units of kUlp) between the GPU's and the CPU's score of one expert. CUDA: expf 2 ulp,
// log1pf 1 ulp, sqrtf and '/' correctly rounded (no fast math); glibc expf / log1pf under 1 ulp.
//   f 0: softplus carries exp's error with a factor x / ((1 + x) log1p(x)) <= 1: GPU 3, CPU 2; sqrt halves it
//        and rounds: GPU 2, CPU 1.5 -> 3.5.
//   f 1: 1 + e: exp's error times e / (1 + e) <= 1 plus a rounding, the reciprocal another: GPU 3, CPU 2 -> 5.
//   f 2: expf(l - max): l - max is the same float on both sides: GPU 2, CPU 1 -> 3; then t / S rounds once on
//        each side (1) and S differs by sum_rel (see route_ref), unless the weights are normalized, where
//        the common factor 1 / S cancels.
double score_bound(int f, bool with_sum, double sum_rel) {
  if (f == 0) return 3.5;
  if (f == 1) return 5.0;
  return 3.0 + 1.0 + (with_sum ? sum_rel : 0.0);
}

// One row as cpu::moe_route computes it (same float operations in the same order).
RefRow route_ref(const float* logit, int E, int K, int f, const float* bias, const int32_t* hash_row, bool norm,
                 float scaling) {
  std::vector<float> s(logit, logit + E);
  for (int e = 0; e < E; ++e) s[e] = score_fn(f, s[e]);
  double sum_rel = 0.0;  // f 2: bound on |S_gpu - S_cpu| / S in kUlp
  if (f == 2) {
    const float mx = *std::max_element(s.begin(), s.end());
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(s[e] - mx));
    double exact = 0.0;  // of the CPU's float terms; the GPU's terms are within 2 ulp of the true exp, these 1
    for (int e = 0; e < E; ++e) exact += s[e];
    // GPU: per thread ceil(E / 256) adds, a 5-level warp tree, 8 warp sums in order: every term sees at most
    // d = ceil(E / 256) + 13 roundings of positive partial sums, |error| <= d * 2^-24 relative.
    const double d = (E + 255) / 256 + 13;
    const double cpu_err = exact > 0 && std::isfinite(exact) ? std::fabs(sum - exact) / exact / kUlp : 0.0;
    sum_rel = cpu_err + 3.0 + d / 2.0;
    for (int e = 0; e < E; ++e) s[e] /= sum;
  }
  RefRow r;
  r.idx.resize(K);
  if (hash_row) {
    std::copy(hash_row, hash_row + K, r.idx.begin());
  } else {
    std::vector<float> key(E);
    for (int e = 0; e < E; ++e) key[e] = s[e] + bias[e];
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key_before(key[a], a, key[b], b); });
    std::copy(order.begin(), order.begin() + K, r.idx.begin());
    // Keys next to each other in the order, up to the first one not taken, must be exact ties on both sides
    // (the same logit and bias, both NaN, both +inf) or further apart than either side's error.
    const double sb = score_bound(f, true, sum_rel);
    for (int i = 0; i < K && i + 1 < E; ++i) {
      const int a = order[i], b = order[i + 1];
      const float ka = key[a], kb = key[b];
      // NaN and infinite keys come from NaN / +inf logits on both sides alike (no finite logit drawn here
      // overflows), so their order is exact.
      if (std::isnan(ka) || std::isnan(kb) || std::isinf(ka) || std::isinf(kb)) continue;
      if ((logit[a] == logit[b] || (std::isnan(logit[a]) && std::isnan(logit[b]))) && bias[a] == bias[b]) continue;
      // One side's key error: its score's bound plus the rounding of score + bias. A -inf logit scores exactly
      // 0 on both sides (expf(-inf) = 0, log1pf(0) = sqrtf(0) = 1 / inf = 0), so its key is its bias on both
      // and carries no error (two biases one ulp apart behind -inf logits are then still ordered exactly).
      auto side = [&](int e, float k) {
        return logit[e] == -kInf && s[e] == 0.0f ? 0.0 : sb * std::fabs(s[e]) + std::fabs(k);
      };
      const double margin = 2.0 * kUlp * (side(a, ka) + side(b, kb)) + 1e-37;
      if (!(std::fabs(static_cast<double>(ka) - kb) > margin)) r.well_conditioned = false;
    }
  }
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += s[r.idx[k]];
  r.w.resize(K);
  r.bound.resize(K);
  // Weights: unnormalized, the score's bound and the product by scaling (0.5 ulp a side). Normalized: the
  // numerator's bound, the K-term sum of positive scores in the same order (bound of its terms plus K - 1
  // roundings of 0.5 ulp a side), the division and the product: 2 * score + K + 1.
  const double sc = score_bound(f, !norm, sum_rel);
  const double rel = norm ? 2.0 * sc + K + 1.0 : sc + 1.0;
  for (int k = 0; k < K; ++k) {
    float w = s[r.idx[k]];
    if (norm) w /= (sum + 1e-20f);
    r.w[k] = w * scaling;
    r.bound[k] = 1.01 * rel * kUlp * std::fabs(r.w[k]) + 1e-37;  // 1.01: second-order terms
  }
  return r;
}

enum RowMode { kNormal, kQuant4, kQuant2, kSomeNaN, kSomeInf, kAllNaN, kAllNegInf, kSomeNegInf, kQuantPosInf, kModes };

void fill_row(std::mt19937_64& rng, RowMode mode, float* l, int E) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int> q4(0, 3), q2(0, 1), pick(0, E - 1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  static const float levels[4] = {-1.5f, -0.25f, 0.5f, 1.75f};
  for (int e = 0; e < E; ++e) {
    switch (mode) {
      case kQuant4: case kQuantPosInf: l[e] = levels[q4(rng)]; break;
      case kQuant2: l[e] = static_cast<float>(q2(rng)); break;
      case kAllNaN: l[e] = kNaN; break;
      case kAllNegInf: l[e] = -kInf; break;
      default: l[e] = nd(rng);
    }
    if (mode == kSomeNaN && u(rng) < 0.05f) l[e] = kNaN;
    if (mode == kSomeInf && u(rng) < 0.1f) l[e] = u(rng) < 0.5f ? kInf : -kInf;
    if (mode == kSomeNegInf && u(rng) < 0.3f) l[e] = -kInf;
  }
  if (mode == kSomeNaN) l[pick(rng)] = kNaN;
  if (mode == kSomeInf) l[pick(rng)] = kInf, l[pick(rng)] = -kInf;
  if (mode == kQuantPosInf) l[pick(rng)] = kInf;
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("DSV4_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("glue::route test seed %llu (DSV4_TEST_SEED=%llu repeats it)\n", static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b;
}

struct Stats {
  int cases = 0, rows = 0, redrawn = 0, cpu_rows = 0, warp_rows = 0;
  double worst_ulp = 0.0;  // largest |gpu - ref| / (kUlp |ref|) seen
};

void run_case(int E, int K, int T, int f, bool norm, bool hash, int bias_mode, uint64_t salt, Stats& st) {
  SCOPED_TRACE(::testing::Message() << "E " << E << " K " << K << " T " << T << " score_func " << f << " norm "
                                  << norm << " hash " << hash << " bias_mode " << bias_mode << " salt " << salt);
  std::mt19937_64 rng(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  const float scaling = 2.5f;
  const int vocab = 37;
  std::vector<float> bias(E, 0.0f);
  {
    std::normal_distribution<float> nd(0.0f, 0.5f);
    std::uniform_int_distribution<int> q(0, 1);
    for (float& b : bias) b = bias_mode == 0 ? nd(rng) : bias_mode == 1 ? 0.0f : 0.5f * static_cast<float>(q(rng));
  }
  std::vector<int32_t> tid2eid(static_cast<size_t>(vocab) * K), tokens(T);
  {
    std::vector<int32_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    for (int v = 0; v < vocab; ++v) {
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + K, tid2eid.begin() + static_cast<size_t>(v) * K);
    }
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int32_t& t : tokens) t = tok(rng);
  }
  std::vector<float> logits(static_cast<size_t>(T) * E);
  std::vector<RefRow> ref(T);
  std::vector<bool> finite(T);
  for (int t = 0; t < T; ++t) {
    const RowMode mode = static_cast<RowMode>((t + salt) % kModes);
    float* l = logits.data() + static_cast<size_t>(t) * E;
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 200) << "no well-conditioned row drawn for row " << t;
      fill_row(rng, mode, l, E);
      ref[t] = route_ref(l, E, K, f, bias.data(), hash ? tid2eid.data() + static_cast<size_t>(tokens[t]) * K : nullptr,
                         norm, scaling);
      if (ref[t].well_conditioned) break;
      ++st.redrawn;
    }
    finite[t] = std::all_of(l, l + E, [](float v) { return std::isfinite(v); });
  }

  // The reference is the CPU router: cpu::moe_route on the finite rows through an identity gate.
  std::vector<int> fr;
  for (int t = 0; t < T; ++t)
    if (finite[t]) fr.push_back(t);
  if (!fr.empty()) {
    ModelConfig c;
    c.vocab_size = vocab;
    c.n_routed_experts = E;
    c.num_experts_per_tok = K;
    c.scoring_func = static_cast<ScoreFunc>(f);
    c.norm_topk_prob = norm;
    c.routed_scaling_factor = scaling;
    std::vector<uint16_t> eye(static_cast<size_t>(E) * E, 0);
    for (int e = 0; e < E; ++e) eye[static_cast<size_t>(e) * E + e] = f32_to_bf16(1.0f);
    LayerWeights L;
    L.gate.name = "gate";
    L.gate.fmt = WeightFormat::kBF16;
    L.gate.rows = L.gate.cols = E;
    L.gate.w = reinterpret_cast<const uint8_t*>(eye.data());
    L.hash = hash;
    if (hash) L.tid2eid = tid2eid;
    else L.gate_bias = bias;
    const int n = static_cast<int>(fr.size());
    std::vector<float> x(static_cast<size_t>(n) * E), cw(static_cast<size_t>(n) * K);
    std::vector<int32_t> ctok(n), cidx(static_cast<size_t>(n) * K);
    for (int i = 0; i < n; ++i) {
      std::copy_n(logits.begin() + static_cast<size_t>(fr[i]) * E, E, x.begin() + static_cast<size_t>(i) * E);
      ctok[i] = tokens[fr[i]];
    }
    cpu::moe_route(c, L, x.data(), n, ctok.data(), cidx.data(), cw.data());
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < K; ++k) {
        const RefRow& r = ref[fr[i]];
        ASSERT_EQ(cidx[static_cast<size_t>(i) * K + k], r.idx[k]) << "route_ref vs cpu::moe_route, row " << fr[i];
        ASSERT_TRUE(same_float(cw[static_cast<size_t>(i) * K + k], r.w[k]))
            << "route_ref vs cpu::moe_route, row " << fr[i] << " slot " << k << ": " << cw[i * K + k] << " vs "
            << r.w[k];
      }
    st.cpu_rows += n;
  }

  DevBuf dl(sizeof(float) * logits.size()), db(sizeof(float) * E), dh(sizeof(int32_t) * tid2eid.size()),
      dt(sizeof(int32_t) * T), di(sizeof(int32_t) * T * K), dw(sizeof(float) * T * K);
  ck(cudaMemcpy(dl.p, logits.data(), sizeof(float) * logits.size(), cudaMemcpyHostToDevice), "logits upload");
  ck(cudaMemcpy(db.p, bias.data(), sizeof(float) * E, cudaMemcpyHostToDevice), "bias upload");
  ck(cudaMemcpy(dh.p, tid2eid.data(), sizeof(int32_t) * tid2eid.size(), cudaMemcpyHostToDevice), "tid2eid upload");
  ck(cudaMemcpy(dt.p, tokens.data(), sizeof(int32_t) * T, cudaMemcpyHostToDevice), "tokens upload");
  const std::vector<int32_t> pidx(static_cast<size_t>(T) * K, -7);
  const std::vector<float> pw(static_cast<size_t>(T) * K, kNaN);
  // One glue::route call on poisoned outputs: its picks and weights.
  auto run_route = [&](const char* what, std::vector<int32_t>& ri, std::vector<float>& rw) {
    ck(cudaMemcpy(di.p, pidx.data(), sizeof(int32_t) * pidx.size(), cudaMemcpyHostToDevice), "poison idx");
    ck(cudaMemcpy(dw.p, pw.data(), sizeof(float) * pw.size(), cudaMemcpyHostToDevice), "poison weights");
    glue::route(dl.as<float>(), T, E, K, f, hash ? nullptr : db.as<float>(), hash ? dh.as<int32_t>() : nullptr,
                dt.as<int32_t>(), norm, scaling, di.as<int32_t>(), dw.as<float>(), nullptr);
    ck(cudaDeviceSynchronize(), what);
    ri.resize(pidx.size());
    rw.resize(pidx.size());
    ck(cudaMemcpy(ri.data(), di.p, sizeof(int32_t) * ri.size(), cudaMemcpyDeviceToHost), "idx download");
    ck(cudaMemcpy(rw.data(), dw.p, sizeof(float) * rw.size(), cudaMemcpyDeviceToHost), "weights download");
  };
  std::vector<int32_t> gi;
  std::vector<float> gw;
  run_route("glue::route", gi, gw);

  // The warp-per-token kernel (glue::set_route_warp_kernel, E <= 256) on the same inputs: bit for bit the same
  // picks and weights as the rank kernel (the production one up to 1024 experts).
  if (E <= 256) {
    std::vector<int32_t> wi;
    std::vector<float> ww;
    glue::set_route_warp_kernel(true);
    run_route("glue::route (warp kernel)", wi, ww);
    glue::set_route_warp_kernel(false);
    for (size_t i = 0; i < gi.size(); ++i) {
      ASSERT_EQ(wi[i], gi[i]) << "warp vs rank kernel, row " << i / K << " slot " << i % K;
      ASSERT_EQ(0, std::memcmp(&ww[i], &gw[i], sizeof(float))) << "warp vs rank kernel, row " << i / K << " slot "
                                                                << i % K << ": " << ww[i] << " vs " << gw[i];
    }
    st.warp_rows += T;
  }

  for (int t = 0; t < T; ++t) {
    const RefRow& r = ref[t];
    for (int k = 0; k < K; ++k) {
      const int32_t g = gi[static_cast<size_t>(t) * K + k];
      const float w = gw[static_cast<size_t>(t) * K + k];
      ASSERT_EQ(g, r.idx[k]) << "row " << t << " (mode " << (t + salt) % kModes << ") slot " << k;
      if (std::isnan(r.w[k]) || std::isinf(r.w[k])) {
        ASSERT_TRUE(same_float(w, r.w[k])) << "row " << t << " slot " << k << ": " << w << " vs " << r.w[k];
        continue;
      }
      ASSERT_TRUE(std::isfinite(w)) << "row " << t << " slot " << k << ": " << w << " vs " << r.w[k];
      const double err = std::fabs(static_cast<double>(w) - r.w[k]);
      ASSERT_LE(err, r.bound[k]) << "row " << t << " (mode " << (t + salt) % kModes << ") slot " << k << ": " << w
                                 << " vs " << r.w[k];
      if (r.w[k] != 0.0f) st.worst_ulp = std::max(st.worst_ulp, err / (kUlp * std::fabs(r.w[k])));
    }
  }
  ++st.cases;
  st.rows += T;
}

TEST(GlueRoute, MatchesCpuRouter) {
  DSV4_REQUIRE_GPU();
  Stats st;
  uint64_t salt = 0;
  for (int E : {8, 16, 33, 256, 384, 1024})  // 1024: the rank kernel's last
    for (int K : {1, 6, 8})
      for (int T : {1, 7, 64})
        for (int f = 0; f < 3; ++f)
          for (int norm = 0; norm < 2; ++norm)
            for (int hash = 0; hash < 2; ++hash) {
              run_case(E, K, T, f, norm != 0, hash != 0, static_cast<int>(salt % 3), salt, st);
              ++salt;
              if (HasFatalFailure()) return;
            }
  std::printf("glue::route: %d cases, %d rows (%d also through cpu::moe_route, %d bitwise against the warp "
              "kernel), %d ill-conditioned rows redrawn, worst weight error %.2f ulp\n", st.cases, st.rows,
              st.cpu_rows, st.warp_rows, st.redrawn, st.worst_ulp);
}

// The largest accepted expert count (one warp's scores and keys fill 48 KiB of shared memory), and the error
// one past it.
TEST(GlueRoute, LargestExpertCount) {
  DSV4_REQUIRE_GPU();
  Stats st;
  for (int f = 0; f < 3; ++f) run_case(6144, 6, 7, f, true, false, f, 1000 + f, st);
  EXPECT_THROW(glue::route(nullptr, 1, 6145, 6, 0, nullptr, nullptr, nullptr, true, 1.0f, nullptr, nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace dsv4
