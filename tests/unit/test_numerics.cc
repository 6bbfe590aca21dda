// Scalar formats against independent implementations: torch's float8_e4m3fn, float8_e8m0fnu and bfloat16
// casts, and transformers' MXFP4 decoder (fixtures from tools/golden/make_numerics.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear.h"
#include "core/numerics.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using testing::fixture;
using testing::read_file;

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(Numerics, Fp8E4M3DecodeMatchesTorchForAll256Codes) {
  auto want = read_file<float>(fixture("numerics/fp8_e4m3_decode.f32"));
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same_float(fp8_e4m3_to_f32(static_cast<uint8_t>(c)), want[c])) << "code " << c;
}

TEST(Numerics, E8M0DecodeMatchesTorchForAll256Codes) {
  auto want = read_file<float>(fixture("numerics/e8m0_decode.f32"));
  for (int c = 0; c < 256; ++c) EXPECT_TRUE(same_float(e8m0_to_f32(static_cast<uint8_t>(c)), want[c])) << "code " << c;
}

TEST(Numerics, Fp8E4M3EncodeMatchesTorchIncludingTiesAndSubnormals) {
  auto in = read_file<float>(fixture("numerics/fp8_encode_in.f32"));
  auto want = read_file<uint8_t>(fixture("numerics/fp8_encode_out.u8"));
  ASSERT_EQ(in.size(), want.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(f32_to_fp8_e4m3(in[i]), want[i]) << "value " << in[i] << " (index " << i << ")";
}

TEST(Numerics, Bf16EncodeMatchesTorchIncludingTies) {
  auto in = read_file<float>(fixture("numerics/bf16_encode_in.f32"));
  auto want = read_file<int16_t>(fixture("numerics/bf16_encode_out.i16"));
  ASSERT_EQ(in.size(), want.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(f32_to_bf16(in[i]), static_cast<uint16_t>(want[i])) << "value " << in[i];
}

// Also pins the nibble order: element 2j sits in the low nibble of byte j.
// IEEE binary16 (the GPU GEMVs' f16 activations): every finite code round-trips, and the encoder rounds to
// nearest even at normal, subnormal and overflow boundaries (values computed by hand from the format).
TEST(Numerics, F16EncodeDecode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "code " << h;
  }
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);   // below the midpoint to 2^16
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);   // the midpoint rounds to even: inf
  EXPECT_EQ(f32_to_f16(-1e6f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);              // half the smallest subnormal: even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);              // 0.75 ulp: up
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);              // 1.5 ulp: even (2)
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);       // tie: even
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);       // tie: even (up)
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);           // subnormal rounds up to the first normal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(Numerics, Fp4DequantMatchesTransformersMxfp4Decoder) {
  auto packed = read_file<uint8_t>(fixture("numerics/fp4_packed.u8"));
  auto scales = read_file<uint8_t>(fixture("numerics/fp4_scales.u8"));
  auto want = read_file<float>(fixture("numerics/fp4_decode.f32"));
  const int rows = 8, cols = 128;
  ASSERT_EQ(want.size(), static_cast<size_t>(rows * cols));
  LinearWeight w;
  w.name = "fp4 fixture";
  w.fmt = WeightFormat::kFP4;
  w.rows = rows;
  w.cols = cols;
  w.w = packed.data();
  w.scale = scales.data();
  std::vector<float> row(cols);
  for (int r = 0; r < rows; ++r) {
    cpu::dequant_row(w, r, row.data());
    for (int c = 0; c < cols; ++c) ASSERT_EQ(row[c], want[r * cols + c]) << "row " << r << " col " << c;
  }
}

TEST(Numerics, Fp8BlockDequantUsesTheTileScale) {
  // 3 x 200 weight, block 128: scale tiles [1 x 2]; the second tile covers columns 128..199.
  std::vector<uint8_t> codes(3 * 200, 0x38);  // 1.0
  std::vector<uint8_t> sc = {127 + 2, 127 - 3};
  LinearWeight w;
  w.fmt = WeightFormat::kFP8Block;
  w.rows = 3;
  w.cols = 200;
  w.w = codes.data();
  w.scale = sc.data();
  std::vector<float> row(200);
  cpu::dequant_row(w, 2, row.data());
  EXPECT_EQ(row[0], 4.0f);
  EXPECT_EQ(row[127], 4.0f);
  EXPECT_EQ(row[128], 0.125f);
  EXPECT_EQ(row[199], 0.125f);
}

// act_quant (spec 3.3): per block of 128, scale 2^ceil(log2(max(amax, 1e-4) / 448)), codes to e4m3 with round to
// nearest even, dequantized again. Checked against a brute-force nearest-e4m3 search (ties to the even code)
// with the scale computed independently, and on hand-picked cases.
TEST(Numerics, ActQuantE4m3PerBlockOf128) {
  const float* tab = fp8_e4m3_table();
  auto nearest = [&](double v) {  // the e4m3 value nearest to v (ties: even code), |v| <= 448
    int best = 0;
    for (int c = 0; c < 256; ++c) {
      if (std::isnan(tab[c])) continue;
      const double d = std::fabs(tab[c] - v), db = std::fabs(tab[best] - v);
      if (d < db || (d == db && (c & 1) == 0 && (best & 1) == 1)) best = c;
    }
    return static_cast<double>(tab[best]);
  };
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(130 + 128), out(x.size(), NAN);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i < 128 ? 3.0f : i < 256 ? 1e-3f : 1e-7f);
  x[5] = -7.5f;  // the first block's amax
  act_quant_e4m3(x.data(), static_cast<int64_t>(x.size()), 128, out.data());
  for (size_t b = 0; b < x.size(); b += 128) {
    const size_t e = std::min(x.size(), b + 128);
    double amax = 1e-4;
    for (size_t i = b; i < e; ++i) amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
    const double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<float>(amax) / 448.0f))));
    for (size_t i = b; i < e; ++i)
      ASSERT_EQ(static_cast<double>(out[i]), nearest(x[i] / scale) * scale) << "element " << i << " block " << b / 128;
  }
  // amax 7.5 -> scale 2^ceil(log2(7.5 / 448)) = 2^-5; 7.5 / 2^-5 = 240 is an e4m3 value.
  EXPECT_EQ(out[5], -7.5f);
  // The last block holds two values of ~1e-7: amax floored at 1e-4, scale 2^-22, both far below one code step
  // of the largest codes but representable as e4m3 subnormals times 2^-22.
  EXPECT_EQ(e4m3_block_exponent(x.data() + 256, 2), -22);
  float one[2] = {1.0f + 0.03125f, 1.0f}, q[2];
  act_quant_e4m3(one, 2, 128, q);  // amax 1.03 -> scale 2^-8: 264 lies between e4m3 256 and 288 -> 256
  EXPECT_EQ(q[0], 1.0f);
  EXPECT_EQ(q[1], 1.0f);
}

// A linear with LinearWeight::act = kE4m3 (act_quant) or kBf16 equals the plain linear on activations so
// quantized or rounded, bit for bit, and BF16 weights ignore the setting.
TEST(Numerics, LinearActInputTransformsTheActivationsOnly) {
  using A = LinearWeight::ActInput;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int64_t rows = 16, cols = 256, T = 3, ld = 300;
  std::vector<uint8_t> codes(rows * cols), sc = {125, 130};
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 0x7E);
  std::vector<float> x(T * ld), xq(T * cols), y1(T * rows), y2(T * rows), plain(T * rows);
  for (auto& v : x) v = nd(rng);
  LinearWeight w;
  w.fmt = WeightFormat::kFP8Block;
  w.rows = rows;
  w.cols = cols;
  w.w = codes.data();
  w.scale = sc.data();
  cpu::linear_rows(w, 0, rows, x.data(), T, ld, plain.data(), rows);
  for (A mode : {A::kE4m3, A::kBf16}) {
    SCOPED_TRACE(mode == A::kE4m3 ? "e4m3 (act_quant)" : "bf16");
    for (int64_t t = 0; t < T; ++t) {
      if (mode == A::kE4m3) act_quant_e4m3(x.data() + t * ld, cols, 128, xq.data() + t * cols);
      else
        for (int64_t k = 0; k < cols; ++k) xq[t * cols + k] = round_bf16(x[t * ld + k]);
    }
    w.act = mode;
    cpu::linear_rows(w, 0, rows, x.data(), T, ld, y1.data(), rows);
    w.act = A::kF32;
    cpu::linear_rows(w, 0, rows, xq.data(), T, cols, y2.data(), rows);
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)));
    EXPECT_NE(0, std::memcmp(y1.data(), plain.data(), y1.size() * sizeof(float))) << "the mode changed nothing";
  }
  std::vector<uint16_t> wb(rows * cols);
  for (auto& v : wb) v = f32_to_bf16(nd(rng));
  LinearWeight b;
  b.fmt = WeightFormat::kBF16;
  b.rows = rows;
  b.cols = cols;
  b.w = reinterpret_cast<const uint8_t*>(wb.data());
  cpu::linear_rows(b, 0, rows, x.data(), T, ld, y2.data(), rows);
  for (A mode : {A::kE4m3, A::kBf16}) {
    b.act = mode;
    cpu::linear_rows(b, 0, rows, x.data(), T, ld, y1.data(), rows);
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float))) << "BF16 weights must ignore act";
  }
}

}  // namespace
}  // namespace dsv4
