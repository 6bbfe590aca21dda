// cuda::indexer_scores_fp8 against cpu::indexer_scores_fp8 / cpu::indexer_scores_mxfp4: decode (few queries
// over long key caches), causal prefill (query at position p sees t < (p+1)/4, including 0 visible), key
// counts on every tile boundary, per-query key offsets, block tables with blocks out of order, MXFP4 keys,
// the exact_q kernel, and a CUDA graph replayed with new device-side n_visible. Inputs are fresh random
// values every run (seed printed), outputs are poisoned before every launch.
//
// Bound (derived in src/backend/cuda/indexer.cu): per key t,
//   |got - want| <= 2^-10 * d^-0.5 * sum_h |w_h| sum_d |q_hd k_td| + 2^-23 * d^-0.5 * s_key(t) * sum_h |w_h| sum_d |q_hd|
// (q rounded once to fp16 after a per-head power-of-two scale: 2^-11 relative per element, plus fp32 sums;
// the second term covers MXFP4 blocks more than 23 binades below the row's largest). exact_q keeps the older
// bound 1e-4 of the row's largest |score| (q carried as bf16 hi + lo). fp8_q (the FP8 tensor-core kernel, sm_90)
// is compared with the reference run on q quantized as the kernel does (cpu::act_quant_e4m3 per head, block 128),
// bound 2^-10 * d^-0.5 * sum_h |w_h| sum_d |q8_hd k_td| (derived in src/backend/cuda/indexer_wgmma.cu).
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/indexer_fp8.h"
#include "backend/cuda/glue/glue.h"
#include "core/numerics.h"
#include "cuda_test_util.h"
#include "engine/kv_state.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;
using cuda::IndexerKeyFormat;
constexpr int H = cuda::kIndexerHeads, Dk = cuda::kIndexerDim;

enum class Mode { kShared, kOffset, kPaged };

struct Case {
  int n_q = 1;
  int64_t n_keys = 1;
  bool causal = false;
  IndexerKeyFormat fmt = IndexerKeyFormat::kFP8;
  Mode mode = Mode::kShared;
  int block_size = 64;
  int64_t row_bytes = 0;  // 0: the format's natural row (136 / 68)
  bool exact_q = false;
  bool fp8_q = false;
  bool share_hint = false;  // IndexerArgs::queries_share_keys
  float w_scale = 1.0f;     // IndexerArgs::w_scale
  std::string name() const {
    return "n_q=" + std::to_string(n_q) + " n_keys=" + std::to_string(n_keys) + (causal ? " causal" : "") +
           (fmt == IndexerKeyFormat::kMXFP4 ? " mxfp4" : " fp8") +
           (mode == Mode::kOffset ? " offsets" : mode == Mode::kPaged ? " paged/" + std::to_string(block_size) : "") +
           " rb=" + std::to_string(row_bytes) + (exact_q ? " exact_q" : "") + (fp8_q ? " fp8_q" : "") +
           (share_hint ? " share_hint" : "") + (w_scale != 1.0f ? " w_scale=" + std::to_string(w_scale) : "");
  }
};

// Host data and device buffers of one problem; n_visible can be changed between launches.
struct Problem {
  Case cs;
  int64_t rb = 0, stride = 0, max_blocks = 0;
  std::vector<uint8_t> pool;       // key rows
  std::vector<float> q, w;
  std::vector<float> w_ref;        // w * w_scale, rounded once in fp32 (what the reference multiplies by)
  std::vector<float> q8;           // fp8_q: q as the kernel quantizes it (e4m3 codes times 2^e), else q
  std::vector<int32_t> vis;
  std::vector<int64_t> offs;       // kOffset
  std::vector<int32_t> table;      // kPaged, [n_q, max_blocks]
  std::vector<int32_t> perm;       // kPaged: block ids in the order they are handed out
  std::unique_ptr<DeviceBuffer<uint8_t>> dk;
  std::unique_ptr<DeviceBuffer<float>> dq, dw, dout;
  std::unique_ptr<DeviceBuffer<int32_t>> dvis, dtable;
  std::unique_ptr<DeviceBuffer<int64_t>> doffs;

  int64_t row_of(int s, int64_t t) const {
    if (cs.mode == Mode::kPaged) return int64_t(table[size_t(s) * max_blocks + t / cs.block_size]) * cs.block_size + t % cs.block_size;
    if (cs.mode == Mode::kOffset) return offs[s] + t;
    return t;
  }
  cuda::IndexerArgs args() const {
    cuda::IndexerArgs a;
    a.q = dq->get(); a.w = dw->get(); a.keys = dk->get(); a.n_keys = cs.n_keys; a.row_bytes = rb;
    a.n_visible = dvis->get(); a.scores = dout->get(); a.score_stride = stride; a.n_queries = cs.n_q;
    a.format = cs.fmt; a.exact_q = cs.exact_q; a.fp8_q = cs.fp8_q; a.queries_share_keys = cs.share_hint;
    a.w_scale = cs.w_scale;
    if (cs.mode == Mode::kOffset) a.key_offset = doffs->get();
    if (cs.mode == Mode::kPaged) {
      a.block_table = dtable->get(); a.max_blocks = static_cast<int>(max_blocks); a.block_size = cs.block_size;
    }
    return a;
  }
  // Block-table entries of blocks with no visible key are -1 (the kernel must not read them).
  void set_vis(const std::vector<int32_t>& v) {
    vis = v;
    dvis->upload(vis);
    if (cs.mode != Mode::kPaged) return;
    for (int s = 0; s < cs.n_q; ++s)
      for (int64_t b = 0; b < max_blocks; ++b)
        table[size_t(s) * max_blocks + b] = b * cs.block_size < vis[s] ? perm[size_t(s) * max_blocks + b] : -1;
    dtable->upload(table);
  }
};

void make_problem(Problem& p, const Case& cs, std::mt19937_64& rng) {
  p.cs = cs;
  const bool fp4 = cs.fmt == IndexerKeyFormat::kMXFP4;
  p.rb = cs.row_bytes ? cs.row_bytes : (fp4 ? 68 : 136);
  p.stride = cs.n_keys + 5;
  int64_t n_rows = cs.n_keys;
  if (cs.mode == Mode::kOffset) {
    p.offs.resize(cs.n_q);
    for (int s = 0; s < cs.n_q; ++s) p.offs[s] = int64_t(cs.n_q - 1 - s) * (cs.n_keys + 7) + 3;  // reversed, gaps
    n_rows = int64_t(cs.n_q) * (cs.n_keys + 7) + 3;
  } else if (cs.mode == Mode::kPaged) {
    p.max_blocks = (cs.n_keys + cs.block_size - 1) / cs.block_size;
    const int64_t n_blocks = cs.n_q * p.max_blocks + 3;
    std::vector<int32_t> ids(n_blocks);
    for (int64_t i = 0; i < n_blocks; ++i) ids[i] = static_cast<int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);  // blocks out of order, shared pool
    p.perm.assign(ids.begin(), ids.begin() + cs.n_q * p.max_blocks);
    p.table.assign(p.perm.size(), -1);
    n_rows = n_blocks * cs.block_size;
  }
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> mag(0.05f, 20.f);
  p.pool.assign(size_t(n_rows) * p.rb, 0);
  if (!fp4) {
    KvCodec codec(KvDtype::kFP8, Dk, 0, Dk);
    std::vector<uint8_t> tmp(codec.row_bytes());
    std::vector<float> x(Dk);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float m = mag(rng);  // per-key magnitudes differ, so per-key scales differ
      for (float& v : x) v = m * nd(rng);
      codec.encode(x.data(), tmp.data());
      std::memcpy(p.pool.data() + r * p.rb, tmp.data(), std::min<size_t>(tmp.size(), size_t(p.rb)));
    }
  } else {
    std::uniform_int_distribution<int> byte(0, 255), base(112, 140), jitter(-3, 3);
    for (int64_t r = 0; r < n_rows; ++r) {
      uint8_t* row = p.pool.data() + r * p.rb;
      for (int i = 0; i < Dk / 2; ++i) row[i] = static_cast<uint8_t>(byte(rng));
      const int b = base(rng);
      for (int j = 0; j < 4; ++j) row[Dk / 2 + j] = static_cast<uint8_t>(b + jitter(rng));
      if (r % 7 == 3) row[Dk / 2] = static_cast<uint8_t>(b + 30);       // other blocks 27..33 binades lower
      if (r % 11 == 5) row[Dk / 2 + 2] = static_cast<uint8_t>(b - 45);  // flushed block
    }
  }
  p.q.resize(size_t(cs.n_q) * H * Dk);
  p.w.resize(size_t(cs.n_q) * H);
  for (size_t i = 0; i < p.q.size(); ++i) p.q[i] = nd(rng) * (i / Dk % 5 == 0 ? 1e-3f : 1.f);  // unequal heads
  for (float& v : p.w) v = nd(rng) * 0.01f;
  p.w_ref = p.w;
  for (float& v : p.w_ref) v *= cs.w_scale;
  if (cs.n_q > 2) {  // adversarial heads for the per-head q scale: all zero (amax floor 1e-4) and huge
    std::fill_n(p.q.begin() + size_t(1) * H * Dk + 7 * Dk, Dk, 0.f);
    for (int d = 0; d < Dk; ++d) p.q[size_t(2) * H * Dk + 9 * Dk + d] *= 3e4f;
  }
  p.q8 = p.q;
  if (cs.fp8_q) act_quant_e4m3(p.q.data(), int64_t(p.q.size()), Dk, p.q8.data());
  p.dk = std::make_unique<DeviceBuffer<uint8_t>>(p.pool.size());
  p.dq = std::make_unique<DeviceBuffer<float>>(p.q.size());
  p.dw = std::make_unique<DeviceBuffer<float>>(p.w.size());
  p.dout = std::make_unique<DeviceBuffer<float>>(size_t(cs.n_q) * p.stride);
  p.dvis = std::make_unique<DeviceBuffer<int32_t>>(cs.n_q);
  p.dk->upload(p.pool); p.dq->upload(p.q); p.dw->upload(p.w);
  if (cs.mode == Mode::kOffset) {
    p.doffs = std::make_unique<DeviceBuffer<int64_t>>(cs.n_q);
    p.doffs->upload(p.offs);
  }
  if (cs.mode == Mode::kPaged) p.dtable = std::make_unique<DeviceBuffer<int32_t>>(p.table.size());
}

std::vector<int32_t> random_vis(const Case& cs, std::mt19937_64& rng) {
  std::vector<int32_t> vis(cs.n_q);
  std::uniform_int_distribution<int64_t> pos(0, 4 * cs.n_keys + 3);
  for (int s = 0; s < cs.n_q; ++s)
    vis[s] = cs.causal ? static_cast<int32_t>((pos(rng) + 1) / 4) : static_cast<int32_t>(cs.n_keys);
  if (cs.causal && cs.n_q > 2) { vis[0] = 0; vis[1] = static_cast<int32_t>(cs.n_keys); }
  return vis;
}

// Downloads the scores and checks every (query, key) against the CPU reference and the bound above.
void check_scores(const Problem& p, const std::string& label) {
  const Case& cs = p.cs;
  const bool fp4 = cs.fmt == IndexerKeyFormat::kMXFP4;
  const std::vector<float> got = p.dout->download();
  const float* lut = fp8_e4m3_table();
  std::vector<uint8_t> rows(size_t(cs.n_keys) * p.rb);
  std::vector<float> want(cs.n_keys), kd(Dk);
  double worst_bound = 0, worst_rel_max = 0;
  const double rs = 1.0 / std::sqrt(double(Dk));
  for (int s = 0; s < cs.n_q; ++s) {
    const int64_t vis = std::clamp<int64_t>(p.vis[s], 0, cs.n_keys);
    for (int64_t t = 0; t < vis; ++t)
      std::memcpy(rows.data() + t * p.rb, p.pool.data() + p.row_of(s, t) * p.rb, size_t(p.rb));
    const float* qs = p.q8.data() + size_t(s) * H * Dk;
    const float* ws = p.w_ref.data() + size_t(s) * H;
    if (fp4) cpu::indexer_scores_mxfp4(qs, ws, H, Dk, rows.data(), cs.n_keys, p.rb, vis, want.data());
    else cpu::indexer_scores_fp8(qs, ws, H, Dk, rows.data(), cs.n_keys, p.rb, vis, want.data());
    double max_abs = 0, q1 = 0;
    for (int h = 0; h < H; ++h) {
      double sq = 0;
      for (int d = 0; d < Dk; ++d) sq += std::fabs(qs[h * Dk + d]);
      q1 += std::fabs(ws[h]) * sq;
    }
    for (int64_t t = 0; t < cs.n_keys; ++t)
      if (std::isfinite(want[t])) max_abs = std::max(max_abs, std::fabs(double(want[t])));
    for (int64_t t = 0; t < cs.n_keys; ++t) {
      const float g = got[size_t(s) * p.stride + t];
      if (t >= vis) {
        ASSERT_TRUE(std::isinf(g) && g < 0) << label << ": query " << s << " key " << t << " must be -inf, got " << g;
        continue;
      }
      ASSERT_TRUE(std::isfinite(g)) << label << ": query " << s << " key " << t << " got " << g;
      const uint8_t* row = rows.data() + t * p.rb;
      double skey;
      if (fp4) {
        const uint8_t em = std::max(std::max(row[64], row[65]), std::max(row[66], row[67]));
        skey = e8m0_to_f32(em);
        for (int d = 0; d < Dk; ++d)
          kd[d] = fp4_e2m1_to_f32(d % 2 ? row[d / 2] >> 4 : row[d / 2] & 0xf) * e8m0_to_f32(row[64 + d / 32]);
      } else {
        skey = e8m0_to_f32(row[Dk]);
        for (int d = 0; d < Dk; ++d) kd[d] = lut[row[d]] * static_cast<float>(skey);
      }
      double m = 0;
      for (int h = 0; h < H; ++h) {
        double sh = 0;
        for (int d = 0; d < Dk; ++d) sh += std::fabs(double(qs[h * Dk + d]) * kd[d]);
        m += std::fabs(ws[h]) * sh;
      }
      const double err = std::fabs(double(g) - double(want[t]));
      const double bound = cs.exact_q ? 1e-4 * max_abs + 1e-6 : std::ldexp(m * rs, -10) + std::ldexp(skey * q1 * rs, -23) + 1e-30;
      worst_bound = std::max(worst_bound, err / bound);
      if (max_abs > 0) worst_rel_max = std::max(worst_rel_max, err / max_abs);
      ASSERT_LE(err, bound) << label << ": query " << s << " key " << t << " got " << g << " want " << want[t];
    }
  }
  std::printf("[stats] %s: max err/bound %.3g, max err/max|score| %.3g\n", label.c_str(), worst_bound, worst_rel_max);
}

void run_case(const Case& cs, uint64_t seed) {
  SCOPED_TRACE(cs.name());
  std::mt19937_64 rng(seed);
  Problem p;
  make_problem(p, cs, rng);
  p.set_vis(random_vis(cs, rng));
  p.dout->poison();
  cuda::indexer_scores_fp8(p.args(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check_scores(p, cs.name());
}

TEST(CudaIndexer, Decode) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed();
  run_case({.n_q = 1, .n_keys = 100000}, seed);
  run_case({.n_q = 4, .n_keys = 7777}, seed + 1);
  run_case({.n_q = 2, .n_keys = 1}, seed + 2);
}

// Units of 16 keys per warp stage, 4 stages, 64 keys per CTA step: every boundary, visible counts random
// (causal) with one query at 0 and one at all keys.
TEST(CudaIndexer, TileBoundaries) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 10;
  int i = 0;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 4097})
    run_case({.n_q = 5, .n_keys = n, .causal = true}, seed + i++);
  for (int64_t n : {1, 15, 16, 17, 1025})
    run_case({.n_q = 5, .n_keys = n, .causal = true, .fmt = IndexerKeyFormat::kMXFP4}, seed + i++);
}

TEST(CudaIndexer, CausalPrefill) {
  DSV4_REQUIRE_GPU();
  run_case({.n_q = 64, .n_keys = 4096, .causal = true}, cuda_test::test_seed() + 3);
  run_case({.n_q = 300, .n_keys = 1000, .causal = true}, cuda_test::test_seed() + 4);
}

TEST(CudaIndexer, PerQueryOffsets) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 30;
  run_case({.n_q = 6, .n_keys = 3001, .causal = true, .mode = Mode::kOffset}, seed);
  run_case({.n_q = 3, .n_keys = 20000, .mode = Mode::kOffset, .row_bytes = 144}, seed + 1);
  run_case({.n_q = 5, .n_keys = 999, .causal = true, .fmt = IndexerKeyFormat::kMXFP4, .mode = Mode::kOffset}, seed + 2);
}

TEST(CudaIndexer, BlockTables) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 40;
  int i = 0;
  for (int bs : {1, 16, 48, 64, 256})
    run_case({.n_q = 5, .n_keys = 2500, .causal = true, .mode = Mode::kPaged, .block_size = bs}, seed + i++);
  run_case({.n_q = 2, .n_keys = 30000, .mode = Mode::kPaged, .block_size = 64}, seed + i++);
  for (int bs : {16, 64})
    run_case({.n_q = 5, .n_keys = 2500, .causal = true, .fmt = IndexerKeyFormat::kMXFP4, .mode = Mode::kPaged,
              .block_size = bs, .row_bytes = 72}, seed + i++);
}

TEST(CudaIndexer, Mxfp4Keys) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 50;
  run_case({.n_q = 1, .n_keys = 100000, .fmt = IndexerKeyFormat::kMXFP4}, seed);
  run_case({.n_q = 64, .n_keys = 2048, .causal = true, .fmt = IndexerKeyFormat::kMXFP4}, seed + 1);
  run_case({.n_q = 3, .n_keys = 5000, .fmt = IndexerKeyFormat::kMXFP4, .row_bytes = 132}, seed + 2);
}

// The FP8 tensor-core kernel (sm_90): four queries per CTA for shared keys or with the hint (then in passes over
// the distinct key offsets of a CTA's queries), one query per CTA otherwise; tile boundaries of 64 keys.
TEST(CudaIndexer, Fp8QKernel) {
  DSV4_REQUIRE_GPU();
  if (!cuda::indexer_fp8_q_supported()) GTEST_SKIP() << "fp8_q needs compute capability 9.0";
  const uint64_t seed = cuda_test::test_seed() + 80;
  int i = 0;
  run_case({.n_q = 1, .n_keys = 100000, .fp8_q = true}, seed + i++);
  run_case({.n_q = 64, .n_keys = 4096, .causal = true, .fp8_q = true}, seed + i++);
  run_case({.n_q = 301, .n_keys = 1000, .causal = true, .fp8_q = true}, seed + i++);
  run_case({.n_q = 8, .n_keys = 30000, .fp8_q = true}, seed + i++);
  for (int64_t n : {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 4097})
    run_case({.n_q = 9, .n_keys = n, .causal = true, .fp8_q = true}, seed + i++);
  run_case({.n_q = 5, .n_keys = 3001, .causal = true, .mode = Mode::kOffset, .fp8_q = true}, seed + i++);
  run_case({.n_q = 13, .n_keys = 3001, .causal = true, .mode = Mode::kOffset, .fp8_q = true, .share_hint = true},
           seed + i++);
  run_case({.n_q = 3, .n_keys = 20000, .mode = Mode::kOffset, .row_bytes = 144, .fp8_q = true}, seed + i++);
  for (int bs : {1, 16, 64})
    run_case({.n_q = 5, .n_keys = 2500, .causal = true, .mode = Mode::kPaged, .block_size = bs, .fp8_q = true},
             seed + i++);
  // Rows a multiple of 16 bytes: the 16-byte copy granule, on every addressing mode.
  run_case({.n_q = 64, .n_keys = 4097, .causal = true, .row_bytes = 144, .fp8_q = true}, seed + i++);
  run_case({.n_q = 1, .n_keys = 100000, .row_bytes = 144, .fp8_q = true}, seed + i++);
  run_case({.n_q = 13, .n_keys = 3001, .causal = true, .mode = Mode::kOffset, .row_bytes = 160, .fp8_q = true,
            .share_hint = true}, seed + i++);
  run_case({.n_q = 5, .n_keys = 2500, .causal = true, .mode = Mode::kPaged, .block_size = 16, .row_bytes = 144,
            .fp8_q = true}, seed + i++);
}

TEST(CudaIndexer, ExactQKernel) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 60;
  run_case({.n_q = 1, .n_keys = 100000, .exact_q = true}, seed);
  run_case({.n_q = 64, .n_keys = 4096, .causal = true, .exact_q = true}, seed + 1);
  run_case({.n_q = 4, .n_keys = 3000, .causal = true, .mode = Mode::kPaged, .block_size = 32, .exact_q = true}, seed + 2);
  run_case({.n_q = 4, .n_keys = 3000, .causal = true, .mode = Mode::kOffset, .exact_q = true}, seed + 3);
}

// IndexerArgs::w_scale on every kernel path (the engine passes 1/sqrt(64) instead of a scaling launch): a power
// of two and a scale that rounds, against the reference over the once-rounded products.
TEST(CudaIndexer, HeadWeightScale) {
  DSV4_REQUIRE_GPU();
  const uint64_t seed = cuda_test::test_seed() + 90;
  int i = 0;
  for (float sc : {0.125f, 1.0f / std::sqrt(48.0f)}) {
    run_case({.n_q = 1, .n_keys = 30000, .w_scale = sc}, seed + i++);
    run_case({.n_q = 64, .n_keys = 2049, .causal = true, .w_scale = sc}, seed + i++);
    run_case({.n_q = 5, .n_keys = 999, .causal = true, .fmt = IndexerKeyFormat::kMXFP4, .w_scale = sc}, seed + i++);
    run_case({.n_q = 4, .n_keys = 3000, .causal = true, .exact_q = true, .w_scale = sc}, seed + i++);
    if (cuda::indexer_fp8_q_supported()) {
      run_case({.n_q = 1, .n_keys = 30000, .fp8_q = true, .w_scale = sc}, seed + i++);
      run_case({.n_q = 64, .n_keys = 2049, .causal = true, .fp8_q = true, .w_scale = sc}, seed + i++);
    }
  }
}

// IndexerArgs::rope_cs (the engine's index q RoPE, applied as the kernels load q, with glue::rope_table's factors)
// gives the same scores, bit for bit, as q rotated first by glue::heads_norm_rope (the engine's other path), on every kernel: the streaming
// kernel (FP8 and MXFP4 keys), exact_q, fp8_q with one and four queries per CTA, paged; with the rotated block
// covering half the head, all of it, and 3 pairs (a float4 split between rotated and not). The scores are also
// checked against the CPU reference on the rotated q. Positions include 0 and ~2^20.
TEST(CudaIndexer, RopeOnLoadMatchesRotatedQ) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 110);
  std::vector<Case> cases = {
      {.n_q = 1, .n_keys = 30000},
      {.n_q = 64, .n_keys = 2049, .causal = true, .share_hint = true},
      {.n_q = 5, .n_keys = 999, .causal = true, .fmt = IndexerKeyFormat::kMXFP4},
      {.n_q = 4, .n_keys = 3000, .causal = true, .exact_q = true},
      {.n_q = 4, .n_keys = 3000, .causal = true, .mode = Mode::kPaged, .block_size = 64},
  };
  if (cuda::indexer_fp8_q_supported()) {
    cases.push_back({.n_q = 1, .n_keys = 30000, .fp8_q = true});
    cases.push_back({.n_q = 64, .n_keys = 2049, .causal = true, .fp8_q = true, .share_hint = true});
    cases.push_back({.n_q = 4, .n_keys = 3000, .causal = true, .mode = Mode::kPaged, .block_size = 64, .fp8_q = true});
  }
  int i = 0;
  for (const Case& cs : cases) {
    for (int n_freq : {32, 64, 3}) {
      const std::string label = cs.name() + " rope n_freq=" + std::to_string(n_freq);
      SCOPED_TRACE(label);
      Problem p;
      make_problem(p, cs, rng);
      p.set_vis(random_vis(cs, rng));
      std::vector<int64_t> pos(cs.n_q);
      std::uniform_int_distribution<int64_t> any_pos(0, int64_t{1} << 20);
      for (int64_t& v : pos) v = any_pos(rng);
      pos[0] = (i++ % 2) ? 0 : (int64_t{1} << 20) - 1;
      std::vector<float> inv_freq(n_freq);
      for (int f = 0; f < n_freq; ++f) inv_freq[f] = std::pow(10000.0f, -2.0f * f / (2 * n_freq));
      DeviceBuffer<int64_t> dpos(pos.size());
      DeviceBuffer<float> dfreq(inv_freq.size()), drot(p.q.size());
      DeviceBuffer<float2> dcs(size_t(cs.n_q) * n_freq);
      dpos.upload(pos);
      dfreq.upload(inv_freq);
      drot.upload(p.q);
      glue::heads_norm_rope(drot.get(), cs.n_q, H, Dk, dpos.get(), dfreq.get(), n_freq, false, 1e-6f, false, nullptr);
      dcs.poison();
      glue::rope_table(dpos.get(), cs.n_q, dfreq.get(), n_freq, dcs.get(), nullptr);
      // The reference: scores of the q rotated in place first.
      cuda::IndexerArgs a = p.args();
      a.q = drot.get();
      p.dout->poison();
      cuda::indexer_scores_fp8(a, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> want = p.dout->download();
      // The kernels rotating the unrotated q themselves.
      a = p.args();
      a.rope_cs = dcs.get();
      a.rope_n_freq = n_freq;
      p.dout->poison();
      cuda::indexer_scores_fp8(a, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = p.dout->download();
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << label << ": scores differ from those of the q rotated first";
      // And against the CPU reference on the rotated q (as the kernels quantize it with fp8_q).
      p.q = drot.download();
      p.q8 = p.q;
      if (cs.fp8_q) act_quant_e4m3(p.q.data(), int64_t(p.q.size()), Dk, p.q8.data());
      check_scores(p, label);
    }
  }
}

TEST(CudaIndexer, RopeArgumentsFailLoudly) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 111);
  Problem p;
  make_problem(p, {.n_q = 1, .n_keys = 100}, rng);
  p.set_vis(random_vis(p.cs, rng));
  DeviceBuffer<float2> dcs(65);
  for (int n_freq : {0, 65, -1}) {
    cuda::IndexerArgs a = p.args();
    a.rope_cs = dcs.get();
    a.rope_n_freq = n_freq;
    EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error) << "n_freq " << n_freq;
  }
}

// One captured launch (paged, 4 sequences), replayed with new n_visible (and block tables) written on the device.
TEST(CudaIndexer, GraphReplayWithNewLengths) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 70);
  for (int variant = 0; variant < 3; ++variant) {
    if (variant == 2 && !cuda::indexer_fp8_q_supported()) continue;
    const IndexerKeyFormat fmt = variant == 1 ? IndexerKeyFormat::kMXFP4 : IndexerKeyFormat::kFP8;
    const Case cs{.n_q = 4, .n_keys = 3000, .causal = true, .fmt = fmt, .mode = Mode::kPaged, .block_size = 64,
                  .fp8_q = variant == 2};
    SCOPED_TRACE(cs.name());
    Problem p;
    make_problem(p, cs, rng);
    p.set_vis(random_vis(cs, rng));
    cuda::indexer_scores_fp8(p.args(), nullptr);  // first call outside the capture (one-time attributes)
    CUDA_OK(cudaDeviceSynchronize());
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    cuda::indexer_scores_fp8(p.args(), st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<int32_t> v = random_vis(cs, rng);
      if (rep == 1) std::fill(v.begin(), v.end(), 0);
      if (rep == 2) std::fill(v.begin(), v.end(), static_cast<int32_t>(cs.n_keys));
      p.set_vis(v);
      p.dout->poison();
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      check_scores(p, cs.name() + " graph replay " + std::to_string(rep));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

TEST(CudaIndexer, UnsupportedShapeFailsLoudly) {
  DSV4_REQUIRE_GPU();
  cuda::IndexerArgs a;
  a.n_queries = 1;
  a.n_keys = 10;
  a.score_stride = 10;
  a.row_bytes = 100;
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
  a.row_bytes = 136;
  a.block_table = reinterpret_cast<const int32_t*>(16);
  a.block_size = 0;
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
  a.block_table = nullptr;
  a.format = IndexerKeyFormat::kMXFP4;
  a.row_bytes = 66;
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
  a.row_bytes = 68;
  a.exact_q = true;
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
  a.exact_q = false;
  a.fp8_q = true;  // FP8 q needs FP8 keys
  EXPECT_THROW(cuda::indexer_scores_fp8(a, nullptr), Error);
}

}  // namespace
}  // namespace dsv4
