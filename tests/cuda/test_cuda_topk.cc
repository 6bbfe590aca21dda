// cuda::topk_rows against cpu::topk_row. Both follow the same deterministic rule (lowest index among equal
// values, ascending output, -1 padding), so indices must match exactly — which implies identical value
// multisets — on random rows and on the adversarial battery of issue #4 / spec F9, F15.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/topk.h"
#include "cuda_test_util.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;

struct Case {
  std::string name;
  int rows, cols, k;
  int64_t stride;
  std::vector<float> scores;     // rows * stride
  std::vector<int32_t> lengths;  // empty: all cols
};

// The kernels behind cuda::topk_rows for rows longer than k, selected per call by DSV4_TOPK_KERNEL ("resident"
// applies to rows of at most 64K entries, "small" to rows of at most 4096; other rows take the streaming kernel
// or the default choice), and "one_cta": the default choice under the one-CTA-per-row policy of parts with less
// than 128 KB of shared memory per block (DSV4_TOPK_ONE_CTA=1: the streaming kernel without a cluster).
const char* const kKernels[] = {"stream", "resident", "small", "one_cta"};
// Sets DSV4_TOPK_KERNEL (or DSV4_TOPK_ONE_CTA) for its lifetime.
struct KernelChoice {
  explicit KernelChoice(const char* k) : var(std::strcmp(k, "one_cta") == 0 ? "DSV4_TOPK_ONE_CTA" : "DSV4_TOPK_KERNEL") {
    setenv(var, std::strcmp(k, "one_cta") == 0 ? "1" : k, 1);
  }
  ~KernelChoice() { unsetenv(var); }
  const char* var;
};

// Runs every kernel on `c` (output poisoned first) and compares every row with the CPU reference; then once more
// through a cuda::TopkOutput placement (an odd row stride with a gap, a constant and a per-row shift, as the
// engine's slot lists use it): every shifted entry must match and the gaps must keep their poison.
void check_case(const Case& c) {
  SCOPED_TRACE(c.name + " rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols) +
               " k=" + std::to_string(c.k));
  std::vector<int32_t> want(static_cast<size_t>(c.rows) * c.k);
  for (int r = 0; r < c.rows; ++r) {
    const int n = c.lengths.empty() ? c.cols : std::min(c.lengths[r], c.cols);
    cpu::topk_row(c.scores.data() + static_cast<int64_t>(r) * c.stride, n, c.k,
                  want.data() + static_cast<int64_t>(r) * c.k);
  }
  DeviceBuffer<float> d_scores(c.scores.size());
  d_scores.upload(c.scores);
  DeviceBuffer<int32_t> d_len(std::max<size_t>(c.lengths.size(), 1));
  if (!c.lengths.empty()) d_len.upload(c.lengths);
  DeviceBuffer<int32_t> d_out(static_cast<size_t>(c.rows) * c.k);
  for (const char* kernel : kKernels) {
    SCOPED_TRACE(kernel);
    const KernelChoice choice(kernel);
    d_out.poison();
    cuda::topk_rows(d_scores.get(), c.stride, c.cols, c.lengths.empty() ? nullptr : d_len.get(), c.rows, c.k,
                    d_out.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int32_t> got = d_out.download();
    for (int r = 0; r < c.rows; ++r) {
      const int32_t* g = got.data() + static_cast<int64_t>(r) * c.k;
      const int32_t* w = want.data() + static_cast<int64_t>(r) * c.k;
      int bad = -1;
      for (int i = 0; i < c.k && bad < 0; ++i)
        if (g[i] != w[i]) bad = i;
      ASSERT_EQ(bad, -1) << "row " << r << " slot " << bad << ": gpu " << g[bad] << " cpu " << w[bad];
    }
    // The placement: row r at offset 5 + r * (k + 3), index j written as j + 1000 + row_add[r].
    const int64_t stride = c.k + 3, off = 5;
    std::vector<int64_t> row_add(c.rows);
    for (int r = 0; r < c.rows; ++r) row_add[r] = (int64_t{1} << 28) - 77 * r;
    DeviceBuffer<int64_t> d_add(row_add.size());
    d_add.upload(row_add);
    DeviceBuffer<int32_t> d_placed(static_cast<size_t>(off + c.rows * stride + 3));
    d_placed.poison();
    const std::vector<int32_t> poison = d_placed.download();
    cuda::TopkOutput place;
    place.stride = stride;
    place.add = 1000;
    place.row_add = d_add.get();
    cuda::topk_rows(d_scores.get(), c.stride, c.cols, c.lengths.empty() ? nullptr : d_len.get(), c.rows, c.k,
                    d_placed.get() + off, nullptr, place);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int32_t> placed = d_placed.download();
    for (size_t i = 0; i < placed.size(); ++i) {
      const int64_t rel = static_cast<int64_t>(i) - off;
      const int64_t r = rel >= 0 ? rel / stride : -1, col = rel >= 0 ? rel % stride : -1;
      if (r < 0 || r >= c.rows || col >= c.k) {
        ASSERT_EQ(placed[i], poison[i]) << "placed output: element " << i << " outside the rows was written";
        continue;
      }
      const int32_t w = want[static_cast<size_t>(r) * c.k + col];
      const int64_t expect = w < 0 ? -1 : w + 1000 + row_add[r];
      ASSERT_EQ(placed[i], expect) << "placed output: row " << r << " slot " << col;
    }
  }
}

Case random_case(std::mt19937_64& rng, int rows, int cols, int k, int64_t stride = -1) {
  Case c{"random", rows, cols, k, stride < 0 ? cols : stride, {}, {}};
  c.scores.resize(static_cast<size_t>(rows) * c.stride);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (float& x : c.scores) x = nd(rng);
  return c;
}

TEST(CudaTopk, RandomRowsAllK) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed());
  for (int k : {512, 1024, 2048})
    for (int cols : {100, 2048, 8192, 65536, 262144}) check_case(random_case(rng, 4, cols, k));
  check_case(random_case(rng, 2, 1 << 20, 2048));  // rows up to 1M
}

// Lengths around every internal threshold: k, the 8192-element emission step, the 16384-element streaming
// step, 8192 / 32768 (other implementations' path switches), plus odd strides (unaligned rows).
TEST(CudaTopk, LengthsAroundThresholds) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 1);
  for (int k : {512, 1024, 2048}) {
    for (int base : {k, 2048, 4096, 8192, 16384, 32768, 65536})
      for (int d : {-1, 0, 1}) check_case(random_case(rng, 2, base + d, k));
    check_case(random_case(rng, 3, 40001, k, 40003));  // odd stride: rows not 16-byte aligned
  }
}

// Thousands of exact ties: values from a tiny set, so the k-th value is shared by thousands of entries.
TEST(CudaTopk, ExactTies) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 2);
  for (int k : {512, 1024, 2048}) {
    Case c{"ties", 4, 65536, k, 65536, {}, {}};
    c.scores.resize(4 * 65536);
    std::uniform_int_distribution<int> v(0, 7);
    for (float& x : c.scores) x = static_cast<float>(v(rng));
    check_case(c);
    for (float& x : c.scores) x = 1.0f;  // all equal: lowest k indices
    c.name = "all-equal";
    check_case(c);
    for (size_t i = 0; i < c.scores.size(); ++i) c.scores[i] = (i & 1) ? -0.0f : 0.0f;  // -0 == +0
    c.name = "signed-zeros";
    check_case(c);
  }
}

// All values inside one fp16 bin ([1, 1 + 1/32)): the coarse histogram cannot separate anything and the
// pivot bin holds the whole row (streaming exact path).
TEST(CudaTopk, OneFp16Bin) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 3);
  std::uniform_real_distribution<float> u(1.0f, 1.03125f);
  for (int k : {512, 1024, 2048})
    for (int cols : {9000, 65536, 262144}) {
      Case c{"one-bin", 2, cols, k, cols, {}, {}};
      c.scores.resize(2 * static_cast<size_t>(cols));
      for (float& x : c.scores) x = u(rng);
      check_case(c);
    }
}

// Pivot-bin populations around 3708, 4096, 8192 (this kernel's buffer) and 16384, with some ties inside.
TEST(CudaTopk, PivotBinPopulations) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 4);
  std::uniform_real_distribution<float> in_bin(1.0f, 1.03125f), high(100.f, 200.f), low(-50.f, -1.f);
  for (int k : {512, 1024, 2048})
    for (int pop : {3707, 3708, 3709, 4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385}) {
      const int cols = 65536;
      Case c{"pivot-pop-" + std::to_string(pop), 1, cols, k, cols, {}, {}};
      c.scores.resize(cols);
      const int above = k / 2;
      for (int i = 0; i < cols; ++i) {
        float x;
        if (i < pop) x = (i % 7 == 0) ? 1.015625f : in_bin(rng);  // every 7th an exact tie
        else if (i < pop + above) x = high(rng);
        else x = low(rng);
        c.scores[i] = x;
      }
      std::shuffle(c.scores.begin(), c.scores.end(), rng);
      check_case(c);
    }
}

// Many rows: the streaming kernel's cluster size follows the row count (8 CTAs per row for a few rows, 1 for
// hundreds), so these cover its other cluster sizes. Ascending rows admit every element of every tile and
// compact the candidate buffer after each one; descending rows never compact after the first; ties and
// per-row lengths cross the compaction points.
TEST(CudaTopk, ManyRows) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 8);
  for (int k : {512, 1024, 2048})
    for (int rows : {64, 300, 512}) {
      const int cols = rows == 300 ? 20001 : 32768;
      Case c = random_case(rng, rows, cols, k);
      c.name = "many-rows";
      std::uniform_int_distribution<int> v(0, 15), len(0, cols);
      for (int r = 0; r < rows; ++r) {
        float* x = c.scores.data() + static_cast<int64_t>(r) * cols;
        switch (r % 5) {
          case 1: for (int i = 0; i < cols; ++i) x[i] = static_cast<float>(i); break;         // ascending
          case 2: for (int i = 0; i < cols; ++i) x[i] = static_cast<float>(cols - i); break;  // descending
          case 3: for (int i = 0; i < cols; ++i) x[i] = static_cast<float>(v(rng)); break;    // ties
          default: break;
        }
      }
      c.lengths.resize(rows);
      for (int r = 0; r < rows; ++r) c.lengths[r] = r % 7 == 6 ? len(rng) : cols;
      check_case(c);
    }
}

// -inf padding, NaN, fewer valid entries than k, per-row lengths (incl. 0 and lengths past cols).
TEST(CudaTopk, InvalidEntriesAndLengths) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 5);
  for (int k : {512, 1024, 2048}) {
    Case c = random_case(rng, 8, 20000, k);
    c.name = "invalid";
    // row 0: -inf tail; row 1: only 300 valid; row 2: NaNs sprinkled; row 3: all -inf; rows 4-7: lengths.
    for (int i = 5000; i < 20000; ++i) c.scores[i] = -INFINITY;
    for (int i = 0; i < 20000; ++i)
      if (i % 64) c.scores[20000 + i] = -INFINITY;
    for (int i = 0; i < 20000; i += 3) c.scores[2 * 20000 + i] = NAN;
    for (int i = 0; i < 20000; ++i) c.scores[3 * 20000 + i] = -INFINITY;
    c.lengths = {20000, 20000, 20000, 20000, 0, k - 1, k + 1, 1 << 30};
    check_case(c);
  }
}

// F15: fewer entries than k (select_k < topk width) — every valid entry present, then -1.
TEST(CudaTopk, FewerEntriesThanK) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 6);
  for (int k : {512, 1024, 2048})
    for (int cols : {1, 7, 300, 511}) check_case(random_case(rng, 3, cols, k));
  // Rows of at most k entries take the compaction path: cols == k and k + 1 (the boundary), -inf, NaN,
  // exact ties, lengths below, at and past cols, padded strides.
  for (int k : {1, 5, 512, 2048})
    for (int cols : {k, k + 1, std::max(1, k - 3)}) {
      Case c = random_case(rng, 6, cols, k, cols + 3);
      c.name = "short";
      for (int i = 0; i < cols; i += 3) c.scores[i] = -INFINITY;
      for (int i = 1; i < cols; i += 4) c.scores[c.stride + i] = NAN;
      for (int i = 0; i < cols; ++i) c.scores[2 * c.stride + i] = 1.0f;
      for (int i = 0; i < cols; ++i) c.scores[3 * c.stride + i] = -INFINITY;
      c.scores[3 * c.stride + cols - 1] = INFINITY;
      c.lengths = {cols, cols, cols, cols, cols / 2, cols + 100};
      check_case(c);
    }
}

// Rows of at most 4096 entries (the decode step's indexer rows up to 16K context; the "small" kernel's range)
// on every pattern above: random, ties, all equal, signed zeros, one fp16 bin, pivot digits shared by many
// entries, keys whose top 8 bits are 0 (huge negative values), -inf / NaN, per-row lengths, odd strides,
// ascending and descending rows, every length from k + 1 to 4096 around the kernels' steps.
TEST(CudaTopk, SmallRows) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 9);
  std::uniform_int_distribution<int> v8(0, 7);
  std::uniform_real_distribution<float> in_bin(1.0f, 1.03125f), huge_neg(-3.4e38f, -1e37f);
  for (int k : {512, 1024, 2048})
    for (int cols : {k + 1, 1000, 2047, 2048, 2049, 3000, 4095, 4096}) {
      if (cols <= k) continue;
      const int rows = 12;
      Case c = random_case(rng, rows, cols, k, cols + (cols % 2 ? 3 : 0));  // odd lengths: unaligned rows
      c.name = "small";
      for (int r = 1; r < rows; ++r) {
        float* x = c.scores.data() + static_cast<int64_t>(r) * c.stride;
        for (int i = 0; i < cols; ++i) {
          switch (r) {
            case 1: x[i] = static_cast<float>(v8(rng)); break;                  // thousands of ties
            case 2: x[i] = 1.0f; break;                                          // all equal
            case 3: x[i] = (i & 1) ? -0.0f : 0.0f; break;                        // -0 == +0
            case 4: x[i] = i % 5 == 0 ? 1.015625f : in_bin(rng); break;          // one bin, exact ties
            case 5: x[i] = huge_neg(rng); break;                                 // top digit 0 or 1
            case 6: x[i] = i % 3 ? -INFINITY : huge_neg(rng); break;             // -inf, few valid
            case 7: x[i] = i % 4 == 1 ? NAN : x[i]; break;                       // NaN sprinkled
            case 8: x[i] = static_cast<float>(i); break;                         // ascending
            case 9: x[i] = static_cast<float>(cols - i); break;                  // descending
            case 10: x[i] = i < k / 2 ? 100.f + i : (i % 2 ? 1.0f : -1.0f); break;  // k-th key shared by half
            default: break;                                                      // row 11: random, length
          }
        }
      }
      c.lengths.assign(rows, cols);
      c.lengths[6] = cols - 1;
      c.lengths[11] = std::uniform_int_distribution<int>(0, cols)(rng);
      check_case(c);
      c.name = "small-lengths";
      const int lens[] = {0, 1, k - 1, k, k + 1, cols - 1, cols, 1 << 30, k + 7, cols / 2, 3, cols};
      for (int r = 0; r < rows; ++r) c.lengths[r] = lens[r];
      check_case(c);
    }
}

// F7, for the kernel chosen by DSV4_TOPK_KERNEL: one captured graph replayed 100 times with new device-side
// lengths (crossing k, the buffer and the streaming thresholds) and new scores; each replay must equal the CPU
// reference (and so eager execution).
void check_graph_replay(std::mt19937_64& rng, int cols = 70000) {
  const int rows = 6, k = 1024;
  DeviceBuffer<float> d_scores(static_cast<size_t>(rows) * cols);
  DeviceBuffer<int32_t> d_len(rows), d_out(static_cast<size_t>(rows) * k), d_eager(static_cast<size_t>(rows) * k);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cuda::topk_rows(d_scores.get(), cols, cols, d_len.get(), rows, k, d_out.get(), st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  std::uniform_int_distribution<int> len(0, cols);
  std::uniform_real_distribution<float> in_bin(1.0f, 1.03125f);
  for (int it = 0; it < 100; ++it) {
    Case c = random_case(rng, rows, cols, k);
    if (it % 3 == 0)  // every third replay: a row whose pivot bin overflows the shared buffer
      for (int i = 0; i < std::min(20000, cols); ++i) c.scores[i] = in_bin(rng);
    c.lengths.resize(rows);
    for (int r = 0; r < rows; ++r) c.lengths[r] = len(rng);
    c.lengths[0] = std::max(c.lengths[0], std::min(20000, cols));
    c.lengths[1] = k - 1 + it % 3;
    d_scores.upload(c.scores);
    d_len.upload(c.lengths);
    d_out.poison();
    CUDA_OK(cudaGraphLaunch(exec, st));
    cuda::topk_rows(d_scores.get(), cols, cols, d_len.get(), rows, k, d_eager.get(), st);
    CUDA_OK(cudaStreamSynchronize(st));
    const auto g = d_out.download(), e = d_eager.download();
    ASSERT_EQ(0, std::memcmp(g.data(), e.data(), g.size() * 4)) << "replay " << it << " differs from eager";
    std::vector<int32_t> want(k);
    for (int r = 0; r < rows; ++r) {
      cpu::topk_row(c.scores.data() + static_cast<int64_t>(r) * cols, c.lengths[r], k, want.data());
      ASSERT_EQ(0, std::memcmp(want.data(), g.data() + static_cast<int64_t>(r) * k, k * 4))
          << "replay " << it << " row " << r;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST(CudaTopk, GraphReplayWithChangingLengths) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 7);
  for (const char* kernel : kKernels) {
    SCOPED_TRACE(kernel);
    const KernelChoice choice(kernel);
    check_graph_replay(rng);
  }
  const KernelChoice choice("small");  // rows of 4096 entries (the small kernel's longest)
  check_graph_replay(rng, 4096);
}

// cuda::select_all_rows (no scores) equals cuda::topk_rows on rows of at most k finite entries, plain and placed
// (the engine's slot lists), every length case (none, 0, negative, below / at / past cols), k on both sides of
// the kernel's 256-thread blocks; outputs poisoned first, the placement's gaps must keep their poison.
TEST(CudaTopk, SelectAllMatchesTopkOnShortRows) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(cuda_test::test_seed() + 9);
  for (int k : {1, 16, 255, 256, 257, 512, 2048})
    for (int cols : {1, k / 2 + 1, k}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " cols=" + std::to_string(cols));
      const int rows = 7;
      Case c = random_case(rng, rows, cols, k, cols + 1);
      for (bool with_lengths : {false, true}) {
        const std::vector<int32_t> lengths = {cols, 0, -5, cols / 2, cols + 100, 1, cols - 1};
        DeviceBuffer<float> d_scores(c.scores.size());
        d_scores.upload(c.scores);
        DeviceBuffer<int32_t> d_len(lengths.size());
        d_len.upload(lengths);
        const int32_t* len = with_lengths ? d_len.get() : nullptr;
        std::vector<int64_t> row_add(rows);
        for (int r = 0; r < rows; ++r) row_add[r] = 4096 * r + 11;
        DeviceBuffer<int64_t> d_add(row_add.size());
        d_add.upload(row_add);
        cuda::TopkOutput place;
        place.stride = k + 5;
        place.add = 300;
        place.row_add = d_add.get();
        for (const cuda::TopkOutput& pl : {cuda::TopkOutput{}, place}) {
          const size_t n_out = static_cast<size_t>(rows) * (pl.stride ? pl.stride : k);
          DeviceBuffer<int32_t> want(n_out), got(n_out);
          want.poison();
          got.poison();
          cuda::topk_rows(d_scores.get(), c.stride, cols, len, rows, k, want.get(), nullptr, pl);
          cuda::select_all_rows(cols, len, rows, k, got.get(), nullptr, pl);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<int32_t> w = want.download(), g = got.download();
          for (size_t i = 0; i < n_out; ++i)
            ASSERT_EQ(g[i], w[i]) << "element " << i << (pl.stride ? " (placed)" : "") << " lengths "
                                  << with_lengths;
        }
      }
    }
}

// Issue #4: one CTA per row on parts with less than 128 KB of shared memory per block. The policy applies there by
// itself (device_config().smem_optin) and anywhere under DSV4_TOPK_ONE_CTA=1, which every check_case above runs
// ("one_cta"); here the shapes' CTAs per row: 1 for every shape under the policy, and on a part with more shared
// memory the clusters the default gives long rows (so the knob is seen to change something).
TEST(CudaTopk, OneCtaPerRowPolicy) {
  DSV4_REQUIRE_GPU();
  const bool small_smem = cuda::device_config().smem_optin < size_t{128} * 1024;
  const int shapes[][2] = {{65536, 1}, {65536, 8}, {262144, 1}, {1 << 20, 2}, {16384, 64}, {8192, 1}, {4096, 1}};
  for (const auto& sh : shapes) {
    const int dflt = cuda::topk_ctas_per_row(sh[0], sh[1], 512);
    if (small_smem) {
      EXPECT_EQ(dflt, 1) << sh[0] << " x " << sh[1];
    }
    const KernelChoice one("one_cta");
    EXPECT_EQ(cuda::topk_ctas_per_row(sh[0], sh[1], 512), 1) << sh[0] << " x " << sh[1];
  }
  if (!small_smem) {
    EXPECT_GT(cuda::topk_ctas_per_row(65536, 1, 512), 1);
    EXPECT_GT(cuda::topk_ctas_per_row(262144, 8, 512), 1);
  }
  // A long row through one CTA under the policy: 1M entries, k 2048, lengths cut short and a NaN / -inf sprinkle.
  std::mt19937_64 rng(cuda_test::test_seed() + 20);
  Case c = random_case(rng, 2, 1 << 20, 2048);
  c.name = "one CTA, 1M entries";
  c.lengths = {1 << 20, 700001};
  for (int i = 0; i < 64; ++i) c.scores[rng() % c.scores.size()] = i % 2 ? NAN : -INFINITY;
  check_case(c);
}

TEST(CudaTopk, UnsupportedShapeFailsLoudly) {
  DSV4_REQUIRE_GPU();
  EXPECT_THROW(cuda::topk_rows(nullptr, 10, 10, nullptr, 1, 4096, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::topk_rows(nullptr, 10, 10, nullptr, 1, 0, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::select_all_rows(10, nullptr, 1, 8, nullptr, nullptr), Error);  // rows longer than k
  EXPECT_THROW(cuda::select_all_rows(10, nullptr, 1, 0, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace dsv4
