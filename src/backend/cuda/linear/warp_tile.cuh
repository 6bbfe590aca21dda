// One warp's share of a weight-streaming GEMM: 16 weight rows (row0 .. row0+15) of NMAT matrices that share
// the same activations, over CPW consecutive 128-wide K chunks starting at chunk c0, against up to 8*NT
// activation rows. All weight loads of the CPW chunks are issued before the first use (bytes in flight is
// what bounds a decode GEMV); activations come from L2/L1.
//
// Thread (g = lane/4, t = lane%4) streams rows row0+g and row0+g+8, bytes covering k = 32t .. 32t+31 of
// each chunk, and holds activations of token 8*nt + g (xr[nt]: that row at k = 32t, or null).
// acc[m][nt][0..3]: mma C fragment (rows g, g+8; tokens 8nt+2t, 8nt+2t+1).
#pragma once
#include "backend/cuda/linear/frag.cuh"

namespace dsv4::cudalin::dev {

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// FP8 e4m3 weights [N, K] with 128x128 tile scales (UE8M0 or f32). The 16 rows lie in one 128-row tile,
// so each chunk has one scale per matrix, applied in fp32 to that chunk's partial sum.
template <int NT, int CPW, int NMAT>
__device__ __forceinline__ void fp8_warp(const uint8_t* const (&W)[NMAT], const uint8_t* const (&S)[NMAT],
                                         bool sf32, int64_t K, int64_t row0, int c0, int C, int nt_valid,
                                         const uint16_t* const (&xr)[NT], float (&acc)[NMAT][NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t sc_cols = K / 128, sc_row = row0 / 128;
  uint4 wr[NMAT][CPW][4];
  float sc[NMAT][CPW];
#pragma unroll
  for (int j = 0; j < CPW; ++j)
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      if (c0 + j < C) {
        const uint8_t* p = W[m] + (row0 + g) * K + int64_t(c0 + j) * 128 + t * 32;
        wr[m][j][0] = ld_stream(p);
        wr[m][j][1] = ld_stream(p + 16);
        wr[m][j][2] = ld_stream(p + 8 * K);
        wr[m][j][3] = ld_stream(p + 8 * K + 16);
        const int64_t si = sc_row * sc_cols + c0 + j;
        sc[m][j] = sf32 ? reinterpret_cast<const float*>(S[m])[si] : e8m0_f32(S[m][si]);
      }
    }
#pragma unroll
  for (int j = 0; j < CPW; ++j) {
    if (c0 + j >= C) break;
    // A fragments of the 8 k16 steps: step s uses word s of the thread's 32 bytes of each row.
    uint32_t af[NMAT][8][4];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t wa = word(wr[m][j][s >> 2], s & 3), wb = word(wr[m][j][2 + (s >> 2)], s & 3);
        af[m][s][0] = e4m3_02(wa);  // row g,   bytes 4s, 4s+2
        af[m][s][1] = e4m3_02(wb);  // row g+8
        af[m][s][2] = e4m3_13(wa);  // row g,   bytes 4s+1, 4s+3
        af[m][s][3] = e4m3_13(wb);
      }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= nt_valid) break;
      Act32 a;
      load_act(a, xr[nt] ? xr[nt] + int64_t(c0 + j) * 128 : nullptr);
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        float tmp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 8; ++s)  // activations permuted like the weight bytes: (4s, 4s+2), (4s+1, 4s+3)
          mma(tmp, af[m][s][0], af[m][s][1], af[m][s][2], af[m][s][3], prmt(a.u[2 * s], a.u[2 * s + 1], 0x5410),
              prmt(a.u[2 * s], a.u[2 * s + 1], 0x7632));
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][nt][i] = fmaf(tmp[i], sc[m][j], acc[m][nt][i]);
      }
    }
  }
}

// MXFP4 weights: packed e2m1 [N, K/2] (element 2j in the low nibble), UE8M0 scales [N, K/32]. A thread's
// 16 bytes of a row are exactly one 32-element scale block, so the scale is folded into the bf16 weights.
template <int NT, int CPW, int NMAT>
__device__ __forceinline__ void fp4_warp(const uint8_t* const (&W)[NMAT], const uint8_t* const (&S)[NMAT],
                                         int64_t K, int64_t row0, int c0, int C, int nt_valid,
                                         const uint16_t* const (&xr)[NT], float (&acc)[NMAT][NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint4 wr[NMAT][CPW][2];
  uint32_t se[NMAT][CPW][2];
#pragma unroll
  for (int j = 0; j < CPW; ++j)
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      if (c0 + j < C) {
        const uint8_t* p = W[m] + (row0 + g) * (K / 2) + int64_t(c0 + j) * 64 + t * 16;
        wr[m][j][0] = ld_stream(p);
        wr[m][j][1] = ld_stream(p + 8 * (K / 2));
        const uint8_t* q = S[m] + (row0 + g) * (K / 32) + int64_t(c0 + j) * 4 + t;
        se[m][j][0] = __ldg(q);
        se[m][j][1] = __ldg(q + 8 * (K / 32));
      }
    }
#pragma unroll
  for (int j = 0; j < CPW; ++j) {
    if (c0 + j >= C) break;
    uint32_t af[NMAT][8][4];
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      const Fp4Scale sa = fp4_scale(se[m][j][0]), sb = fp4_scale(se[m][j][1]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // word q: elements 8q..8q+7 -> steps 2q (nibbles 0,4 | 1,5), 2q+1 (2,6 | 3,7)
        const uint32_t wa = word(wr[m][j][0], q), wb = word(wr[m][j][1], q);
        af[m][2 * q][0] = fp4_apply(e2m1_pair<0>(wa), sa);
        af[m][2 * q][1] = fp4_apply(e2m1_pair<0>(wb), sb);
        af[m][2 * q][2] = fp4_apply(e2m1_pair<1>(wa), sa);
        af[m][2 * q][3] = fp4_apply(e2m1_pair<1>(wb), sb);
        af[m][2 * q + 1][0] = fp4_apply(e2m1_pair<2>(wa), sa);
        af[m][2 * q + 1][1] = fp4_apply(e2m1_pair<2>(wb), sb);
        af[m][2 * q + 1][2] = fp4_apply(e2m1_pair<3>(wa), sa);
        af[m][2 * q + 1][3] = fp4_apply(e2m1_pair<3>(wb), sb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= nt_valid) break;
      Act32 a;
      load_act(a, xr[nt] ? xr[nt] + int64_t(c0 + j) * 128 : nullptr);
#pragma unroll
      for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // activations (8q, 8q+4), (8q+1, 8q+5) | (8q+2, 8q+6), (8q+3, 8q+7)
          mma(acc[m][nt], af[m][2 * q][0], af[m][2 * q][1], af[m][2 * q][2], af[m][2 * q][3],
              prmt(a.u[4 * q], a.u[4 * q + 2], 0x5410), prmt(a.u[4 * q], a.u[4 * q + 2], 0x7632));
          mma(acc[m][nt], af[m][2 * q + 1][0], af[m][2 * q + 1][1], af[m][2 * q + 1][2], af[m][2 * q + 1][3],
              prmt(a.u[4 * q + 1], a.u[4 * q + 3], 0x5410), prmt(a.u[4 * q + 1], a.u[4 * q + 3], 0x7632));
        }
    }
  }
}


}  // namespace dsv4::cudalin::dev
