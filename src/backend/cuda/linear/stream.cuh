// Streaming version of one warp's share of a weight-streaming GEMM (v2 kernels, see docs/GEMM_MOE.md):
// 16 weight rows (row0 .. row0+15) of NMAT matrices that share activations, over the K chunks [cb, ce)
// (128 wide each), against up to 8*NT activation rows.
//
// Weights go through a per-warp ring of STAGES chunks in shared memory filled with cp.async (16-byte
// pieces, L2 only): STAGES-1 chunks are always in flight while one is converted and multiplied, so a warp
// streams any number of chunks without holding them in registers. Every lane copies exactly the bytes it
// later reads (same layout as warp_tile.cuh: lane (g, t) owns rows g and g+8, bytes of k = 32t .. 32t+31),
// so no barrier is needed: cp.async.wait_group orders a lane's own copies.
// FP8 tile scales: one register per lane holds chunk cb+lane's scale (shuffled out per chunk). MXFP4 scales
// (4 bytes per row and chunk) travel in the ring with the weights.
// Activations (L1/L2) are loaded one chunk ahead into registers when NT == 1 (the default PREFETCH); the lean
// kernels (PREFETCH = 0, fewer registers) load a chunk's activations when the chunk starts (f16 MXFP4: once, before
// the ring wait; see kEarlyAct).
// H16: the activations are f16 instead of bf16 and the MMAs f16. FP8: each e4m3 pair becomes an f16 pair in
// one cvt instruction (the bf16 path needs ~4 integer instructions per pair), and the activations need no
// byte permutes (word s of a lane's weights is k = 4s..4s+3 in order). MXFP4: nibbles -> e4m3 bytes by
// shifts (frag.cuh), cvt to f16, one f16 multiply by the scale factor (exact for UE8M0 scales in
// [kFp4F16MinE, kFp4F16MaxE]; the caller checks), ~4 instructions per pair instead of ~7.
#pragma once
#include "backend/cuda/linear/frag.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cudalin::dev {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds128(const uint4* p) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(smem_u32(p)) : "memory");
  return r;
}
__device__ __forceinline__ uint2 lds64(const void* p) {
  uint2 r;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(smem_u32(p)) : "memory");
  return r;
}

__device__ __forceinline__ uint32_t word4(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// uint4 units of one stage of one matrix in a warp's ring.
template <bool FP4>
struct RingGeom {
  static constexpr int kU4 = FP4 ? 2 * 32 + 16 : 4 * 32;  // FP4: 2 pieces + 32 lanes x 8 scale bytes
};
template <bool FP4, int NMAT, int STAGES>
constexpr int ring_bytes_per_warp() {
  return STAGES * NMAT * RingGeom<FP4>::kU4 * 16;
}

// B fragments of one 128-wide chunk for one n-tile: bf[s][0..1] for the 8 k16 steps, permuted like the
// weight bytes (FP8: bytes (4s, 4s+2), (4s+1, 4s+3) of word s; FP4: nibbles (0,4), (1,5) | (2,6), (3,7)).
template <bool FP4>
__device__ __forceinline__ void act_frags(const Act32& a, uint32_t (&bf)[8][2]) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    uint32_t u0, u1;
    if constexpr (FP4) {
      const int q = s >> 1, o = s & 1;
      u0 = a.u[4 * q + o], u1 = a.u[4 * q + o + 2];
    } else {
      u0 = a.u[2 * s], u1 = a.u[2 * s + 1];
    }
    bf[s][0] = prmt(u0, u1, 0x5410);
    bf[s][1] = prmt(u0, u1, 0x7632);
  }
}


// PDL: the weight prologue (STAGES-1 chunks) is issued before cuda::pdl::wait(), which precedes every activation
// read; the caller must not read anything a preceding kernel writes before calling this.
// Activations of one lane for one chunk, matching its weight bytes. FP4: k = 32t .. 32t+31 (p = x + 32t).
// FP8: k = 16t .. 16t+15 and 64+16t .. 64+16t+15 (p = x + 16t), so that word s of the lane's 32 weight
// bytes (s < 4: first piece, else second) meets u[2s], u[2s+1] as in the FP4-style contiguous case.
template <bool FP4>
__device__ __forceinline__ void load_act_lane(Act32& a, const uint16_t* p) {
  if (!p) {
#pragma unroll
    for (int m = 0; m < 16; ++m) a.u[m] = 0u;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = ld_act(p + (FP4 ? 8 * q : (q < 2 ? 8 * q : 64 + 8 * (q - 2))));
    a.u[4 * q] = v.x, a.u[4 * q + 1] = v.y, a.u[4 * q + 2] = v.z, a.u[4 * q + 3] = v.w;
  }
}

// PREFETCH: the activations of the next chunk are loaded during this one (two register sets) when NT == 1
// (-1, the default), never (0: ~30 fewer registers, so more blocks fit an SM), or always (1).
template <bool FP4, int NT, int NMAT, int STAGES, bool H16 = false, int PREFETCH = -1>
__device__ __forceinline__ void stream_warp(uint4* ring, const uint8_t* const (&W)[NMAT],
                                            const uint8_t* const (&S)[NMAT], bool sf32, int64_t K, int64_t row0,
                                            int cb, int ce, int nt_valid, const uint16_t* const (&xr)[NT],
                                            float (&acc)[NMAT][NT][4]) {
  constexpr int U4 = RingGeom<FP4>::kU4;
  constexpr bool PF = PREFETCH < 0 ? NT == 1 : PREFETCH == 1;  // activation prefetch where registers allow
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t byte_t = fp4_byte_selector(t);  // FP4 + H16: this lane's scale byte of a ring scale word
  // FP4 + H16: the odd k16 steps' MMA chain (the even steps accumulate into acc itself), added to acc at the end;
  // one pair of chains for the whole K range instead of per chunk (no per-chunk zeroing and adds). Not for the
  // bf16 FP4 kernels: the 8 extra live registers made their lean w1/w3 variant spill at its 80-register bound.
  constexpr bool kChainsAcross = FP4 && H16;
  float acc_odd[NMAT][NT][4] = {};
  const int n = ce - cb;
  if (n <= 0) {
    cuda::pdl::wait();
    return;
  }
  // Per-lane source pointers at chunk 0 and the byte stride per chunk.
  const uint8_t* wsrc[NMAT];
  const uint8_t* ssrc[NMAT];
  int64_t rstride;  // bytes between row g and row g+8
#pragma unroll
  for (int m = 0; m < NMAT; ++m) {
    if constexpr (FP4) {
      wsrc[m] = W[m] + (row0 + g) * (K / 2) + t * 16;
      ssrc[m] = S[m] + (row0 + g) * (K / 32);
    } else {
      wsrc[m] = W[m] + (row0 + g) * K + t * 16;  // pieces at k = 16t and 64 + 16t: full 32-byte sectors
      ssrc[m] = S[m];
    }
  }
  rstride = FP4 ? 8 * (K / 2) : 8 * K;
  const int64_t sstride = 8 * (K / 32);
  // kRunPtr: a running weight pointer, advanced by one chunk right before its copies (issue() runs for i = 0, 1,
  // ... in order), instead of the chunk's address rebuilt from wsrc into registers an in-flight copy still reads
  // (run 150's LDGSTS stall). f16 w2 only (75 registers): w1/w3 then spilled 12 bytes at their 80-register bound
  // and lost 3% (run 156); the lean bf16 w2 spilled 4 bytes. Run 156: T = 1 47.5 -> 46.8 us.
  constexpr bool kRunPtr = FP4 && H16 && NMAT == 1;
  const uint8_t* wrun[NMAT];
#pragma unroll
  for (int m = 0; m < NMAT; ++m) wrun[m] = wsrc[m] + int64_t(cb - 1) * 64;
  auto issue = [&](int i) {
    const int c = cb + i;
    uint4* st = ring + (i % STAGES) * (NMAT * U4);
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      uint4* sm = st + m * U4;
      if constexpr (FP4) {
        const uint8_t* p;
        if constexpr (kRunPtr) p = (wrun[m] += 64);
        else p = wsrc[m] + int64_t(c) * 64;
        cp_async16(smem_u32(sm + lane), p);
        cp_async16(smem_u32(sm + 32 + lane), p + rstride);
        uint32_t* sc = reinterpret_cast<uint32_t*>(sm + 64) + 2 * lane;
        const uint8_t* q = ssrc[m] + int64_t(c) * 4;
        cp_async4(smem_u32(sc), q);  // (scales 4-byte aligned: checked at load, moe_expert_aligned)
        cp_async4(smem_u32(sc + 1), q + sstride);
      } else {
        const uint8_t* p = wsrc[m] + int64_t(c) * 128;
        cp_async16(smem_u32(sm + lane), p);
        cp_async16(smem_u32(sm + 32 + lane), p + 64);
        cp_async16(smem_u32(sm + 64 + lane), p + rstride);
        cp_async16(smem_u32(sm + 96 + lane), p + rstride + 64);
      }
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n) issue(i);
    cp_commit();
  }
  // FP8 scales of chunks cb + 32j + lane, refreshed every 32 chunks.
  const int64_t sc_cols = K / 128, sc_base = (row0 / 128) * sc_cols;
  float scv[NMAT];
  auto load_scales = [&](int i0) {
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      scv[m] = 0.f;
      if constexpr (!FP4) {
        const int c = cb + i0 + lane;
        if (c < ce) {
          const int64_t si = sc_base + c;
          scv[m] = sf32 ? __ldg(reinterpret_cast<const float*>(S[m]) + si) : e8m0_f32(__ldg(S[m] + si));
        }
      }
    }
  };
  if constexpr (!FP4) load_scales(0);
  cuda::pdl::wait();  // weights and scales are constant; activations may come from the preceding kernel

  // Activations of chunk i+1 are loaded while chunk i is computed, into the other of two register sets
  // (ping-pong: a copy between the sets would wait for the load).
  Act32 actA[NT], actB[NT];
  auto load_acts = [&](Act32 (&dst)[NT], int c) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      if (nt < nt_valid) load_act_lane<FP4>(dst[nt], xr[nt] ? xr[nt] + int64_t(c) * 128 : nullptr);
  };
  if constexpr (PF) load_acts(actA, cb);

  // kEarlyAct (the lean f16 MXFP4 kernels, no prefetch): the chunk's activations are loaded once, right after the
  // ring refill is issued and before its wait (not once per matrix just before the MMAs), their B fragments are
  // built once for all NMAT matrices, and each word q of the weights is multiplied as soon as it is converted, so
  // that 8 fragment registers are live instead of 32 (80 registers, no spill on sm_90a / 120a / 121a). Nsight
  // Compute (twenty-fifth session, run 150): the first use of the late load was the lean kernels' hottest stall.
  // The same sums in the same order as the generic path.
  constexpr bool kEarlyAct = FP4 && H16 && PREFETCH == 0;
  auto body = [&](int i, Act32 (&cur)[NT], Act32 (&nxt)[NT]) {
    const int c = cb + i;
    if (i + STAGES - 1 < n) issue(i + STAGES - 1);
    cp_commit();
    if constexpr (kEarlyAct) {  // unconditional writes: no register set stays live across chunks
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        load_act_lane<FP4>(cur[nt], nt < nt_valid && xr[nt] ? xr[nt] + int64_t(c) * 128 : nullptr);
    }
    if constexpr (PF) {
      if (i + 1 < n) load_acts(nxt, c + 1);
    }
    float scm[NMAT];
    if constexpr (!FP4) {
      if (i > 0 && (i & 31) == 0) load_scales(i);
#pragma unroll
      for (int m = 0; m < NMAT; ++m) scm[m] = __shfl_sync(0xFFFFFFFFu, scv[m], i & 31);
    }
    cp_wait<STAGES - 1>();
    const uint4* st = ring + (i % STAGES) * (NMAT * U4);
    uint32_t bf_early[NT][8][2];  // kEarlyAct: B fragments (the same values for every matrix)
    if constexpr (kEarlyAct) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) act_frags<false>(cur[nt], bf_early[nt]);
    }
    // One matrix at a time (32 fragment registers live), each against every n-tile.
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      const uint4* sm = st + m * U4;
      uint32_t af[8][4];
      if constexpr (FP4 && H16) {
        // Word q (k = 8q .. 8q+7 of the lane's 32): k16 step 2q takes pairs (n0, n2) | (n1, n3), step 2q+1
        // (n4, n6) | (n5, n7); act_frags<false> builds the activations in the same order.
        const uint4 w0 = lds128(sm + lane), w1 = lds128(sm + 32 + lane);
        const uint2 se = lds64(reinterpret_cast<const uint32_t*>(sm + 64) + 2 * lane);
        const uint32_t fa = fp4_f16_factor_of_byte(se.x, byte_t), fb = fp4_f16_factor_of_byte(se.y, byte_t);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t ea = e2m1_even_e4m3(word4(w0, q)), oa = e2m1_odd_e4m3(word4(w0, q));
          const uint32_t eb = e2m1_even_e4m3(word4(w1, q)), ob = e2m1_odd_e4m3(word4(w1, q));
          af[2 * q][0] = hmul2(e4m3x2_f16_lo(ea), fa);
          af[2 * q][1] = hmul2(e4m3x2_f16_lo(eb), fb);
          af[2 * q][2] = hmul2(e4m3x2_f16_lo(oa), fa);
          af[2 * q][3] = hmul2(e4m3x2_f16_lo(ob), fb);
          af[2 * q + 1][0] = hmul2(e4m3x2_f16_hi(ea), fa);
          af[2 * q + 1][1] = hmul2(e4m3x2_f16_hi(eb), fb);
          af[2 * q + 1][2] = hmul2(e4m3x2_f16_hi(oa), fa);
          af[2 * q + 1][3] = hmul2(e4m3x2_f16_hi(ob), fb);
          if constexpr (kEarlyAct) {  // word q's two k16 steps now
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if (nt >= nt_valid) break;
              const int s = 2 * q;
              mma_f16(acc[m][nt], af[s][0], af[s][1], af[s][2], af[s][3], bf_early[nt][s][0], bf_early[nt][s][1]);
              mma_f16(acc_odd[m][nt], af[s + 1][0], af[s + 1][1], af[s + 1][2], af[s + 1][3], bf_early[nt][s + 1][0],
                      bf_early[nt][s + 1][1]);
            }
          }
        }
      } else if constexpr (FP4) {
        const uint4 w0 = lds128(sm + lane), w1 = lds128(sm + 32 + lane);
        const uint2 se = lds64(reinterpret_cast<const uint32_t*>(sm + 64) + 2 * lane);
        const Fp4Scale sa = fp4_scale((se.x >> (8 * t)) & 0xFFu), sb = fp4_scale((se.y >> (8 * t)) & 0xFFu);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t wa = word4(w0, q), wb = word4(w1, q);
          af[2 * q][0] = fp4_apply(e2m1_pair<0>(wa), sa);
          af[2 * q][1] = fp4_apply(e2m1_pair<0>(wb), sb);
          af[2 * q][2] = fp4_apply(e2m1_pair<1>(wa), sa);
          af[2 * q][3] = fp4_apply(e2m1_pair<1>(wb), sb);
          af[2 * q + 1][0] = fp4_apply(e2m1_pair<2>(wa), sa);
          af[2 * q + 1][1] = fp4_apply(e2m1_pair<2>(wb), sb);
          af[2 * q + 1][2] = fp4_apply(e2m1_pair<3>(wa), sa);
          af[2 * q + 1][3] = fp4_apply(e2m1_pair<3>(wb), sb);
        }
      } else {
        const uint4 p0 = lds128(sm + lane), p1 = lds128(sm + 32 + lane), p2 = lds128(sm + 64 + lane),
                    p3 = lds128(sm + 96 + lane);
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const uint32_t wa = word4(s < 4 ? p0 : p1, s & 3), wb = word4(s < 4 ? p2 : p3, s & 3);
          if constexpr (H16) {  // k pairs (0,1) | (2,3) of the word, matching the activations' natural order
            af[s][0] = e4m3x2_f16_lo(wa);
            af[s][1] = e4m3x2_f16_lo(wb);
            af[s][2] = e4m3x2_f16_hi(wa);
            af[s][3] = e4m3x2_f16_hi(wb);
          } else {
            af[s][0] = e4m3_02(wa);
            af[s][1] = e4m3_02(wb);
            af[s][2] = e4m3_13(wa);
            af[s][3] = e4m3_13(wb);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < (kEarlyAct ? 0 : NT); ++nt) {  // (kEarlyAct: multiplied above)
        if (nt >= nt_valid) break;
        if constexpr (!PF && !kEarlyAct) load_act_lane<FP4>(cur[nt], xr[nt] ? xr[nt] + int64_t(c) * 128 : nullptr);
        // Two independent MMA chains (even / odd k16 steps). kChainsAcross: straight into acc and acc_odd;
        // otherwise per chunk, then added (bf16 FP4) or scaled (FP8, the chunk's block scale) into acc.
        float t0[4] = {0.f, 0.f, 0.f, 0.f}, t1[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (H16 && FP4) {
          uint32_t bf[8][2];
          act_frags<false>(cur[nt], bf);  // pairs (x0, x2) | (x1, x3) of each word pair, as the weights above
#pragma unroll
          for (int s = 0; s < 8; s += 2) {
            mma_f16(acc[m][nt], af[s][0], af[s][1], af[s][2], af[s][3], bf[s][0], bf[s][1]);
            mma_f16(acc_odd[m][nt], af[s + 1][0], af[s + 1][1], af[s + 1][2], af[s + 1][3], bf[s + 1][0], bf[s + 1][1]);
          }
        } else if constexpr (H16) {
          const uint32_t* u = cur[nt].u;
#pragma unroll
          for (int s = 0; s < 8; s += 2) {
            mma_f16(t0, af[s][0], af[s][1], af[s][2], af[s][3], u[2 * s], u[2 * s + 1]);
            mma_f16(t1, af[s + 1][0], af[s + 1][1], af[s + 1][2], af[s + 1][3], u[2 * s + 2], u[2 * s + 3]);
          }
        } else {
          uint32_t bf[8][2];
          act_frags<FP4>(cur[nt], bf);
#pragma unroll
          for (int s = 0; s < 8; s += 2) {
            mma(t0, af[s][0], af[s][1], af[s][2], af[s][3], bf[s][0], bf[s][1]);
            mma(t1, af[s + 1][0], af[s + 1][1], af[s + 1][2], af[s + 1][3], bf[s + 1][0], bf[s + 1][1]);
          }
        }
        if constexpr (!kChainsAcross) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if constexpr (FP4) acc[m][nt][k] += t0[k] + t1[k];
            else acc[m][nt][k] = fmaf(t0[k] + t1[k], scm[m], acc[m][nt][k]);
          }
        }
      }
    }
  };
  int i = 0;
  for (; i + 1 < n; i += 2) {
    body(i, actA, actB);
    body(i + 1, actB, actA);
  }
  if (i < n) body(i, actA, actB);
  cp_wait<0>();
  if constexpr (kChainsAcross) {
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[m][nt][k] += acc_odd[m][nt][k];
  }
}

// Epilogue of the split-K streaming kernels: each warp has stashed its 16 x 8 partial tile (stash_frag) in
// red[m][warp] for each of NMAT matrices; the block's tile tl has its ksb splits in warps tl*ksb ..
// tl*ksb + ksb - 1. Calls emit(tl, row, col, sums) for every one of the tpb * 128 outputs, each matrix's
// splits added in split order. The caller synchronises the block before and after.
template <int NMAT, typename Emit>
__device__ __forceinline__ void sum_splits(float (*const (&red)[NMAT])[128], int tpb, int ksb, Emit&& emit) {
  for (int i = threadIdx.x; i < tpb * 128; i += blockDim.x) {
    const int tl = i >> 7, o = i & 127;
    float v[NMAT] = {};
    for (int k = 0; k < ksb; ++k) {
#pragma unroll
      for (int m = 0; m < NMAT; ++m) v[m] += red[m][tl * ksb + k][o];
    }
    emit(tl, o >> 3, o & 7, v);
  }
}

// The whole split-K epilogue of the streaming kernels: for each valid n-tile, every warp stashes its 16 x 8
// partial tile of each matrix (red[m][warp]), the block adds the splits (sum_splits) and calls
// emit(nt, tl, row, col, sums); barriers before and after each tile, so `red` is reused safely.
template <int NMAT, int NT, typename Emit>
__device__ __forceinline__ void reduce_tiles(float (*const (&red)[NMAT])[128], const float (&acc)[NMAT][NT][4],
                                             int nt_valid, int tpb, int ksb, Emit&& emit) {
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= nt_valid) break;
#pragma unroll
    for (int m = 0; m < NMAT; ++m) stash_frag(red[m][warp], acc[m][nt]);
    __syncthreads();
    sum_splits<NMAT>(red, tpb, ksb, [&](int tl, int r, int col, const float (&v)[NMAT]) { emit(nt, tl, r, col, v); });
    __syncthreads();
  }
}

}  // namespace dsv4::cudalin::dev
