// Prefill path: dequant_to_bf16 must reproduce the CPU dequantization bit for bit (every FP8 and MXFP4
// value times its power-of-two scale is a bf16 value), and gemm_bf16 (cuBLAS, fp32 accumulation) must match
// the float64 product within fp32 summation error (norm 1e-4, elementwise (K+8) 2^-23 sum|x w|); the
// router's fp32 GEMM (gemm_f32) the same.
#include <tuple>

#include "linear_test_util.h"

namespace dsv4 {
namespace {

using namespace lintest;

// Where the activations and outputs sit: packed (the defaults), or column blocks of wider rows (row
// strides ldx / ldy, offsets x_off / y_off) as the grouped output projection uses them.
struct Layout {
  int64_t ldx = 0, x_off = 0, ldy = 0, y_off = 0;
};

void run_case(bool fp4, int64_t M, int64_t rows, int64_t cols, uint64_t salt, Layout lay = {}) {
  const bool packed = lay.ldx == 0;
  const int64_t ldx = packed ? cols : lay.ldx, ldy = packed ? rows : lay.ldy;
  SCOPED_TRACE(::testing::Message() << (fp4 ? "fp4" : "fp8") << " M " << M << " W [" << rows << ", " << cols
                                    << "] ldx " << ldx << " ldy " << ldy);
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  HostWeight h = fp4 ? random_fp4(rng, rows, cols, 115, 130) : random_fp8(rng, rows, cols, 115, 130, false);
  bind(h);
  const std::vector<float> W = dequant(h.view);
  DevBuf<uint8_t> dw(h.w), ds(h.s);
  cudalin::DevWeight dev{h.view.fmt, rows, cols, dw.p, ds.p, false};
  DevBuf<uint16_t> wb(size_t(rows) * cols);
  wb.poison();
  cudalin::dequant_to_bf16(dev, wb.p, nullptr);
  std::vector<float> xf_wide;
  std::vector<uint16_t> xb_wide;
  random_bf16(rng, size_t(M) * ldx, xf_wide, xb_wide);
  DevBuf<uint16_t> dx(xb_wide);
  DevBuf<float> dy(size_t(M) * ldy);
  dy.poison();
  if (packed) cudalin::gemm_bf16(dx.p, M, wb.p, rows, cols, dy.p, nullptr);
  else cudalin::gemm_bf16(dx.p + lay.x_off, ldx, M, wb.p, rows, cols, dy.p + lay.y_off, ldy, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> wgot = wb.download();
  int64_t mismatches = 0;
  for (size_t i = 0; i < W.size(); ++i) mismatches += wgot[i] != f32_to_bf16(W[i]) || round_bf16(W[i]) != W[i];
  EXPECT_EQ(mismatches, 0) << "dequantized weights differ from the CPU reference";
  std::vector<float> xf(size_t(M) * cols);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t k = 0; k < cols; ++k) xf[t * cols + k] = xf_wide[t * ldx + lay.x_off + k];
  std::vector<double> ref, abs;
  ref_gemm(W, rows, cols, xf, static_cast<int>(M), ref, abs);
  const std::vector<float> wide = dy.download();
  std::vector<float> got(size_t(M) * rows);
  int64_t touched = 0;
  for (int64_t t = 0; t < M; ++t)
    for (int64_t c = 0; c < ldy; ++c) {
      const float v = wide[t * ldy + c];
      if (c >= lay.y_off && c < lay.y_off + rows) got[t * rows + c - lay.y_off] = v;
      else touched += !std::isnan(v);  // poison is 0xFFFFFFFF, a NaN
    }
  EXPECT_EQ(touched, 0) << "elements outside the output block were written";
  const ErrStats e = compare(got, ref, abs);
  std::printf("prefill %s M=%lld [%lld,%lld] ldx %lld ldy %lld: rel_norm %.3g worst/abs %.3g\n", fp4 ? "fp4" : "fp8",
              (long long)M, (long long)rows, (long long)cols, (long long)ldx, (long long)ldy, e.rel_norm, e.worst);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_norm, 1e-4);
  EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -23));
}

TEST(CudaPrefill, Fp8) {
  DSV4_REQUIRE_GPU();
  run_case(false, 200, 512, 1024, 1);
}

// The strided form: x a column block of a wider bf16 activation, y a column block of a wider output; the
// gaps around the block must keep their poison.
TEST(CudaPrefill, StridedBlocks) {
  DSV4_REQUIRE_GPU();
  run_case(false, 97, 256, 512, 77, Layout{1536, 512, 1024, 384});
}

TEST(CudaPrefill, Mxfp4) {
  DSV4_REQUIRE_GPU();
  run_case(true, 130, 384, 2048, 2);
}

// The router's fp32 path (widen_bf16_to_f32 + gemm_f32): the widened weight is the bf16 value exactly, every
// element written (poisoned before); the product of fp32 activations (not rounded to 16 bits) matches float64
// within fp32 summation error (norm: ~2^-24 sqrt(K) ~ 3e-6 at K = 4096, bound 2e-5; a TF32 GEMM's 10-bit
// mantissas give ~2^-11 ~ 5e-4, so the bound tells them apart).
// Shapes: V4-Flash's router (256 x 4096) at a 130-token step, and an odd one.
TEST(CudaPrefill, F32GemmOfWidenedBf16Weight) {
  DSV4_REQUIRE_GPU();
  for (auto [M, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{130, 256, 4096}, {67, 33, 520}}) {
    SCOPED_TRACE(::testing::Message() << "M " << M << " W [" << rows << ", " << cols << "]");
    std::mt19937_64 rng(seed() ^ static_cast<uint64_t>(rows * 7919 + cols));
    std::vector<float> W;
    std::vector<uint16_t> wb;
    random_bf16(rng, size_t(rows) * cols, W, wb);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(size_t(M) * cols);
    for (float& v : x) v = nd(rng);  // full fp32 mantissas
    DevBuf<uint16_t> dwb(wb);
    DevBuf<float> dwf(size_t(rows) * cols), dx(x), dy(size_t(M) * rows);
    dwf.poison();
    dy.poison();
    cudalin::widen_bf16_to_f32(dwb.p, dwf.p, rows * cols, nullptr);
    cudalin::gemm_f32(dx.p, M, dwf.p, rows, cols, dy.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> wf = dwf.download();
    int64_t mismatches = 0;
    for (size_t i = 0; i < W.size(); ++i) mismatches += std::memcmp(&wf[i], &W[i], 4) != 0;
    EXPECT_EQ(mismatches, 0) << "widened weights differ from the bf16 values";
    std::vector<double> ref, abs;
    ref_gemm(W, rows, cols, x, static_cast<int>(M), ref, abs);
    const ErrStats e = compare(dy.download(), ref, abs);
    std::printf("gemm_f32 M=%lld [%lld,%lld]: rel_norm %.3g worst/abs %.3g\n", (long long)M, (long long)rows,
                (long long)cols, e.rel_norm, e.worst);
    EXPECT_EQ(e.non_finite, 0);
    EXPECT_LE(e.rel_norm, 2e-5);
    EXPECT_LE(e.worst, (cols + 8) * std::ldexp(1.0, -24));
  }
}

}  // namespace
}  // namespace dsv4
