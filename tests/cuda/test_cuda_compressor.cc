// cuda::compressor against the CPU path of engine/attention.cc run_compressor (cpu::compressor_push, RMSNorm,
// RoPE at the block start, KvCodec::encode) for the three shapes: (4, 512) overlap, (128, 512), (4, 128) indexer.
// Several sequences at different positions share each launch; chunks cut blocks anywhere; sequences start at 0
// (block 0 of the overlap, device state poisoned: it needs no initialisation) or at a far position with a state
// built on the CPU and copied in the documented layout. Fresh random tokens every launch, outputs poisoned.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/compressor.h"
#include "backend/cpu/norm_rope.h"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "cuda_test_util.h"
#include "engine/kv_state.h"

namespace dsv4 {
namespace {

using cuda_test::DeviceBuffer;

struct Shape {
  int ratio, head;
  KvDtype dtype;
};

cuda::KvRowFormat to_format(KvDtype d) {
  return d == KvDtype::kF32 ? cuda::KvRowFormat::kF32
                            : d == KvDtype::kBF16 ? cuda::KvRowFormat::kBF16 : cuda::KvRowFormat::kFP8;
}

class Harness {
 public:
  Harness(Shape sh, std::vector<int64_t> starts, uint64_t seed)
      : sh_(sh), W_((sh.ratio == 4 ? 2 : 1) * sh.head), rng_(seed), nd_(0.f, 1.f),
        codec_(sh.dtype, sh.head, sh.head == 512 ? 64 : 0, sh.head == 512 ? 64 : 128),
        n_(static_cast<int>(starts.size())), pos_(starts), cpu_(n_),
        state_floats_(cuda::compressor_state_floats(sh.ratio, sh.head)),
        d_state_(state_floats_ * n_), d_ape_(sh.ratio * W_), d_norm_(sh.head), d_freq_(32) {
    ape_.resize(sh.ratio * W_);
    for (float& v : ape_) v = 0.5f * nd_(rng_);
    norm_.resize(sh.head);
    for (float& v : norm_) v = 1.0f + 0.2f * nd_(rng_);
    YarnConfig y;
    y.enabled = true; y.factor = 16; y.original_max_position_embeddings = 65536;
    freq_ = cpu::rope_inv_freq(160000.0, 64, y);
    d_ape_.upload(ape_); d_norm_.upload(norm_); d_freq_.upload(freq_);
    d_state_.poison();
    std::vector<float> st(state_floats_ * n_);
    DeviceBuffer<float> tmp(1);
    for (int s = 0; s < n_; ++s) {
      cpu::CompressorState& c = cpu_[s];
      c.init(sh.ratio, sh.head);
      if (pos_[s] == 0) continue;  // fresh: the device slot stays poisoned
      // A state as if pos_[s] tokens had been pushed: random open rows and previous half.
      c.filled = static_cast<int>(pos_[s] % sh.ratio);
      c.have_prev = c.overlap && pos_[s] >= sh.ratio;
      for (float& v : c.kv) v = nd_(rng_);
      for (float& v : c.score) v = 2.0f * nd_(rng_);
      for (float& v : c.prev_kv) v = nd_(rng_);
      for (float& v : c.prev_score) v = 2.0f * nd_(rng_);
      float* d = st.data() + slot(s) * state_floats_;
      std::memcpy(d, c.kv.data(), c.kv.size() * 4);
      std::memcpy(d + c.kv.size(), c.score.data(), c.score.size() * 4);
      if (c.overlap) {
        std::memcpy(d + 2 * c.kv.size(), c.prev_kv.data(), c.prev_kv.size() * 4);
        std::memcpy(d + 2 * c.kv.size() + c.prev_kv.size(), c.prev_score.data(), c.prev_score.size() * 4);
      }
      check_ok(cudaMemcpy(d_state_.get() + slot(s) * state_floats_, d, state_floats_ * 4, cudaMemcpyHostToDevice));
    }
  }
  ~Harness() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  // Every later step() replays one CUDA graph captured at its first call (fixed n_seqs and grid bound).
  void use_graph(int max_tokens, int max_count) { graph_max_tokens_ = max_tokens, graph_max_count_ = max_count; }
  // Eager launches then pass max_count / 3: the bound only sizes the grid, larger counts must still work.
  void understate_max_count() { understate_ = true; }
  int slot(int s) const { return n_ - 1 - s; }  // exercises state_slot indirection
  static void check_ok(cudaError_t e) { cuda::check(e, "test copy"); }

  // One launch: sequence s gets counts[s] new tokens (0 allowed). Returns the number of entries checked.
  int step(const std::vector<int>& counts) {
    const int64_t stride = W_ + 4;  // rows not packed (a multiple of 4: the kernel reads float4)
    int T = 0, max_count = 0;
    std::vector<int32_t> first(n_), cnt(n_);
    std::vector<int64_t> start(n_), out_first(n_);
    int64_t rows = 0;
    std::vector<int64_t> n_ent(n_);
    for (int s = 0; s < n_; ++s) {
      first[s] = T; cnt[s] = counts[s]; start[s] = pos_[s];
      T += counts[s];
      max_count = std::max(max_count, counts[s]);
      n_ent[s] = (pos_[s] + counts[s]) / sh_.ratio - pos_[s] / sh_.ratio;
      out_first[s] = rows + 1;  // one untouched (poisoned) row before each sequence's entries
      rows += n_ent[s] + 1;
    }
    rows += 1;
    std::vector<float> kv(static_cast<size_t>(std::max(T, 1)) * stride), gate(kv.size());
    for (float& v : kv) v = nd_(rng_);
    for (float& v : gate) v = 2.0f * nd_(rng_);
    const size_t rb = codec_.row_bytes();
    const int64_t out_rb = static_cast<int64_t>(rb) + 8;  // stride above the row size
    std::vector<int32_t> slots(n_);
    for (int s = 0; s < n_; ++s) slots[s] = slot(s);
    // Eager: buffers sized for this launch. Graph mode: one set of buffers sized for the largest launch,
    // captured once, then every launch only changes their contents and replays the graph.
    const bool graph = graph_max_tokens_ > 0;
    if (graph) {
      EXPECT_LE(T, graph_max_tokens_);
      EXPECT_LE(max_count, graph_max_count_);
    }
    const size_t n_in = graph ? static_cast<size_t>(graph_max_tokens_) * stride : kv.size();
    const int64_t n_rows = graph ? static_cast<int64_t>(n_) * (graph_max_count_ / sh_.ratio + 2) + 1 : rows;
    EXPECT_LE(rows, n_rows);
    if (!graph || !g_kv_) {
      g_kv_ = std::make_unique<DeviceBuffer<float>>(n_in);
      g_gate_ = std::make_unique<DeviceBuffer<float>>(n_in);
      g_first_ = std::make_unique<DeviceBuffer<int32_t>>(n_);
      g_cnt_ = std::make_unique<DeviceBuffer<int32_t>>(n_);
      g_slot_ = std::make_unique<DeviceBuffer<int32_t>>(n_);
      g_start_ = std::make_unique<DeviceBuffer<int64_t>>(n_);
      g_of_ = std::make_unique<DeviceBuffer<int64_t>>(n_);
      g_out_ = std::make_unique<DeviceBuffer<uint8_t>>(n_rows * out_rb);
    }
    g_kv_->upload(kv); g_gate_->upload(gate); g_first_->upload(first); g_cnt_->upload(cnt); g_start_->upload(start);
    g_of_->upload(out_first); g_slot_->upload(slots);
    g_out_->poison();
    cuda::CompressorArgs a;
    a.ratio = sh_.ratio; a.head = sh_.head; a.kv = g_kv_->get(); a.gate = g_gate_->get(); a.row_stride = stride;
    a.ape = d_ape_.get(); a.norm = d_norm_.get(); a.eps = 1e-6f; a.inv_freq = d_freq_.get(); a.n_freq = 32;
    a.n_seqs = n_; a.seq_first = g_first_->get(); a.seq_count = g_cnt_->get(); a.seq_start = g_start_->get();
    a.max_count = graph ? graph_max_count_ : understate_ ? max_count / 3 : max_count;
    a.state = d_state_.get(); a.state_slot = g_slot_->get();
    a.out = g_out_->get(); a.out_row_bytes = out_rb; a.out_first = g_of_->get();
    a.format = to_format(sh_.dtype); a.fp8_rope_dims = sh_.head == 512 ? 64 : 0;
    a.fp8_scale_block = sh_.head == 512 ? 64 : 128;
    EXPECT_EQ(cuda::compressor_row_bytes(a.format, a.head, a.fp8_rope_dims, a.fp8_scale_block), rb);
    if (!graph) {
      cuda::compressor(a, nullptr);
    } else {
      if (!exec_) {
        // A blocking stream: it waits for the uploads and the poison memset issued on the legacy stream.
        check_ok(cudaStreamCreate(&stream_));
        cudaGraph_t g = nullptr;
        check_ok(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
        cuda::compressor(a, stream_);
        check_ok(cudaStreamEndCapture(stream_, &g));
        check_ok(cudaGraphInstantiate(&exec_, g, 0));
        cudaGraphDestroy(g);
      }
      check_ok(cudaGraphLaunch(exec_, stream_));
    }
    check_ok(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = g_out_->download();

    // CPU reference, and the comparison.
    std::vector<uint8_t> want_row(rb);
    std::vector<float> pooled(sh_.head), wv(sh_.head), gv(sh_.head);
    std::vector<bool> written(n_rows, false);
    int checked = 0;
    for (int s = 0; s < n_; ++s) {
      int64_t e = 0;
      for (int i = 0; i < counts[s]; ++i) {
        const int64_t p = pos_[s] + i, t = first[s] + i;
        if (!cpu::compressor_push(cpu_[s], p, &kv[t * stride], &gate[t * stride], ape_.data(), pooled.data()))
          continue;
        cpu::rmsnorm(pooled.data(), norm_.data(), sh_.head, 1e-6f, pooled.data());
        cpu::rope(pooled.data(), sh_.head, freq_, p + 1 - sh_.ratio);
        codec_.encode(pooled.data(), want_row.data());
        const int64_t r = out_first[s] + e++;
        written[r] = true;
        const uint8_t* g = &got[r * out_rb];
        codec_.decode(want_row.data(), wv.data());
        codec_.decode(g, gv.data());
        compare(wv, gv, want_row.data(), g, "seq " + std::to_string(s) + " block " + std::to_string(p / sh_.ratio));
        ++checked;
      }
      EXPECT_EQ(e, n_ent[s]);
      pos_[s] += counts[s];
    }
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t b = 0; b < out_rb; ++b)
        if ((r >= rows || !written[r] || b >= static_cast<int64_t>(rb)) && got[r * out_rb + b] != 0x7b) {
          ADD_FAILURE() << "byte " << b << " of row " << r << " must stay untouched";
          return checked;
        }
    return checked;
  }

  // The valid part of every device state slot equals the CPU state.
  void check_state() {
    std::vector<float> st(state_floats_ * n_);
    check_ok(cudaMemcpy(st.data(), d_state_.get(), st.size() * 4, cudaMemcpyDeviceToHost));
    for (int s = 0; s < n_; ++s) {
      const cpu::CompressorState& c = cpu_[s];
      const float* d = st.data() + slot(s) * state_floats_;
      for (int r = 0; r < c.filled; ++r)
        for (int ch = 0; ch < W_; ++ch) {
          ASSERT_EQ(d[r * W_ + ch], c.kv[r * W_ + ch]) << "seq " << s << " kv row " << r;
          ASSERT_EQ(d[c.kv.size() + r * W_ + ch], c.score[r * W_ + ch]) << "seq " << s << " score row " << r;
        }
      if (c.overlap && c.have_prev) {
        for (size_t i = 0; i < c.prev_kv.size(); ++i) {
          ASSERT_EQ(d[2 * c.kv.size() + i], c.prev_kv[i]) << "seq " << s << " prev_kv " << i;
          ASSERT_EQ(d[2 * c.kv.size() + c.prev_kv.size() + i], c.prev_score[i]) << "seq " << s << " prev_score";
        }
      }
    }
  }

 private:
  void compare(const std::vector<float>& w, const std::vector<float>& g, const uint8_t* wb, const uint8_t* gb,
               const std::string& where) {
    SCOPED_TRACE(where);
    if (sh_.dtype == KvDtype::kF32) {
      for (int c = 0; c < sh_.head; ++c) ASSERT_NEAR(g[c], w[c], 2e-5f + 2e-5f * std::fabs(w[c])) << "channel " << c;
      return;
    }
    // bf16 / fp8: the fp32 values differ in the last bits (summation order, expf), so a value can round to the
    // neighbouring code: allow one code step, and require almost all bytes to be identical.
    const int nope = sh_.head - (sh_.head == 512 ? 64 : 0), blk = sh_.head == 512 ? 64 : 128;
    for (int c = 0; c < sh_.head; ++c) {
      float tol = std::fabs(w[c]) * (1.0f / 64) + 1e-6f;  // bf16: one code step
      if (sh_.dtype == KvDtype::kFP8 && c < nope) {
        const uint8_t* sw = wb + nope + 2 * (sh_.head - nope);
        const uint8_t* sg = gb + nope + 2 * (sh_.head - nope);
        const float sc = std::ldexp(1.0f, std::max<int>(sw[c / blk], sg[c / blk]) - 127);
        tol = 0.13f * std::max(std::fabs(w[c]), std::fabs(g[c])) + sc * (1.0f / 256);
      }
      ASSERT_TRUE(std::isfinite(g[c])) << "channel " << c;
      ASSERT_NEAR(g[c], w[c], tol) << "channel " << c;
    }
    const size_t rb = codec_.row_bytes();
    for (size_t b = 0; b < rb; ++b) diff_bytes_ += wb[b] != gb[b];
    total_bytes_ += rb;
  }

 public:
  int64_t diff_bytes_ = 0, total_bytes_ = 0;

 private:
  Shape sh_;
  int W_;
  std::mt19937_64 rng_;
  std::normal_distribution<float> nd_;
  KvCodec codec_;
  int n_;
  std::vector<int64_t> pos_;
  std::vector<cpu::CompressorState> cpu_;
  size_t state_floats_;
  DeviceBuffer<float> d_state_, d_ape_, d_norm_, d_freq_;
  std::vector<float> ape_, norm_, freq_;
  // The launch's buffers (kept across steps in graph mode).
  std::unique_ptr<DeviceBuffer<float>> g_kv_, g_gate_;
  std::unique_ptr<DeviceBuffer<int32_t>> g_first_, g_cnt_, g_slot_;
  std::unique_ptr<DeviceBuffer<int64_t>> g_start_, g_of_;
  std::unique_ptr<DeviceBuffer<uint8_t>> g_out_;
  bool understate_ = false;
  int graph_max_tokens_ = 0, graph_max_count_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

const Shape kShapes[] = {{4, 512, KvDtype::kF32},  {4, 512, KvDtype::kFP8},   {4, 512, KvDtype::kBF16},
                         {128, 512, KvDtype::kF32}, {128, 512, KvDtype::kFP8}, {4, 128, KvDtype::kF32},
                         {4, 128, KvDtype::kFP8}};

std::string name(const Shape& s) {
  return "ratio=" + std::to_string(s.ratio) + " head=" + std::to_string(s.head) + " " + kv_dtype_name(s.dtype);
}

void finish(Harness& h) {
  h.check_state();
  if (h.total_bytes_) {
    EXPECT_LE(h.diff_bytes_ * 100, h.total_bytes_) << "more than 1% of stored bytes differ";
  }
}

// Prefill in chunks that cut blocks anywhere; four sequences per launch at different positions, two of them
// from position 0 (block 0 of the overlap), one far out (position ~1M: large RoPE angles).
TEST(CudaCompressor, ChunkedPrefill) {
  DSV4_REQUIRE_GPU();
  uint64_t seed = cuda_test::test_seed();
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE(name(sh));
    Harness h(sh, {0, 0, 1000003, 257}, ++seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int big = sh.ratio == 128 ? 300 : 23;
    int checked = 0;
    for (int it = 0; it < 6; ++it) {
      std::uniform_int_distribution<int> c(0, big);
      checked += h.step({c(rng), 1 + c(rng), c(rng), it == 0 ? 0 : c(rng)});
      ASSERT_FALSE(HasFatalFailure());
    }
    h.step({sh.ratio, 2 * sh.ratio + 1, sh.ratio - 1, 3});  // exact block, block + 1, short of a block
    ASSERT_FALSE(HasFatalFailure());
    h.understate_max_count();
    checked += h.step({5 * sh.ratio + 2, 3, 0, 9 * sh.ratio - 1});  // counts above the launch's max_count
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_GT(checked, 4);
    finish(h);
  }
}

// Decode: 64 or 200 sequences, one token each per launch, most launches write nothing for most sequences.
// (Ratio 128 splits each entry over a cluster of CTAs for up to 8 x SMs / 8 sequences, 132 on an H200: 64 take
// the split kernel, 200 the one-CTA-per-entry one.)
TEST(CudaCompressor, Decode) {
  DSV4_REQUIRE_GPU();
  uint64_t seed = cuda_test::test_seed() + 100;
  for (const Shape& sh : kShapes)
    for (int n_seqs : {64, 200}) {
      SCOPED_TRACE(name(sh) + " sequences " + std::to_string(n_seqs));
      std::mt19937 rng(static_cast<uint32_t>(seed));
      std::vector<int64_t> starts(n_seqs);
      for (int s = 0; s < n_seqs; ++s)
        starts[s] = s < 4 ? s
                          : (s % 2 ? static_cast<int64_t>(rng() % 2000000)
                                   : (rng() % 5000) * sh.ratio + sh.ratio - 1 - s % 6);
      Harness h(sh, starts, ++seed);
      int checked = 0;
      for (int it = 0; it < 9; ++it) {
        checked += h.step(std::vector<int>(n_seqs, 1));
        ASSERT_FALSE(HasFatalFailure());
      }
      EXPECT_GT(checked, sh.ratio == 4 ? n_seqs : n_seqs / 4);
      finish(h);
    }
}

// CUDA graph safety: one captured launch replayed 100 times, with new tokens, counts (0 .. max, cutting blocks
// anywhere) and therefore new output rows each time, equals the CPU path like eager launches do.
TEST(CudaCompressor, GraphReplayWithChangingCounts) {
  DSV4_REQUIRE_GPU();
  uint64_t seed = cuda_test::test_seed() + 200;
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE(name(sh));
    Harness h(sh, {0, 5, 1000003, 131}, ++seed);
    const int max_count = sh.ratio == 128 ? 260 : 19;
    h.use_graph(4 * max_count, max_count);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int> c(0, max_count);
    int checked = 0;
    for (int it = 0; it < 100; ++it) {
      checked += h.step({c(rng), c(rng), it % 3 ? 1 : c(rng), c(rng)});
      ASSERT_FALSE(HasFatalFailure()) << "replay " << it;
    }
    EXPECT_GT(checked, 20);
    finish(h);
  }
}

TEST(CudaCompressor, UnsupportedShapesFailLoudly) {
  DSV4_REQUIRE_GPU();
  cuda::CompressorArgs a;
  a.ratio = 128; a.head = 128; a.n_seqs = 1;
  try {
    cuda::compressor(a, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ratio=128 head=128"), std::string::npos) << e.what();
  }
  // Rows that float4 loads cannot read: a stride that is not a multiple of 4, or a misaligned pointer. Nothing
  // launches (the pointers are never dereferenced).
  auto* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);
  a.ratio = 4; a.head = 512; a.max_count = 1; a.row_stride = 1025;
  a.kv = a.gate = a.ape = a.norm = a.inv_freq = fake;
  a.state = fake;
  a.seq_first = a.seq_count = reinterpret_cast<const int32_t*>(fake);
  a.seq_start = a.out_first = reinterpret_cast<const int64_t*>(fake);
  a.out = reinterpret_cast<uint8_t*>(fake);
  a.out_row_bytes = 4096;
  a.format = cuda::KvRowFormat::kF32;
  for (int64_t stride : {int64_t{1025}, int64_t{1024}}) {
    a.row_stride = stride;
    a.gate = stride == 1024 ? fake + 1 : fake;
    try {
      cuda::compressor(a, nullptr);
      FAIL() << "expected an error for row_stride " << stride;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dsv4
