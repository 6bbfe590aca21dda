// cudalin::gemv (decode GEMM, 1..64 rows) against the CPU reference's dequantization in float64.
// Error bound: weights are exact in bf16 and bf16 x bf16 products are exact in fp32, so the GPU differs from
// the float64 sum only by fp32 summation (and, for FP8, one fp32 scale product per 128-chunk). With at most
// K+8 roundings of relative size 2^-23 (tensor cores may truncate), |err| <= (K+8) 2^-23 sum_k |x_k w_k|
// elementwise; in norm the errors are far smaller and we ask 1e-4 (the bf16 rounding of activations that
// the engine's fp32 CPU path does not do is ~1e-3, reported separately against cpu::linear). The f16
// activation path (kFp8F16) has the same bound: e4m3 weights are exact f16 values, f16 products exact in fp32.
#include "core/error.h"
#include "linear_test_util.h"

namespace dsv4 {
namespace {

using namespace lintest;

enum class Kind { kFp8, kFp8F32, kFp4, kFp8F16 };

void run_case(Kind kind, int64_t rows, int64_t cols, const std::vector<int>& Ts, uint64_t salt) {
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  HostWeight h = kind == Kind::kFp4 ? random_fp4(rng, rows, cols, 110, 140)
                                    : random_fp8(rng, rows, cols, 112, 136, kind == Kind::kFp8F32);
  bind(h);
  const bool h16 = kind == Kind::kFp8F16;
  const cudalin::ActFormat act = h16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16;
  auto random_act = [&](size_t n, std::vector<float>& f, std::vector<uint16_t>& b) {
    if (h16) random_f16(rng, n, f, b);
    else random_bf16(rng, n, f, b);
  };
  const std::vector<float> W = dequant(h.view);
  DevBuf<uint8_t> dw(h.w), ds(h.s);
  cudalin::DevWeight dev{h.view.fmt, rows, cols, dw.p, ds.p, h.view.scale_is_f32};
  cudalin::Workspace ws = cudalin::workspace_create();
  for (int T : Ts) {
    SCOPED_TRACE(::testing::Message() << "kind " << int(kind) << " W [" << rows << ", " << cols << "] T " << T);
    std::vector<float> xf;
    std::vector<uint16_t> xb;
    random_act(size_t(T) * cols, xf, xb);
    DevBuf<uint16_t> dx(xb), dy16(size_t(T) * rows);
    DevBuf<float> dy(size_t(T) * rows);
    dy.poison(), dy16.poison();
    cudalin::gemv(dev, dx.p, cols, T, dy.p, rows, ws, nullptr, act, {dy16.p, act});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = dy.download();
    const std::vector<uint16_t> got16 = dy16.download();
    for (size_t i = 0; i < got.size(); ++i)  // the 16-bit copy of y (cudalin::Out16), in the activations' format
      ASSERT_EQ(got16[i], h16 ? f32_to_f16(got[i]) : f32_to_bf16(got[i])) << "y16[" << i << "]";
    std::vector<double> ref, abs;
    ref_gemm(W, rows, cols, xf, T, ref, abs);
    const ErrStats e = compare(got, ref, abs);
    // The engine's CPU path itself (fp32 everywhere) on the same bf16-representable inputs.
    std::vector<float> cpu_y(size_t(T) * rows);
    cpu::linear(h.view, xf.data(), T, cpu_y.data());
    std::vector<double> cpu_d(cpu_y.begin(), cpu_y.end());
    const ErrStats ec = compare(got, cpu_d, abs);
    std::printf("gemv kind=%d [%lld,%lld] T=%d rel_norm=%.3g worst/abs=%.3g vs cpu::linear rel_norm=%.3g\n", int(kind),
                (long long)rows, (long long)cols, T, e.rel_norm, e.worst, ec.rel_norm);
    EXPECT_EQ(e.non_finite, 0) << "unwritten or non-finite outputs";
    EXPECT_LE(e.rel_norm, 1e-4);
    EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -23));
    EXPECT_LE(ec.rel_norm, 1e-4);
  }
  // Twice on the same inputs: the split-K reduction order is fixed, so the results are bit-identical.
  {
    const int T = 3;
    std::vector<float> xf;
    std::vector<uint16_t> xb;
    random_act(size_t(T) * cols, xf, xb);
    DevBuf<uint16_t> dx(xb);
    DevBuf<float> y1(size_t(T) * rows), y2(size_t(T) * rows);
    y1.poison(), y2.poison();
    cudalin::gemv(dev, dx.p, cols, T, y1.p, rows, ws, nullptr, act);
    cudalin::gemv(dev, dx.p, cols, T, y2.p, rows, ws, nullptr, act);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto a = y1.download(), b = y2.download();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "gemv is not deterministic";
  }
  cudalin::workspace_destroy(ws);
}

// gemv_grouped: the grouped output projection's shape (G groups of group_rows rows, group g reading the
// activation columns [g*stride, g*stride + cols)), against float64 per group, in both kernel versions.
void run_grouped(Kind kind, int64_t groups, int64_t group_rows, int64_t cols, int64_t stride, int T, uint64_t salt) {
  const bool h16 = kind == Kind::kFp8F16;
  SCOPED_TRACE(::testing::Message() << "grouped kind " << int(kind) << " G " << groups << " x [" << group_rows << ", "
                                    << cols << "] stride " << stride << " T " << T);
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  const int64_t rows = groups * group_rows, ldx = (groups - 1) * stride + cols + 8, ldy = rows + 16;
  HostWeight h = kind == Kind::kFp4 ? random_fp4(rng, rows, cols, 110, 140) : random_fp8(rng, rows, cols, 112, 136, false);
  bind(h);
  const std::vector<float> W = dequant(h.view);
  DevBuf<uint8_t> dw(h.w), ds(h.s);
  cudalin::DevWeight dev{h.view.fmt, rows, cols, dw.p, ds.p, h.view.scale_is_f32};
  cudalin::Workspace ws = cudalin::workspace_create();
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  if (h16) random_f16(rng, size_t(T) * ldx, xf, xb);
  else random_bf16(rng, size_t(T) * ldx, xf, xb);
  DevBuf<uint16_t> dx(xb);
  for (int version : {2, 1}) {
    if (h16 && version == 1) continue;  // f16 activations: v2 kernels only
    cudalin::set_linear_kernel_version(version);
    DevBuf<float> dy(size_t(T) * ldy);
    dy.poison();
    cudalin::gemv_grouped(dev, group_rows, stride, dx.p, ldx, T, dy.p, ldy, ws, nullptr,
                          h16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> wide = dy.download();
    std::vector<float> got(size_t(T) * rows);
    int64_t outside = 0;
    for (int t = 0; t < T; ++t)
      for (int64_t r = 0; r < ldy; ++r) {
        if (r < rows) got[size_t(t) * rows + r] = wide[size_t(t) * ldy + r];
        else outside += !std::isnan(wide[size_t(t) * ldy + r]);  // poison: 0xFFFFFFFF
      }
    EXPECT_EQ(outside, 0) << "wrote past the output rows";
    std::vector<double> ref(size_t(T) * rows), abs(size_t(T) * rows);
    for (int t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t g = r / group_rows;
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double p = double(xf[size_t(t) * ldx + g * stride + k]) * W[size_t(r) * cols + k];
          acc += p, mag += std::fabs(p);
        }
        ref[size_t(t) * rows + r] = acc, abs[size_t(t) * rows + r] = mag;
      }
    const ErrStats e = compare(got, ref, abs);
    std::printf("gemv_grouped v%d kind=%d G=%lld [%lld,%lld] T=%d rel_norm=%.3g worst/abs=%.3g\n", version, int(kind),
                (long long)groups, (long long)group_rows, (long long)cols, T, e.rel_norm, e.worst);
    EXPECT_EQ(e.non_finite, 0) << "unwritten or non-finite outputs (version " << version << ")";
    EXPECT_LE(e.rel_norm, 1e-4);
    EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -23));
  }
  cudalin::set_linear_kernel_version(2);
  cudalin::workspace_destroy(ws);
}

TEST(CudaGemv, Grouped) {
  DSV4_REQUIRE_GPU();
  run_grouped(Kind::kFp8, 8, 1024, 4096, 4096, 1, 21);  // V4-Flash wo_a: 8 x [1024, 4096], x = o [32768]
  run_grouped(Kind::kFp8, 8, 128, 4096, 4096, 9, 22);   // the engine test models' wo_a
  run_grouped(Kind::kFp8, 3, 16, 256, 384, 64, 23);     // one tile per group, stride above the width
  run_grouped(Kind::kFp4, 4, 64, 512, 512, 2, 24);
  run_grouped(Kind::kFp8F16, 8, 1024, 4096, 4096, 1, 26);
  run_grouped(Kind::kFp8F16, 3, 16, 256, 384, 64, 27);
  cudalin::set_gemv_ksplit(32);  // split-K across blocks (grid.y > 1) whatever the device's SM count
  run_grouped(Kind::kFp8, 8, 1024, 4096, 4096, 3, 25);
  cudalin::set_gemv_ksplit(0);
  cudalin::Workspace ws = cudalin::workspace_create();
  cudalin::DevWeight bad{WeightFormat::kFP8Block, 100 * 16, 256, nullptr, nullptr, false};
  EXPECT_THROW(cudalin::gemv_grouped(bad, 24, 256, nullptr, 4096, 1, nullptr, 1600, ws, nullptr), Error);
  cudalin::workspace_destroy(ws);
}

const std::vector<int> kTs = {1, 2, 7, 8, 9, 16, 23, 33, 64};

TEST(CudaGemv, Fp8Ue8m0) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::kFp8, 2048, 4096, kTs, 1);  // K split across blocks
  run_case(Kind::kFp8, 4096, 1024, kTs, 2);
  run_case(Kind::kFp8, 256, 512, kTs, 3);    // fewer chunks than warps
  // Short K with many row tiles: one or two warps per block (fewer than 128 threads for the 128 outputs
  // of a fragment). Regression: rows 4..15 of each tile were left unwritten (found by the GPU engine test).
  run_case(Kind::kFp8, 16384, 256, {1, 2, 9, 64}, 8);
  run_case(Kind::kFp8, 8192, 512, {1, 9}, 9);
}

// f16 activations (ActFormat::kF16): e4m3 -> f16 by cvt, f16 MMAs; the same shapes as Fp8Ue8m0.
TEST(CudaGemv, Fp8F16Activations) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::kFp8F16, 2048, 4096, kTs, 41);
  run_case(Kind::kFp8F16, 4096, 1024, kTs, 42);
  run_case(Kind::kFp8F16, 256, 512, kTs, 43);
  run_case(Kind::kFp8F16, 16384, 256, {1, 2, 9, 64}, 44);
  run_case(Kind::kFp8F16, 32768, 1024, {1, 4}, 45);  // V4-Flash wq_b
  // MXFP4 weights with f16 activations are refused with a message.
  cudalin::Workspace ws = cudalin::workspace_create(1024, 16);
  DevBuf<uint8_t> w(4096), s(512);
  DevBuf<uint16_t> x(4096);
  DevBuf<float> y(4096);
  cudalin::DevWeight fp4{WeightFormat::kFP4, 16, 256, w.p, s.p, false};
  EXPECT_THROW(cudalin::gemv(fp4, x.p, 256, 1, y.p, 16, ws, nullptr, cudalin::ActFormat::kF16), Error);
  cudalin::workspace_destroy(ws);
}

TEST(CudaGemv, Fp8F32Scales) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::kFp8F32, 1024, 2048, {1, 9, 64}, 4);
}

TEST(CudaGemv, Mxfp4) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::kFp4, 2048, 4096, kTs, 5);
  run_case(Kind::kFp4, 4096, 2048, kTs, 6);
  run_case(Kind::kFp4, 384, 1024, kTs, 7);
  run_case(Kind::kFp4, 16384, 256, {1, 2, 9, 64}, 10);  // one warp per block, as above
}

// Every K-split configuration of the v2 kernel (tiles per block 8..1, K split across 1..8 warps and across
// blocks), on shapes where the row tiles do not fill the last block (16, 48, 144 rows) and the chunks do not
// divide evenly among the splits (K = 128 .. 3072 = 1 .. 24 chunks).
TEST(CudaGemv, AllSplits) {
  DSV4_REQUIRE_GPU();
  uint64_t salt = 20;
  for (int ks : {1, 2, 4, 8, 16, 32}) {
    cudalin::set_gemv_ksplit(ks);
    run_case(Kind::kFp8, 144, 3072, {1, 9}, ++salt);
    run_case(Kind::kFp4, 48, 640, {1, 17}, ++salt);
    run_case(Kind::kFp8F32, 16, 128, {2, 33}, ++salt);
    run_case(Kind::kFp4, 272, 1152, {8, 64}, ++salt);
    run_case(Kind::kFp8F16, 144, 3072, {1, 33}, ++salt);
  }
  cudalin::set_gemv_ksplit(0);
}

// Blocks of 4 warps (set_gemv_block_warps(4); default 8): the same cases on the smaller blocks, every K split.
TEST(CudaGemv, FourWarpBlocks) {
  DSV4_REQUIRE_GPU();
  cudalin::set_gemv_block_warps(4);
  run_case(Kind::kFp8, 2048, 4096, {1, 9, 64}, 50);
  run_case(Kind::kFp8F16, 1536, 4096, {1, 4}, 51);  // wq_a + wkv
  run_case(Kind::kFp4, 384, 1024, {1, 23}, 52);
  run_case(Kind::kFp8, 16384, 256, {1, 2, 9}, 53);
  uint64_t salt = 60;
  for (int ks : {1, 2, 4, 8, 16}) {
    cudalin::set_gemv_ksplit(ks);
    run_case(Kind::kFp8, 144, 3072, {1, 9}, ++salt);
    run_case(Kind::kFp4, 48, 640, {1, 17}, ++salt);
  }
  cudalin::set_gemv_ksplit(0);
  cudalin::set_gemv_block_warps(8);
  EXPECT_THROW(cudalin::set_gemv_block_warps(5), Error);
}

// The first kernels (still the fallback for weights the cp.async path cannot take).
// Grids sized to 1/2 and 1/8 of the resident slots (set_decode_wave_div; default 1): other K splits, the same
// results within the bounds, and the refusal of a divisor outside 1..8.
TEST(CudaGemv, WaveDivisor) {
  DSV4_REQUIRE_GPU();
  uint64_t salt = 70;
  for (int div : {2, 8}) {
    cudalin::set_decode_wave_div(div);
    run_case(Kind::kFp8, 2048, 4096, {1, 9, 64}, ++salt);
    run_case(Kind::kFp8F16, 1536, 4096, {1, 4}, ++salt);
    run_case(Kind::kFp4, 384, 1024, {1, 23}, ++salt);
    run_case(Kind::kFp8, 32768, 1024, {1}, ++salt);
  }
  cudalin::set_decode_wave_div(1);
  EXPECT_THROW(cudalin::set_decode_wave_div(0), Error);
}

TEST(CudaGemv, Version1) {
  DSV4_REQUIRE_GPU();
  cudalin::set_linear_kernel_version(1);
  run_case(Kind::kFp8, 2048, 4096, {1, 9, 64}, 30);
  run_case(Kind::kFp4, 384, 1024, {1, 23}, 31);
  cudalin::set_linear_kernel_version(2);
}

TEST(CudaGemv, RejectsUnsupportedShapes) {
  DSV4_REQUIRE_GPU();
  cudalin::Workspace ws = cudalin::workspace_create(1024, 16);
  DevBuf<uint8_t> w(4096), s(64);
  DevBuf<uint16_t> x(4096);
  DevBuf<float> y(4096);
  cudalin::DevWeight bad{WeightFormat::kFP8Block, 24, 128, w.p, s.p, false};
  try {
    cudalin::gemv(bad, x.p, 128, 1, y.p, 24, ws, nullptr);
    ADD_FAILURE() << "no error for 24 rows";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[24, 128]"), std::string::npos) << e.what();
  }
  cudalin::DevWeight ok{WeightFormat::kFP8Block, 16, 128, w.p, s.p, false};
  EXPECT_THROW(cudalin::gemv(ok, x.p, 128, 65, y.p, 16, ws, nullptr), std::exception);
  cudalin::workspace_destroy(ws);
}

}  // namespace
}  // namespace dsv4
