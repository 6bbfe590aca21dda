// glue::sample_rows (GPU token sampling) against the CPU sampler (engine/sampler.cc).
//   Greedy: equals dsv4::argmax on random rows with exact ties, -0/+0, -inf entries, all -inf; top_k == 1
//     with temperature > 0 equals greedy.
//   Errors: NaN / +inf rows give status 1 (token -1), invalid parameters status 3.
//   Distribution: rows of every vocab size (1, 7, 2048, 2049, 129280) x every (top_k, top_p, min_p) in
//     {0,5,50} x {0.5,0.9,1} x {0,0.1} (+ 3 peaked rows with top_k 0, top_p < 1), temperatures 0.5..2,
//     random logits (some with many exact ties, some -inf), all configurations of one vocab size in the
//     same launches (per-row parameters), seeds/steps varied. The kept set and its probabilities come from
//     a reproduction of the CPU rule (itself checked against dsv4::Sampler draws for small vocabularies).
//     Every GPU draw must lie in the kept set, and the frequencies pass a chi-square test at significance
//     1e-6 per configuration (Wilson-Hilferty quantile; categories with expected count < 5 pooled). Seeds
//     are fixed, so the test is deterministic.
//   Status 2 (host fallback) exactly where the documented rule says (sample.h), e.g. a flat 129280 row with
//     top_p 0.99, top_k 0; never for plain temperature sampling (whole-vocabulary draw on the GPU).
//   Outputs are poisoned before every launch; every row must be written.
// SKIPs without a CUDA device.
#include "backend/cuda/glue/sample.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "engine/sampler.h"
#include "cuda_engine/dev_buf.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

using glue::SampleRowParams;
constexpr int kCand = 2048;

using testing::ck;
using testing::DevBuf;

// One launch over `rows` rows of d_logits [rows, V]. Outputs poisoned first; checks every row was written.
void run_gpu(const float* d_logits, int rows, int64_t V, const std::vector<SampleRowParams>& params,
             std::vector<int32_t>& tok, std::vector<int32_t>& st) {
  DevBuf dp(sizeof(SampleRowParams) * rows), dt(sizeof(int32_t) * rows), ds(sizeof(int32_t) * rows),
      ws(glue::sample_workspace_bytes(rows, V));
  ck(cudaMemcpy(dp.p, params.data(), sizeof(SampleRowParams) * rows, cudaMemcpyHostToDevice), "params upload");
  ck(cudaMemset(dt.p, 0xA5, sizeof(int32_t) * rows), "poison tokens");
  ck(cudaMemset(ds.p, 0xA5, sizeof(int32_t) * rows), "poison status");
  glue::sample_rows(d_logits, rows, V, dp.as<SampleRowParams>(), dt.as<int32_t>(), ds.as<int32_t>(), ws.p, nullptr);
  ck(cudaDeviceSynchronize(), "sample_rows");
  tok.resize(rows);
  st.resize(rows);
  ck(cudaMemcpy(tok.data(), dt.p, sizeof(int32_t) * rows, cudaMemcpyDeviceToHost), "tokens download");
  ck(cudaMemcpy(st.data(), ds.p, sizeof(int32_t) * rows, cudaMemcpyDeviceToHost), "status download");
  for (int r = 0; r < rows; ++r) {
    ASSERT_TRUE(st[r] >= 0 && st[r] <= 3) << "row " << r << " status not written: " << st[r];
    if (st[r] == 0) {
      ASSERT_TRUE(tok[r] >= 0 && tok[r] < V) << "row " << r << " token " << tok[r];
    } else {
      ASSERT_EQ(tok[r], -1) << "row " << r << " status " << st[r];
    }
  }
}

void run_gpu_host(const std::vector<float>& logits, int rows, int64_t V, const std::vector<SampleRowParams>& params,
                  std::vector<int32_t>& tok, std::vector<int32_t>& st) {
  DevBuf dl(sizeof(float) * logits.size());
  ck(cudaMemcpy(dl.p, logits.data(), sizeof(float) * logits.size(), cudaMemcpyHostToDevice), "logits upload");
  run_gpu(dl.as<float>(), rows, V, params, tok, st);
}

SampleRowParams sp(float t, int k, float p, float mp, uint64_t seed = 1, uint64_t step = 0) {
  SampleRowParams r;
  r.temperature = t;
  r.top_k = k;
  r.top_p = p;
  r.min_p = mp;
  r.seed = seed;
  r.step = step;
  return r;
}

// ---- the CPU rule, reproduced (engine/sampler.cc), plus the GPU's documented status ------------------------
struct Ref {
  int status = 0;                // what sample_rows must report
  std::vector<int32_t> ids;      // status 0: kept tokens with probability > 0
  std::vector<double> prob;      // their probabilities, normalised over the kept set
};

Ref reference(const float* l, int64_t V, const SampleRowParams& p) {
  Ref ref;
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature) || p.top_k < 0 || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
      !(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    ref.status = 3;
    return ref;
  }
  int64_t n_fin = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(l[i]) || l[i] == INFINITY) {
      ref.status = 1;
      return ref;
    }
    n_fin += l[i] > -INFINITY;
  }
  if (p.temperature == 0.0f || p.top_k == 1) {
    ref.ids = {argmax(l, V)};
    ref.prob = {1.0};
    return ref;
  }
  if (n_fin == 0) {
    ref.status = 1;
    return ref;
  }
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::sort(ids.begin(), ids.end(), better);
  const int64_t K = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const int64_t C = std::min<int64_t>(kCand, V);
  const double mx = l[ids[0]];
  std::vector<double> prob(K);
  double sum = 0.0;
  for (int64_t i = 0; i < K; ++i) sum += (prob[i] = std::exp((l[ids[i]] - mx) / p.temperature));
  for (double& v : prob) v /= sum;
  int64_t keep = K;
  int64_t topp_cut = -1;  // 1-based prefix length reaching top_p (-1: never)
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    int64_t k = 0;
    while (k < keep) {
      acc += prob[k++];
      if (acc >= p.top_p) {
        topp_cut = k;
        break;
      }
    }
    keep = k;
  }
  const double thr = p.min_p * prob[0];
  int64_t minp_cut = -1;  // first index with prob < thr (-1: none before keep)
  if (p.min_p > 0.0f) {
    int64_t k = 1;
    while (k < keep && prob[k] >= thr) ++k;
    if (k < keep) minp_cut = k;
    keep = k;
  }
  // The GPU's status rule (sample.h).
  if (K > C && K < V) {
    ref.status = 2;
  } else if (K > C && n_fin >= C) {  // whole-vocabulary normalisation, candidates not complete
    if (p.top_p < 1.0f) {
      if (topp_cut < 0 || topp_cut > C) ref.status = 2;
    } else if (p.min_p > 0.0f) {
      // a cut among the first C candidates, or min-p keeps every finite logit (the whole-vocabulary draw)
      const bool cut_in_cand = minp_cut >= 1 && minp_cut < C;
      const bool all_finite_kept = minp_cut < 0 || minp_cut >= n_fin;
      if (!cut_in_cand && !all_finite_kept) ref.status = 2;
    }
  }
  if (ref.status != 0) return ref;
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i)
    if (prob[i] > 0.0) total += prob[i];
  for (int64_t i = 0; i < keep; ++i)
    if (prob[i] > 0.0) {
      ref.ids.push_back(ids[i]);
      ref.prob.push_back(prob[i] / total);
    }
  return ref;
}

// Upper 1e-6 quantile of chi-square with df degrees of freedom (Wilson-Hilferty; conservative for df 1..2).
double chi2_threshold(int df) {
  const double z = 4.7534;  // one-sided normal quantile of 1 - 1e-6
  const double d = std::max(df, 1);
  const double a = 2.0 / (9.0 * d);
  return d * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct Chi2 {
  double stat = 0.0;
  int df = 0;
  double threshold = 0.0;
  int64_t outside = 0;  // draws outside the kept set
};

Chi2 chi_square(const Ref& ref, const std::map<int32_t, int64_t>& counts, int64_t n) {
  Chi2 c;
  std::map<int32_t, double> expect;
  for (size_t i = 0; i < ref.ids.size(); ++i) expect[ref.ids[i]] = ref.prob[i] * static_cast<double>(n);
  for (const auto& [id, cnt] : counts)
    if (!expect.count(id)) c.outside += cnt;
  // Buckets: categories with expected >= 5 alone (largest first), the rest pooled (into the last bucket
  // when the pool alone expects < 5).
  std::vector<std::pair<double, int32_t>> order;
  for (const auto& [id, e] : expect) order.push_back({e, id});
  std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<std::pair<double, double>> buckets;  // (expected, observed)
  double pe = 0.0, po = 0.0;
  for (const auto& [e, id] : order) {
    const auto it = counts.find(id);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    if (e >= 5.0) {
      buckets.push_back({e, o});
    } else {
      pe += e;
      po += o;
    }
  }
  if (pe > 0.0 || po > 0.0) {
    if (pe >= 5.0 || buckets.empty())
      buckets.push_back({pe, po});
    else {
      buckets.back().first += pe;
      buckets.back().second += po;
    }
  }
  for (const auto& [e, o] : buckets)
    if (e > 0.0) c.stat += (o - e) * (o - e) / e;
  c.df = static_cast<int>(buckets.size()) - 1;
  c.threshold = c.df > 0 ? chi2_threshold(c.df) : 0.0;
  return c;
}

std::vector<float> random_row(int64_t V, int style, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> r(static_cast<size_t>(V));
  for (auto& v : r) {
    v = n(g) * scale;
    if (style == 1) v = std::round(v * 2.0f) / 2.0f;  // many exact ties
  }
  if (V >= 7) {  // a few -inf entries, and an exact tie at the top
    std::uniform_int_distribution<int64_t> pos(0, V - 1);
    for (int i = 0; i < std::max<int64_t>(1, V / 100); ++i) r[pos(g)] = -INFINITY;
    const float top = *std::max_element(r.begin(), r.end());
    r[pos(g)] = top;
  }
  return r;
}

TEST(GpuSample, RngIsUniform53) {
  for (uint64_t s = 0; s < 1000; ++s) {
    const double u = glue::sample_uniform53(s, s * 3);
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
  }
}

TEST(GpuSample, GreedyEqualsArgmax) {
  DSV4_REQUIRE_GPU();
  int checked = 0;
  for (int64_t V : {int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{2049}, int64_t{129280}}) {
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 4; ++i) rows.push_back(random_row(V, i % 2, i == 3 ? 30.0f : 1.0f, 100 + i));
    {  // exact ties at the maximum in three places, -inf at a lower id
      auto r = random_row(V, 0, 1.0f, 7);
      const float top = *std::max_element(r.begin(), r.end()) + 1.0f;
      for (int64_t i : {V - 1, V / 2, V / 3}) r[i] = top;
      if (V > 1) r[0] = -INFINITY;
      rows.push_back(r);
    }
    rows.push_back(std::vector<float>(V, -INFINITY));  // all -inf: 0, as dsv4::argmax
    {
      std::vector<float> r(V, 0.0f);  // -0 and +0 are equal: lowest id
      for (int64_t i = 0; i < V; i += 2) r[i] = -0.0f;
      rows.push_back(r);
    }
    {
      std::vector<float> r(V, -1e30f);  // maximum at the last id, most entries -inf
      for (int64_t i = 0; i < V; i += 3) r[i] = -INFINITY;
      r[V - 1] = 5.0f;
      rows.push_back(r);
    }
    const int n = static_cast<int>(rows.size());
    std::vector<float> flat;
    std::vector<SampleRowParams> params;
    // Each row twice: temperature 0 (any other params), and temperature 1.3 with top_k 1.
    for (int rep = 0; rep < 2; ++rep)
      for (int i = 0; i < n; ++i) {
        flat.insert(flat.end(), rows[i].begin(), rows[i].end());
        params.push_back(rep == 0 ? sp(0.0f, i % 3 == 0 ? 0 : 50, 0.9f, 0.1f, i, rep) : sp(1.3f, 1, 0.5f, 0.1f, i, rep));
      }
    std::vector<int32_t> tok, st;
    run_gpu_host(flat, 2 * n, V, params, tok, st);
    for (int r = 0; r < 2 * n; ++r) {
      EXPECT_EQ(st[r], 0) << "V " << V << " row " << r;
      EXPECT_EQ(tok[r], argmax(rows[r % n].data(), V)) << "V " << V << " row " << r;
      ++checked;
    }
  }
  std::printf("[greedy] %d rows over vocab 1/7/2048/2049/129280 (ties, -0/+0, -inf, all -inf; T=0 and top_k=1): "
              "all equal dsv4::argmax\n", checked);
}

TEST(GpuSample, NonFiniteAndBadParams) {
  DSV4_REQUIRE_GPU();
  int checked = 0;
  for (int64_t V : {int64_t{1}, int64_t{7}, int64_t{2049}, int64_t{129280}}) {
    std::vector<std::vector<float>> rows;
    std::vector<int> expect;
    std::vector<SampleRowParams> params;
    const std::vector<SampleRowParams> modes = {sp(0.0f, 0, 1.0f, 0.0f), sp(1.0f, 0, 1.0f, 0.0f),
                                                sp(0.7f, 50, 0.9f, 0.1f), sp(1.0f, 1, 1.0f, 0.0f)};
    for (const auto& m : modes) {
      for (float bad : {NAN, INFINITY}) {
        auto r = random_row(V, 0, 1.0f, 3);
        r[V / 2] = bad;
        rows.push_back(r);
        params.push_back(m);
        expect.push_back(1);
      }
      rows.push_back(std::vector<float>(V, -INFINITY));  // all -inf: greedy gives 0, sampling status 1
      params.push_back(m);
      expect.push_back(m.temperature == 0.0f || m.top_k == 1 ? 0 : 1);
      std::vector<float> one(V, -INFINITY);  // a single finite logit: always that token
      one[V - 1] = -3.0f;
      rows.push_back(one);
      params.push_back(m);
      expect.push_back(0);
    }
    for (const auto& b : {sp(-1.0f, 0, 1.0f, 0.0f), sp(NAN, 0, 1.0f, 0.0f), sp(INFINITY, 0, 1.0f, 0.0f),
                          sp(1.0f, -1, 1.0f, 0.0f), sp(1.0f, 0, 0.0f, 0.0f), sp(1.0f, 0, 1.5f, 0.0f),
                          sp(1.0f, 0, 1.0f, -0.5f), sp(1.0f, 0, 1.0f, 2.0f), sp(0.0f, 0, NAN, 0.0f)}) {
      rows.push_back(random_row(V, 0, 1.0f, 5));
      params.push_back(b);
      expect.push_back(3);
    }
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    std::vector<int32_t> tok, st;
    const int n = static_cast<int>(rows.size());
    run_gpu_host(flat, n, V, params, tok, st);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st[r], expect[r]) << "V " << V << " row " << r;
      EXPECT_EQ(reference(rows[r].data(), V, params[r]).status, expect[r]) << "test's reference, row " << r;
      if (expect[r] == 0) {
        const bool all_inf = rows[r][V - 1] == -INFINITY;
        EXPECT_EQ(tok[r], all_inf ? 0 : V - 1) << "V " << V << " row " << r;
      }
      ++checked;
    }
  }
  std::printf("[errors] %d rows: NaN/+inf -> status 1, all -inf sampling -> 1 (greedy -> 0), single finite "
              "logit -> it, invalid params -> 3\n", checked);
}

struct Config {
  int64_t V;
  SampleRowParams p;
  std::vector<float> row;
  Ref ref;
};

// All configurations of one vocab size, interleaved in each launch; `launches` launches of `reps` rows each.
void check_distribution(int64_t V, int reps, int launches, std::vector<Config>& cfgs, int& failures) {
  const int n = static_cast<int>(cfgs.size());
  const int rows = n * reps;
  DevBuf base(sizeof(float) * n * V), batch(sizeof(float) * static_cast<size_t>(rows) * V);
  for (int c = 0; c < n; ++c)
    ck(cudaMemcpy(base.as<float>() + c * V, cfgs[c].row.data(), sizeof(float) * V, cudaMemcpyHostToDevice), "up");
  for (int r = 0; r < rows; ++r)
    ck(cudaMemcpy(batch.as<float>() + static_cast<int64_t>(r) * V, base.as<float>() + (r % n) * V, sizeof(float) * V,
                  cudaMemcpyDeviceToDevice),
       "replicate");
  std::vector<std::map<int32_t, int64_t>> counts(n);
  std::vector<int64_t> draws(n, 0);
  std::vector<int32_t> tok, st, tok0, st0;
  for (int l = 0; l < launches; ++l) {
    std::vector<SampleRowParams> params(rows);
    for (int r = 0; r < rows; ++r) {
      params[r] = cfgs[r % n].p;
      params[r].seed = 0x5EED0000ull + 7919ull * (r % n) + (l & 1);  // two seeds per configuration
      params[r].step = static_cast<uint64_t>(l) * reps + r / n;
    }
    run_gpu(batch.as<float>(), rows, V, params, tok, st);
    if (::testing::Test::HasFatalFailure()) return;
    if (l == 0) {  // determinism: the same launch again gives the same tokens
      run_gpu(batch.as<float>(), rows, V, params, tok0, st0);
      EXPECT_EQ(tok, tok0) << "V " << V << ": not deterministic";
      EXPECT_EQ(st, st0);
    }
    for (int r = 0; r < rows; ++r) {
      const Config& c = cfgs[r % n];
      if (st[r] != c.ref.status) {
        if (++failures < 20)
          ADD_FAILURE() << "V " << V << " cfg " << r % n << " (T " << c.p.temperature << " k " << c.p.top_k << " p "
                        << c.p.top_p << " min_p " << c.p.min_p << "): status " << st[r] << ", expected " << c.ref.status;
        continue;
      }
      if (st[r] == 0) {
        ++counts[r % n][tok[r]];
        ++draws[r % n];
      }
    }
  }
  for (int c = 0; c < n; ++c) {
    const Config& cf = cfgs[c];
    if (cf.ref.status != 0) {
      std::printf("  V %6lld T %.2f top_k %2d top_p %.2f min_p %.2f: status %d (host fallback) on every row, as expected\n",
                  static_cast<long long>(V), cf.p.temperature, cf.p.top_k, cf.p.top_p, cf.p.min_p, cf.ref.status);
      continue;
    }
    const Chi2 x = chi_square(cf.ref, counts[c], draws[c]);
    const bool ok = x.outside == 0 && (x.df == 0 || x.stat <= x.threshold);  // df 0: one category
    std::printf("  V %6lld T %.2f top_k %2d top_p %.2f min_p %.2f: kept %zu, draws %lld, distinct %zu, outside %lld, "
                "chi2 %.1f df %d threshold %.1f %s\n",
                static_cast<long long>(V), cf.p.temperature, cf.p.top_k, cf.p.top_p, cf.p.min_p, cf.ref.ids.size(),
                static_cast<long long>(draws[c]), counts[c].size(), static_cast<long long>(x.outside), x.stat, x.df,
                x.threshold, ok ? "ok" : "FAIL");
    EXPECT_EQ(x.outside, 0) << "V " << V << " cfg " << c << ": draws outside the CPU's kept set";
    if (x.df > 0) {
      EXPECT_LE(x.stat, x.threshold) << "V " << V << " cfg " << c << ": chi-square";
    }
  }
}

TEST(GpuSample, DistributionMatchesCpuRule) {
  DSV4_REQUIRE_GPU();
  const float temps[] = {0.5f, 0.8f, 1.0f, 1.5f, 2.0f};
  const float scales[] = {1.0f, 3.0f, 6.0f};
  int failures = 0, total_cfgs = 0;
  int64_t total_rows = 0;
  for (int64_t V : {int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{2049}, int64_t{129280}}) {
    std::vector<Config> cfgs;
    int i = 0;
    for (int k : {0, 5, 50})
      for (float tp : {0.5f, 0.9f, 1.0f})
        for (float mp : {0.0f, 0.1f}) {
          Config c;
          c.V = V;
          c.p = sp(temps[i % 5], k, tp, mp);
          c.row = random_row(V, i % 2, scales[(i / 2) % 3], 1000 + 17 * i + static_cast<uint32_t>(V));
          c.ref = reference(c.row.data(), V, c.p);
          cfgs.push_back(std::move(c));
          ++i;
        }
    // Peaked rows: nuclei inside the candidates even at vocab 129280 (top_k 0).
    for (const auto& [t, tp, mp, style] : {std::tuple{0.5f, 0.9f, 0.0f, 0}, std::tuple{0.7f, 0.5f, 0.1f, 1},
                                            std::tuple{1.0f, 0.99f, 0.0f, 0}}) {
      Config c;
      c.V = V;
      c.p = sp(t, 0, tp, mp);
      c.row = random_row(V, style, 8.0f, 5000 + 31 * i + static_cast<uint32_t>(V));
      c.ref = reference(c.row.data(), V, c.p);
      cfgs.push_back(std::move(c));
      ++i;
    }
    // The CPU rule reproduction against the real dsv4::Sampler (small vocabularies: it sorts every draw).
    if (V <= 2049)
      for (const Config& c : cfgs) {
        if (c.ref.status != 0) continue;
        SamplingParams sp_cpu;
        sp_cpu.temperature = c.p.temperature;
        sp_cpu.top_k = c.p.top_k;
        sp_cpu.top_p = c.p.top_p;
        sp_cpu.min_p = c.p.min_p;
        sp_cpu.seed = 42;
        Sampler s(sp_cpu);
        for (int d = 0; d < 300; ++d) {
          const int32_t t = s.sample(c.row.data(), V);
          ASSERT_NE(std::find(c.ref.ids.begin(), c.ref.ids.end(), t), c.ref.ids.end())
              << "the test's CPU rule disagrees with dsv4::Sampler (V " << V << ")";
        }
      }
    const bool big = V > 100000;
    const int reps = big ? 256 : 1024, launches = big ? 40 : 16;
    std::printf("[distribution] vocab %lld: %zu configurations x %d draws, %d rows per launch\n",
                static_cast<long long>(V), cfgs.size(), reps * launches, static_cast<int>(cfgs.size()) * reps);
    check_distribution(V, reps, launches, cfgs, failures);
    total_cfgs += static_cast<int>(cfgs.size());
    total_rows += static_cast<int64_t>(cfgs.size()) * reps * launches;
  }
  std::printf("[distribution] %d configurations, %lld GPU draws, chi-square significance 1e-6 per configuration\n",
              total_cfgs, static_cast<long long>(total_rows));
  EXPECT_EQ(failures, 0);
}

TEST(GpuSample, HostFallbackExactlyWhenNeeded) {
  DSV4_REQUIRE_GPU();
  const int64_t V = 129280;
  std::vector<std::vector<float>> rows;
  std::vector<SampleRowParams> params;
  std::vector<int> expect;
  auto add = [&](std::vector<float> r, SampleRowParams p, int e) {
    EXPECT_EQ(reference(r.data(), V, p).status, e) << "test's reference, case " << rows.size();
    rows.push_back(std::move(r));
    params.push_back(p);
    expect.push_back(e);
  };
  const std::vector<float> flat(V, 0.25f);
  add(flat, sp(1.0f, 0, 0.99f, 0.0f), 2);    // nucleus of 127988 tokens > 2048 candidates
  add(flat, sp(1.0f, 0, 0.01f, 0.0f), 0);    // nucleus of 1293 tokens: inside
  add(flat, sp(1.0f, 0, 1.0f, 0.0f), 0);     // plain temperature: whole-vocabulary draw
  add(flat, sp(1.0f, 0, 1.0f, 0.5f), 0);     // min-p keeps every token: whole-vocabulary draw
  add(flat, sp(1.0f, 3000, 1.0f, 0.0f), 2);  // top-k set past the candidates
  add(flat, sp(1.0f, 2048, 0.99f, 0.0f), 0); // top-k set == the candidates
  add(flat, sp(1.0f, V, 0.5f, 0.0f), 2);     // top_k >= vocab is top_k 0
  {
    std::vector<float> r(V, 0.0f);  // min-p keeps all 2048 candidates, drops the one low logit
    r[V - 1] = -100.0f;
    add(r, sp(1.0f, 0, 1.0f, 0.1f), 2);
    add(r, sp(1.0f, 0, 1.0f, 0.0f), 0);
  }
  {
    std::vector<float> r(V, -INFINITY);  // 100 finite logits: the candidates hold every one
    for (int64_t i = 0; i < 100; ++i) r[i * 1000] = static_cast<float>(i % 7);
    add(r, sp(1.0f, 0, 0.999f, 0.0f), 0);
    add(r, sp(2.0f, 0, 1.0f, 0.05f), 0);
  }
  {
    std::vector<float> r(V, 0.0f);  // 100 dominant logits: the nucleus is inside the candidates
    for (int64_t i = 0; i < 100; ++i) r[i * 997] = 20.0f;
    add(r, sp(1.0f, 0, 0.9f, 0.0f), 0);
  }
  std::vector<float> all;
  for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
  std::vector<int32_t> tok, st;
  const int n = static_cast<int>(rows.size());
  run_gpu_host(all, n, V, params, tok, st);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[r], expect[r]) << "case " << r;
    if (st[r] == 0) {
      const Ref ref = reference(rows[r].data(), V, params[r]);
      EXPECT_NE(std::find(ref.ids.begin(), ref.ids.end(), tok[r]), ref.ids.end()) << "case " << r;
    }
  }
  // The whole-vocabulary draw on a flat row spreads over the vocabulary: 4096 draws, 64 bins of ids.
  {
    const int R = 4096;
    std::vector<SampleRowParams> ps(R);
    for (int r = 0; r < R; ++r) ps[r] = sp(1.0f, 0, 1.0f, 0.0f, 77, r);
    DevBuf d(sizeof(float) * static_cast<size_t>(R) * V);
    for (int r = 0; r < R; ++r)
      ck(cudaMemcpy(d.as<float>() + static_cast<int64_t>(r) * V, flat.data(), sizeof(float) * V,
                    cudaMemcpyHostToDevice),
         "up");
    run_gpu(d.as<float>(), R, V, ps, tok, st);
    std::vector<double> bins(64, 0.0);
    for (int r = 0; r < R; ++r) {
      ASSERT_EQ(st[r], 0);
      bins[static_cast<size_t>(tok[r] * 64 / V)] += 1.0;
    }
    double x2 = 0.0;
    for (double o : bins) x2 += (o - R / 64.0) * (o - R / 64.0) / (R / 64.0);
    std::printf("[fallback] %d cases at vocab %lld as documented; flat whole-vocabulary draw: chi2 %.1f over 64 "
                "bins (threshold %.1f)\n", n, static_cast<long long>(V), x2, chi2_threshold(63));
    EXPECT_LE(x2, chi2_threshold(63));
  }
}

}  // namespace
}  // namespace dsv4
