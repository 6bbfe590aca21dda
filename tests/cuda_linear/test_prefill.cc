// Prefill path: dequant_to_bf16 must reproduce the CPU dequantization bit for bit (every FP8 and MXFP4
// value times its power-of-two scale is a bf16 value), and gemm_bf16 (cuBLAS, fp32 accumulation) must match
// the float64 product within fp32 summation error (norm 1e-4, elementwise (K+8) 2^-23 sum|x w|).
#include "linear_test_util.h"

namespace dsv4 {
namespace {

using namespace lintest;

void run_case(bool fp4, int64_t M, int64_t rows, int64_t cols, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << (fp4 ? "fp4" : "fp8") << " M " << M << " W [" << rows << ", " << cols << "]");
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  HostWeight h = fp4 ? random_fp4(rng, rows, cols, 115, 130) : random_fp8(rng, rows, cols, 115, 130, false);
  bind(h);
  const std::vector<float> W = dequant(h.view);
  DevBuf<uint8_t> dw(h.w), ds(h.s);
  cudalin::DevWeight dev{h.view.fmt, rows, cols, dw.p, ds.p, false};
  DevBuf<uint16_t> wb(size_t(rows) * cols);
  wb.poison();
  cudalin::dequant_to_bf16(dev, wb.p, nullptr);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  random_bf16(rng, size_t(M) * cols, xf, xb);
  DevBuf<uint16_t> dx(xb);
  DevBuf<float> dy(size_t(M) * rows);
  dy.poison();
  cudalin::gemm_bf16(dx.p, M, wb.p, rows, cols, dy.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> wgot = wb.download();
  int64_t mismatches = 0;
  for (size_t i = 0; i < W.size(); ++i) mismatches += wgot[i] != f32_to_bf16(W[i]) || round_bf16(W[i]) != W[i];
  EXPECT_EQ(mismatches, 0) << "dequantized weights differ from the CPU reference";
  std::vector<double> ref, abs;
  ref_gemm(W, rows, cols, xf, static_cast<int>(M), ref, abs);
  const ErrStats e = compare(dy.download(), ref, abs);
  std::printf("prefill %s M=%lld [%lld,%lld]: rel_norm %.3g worst/abs %.3g\n", fp4 ? "fp4" : "fp8", (long long)M,
              (long long)rows, (long long)cols, e.rel_norm, e.worst);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_norm, 1e-4);
  EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -23));
}

TEST(CudaPrefill, Fp8) {
  DSV4_REQUIRE_GPU();
  run_case(false, 200, 512, 1024, 1);
}

// The strided form: x a column block of a wider bf16 activation (row stride ldx), y a column block of a
// wider output (row stride ldy); the gaps around the block must keep their poison.
TEST(CudaPrefill, StridedBlocks) {
  DSV4_REQUIRE_GPU();
  std::mt19937_64 rng(seed() ^ 77);
  const int64_t M = 97, rows = 256, cols = 512, ldx = 1536, x_off = 512, ldy = 1024, y_off = 384;
  HostWeight h = random_fp8(rng, rows, cols, 115, 130, false);
  bind(h);
  const std::vector<float> W = dequant(h.view);
  DevBuf<uint8_t> dw(h.w), ds(h.s);
  cudalin::DevWeight dev{h.view.fmt, rows, cols, dw.p, ds.p, false};
  DevBuf<uint16_t> wb(size_t(rows) * cols);
  cudalin::dequant_to_bf16(dev, wb.p, nullptr);
  std::vector<float> xf_wide;
  std::vector<uint16_t> xb_wide;
  random_bf16(rng, size_t(M) * ldx, xf_wide, xb_wide);
  DevBuf<uint16_t> dx(xb_wide);
  DevBuf<float> dy(size_t(M) * ldy);
  dy.poison();
  cudalin::gemm_bf16(dx.p + x_off, ldx, M, wb.p, rows, cols, dy.p + y_off, ldy, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> xf(size_t(M) * cols);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t k = 0; k < cols; ++k) xf[t * cols + k] = xf_wide[t * ldx + x_off + k];
  std::vector<double> ref, abs;
  ref_gemm(W, rows, cols, xf, static_cast<int>(M), ref, abs);
  const std::vector<float> wide = dy.download();
  std::vector<float> got(size_t(M) * rows);
  int64_t touched = 0;
  for (int64_t t = 0; t < M; ++t)
    for (int64_t c = 0; c < ldy; ++c) {
      const float v = wide[t * ldy + c];
      if (c >= y_off && c < y_off + rows) got[t * rows + c - y_off] = v;
      else touched += !std::isnan(v);  // poison is 0xFFFFFFFF, a NaN
    }
  EXPECT_EQ(touched, 0) << "elements outside the output block were written";
  const ErrStats e = compare(got, ref, abs);
  std::printf("prefill strided M=%lld [%lld,%lld] ldx %lld ldy %lld: rel_norm %.3g\n", (long long)M, (long long)rows,
              (long long)cols, (long long)ldx, (long long)ldy, e.rel_norm);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_norm, 1e-4);
  EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -23));
}

TEST(CudaPrefill, Mxfp4) {
  DSV4_REQUIRE_GPU();
  run_case(true, 130, 384, 2048, 2);
}

}  // namespace
}  // namespace dsv4
