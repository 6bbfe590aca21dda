// glue::linear on BF16 weights against a float64 reference on fresh random inputs: the streaming path for
// cols % 256 == 0 (split-K below 16 * SMs rows, warp per row above), the generic path otherwise. Outputs
// are poisoned before each launch and strided (ldy > rows, the gaps must stay NaN), row offsets
// (row_begin) and token counts around the 8-token pass; a second eager launch and a CUDA-graph launch must
// give the same bits. glue::rmsnorm_rows (single-pass float4 / scalar paths and the long-row path, in
// place and strided) against the cpu::rmsnorm formula. glue::heads_norm_rope's float4 kernel against its generic
// one. glue::embed_streams (8 elements per thread, and the
// scalar loop for dims not a multiple of 8 or a misaligned output) bit for bit, output poisoned.
// glue::act_quant_rows (GpuOptions::act_quant) bit for bit against core/numerics act_quant_e4m3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "core/numerics.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  cuda::check(cudaMalloc(&p, std::max<size_t>(16, v.size() * sizeof(T))), "malloc");
  cuda::check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy");
  return p;
}

// Runs f(stream) once captured into a CUDA graph and launches the graph (same kernels as eager calls).
template <typename F>
void run_in_graph(F f) {
  cuda::check(cudaDeviceSynchronize(), "sync");  // the non-blocking stream does not wait for the legacy one
  cudaStream_t s = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda::check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  f(s);
  cudaGraph_t g = nullptr;
  cuda::check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t e = nullptr;
  cuda::check(cudaGraphInstantiate(&e, g, 0), "instantiate");
  cuda::check(cudaGraphLaunch(e, s), "graph launch");
  cuda::check(cudaStreamSynchronize(s), "sync");
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// A new seed every run, printed so that a failure can be replayed.
uint64_t fresh_seed() {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("DSV4_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GlueLinear, Bf16MatchesFloat64) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // glue::linear splits K across a block's 8 warps for rows < 16 * SMs (2112 on an H200).
  const int64_t split = 16 * static_cast<int64_t>(cuda::device_config().sm_count);
  struct Case { int64_t rows, cols, row_begin, T, pad; };  // pad: ldx = cols + pad, ldy = rows + pad + 1
  const Case cases[] = {
      // split-K path (chunks = cols / 256 below, at and above the 8 warps; T around the 8-token pass)
      {1, 256, 0, 1, 0},          {37, 512, 3, 3, 4},         {64, 4096, 7, 9, 0},      {64, 4096, 0, 1, 0},
      {256, 4096, 0, 1, 4},       {5, 768, 0, 17, 0},         {3, 2304, 2, 1, 0},       {16, 1280, 0, 64, 8},
      {512, 4096, 1, 2, 0},       {1024, 4096, 0, 8, 0},      {96, 7168, 5, 17, 4},     {8, 16384, 0, 9, 0},
      {split - 1, 4096, 3, 1, 0}, {split - 1, 1024, 0, 2, 4},
      // warp-per-row path
      {split, 4096, 0, 1, 0},     {split + 9, 1024, 11, 9, 4}, {2 * split + 3, 512, 1, 17, 0},
      {3 * split, 256, 0, 2, 0},
      // generic path (cols % 256 != 0)
      {129, 300, 1, 2, 0}};
  for (const Case& c : cases) {
    const int64_t R = c.rows + c.row_begin + 2;  // rows after the range too: reading them would show
    const int64_t ldx = c.cols + c.pad, ldy = c.rows + c.pad + 1;
    std::vector<uint16_t> w(static_cast<size_t>(R * c.cols));
    for (auto& v : w) v = f32_to_bf16(nd(rng) * 0.05f);
    std::vector<float> x(static_cast<size_t>(c.T * ldx));
    for (auto& v : x) v = nd(rng);
    glue::Weight gw;
    gw.fmt = glue::WFormat::kBF16;
    gw.rows = R;
    gw.cols = c.cols;
    uint16_t* dw = upload(w);
    float* dx = upload(x);
    gw.w = reinterpret_cast<const uint8_t*>(dw);
    float* dy = nullptr;
    const size_t ny = static_cast<size_t>(c.T * ldy);
    ASSERT_EQ(cudaMalloc(&dy, ny * sizeof(float)), cudaSuccess);
    std::vector<float> y(ny), y2(ny), yg(ny);
    // Eager twice, then once from a graph; every launch into a freshly NaN-poisoned y.
    for (std::vector<float>* out : {&y, &y2, &yg}) {
      ASSERT_EQ(cudaMemset(dy, 0xff, ny * sizeof(float)), cudaSuccess);
      if (out == &yg)
        run_in_graph([&](cudaStream_t s) { glue::linear(gw, c.row_begin, c.rows, dx, c.T, ldx, dy, ldy, s); });
      else
        glue::linear(gw, c.row_begin, c.rows, dx, c.T, ldx, dy, ldy, nullptr);
      ASSERT_EQ(cudaMemcpy(out->data(), dy, ny * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    double worst = 0;
    int64_t touched = 0;  // gap entries (r >= rows) that are not NaN any more
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t r = c.rows; r < ldy; ++r) touched += !std::isnan(y[t * ldy + r]);
      for (int64_t r = 0; r < c.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double p = static_cast<double>(bf16_to_f32(w[(c.row_begin + r) * c.cols + k])) * x[t * ldx + k];
          ref += p;
          mag += std::fabs(p);
        }
        const double err = std::fabs(y[t * ldy + r] - ref) / std::max(mag, 1e-30);
        worst = std::isfinite(err) && err <= worst ? worst : (std::isfinite(err) ? err : INFINITY);
      }
    }
    // fp32 accumulation over <= 16384 terms: |error| <= ~cols * 2^-24 * sum|w x|, in practice far less.
    std::printf("rows %lld cols %lld row_begin %lld T %lld pad %lld (%s): max |err| / sum|w x| = %.3e\n",
                static_cast<long long>(c.rows), static_cast<long long>(c.cols), static_cast<long long>(c.row_begin),
                static_cast<long long>(c.T), static_cast<long long>(c.pad),
                c.cols % 256 ? "generic" : (c.rows < split ? "split" : "warp/row"), worst);
    EXPECT_LE(worst, 1e-5) << "rows " << c.rows << " cols " << c.cols << " T " << c.T;
    EXPECT_EQ(touched, 0) << "wrote outside y[t, 0..rows): rows " << c.rows << " cols " << c.cols;
    EXPECT_TRUE(same_bits(y, y2)) << "eager launches differ: rows " << c.rows << " cols " << c.cols;
    EXPECT_TRUE(same_bits(y, yg)) << "graph and eager launches differ: rows " << c.rows << " cols " << c.cols;
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
  }
}

// glue::rmsnorm_rows against the cpu::rmsnorm formula (sum of squares in double, r and y in float):
// n <= 8192 with n % 4 == 0 and 16-byte rows takes the float4 single pass, other n or strides the scalar
// single pass, n > 8192 the two-pass kernel. Out of place into a strided NaN-poisoned y (gaps must stay
// NaN), and in place (y == x, the gaps of x must keep their values).
TEST(GlueEmbed, CopiesTheRowIntoEveryStream) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  struct Case { int64_t dim; int T, n, out_offset; };  // out_offset floats: 1 makes out misaligned
  const Case cases[] = {{4096, 1, 4, 0}, {4096, 5, 4, 0}, {7168, 3, 4, 0}, {2056, 2, 1, 0},
                        {36, 3, 4, 0},   {4096, 2, 4, 1}, {8, 1, 2, 0}};
  const int vocab = 97;
  for (const Case& c : cases) {
    std::vector<uint16_t> table(static_cast<size_t>(vocab * c.dim));
    for (auto& v : table) v = static_cast<uint16_t>(rng());  // any bits, NaN patterns included
    std::vector<int32_t> tokens(static_cast<size_t>(c.T));
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    uint16_t* dt = upload(table);
    int32_t* dtok = upload(tokens);
    const size_t n_out = static_cast<size_t>(c.T) * c.n * c.dim;
    std::vector<float> poison(n_out + c.out_offset, std::numeric_limits<float>::quiet_NaN());
    float* dout = upload(poison);
    glue::embed_streams(dt, dtok, c.T, c.dim, c.n, dout + c.out_offset, nullptr);
    std::vector<float> got(n_out);
    cuda::check(cudaMemcpy(got.data(), dout + c.out_offset, n_out * sizeof(float), cudaMemcpyDeviceToHost), "copy");
    std::vector<uint32_t> want(n_out);
    for (int t = 0; t < c.T; ++t)
      for (int j = 0; j < c.n; ++j)
        for (int64_t d = 0; d < c.dim; ++d)
          want[(static_cast<size_t>(t) * c.n + j) * c.dim + d] = uint32_t{table[tokens[t] * c.dim + d]} << 16;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n_out * sizeof(float)), 0)
        << "dim " << c.dim << " T " << c.T << " streams " << c.n << " out offset " << c.out_offset;
    cudaFree(dt);
    cudaFree(dtok);
    cudaFree(dout);
  }
}

// glue::heads_norm_rope: the float4-per-thread kernel against the generic one (set_heads_norm_rope_generic), bit
// for bit in x and its 16-bit copy: head dims 512 (the attention's q), 128 (the indexer's), 64 and 8, RoPE on
// the last 64 / 32 / 0 dims, norm or not, inverse or not, bf16 / f16 / no copy, several tokens and heads at
// different positions; plus a shape only the generic kernel takes (dim 36).
TEST(GlueNormRope, Float4KernelMatchesGeneric) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case { int dim, n_freq, heads, T; };
  const Case cases[] = {{512, 32, 64, 1}, {512, 32, 8, 3}, {128, 32, 64, 2}, {128, 16, 4, 1},
                        {64, 0, 2, 2},    {8, 2, 3, 2},    {36, 7, 2, 2}};
  int compared = 0;
  for (const Case& c : cases)
    for (int mode = 0; mode < 8; ++mode) {
      const bool norm = mode & 1, inverse = mode & 2, copy = mode & 4, f16 = (mode + c.dim) % 3 == 0;
      const size_t n = static_cast<size_t>(c.T) * c.heads * c.dim;
      std::vector<float> x(n), inv(std::max(1, c.n_freq));
      for (auto& v : x) v = nd(rng) * 3.0f;
      for (int i = 0; i < c.n_freq; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / (2.0f * c.n_freq));
      std::vector<int64_t> pos(c.T);
      for (auto& p : pos) p = static_cast<int64_t>(rng() % 70000);
      int64_t* dpos = nullptr;
      cuda::check(cudaMalloc(&dpos, sizeof(int64_t) * c.T), "malloc");
      cuda::check(cudaMemcpy(dpos, pos.data(), sizeof(int64_t) * c.T, cudaMemcpyHostToDevice), "copy");
      float* dinv = upload(inv);
      std::vector<float> got[2];
      std::vector<uint16_t> got16[2];
      for (int generic = 0; generic < 2; ++generic) {
        float* dx = upload(x);
        uint16_t* dxb = nullptr;
        if (copy) {
          cuda::check(cudaMalloc(&dxb, n * 2), "malloc");
          cuda::check(cudaMemset(dxb, 0x7b, n * 2), "poison");
        }
        glue::set_heads_norm_rope_generic(generic == 1);
        glue::heads_norm_rope(dx, c.T, c.heads, c.dim, dpos, dinv, c.n_freq, norm, 1e-6f, inverse, nullptr, dxb, f16);
        glue::set_heads_norm_rope_generic(false);
        cuda::check(cudaDeviceSynchronize(), "sync");
        got[generic].resize(n);
        cuda::check(cudaMemcpy(got[generic].data(), dx, n * 4, cudaMemcpyDeviceToHost), "copy");
        if (copy) {
          got16[generic].resize(n);
          cuda::check(cudaMemcpy(got16[generic].data(), dxb, n * 2, cudaMemcpyDeviceToHost), "copy");
        }
        cudaFree(dx);
        cudaFree(dxb);
      }
      EXPECT_TRUE(same_bits(got[0], got[1])) << "x differs: dim " << c.dim << " n_freq " << c.n_freq << " mode " << mode;
      if (copy) {
        EXPECT_EQ(got16[0], got16[1]) << "copy differs: dim " << c.dim << " mode " << mode;
      }
      cudaFree(dpos);
      cudaFree(dinv);
      ++compared;
    }
  std::printf("heads_norm_rope: %d cases, the float4 kernel bit for bit the generic one\n", compared);
}

TEST(GlueRmsnorm, MatchesFloat64) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float eps = 1e-6f;
  struct Case { int64_t n; int rows; int64_t pad; bool weighted, in_place; };  // pad: ldx - n
  const Case cases[] = {
      {512, 3, 0, true, false},   {1024, 2, 4, true, true},   {4096, 1, 0, true, true},  {4096, 5, 8, false, false},
      {7168, 2, 0, true, false},  {8192, 3, 4, true, true},   {300, 4, 0, true, false},  {300, 3, 5, false, true},
      {4096, 3, 1, true, false},  {1, 2, 0, true, false},     {8191, 2, 3, true, true},  {8200, 2, 0, true, false},
      {16384, 2, 4, true, true}};
  for (const Case& c : cases) {
    const int64_t ldx = c.n + c.pad, ldy = c.in_place ? ldx : c.n + c.pad + 4;
    std::vector<float> x(static_cast<size_t>(c.rows * ldx)), w(static_cast<size_t>(c.n));
    const float scale = std::exp2(static_cast<float>(static_cast<int>(rng() % 16)) - 8.0f);  // row magnitude
    for (auto& v : x) v = nd(rng) * scale;
    for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
    float* dx = upload(x);
    float* dw = upload(w);
    float* dy = dx;
    const size_t ny = static_cast<size_t>(c.rows * ldy);
    if (!c.in_place) {
      ASSERT_EQ(cudaMalloc(&dy, ny * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(dy, 0xff, ny * sizeof(float)), cudaSuccess);  // NaN poison
    }
    uint16_t* dyb = nullptr;  // the optional bf16 copy, poisoned (0xffff) like y
    ASSERT_EQ(cudaMalloc(&dyb, ny * sizeof(uint16_t)), cudaSuccess);
    ASSERT_EQ(cudaMemset(dyb, 0xff, ny * sizeof(uint16_t)), cudaSuccess);
    glue::rmsnorm_rows(dx, ldx, c.weighted ? dw : nullptr, c.rows, c.n, eps, dy, ldy, nullptr, dyb);
    std::vector<float> y(ny);
    std::vector<uint16_t> yb(ny);
    ASSERT_EQ(cudaMemcpy(y.data(), dy, ny * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(yb.data(), dyb, ny * sizeof(uint16_t), cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad_bf16 = 0;  // yb != bf16(y) (round to nearest even) inside the rows, or written in a gap
    for (int r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < ldy; ++i) {
        const size_t k = static_cast<size_t>(r * ldy + i);
        const uint16_t want = i < c.n ? f32_to_bf16(y[k]) : 0xffff;
        bad_bf16 += yb[k] != want;
      }
    EXPECT_EQ(bad_bf16, 0) << "bf16 copy: n " << c.n << " ldx " << ldx;
    cudaFree(dyb);
    double worst = 0;
    int64_t touched = 0;  // gap entries changed (NaN poison gone, or x modified in place)
    for (int r = 0; r < c.rows; ++r) {
      const float* xr = &x[static_cast<size_t>(r * ldx)];
      double ss = 0.0;
      for (int64_t i = 0; i < c.n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float rr = 1.0f / std::sqrt(static_cast<float>(ss / c.n) + eps);
      for (int64_t i = 0; i < c.n; ++i) {
        const float ref = c.weighted ? w[i] * (xr[i] * rr) : xr[i] * rr;
        const double err = std::fabs(static_cast<double>(y[r * ldy + i]) - ref) / std::max(std::fabs(ref), 1e-30f);
        worst = std::isfinite(err) && err <= worst ? worst : (std::isfinite(err) ? err : INFINITY);
      }
      for (int64_t i = c.n; i < ldy; ++i) {
        const float g = y[r * ldy + i];
        touched += c.in_place ? std::memcmp(&g, &xr[i], sizeof(float)) != 0 : !std::isnan(g);
      }
    }
    std::printf("n %lld rows %d ldx %lld ldy %lld w %d in_place %d: max rel err %.3e\n",
                static_cast<long long>(c.n), c.rows, static_cast<long long>(ldx), static_cast<long long>(ldy),
                c.weighted, c.in_place, worst);
    EXPECT_LE(worst, 1e-6) << "n " << c.n << " ldx " << ldx;
    EXPECT_EQ(touched, 0) << "wrote outside the rows: n " << c.n << " ldx " << ldx;
    if (!c.in_place) cudaFree(dy);
    cudaFree(dx);
    cudaFree(dw);
  }
}

// glue::rmsnorm_rope_encode (one launch) against the three calls it replaces (rmsnorm_rows, heads_norm_rope on
// one head, kv_encode): the same y and the same pool bytes, bit for bit, for f32 / bf16 / fp8 rows; a dim the
// fused kernel does not take (not a multiple of 4) goes through the three calls itself.
TEST(GlueNormRope, KvTailMatchesThreeLaunches) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Case { int dim, fmt, rope; };
  for (const Case c : {Case{512, 2, 64}, Case{512, 1, 64}, Case{512, 0, 64}, Case{128, 2, 64}, Case{130, 1, 2}}) {
    SCOPED_TRACE("dim " + std::to_string(c.dim) + " fmt " + std::to_string(c.fmt));
    const int T = 3, n_freq = c.rope / 2;
    const int64_t ldx = c.dim % 4 ? c.dim : 3 * c.dim;  // the stacked [q_lora | kv] rows when it can
    const int64_t row_bytes = c.fmt == 0 ? 4 * c.dim : c.fmt == 1 ? 2 * c.dim : 512 + 64 + 16;
    const int rows = 8;
    std::vector<float> x(T * ldx), w(c.dim), inv(n_freq);
    for (float& v : x) v = 3.0f * nd(rng);
    for (float& v : w) v = 1.0f + 0.3f * nd(rng);
    for (int i = 0; i < n_freq; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / c.rope);
    const std::vector<int64_t> pos = {5, 1000, 77777}, row_index = {6, 0, 3};
    int64_t* dpos = upload(pos);
    int64_t* drow = upload(row_index);
    float *dx = upload(x), *dw = upload(w), *dinv = upload(inv);
    std::vector<float> got_y[2];
    std::vector<uint8_t> got_pool[2];
    for (int fused = 0; fused < 2; ++fused) {
      const std::vector<float> ypoison(T * c.dim, NAN);
      const std::vector<uint8_t> ppoison(rows * row_bytes, 0xAB);
      float* dy = upload(ypoison);
      uint8_t* dpool = upload(ppoison);
      const float* xin = dx + (ldx == c.dim ? 0 : c.dim);  // the kv part of the stacked row
      if (fused) {
        glue::rmsnorm_rope_encode(xin, ldx, dw, T, c.dim, 1e-6f, dy, dpos, dinv, n_freq, c.fmt, c.rope, 64, dpool,
                                  row_bytes, drow, nullptr);
      } else {
        glue::rmsnorm_rows(xin, ldx, dw, T, c.dim, 1e-6f, dy, c.dim, nullptr);
        glue::heads_norm_rope(dy, T, 1, c.dim, dpos, dinv, n_freq, false, 1e-6f, false, nullptr);
        glue::kv_encode(dy, T, c.dim, c.fmt, c.rope, 64, dpool, row_bytes, drow, nullptr);
      }
      cuda::check(cudaDeviceSynchronize(), "sync");
      got_y[fused].resize(T * c.dim);
      got_pool[fused].resize(rows * row_bytes);
      cuda::check(cudaMemcpy(got_y[fused].data(), dy, got_y[fused].size() * 4, cudaMemcpyDeviceToHost), "y");
      cuda::check(cudaMemcpy(got_pool[fused].data(), dpool, got_pool[fused].size(), cudaMemcpyDeviceToHost), "pool");
      cudaFree(dy);
      cudaFree(dpool);
    }
    EXPECT_EQ(0, std::memcmp(got_y[0].data(), got_y[1].data(), got_y[0].size() * 4)) << "y differs";
    EXPECT_EQ(got_pool[0], got_pool[1]) << "pool rows differ";
    int written = 0;
    for (int r : {0, 3, 6}) written += got_pool[1][r * row_bytes] != 0xAB || got_pool[1][r * row_bytes + 1] != 0xAB;
    EXPECT_EQ(written, 3) << "a token's pool row was not written";
    cudaFree(dpos), cudaFree(drow), cudaFree(dx), cudaFree(dw), cudaFree(dinv);
  }
}

// Random attention inputs on the device for the epilogue test: kRows KV rows (bf16 or f32), q [T, 64, 512]
// (0.1 N(0, 1)), kSlots slots per query in -1 ..
// kRows - 1, positions up to 200000, an output and 16-bit copy buffer, the split workspace.
struct AttnInputs {
  static constexpr int kRows = 300, kSlots = 200;
  std::vector<float> q;
  uint8_t* kv = nullptr;
  float* q_dev = nullptr;
  int32_t* slots = nullptr;
  int64_t* pos = nullptr;
  float* out = nullptr;
  uint16_t* out16 = nullptr;
  void* ws = nullptr;
  int64_t row_bytes = 0;
  AttnInputs(std::mt19937_64& rng, int T, cuda::KvRowFormat fmt) {
    constexpr int H = cuda::kAttnHeads, D = cuda::kAttnDim;
    std::normal_distribution<float> nd(0.f, 1.f);
    const bool f32 = fmt == cuda::KvRowFormat::kF32;
    row_bytes = f32 ? 4 * D : 2 * D;
    std::vector<uint8_t> rows(kRows * row_bytes);
    for (int64_t r = 0; r < kRows; ++r)
      for (int d = 0; d < D; ++d) {
        const float v = 0.5f * nd(rng);
        if (f32) std::memcpy(&rows[r * row_bytes + 4 * d], &v, 4);
        else {
          const uint16_t b = f32_to_bf16(v);
          std::memcpy(&rows[r * row_bytes + 2 * d], &b, 2);
        }
      }
    q.resize(static_cast<size_t>(T) * H * D);
    for (float& v : q) v = 0.1f * nd(rng);
    std::vector<int32_t> sl(static_cast<size_t>(T) * kSlots);
    std::uniform_int_distribution<int> sd(-1, kRows - 1);
    for (int32_t& v : sl) v = sd(rng);
    std::vector<int64_t> p(T);
    std::uniform_int_distribution<int64_t> pd(0, 200000);
    for (int64_t& v : p) v = pd(rng);
    kv = upload(rows), q_dev = upload(q), slots = upload(sl), pos = upload(p);
    EXPECT_EQ(cudaMalloc(&out, q.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out16, q.size() * sizeof(uint16_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&ws, std::max<size_t>(16, cuda::sparse_attention_workspace_bytes(T, kSlots))), cudaSuccess);
  }
  ~AttnInputs() { cudaFree(kv), cudaFree(q_dev), cudaFree(slots), cudaFree(pos), cudaFree(out), cudaFree(out16), cudaFree(ws); }
  AttnInputs(const AttnInputs&) = delete;
  AttnInputs& operator=(const AttnInputs&) = delete;
  cuda::SparseAttentionArgs args(int T, cuda::KvRowFormat fmt, cuda::AttnPrecision prec, const float* sink) const {
    cuda::SparseAttentionArgs a;
    a.q = q_dev, a.kv = kv, a.n_rows = kRows, a.row_bytes = row_bytes, a.format = fmt, a.slots = slots;
    a.n_slots = kSlots, a.sink = sink, a.scale = 1.0f / std::sqrt(static_cast<float>(cuda::kAttnDim)), a.out = out;
    a.n_queries = T, a.workspace = ws, a.precision = prec;
    return a;
  }
};

// cuda::sparse_attention's output epilogue (inverse RoPE of the last 2 * n_freq dims per head, 16-bit copy)
// against the same attention without it followed by glue::heads_norm_rope(inverse, copy), bit for bit: in the
// split combine (few queries) and in the epilogue-only kernel (80 queries: one split), bf16 and f32 rows,
// both precisions, bf16 / f16 / no copy, no rotation. Outputs NaN-poisoned before every launch.
TEST(GlueAttention, RopeEpilogueMatchesSeparateLaunch) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.f, 1.f);
  constexpr int H = cuda::kAttnHeads, D = cuda::kAttnDim, n_freq = 32;
  std::vector<float> inv(n_freq), sink(H);
  for (int i = 0; i < n_freq; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / (2 * n_freq));
  for (float& v : sink) v = nd(rng);
  float* dinv = upload(inv);
  float* dsink = upload(sink);
  struct Case { int T; cuda::KvRowFormat fmt; cuda::AttnPrecision prec; bool rope; int copy; };  // copy: 0 none, 1 bf16, 2 f16
  const Case cases[] = {{1, cuda::KvRowFormat::kBF16, cuda::AttnPrecision::kSplitBf16, true, 2},
                        {5, cuda::KvRowFormat::kBF16, cuda::AttnPrecision::kSplitBf16, true, 1},
                        {80, cuda::KvRowFormat::kBF16, cuda::AttnPrecision::kSplitBf16, true, 2},
                        {3, cuda::KvRowFormat::kF32, cuda::AttnPrecision::kFp32, true, 1},
                        {80, cuda::KvRowFormat::kF32, cuda::AttnPrecision::kFp32, true, 0},
                        {2, cuda::KvRowFormat::kBF16, cuda::AttnPrecision::kFp32, false, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " fmt " + std::to_string(int(c.fmt)) + " rope " +
                 std::to_string(c.rope) + " copy " + std::to_string(c.copy));
    const AttnInputs in(rng, c.T, c.fmt);
    const cuda::SparseAttentionArgs a = in.args(c.T, c.fmt, c.prec, dsink);
    float* dout = in.out;
    uint16_t* d16 = in.out16;
    int64_t* dpos = in.pos;
    const size_t n_out = in.q.size();
    uint16_t* copy = c.copy ? d16 : nullptr;
    std::vector<float> out_sep(n_out), out_fused(n_out);
    std::vector<uint16_t> c_sep(n_out), c_fused(n_out);
    for (int fused = 0; fused < 2; ++fused) {
      ASSERT_EQ(cudaMemset(dout, 0xff, n_out * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(d16, 0xff, n_out * sizeof(uint16_t)), cudaSuccess);
      cuda::SparseAttentionArgs b = a;
      if (fused) {
        if (c.rope) b.rope_pos = dpos, b.rope_inv_freq = dinv, b.rope_n_freq = n_freq;
        b.out16 = copy, b.out16_f16 = c.copy == 2;
        cuda::sparse_attention(b, nullptr);
      } else {
        cuda::sparse_attention(b, nullptr);
        glue::heads_norm_rope(dout, c.T, H, D, dpos, dinv, c.rope ? n_freq : 0, false, 0.f, true, nullptr, copy,
                              c.copy == 2);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy((fused ? out_fused : out_sep).data(), dout, n_out * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy((fused ? c_fused : c_sep).data(), d16, n_out * sizeof(uint16_t), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    size_t non_finite = 0;
    for (float v : out_fused) non_finite += !std::isfinite(v);
    EXPECT_EQ(non_finite, 0u) << "unwritten outputs";
    EXPECT_TRUE(same_bits(out_sep, out_fused)) << "fused out differs from attention + heads_norm_rope";
    EXPECT_EQ(0, std::memcmp(c_sep.data(), c_fused.data(), n_out * sizeof(uint16_t))) << "16-bit copies differ";
    if (!c.copy) {
      EXPECT_EQ(c_fused[0], 0xffffu) << "a copy was written without out16";
    }
    if (&c == &cases[0]) {  // the epilogue's argument checks
      cuda::SparseAttentionArgs b = a;
      b.rope_pos = dpos, b.rope_inv_freq = dinv, b.rope_n_freq = 3;
      EXPECT_THROW(cuda::sparse_attention(b, nullptr), std::exception) << "odd rope_n_freq";
      b.rope_n_freq = n_freq, b.out16 = d16 + 1;
      EXPECT_THROW(cuda::sparse_attention(b, nullptr), std::exception) << "misaligned out16";
    }
  }
  cudaFree(dinv), cudaFree(dsink);
}

// glue::act_quant_rows (GpuOptions::act_quant) bit for bit against core/numerics act_quant_e4m3 on every row:
// fresh normal rows with a spread of magnitudes, and adversarial blocks: all zeros (the 1e-4 floor), e4m3
// midpoints at scale 1 (ties to the even code), amax exactly 448 * 2^k and just above it (the scale's ceil),
// values far below the scale (e4m3 subnormals and flush to zero), a NaN (ignored by the amax, NaN out), and a
// last block shorter than 128 (cols = 300). Outputs strided and poisoned: columns >= cols must stay NaN. The
// bf16 copy must hold the same values exactly; in place (y == x) gives the same bits; rows above 65535 (the
// grid's y limit) take several launches.
TEST(GlueActQuant, MatchesCpuBitwise) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 12, cols = 300, ldx = 320, ldy = 352;
  std::vector<float> x(rows * ldx, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, static_cast<int>(r) * 3 - 12);  // 2^-12 .. 2^21
    for (int64_t k = 0; k < ldx; ++k) x[r * ldx + k] = nd(rng) * mag;
  }
  float* r0 = x.data();  // adversarial blocks of row 0 (block 0: zeros; block 1: midpoints; block 2: partial)
  for (int k = 0; k < 128; ++k) r0[k] = 0.0f;
  const float codes[] = {1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 2.0f, 2.25f, 0.015625f, 0.017578125f};
  for (int k = 0; k < 128; ++k) r0[128 + k] = k % 2 ? (codes[k % 8] + codes[k % 8 + 1]) / 2 : -codes[k % 8];
  r0[128 + 5] = 448.0f;  // amax 448: scale 2^0, the midpoints above round to even at that scale
  float* r1 = x.data() + ldx;  // row 1: amax exactly 448 * 2^3, then just above 448 * 2^-2, then a NaN
  r1[7] = 448.0f * 8.0f;
  r1[128 + 9] = std::nextafter(448.0f / 4.0f, 1e9f);
  r1[256 + 3] = std::numeric_limits<float>::quiet_NaN();
  float* r2 = x.data() + 2 * ldx;  // row 2: one large value over tiny ones (subnormal e4m3 codes and zeros)
  r2[0] = 3.0e4f;
  for (int k = 1; k < 128; ++k) r2[k] = std::ldexp(1.0f, -(k % 24)) * (k % 3 ? 1.0f : -1.0f);

  std::vector<float> want(rows * ldy, std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < rows; ++r) act_quant_e4m3(x.data() + r * ldx, cols, 128, want.data() + r * ldy);
  float* dx = upload(x);
  float* dy = upload(std::vector<float>(rows * ldy, std::numeric_limits<float>::quiet_NaN()));
  uint16_t* dyb = upload(std::vector<uint16_t>(rows * ldy, 0x7fc1));
  glue::act_quant_rows(dx, ldx, rows, cols, dy, ldy, dyb, ldy, nullptr);
  cuda::check(cudaDeviceSynchronize(), "act_quant_rows");
  std::vector<float> got(rows * ldy);
  std::vector<uint16_t> gotb(rows * ldy);
  cuda::check(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost), "copy");
  cuda::check(cudaMemcpy(gotb.data(), dyb, gotb.size() * 2, cudaMemcpyDeviceToHost), "copy");
  int64_t differ = 0, differ_b = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < ldy; ++k) {
      const float w = want[r * ldy + k], g = got[r * ldy + k];
      const bool same = std::memcmp(&w, &g, 4) == 0 || (std::isnan(w) && std::isnan(g));
      if (!same && differ++ < 5) ADD_FAILURE() << "row " << r << " col " << k << ": got " << g << " want " << w;
      const uint16_t b = gotb[r * ldy + k];
      const bool same_b = k >= cols ? b == 0x7fc1 : (std::isnan(w) ? (b & 0x7fff) > 0x7f80 : b == f32_to_bf16(w));
      if (!same_b && differ_b++ < 5) ADD_FAILURE() << "bf16 row " << r << " col " << k << ": got " << b;
    }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(differ_b, 0);
  // In place: the fp32 output over its own input.
  glue::act_quant_rows(dx, ldx, rows, cols, dx, ldx, nullptr, 0, nullptr);
  std::vector<float> inplace(rows * ldx);
  cuda::check(cudaMemcpy(inplace.data(), dx, inplace.size() * 4, cudaMemcpyDeviceToHost), "copy");
  int64_t differ_in = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < ldx; ++k) {
      const float w = k < cols ? want[r * ldy + k] : x[r * ldx + k], g = inplace[r * ldx + k];
      if (!(std::memcmp(&w, &g, 4) == 0 || (std::isnan(w) && std::isnan(g)))) ++differ_in;
    }
  EXPECT_EQ(differ_in, 0) << "in place";
  // 70000 rows of one block (two launches): the last row too.
  const int64_t many = 70000;
  std::vector<float> xm(many * 128);
  for (float& v : xm) v = nd(rng);
  float* dxm = upload(xm);
  float* dym = upload(std::vector<float>(many * 128, std::numeric_limits<float>::quiet_NaN()));
  glue::act_quant_rows(dxm, 128, many, 128, dym, 128, nullptr, 0, nullptr);
  std::vector<float> gotm(many * 128), wantm(many * 128);
  cuda::check(cudaMemcpy(gotm.data(), dym, gotm.size() * 4, cudaMemcpyDeviceToHost), "copy");
  act_quant_e4m3(xm.data(), many * 128, 128, wantm.data());  // blocks of 128 = rows of 128
  EXPECT_TRUE(same_bits(gotm, wantm)) << "70000 rows";
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dy), static_cast<void*>(dyb), static_cast<void*>(dxm),
                  static_cast<void*>(dym)})
    cudaFree(p);
}

}  // namespace
}  // namespace dsv4
