// Register-level building blocks of the weight-streaming kernels: streaming loads, exact e4m3/e2m1 -> bf16
// conversion straight into mma.sync A fragments, and the bf16 m16n8k16 MMA.
//
// K order: a dot product does not care in which order K is visited, so each thread loads 16 contiguous
// weight bytes (one 16-byte load) and we define the fragment's logical k positions to be whatever those
// bytes hold; the activations (B fragment) are permuted the same way with byte permutes. See frag_b_*.
#pragma once
#include <cstdint>

namespace dsv4::cudalin::dev {

__device__ __forceinline__ uint4 ld_stream(const void* p) {  // read-once weights: skip L1
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 ld_act(const void* p) {  // activations: reused by many warps, keep cached
  return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// bf16x2 product a*b, exact when the result is representable (both factors here are a weight and a
// power of two). bf16 arithmetic keeps subnormals (PTX: no .ftz for bf16).
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

// ---- e4m3 -> bf16. Moving the 7 magnitude bits of e4m3 (exp 4 bits bias 7, mantissa 3) into bf16's
// exponent/mantissa fields gives a bf16 whose value is exactly 2^-120 times the e4m3 value, subnormals
// included (both formats' subnormals share the scale 2^(1-bias)). Multiplying by 2^120 is exact.
constexpr uint32_t kBf16x2_2p120 = 0x7B807B80u;  // bf16(2^120) in both halves
// bytes 0 and 2 of w -> (lo, hi) halves
__device__ __forceinline__ uint32_t e4m3_02(uint32_t w) {
  return bmul2(((w << 4) & 0x07F007F0u) | ((w << 8) & 0x80008000u), kBf16x2_2p120);
}
// bytes 1 and 3 of w
__device__ __forceinline__ uint32_t e4m3_13(uint32_t w) {
  return bmul2(((w >> 4) & 0x07F007F0u) | (w & 0x80008000u), kBf16x2_2p120);
}

// ---- e2m1 -> bf16, scale folded in. Nibble (s e1 e0 m) placed at bf16 bits 15 / 8..6 is a bf16 worth
// 2^-126 times the e2m1 value (0.5 lands on a bf16 subnormal, exactly). Register i of a word holds nibbles
// i and i+4 (16 bits apart, so one shift serves both halves).
template <int I>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w) {
  constexpr int ms = 6 - 4 * I;   // magnitude shift (negative: right)
  constexpr int ss = 12 - 4 * I;  // sign shift
  const uint32_t mag = (ms >= 0 ? (w << (ms >= 0 ? ms : 0)) : (w >> (ms < 0 ? -ms : 0))) & 0x01C001C0u;
  const uint32_t sgn = (w << ss) & 0x80008000u;
  return mag | sgn;
}
// Factors turning the 2^-126-scaled codes into code * 2^(e-127) (e = UE8M0 scale byte): f1 * f2 with
// f1 = 2^(min(e,128)-1) and, only when e > 128, f2 = 2^(e-128). e = 255 (NaN scale) gives NaN.
struct Fp4Scale {
  uint32_t f1, f2;
  bool two;
};
__device__ __forceinline__ Fp4Scale fp4_scale(uint32_t e) {
  Fp4Scale s;
  const uint32_t e1 = e < 128u ? e : 128u;
  const uint32_t h1 = (e1 + 126u) << 7;
  s.f1 = e == 255u ? 0x7FC07FC0u : (h1 | (h1 << 16));
  s.two = e > 128u && e != 255u;
  const uint32_t h2 = (e - 1u) << 7;  // 2^(e-128): exponent field e-128+127
  s.f2 = h2 | (h2 << 16);
  return s;
}
__device__ __forceinline__ uint32_t fp4_apply(uint32_t v, const Fp4Scale& s) {
  v = bmul2(v, s.f1);
  if (s.two) v = bmul2(v, s.f2);
  return v;
}

__device__ __forceinline__ float e8m0_f32(uint32_t e) {
  if (e == 0u) return __int_as_float(0x00400000);  // 2^-127 (an fp32 subnormal)
  if (e == 255u) return __int_as_float(0x7FC00000);
  return __int_as_float(static_cast<int>(e << 23));
}

// D += A*B, bf16 inputs, fp32 accumulators. Fragment layout (PTX ISA, m16n8k16): lane = 4*g + t;
// a0:(row g, k 2t..2t+1) a1:(row g+8, same k) a2:(row g, k 8+2t..) a3:(row g+8, k 8+2t..);
// b0:(k 2t.., col g) b1:(k 8+2t.., col g); d0,d1:(row g, col 2t, 2t+1) d2,d3:(row g+8, same cols).
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- e4m3 -> f16 in one instruction per pair (sm_89+; exact: every e4m3 value, subnormals included, is a
// normal f16). Byte 0 / 2 of w lands in the low half of the result, byte 1 / 3 in the high half.
__device__ __forceinline__ uint32_t e4m3x2_f16_lo(uint32_t w) {
  uint32_t r;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(r) : "r"(w));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_f16_hi(uint32_t w) {
  uint32_t r;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(r) : "r"(w));
  return r;
}

// ---- e2m1 -> e4m3 bytes, for the f16 path of MXFP4 (then e4m3x2_f16_*). The 3 magnitude bits of an e2m1
// nibble placed at e4m3 bits 4..2 (exponent low 2 bits, mantissa top bit) give an e4m3 worth exactly 2^-6
// times the e2m1 value, subnormals included (0.5 -> the e4m3 subnormal 2^-7); the sign goes to bit 7.
// Word w holds nibbles n0..n7 (k order, low nibble first); the results hold bytes (n0, n2, n4, n6) and
// (n1, n3, n5, n7). Sign fix: with the nibble at bits 2..5 of a byte (< 64), adding 3 * 32 when bit 5 is set
// clears bit 5 and sets bit 7, without carries into the next byte.
__device__ __forceinline__ uint32_t e2m1_even_e4m3(uint32_t w) {
  const uint32_t f = (w << 2) & 0x3C3C3C3Cu;
  return f + 3u * (f & 0x20202020u);
}
__device__ __forceinline__ uint32_t e2m1_odd_e4m3(uint32_t w) {
  const uint32_t f = (w >> 2) & 0x3C3C3C3Cu;
  return f + 3u * (f & 0x20202020u);
}
// f16x2 product, exact when the result is representable (a weight times a power of two, see fp4_f16_factor).
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// The f16x2 factor 2^(e-121) that turns e4m3 codes worth 2^-6 * e2m1 into e2m1 * 2^(e-127), for UE8M0 scale
// bytes e in [kFp4F16MinE, kFp4F16MaxE], where every product is an exact f16 (subnormals included):
// 0.5 * 2^(e-127) >= 2^-24 needs e >= 104; the factor itself must be an f16 (<= 2^15): e <= 136.
constexpr uint32_t kFp4F16MinE = 104, kFp4F16MaxE = 136;
__device__ __forceinline__ uint32_t fp4_f16_factor(uint32_t e) {
  const int x = int(e) - 121;  // -17 .. 15
  const uint32_t h = x >= -14 ? uint32_t(x + 15) << 10 : 1u << (x + 24);  // normal, or subnormal 2^x
  return h | (h << 16);
}

// fp4_f16_factor of byte t of a word of UE8M0 scale bytes, in three instructions (the stream kernels' hot loop):
// the byte by a permute with sel = fp4_byte_selector(t) (the other bytes zero), 2^(e-121) built as the fp32 bit
// pattern (e + 6) << 23 by one multiply-add, then rounded to f16x2, exactly: every 2^(e-121) for e in
// [kFp4F16MinE, kFp4F16MaxE] is an f16 (2^-17 a subnormal).
__device__ __forceinline__ uint32_t fp4_byte_selector(int t) { return 0x4440u | uint32_t(t); }
__device__ __forceinline__ uint32_t fp4_f16_factor_of_byte(uint32_t word, uint32_t sel) {
  const uint32_t e = prmt(word, 0u, sel);
  const float f = __uint_as_float(e * (1u << 23) + (6u << 23));
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(f));
  return r;
}

// D += A*B with f16 inputs (same fragment layout as mma above): f16 x f16 products are exact in fp32.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Writes this warp's C fragment of n-tile nt into red[128] (row r, col c at r*8 + c).
__device__ __forceinline__ void stash_frag(float* red, const float (&c)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  red[g * 8 + 2 * t] = c[0];
  red[g * 8 + 2 * t + 1] = c[1];
  red[(g + 8) * 8 + 2 * t] = c[2];
  red[(g + 8) * 8 + 2 * t + 1] = c[3];
}

// Activations for one 128-wide K chunk: the thread's 32 bf16 at k = 32t .. 32t+31 of its token (zeros
// when the thread has no token), as 16 words u[m] = (x[2m], x[2m+1]).
struct Act32 {
  uint32_t u[16];
};
__device__ __forceinline__ void load_act(Act32& a, const uint16_t* p) {
  if (p) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = ld_act(p + 8 * q);
      a.u[4 * q] = v.x, a.u[4 * q + 1] = v.y, a.u[4 * q + 2] = v.z, a.u[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int m = 0; m < 16; ++m) a.u[m] = 0u;
  }
}

}  // namespace dsv4::cudalin::dev
