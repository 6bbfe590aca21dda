// MoE prefill GEMM kernel 3 (set_moe_prefill_kernel(3); sm_90a only): kernel 2's design on Hopper's warpgroup
// MMA. Each warp still converts its own 16 weight rows from MXFP4 straight into A fragments in registers
// (moe_prefill_gemm.cuh: WeightRows, raw_to_frags), but a warpgroup of 4 warps multiplies them with one
// asynchronous wgmma.m64nBNk16 per 16 k, B (the tokens) read by the tensor cores from the swizzled shared-memory
// tile through a matrix descriptor. mma.sync needed 16-byte B loads by every warp and BN / 8 MMAs per 16 k;
// here the conversion of the next k-tile overlaps the wgmmas of this one, and one barrier publishes B for two
// k-tiles.
//
// The k relabelling of kernel 2 (lane t4 holds k 16 t4 .. 16 t4 + 15 of each 64-wide k-tile; MMA kk's fragment
// slots 2t, 2t+1 / 8+2t, 9+2t hold k 16t+4kk+0, 1 / +2, 3) must now also hold for B, which the descriptor reads
// in natural order: slot s of MMA kk is column 16 kk + s of the tile. So the activations are stored permuted in
// memory, each 64-wide block by pairs: pair q = 8 kk + 4 h + t of the stored row holds pair 8 t + 2 kk + h of the
// real one (act_pair_src). x is permuted while it is rounded to f16 (or copied, bf16) into the workspace's ybuf;
// h, written by the w1/w3 GEMM, is stored permuted directly (act_pos). Each dot product is the same sum over k
// as in kernel 2 in another order inside each MMA: not bit-identical to kernels 1 or 2, but to itself across
// tile widths.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>  // std::integral_constant

#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/moe_prefill_gemm.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cudalin::moep {

// Stored pair q (0..31) of a 64-wide block holds real pair act_pair_src(q); act_pos(k) is where real element k is
// stored (its inverse, element-wise).
__host__ __device__ constexpr int act_pair_src(int q) { return 8 * (q & 3) + 2 * (q >> 3) + ((q >> 2) & 1); }
__host__ __device__ constexpr int act_pos(int k) {
  const int p = (k & 63) >> 1;
  return (k & ~63) + 2 * (8 * ((p >> 1) & 3) + 4 * (p & 1) + (p >> 3)) + (k & 1);
}
constexpr bool act_pos_inverts_pair_src() {
  for (int q = 0; q < 32; ++q)
    if (act_pos(2 * act_pair_src(q)) != 2 * q || act_pos(2 * act_pair_src(q) + 1) != 2 * q + 1) return false;
  return true;
}
static_assert(act_pair_src(0) == 0 && act_pair_src(1) == 8 && act_pair_src(4) == 1 && act_pair_src(8) == 2 &&
              act_pair_src(31) == 31 && act_pos_inverts_pair_src(), "pair order");

namespace wgmma = cuda::wgmma;

namespace {

// y = x in the pair order, 16-bit (F16: fp32 x rounded to f16, as cast_f32_to_f16; else bf16 x copied): n2 pairs,
// every row a multiple of 64 elements, so a block of 32 pairs never straddles two rows.
template <typename In, bool F16>
__global__ void permute_act_kernel(const In* x, uint32_t* y, int64_t n2) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n2; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t src = (i & ~int64_t(31)) + act_pair_src(int(i & 31));  // in pairs
    if constexpr (F16) {
      const float2 v = reinterpret_cast<const float2*>(x)[src];
      const __half2 h = __floats2half2_rn(v.x, v.y);
      y[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      y[i] = reinterpret_cast<const uint32_t*>(x)[src];
    }
  }
}

constexpr int kStages = 6;  // B ring depth in k-tiles: three pairs, each pair published by one barrier
// Token tiles of 32: the weights through a per-warp ring of kWStages k-tiles (WeightRing, 32 KB per block), eight
// k-tiles ahead instead of in registers two ahead (WeightRows). Run 157: T = 512 (tile 32) 2.15 -> 2.01-2.02 ms;
// at tile 64 (T = 2048, 8192) no gain (2.52 / 8.73 ms either way), so wider tiles keep the registers. (Run 162: the
// kernel runs two blocks per SM either way, registers limit it to that; what more shared memory costs is L1, which
// kernel 3 lives on: docs/GEMM_MOE.md.)
constexpr int kWStages = 8;
template <int BN>
constexpr bool kWeightRing = BN <= 32;
template <int BN>
constexpr int wgmma_smem() {  // + alignment of the tiles to 1024 bytes (the swizzle atom)
  return kStages * BN * kBK * 2 + (kWeightRing<BN> ? (kThreads / 32) * kWStages * 512 : 0) + 1024;
}

// One block: kBM weight rows (two warpgroups of 64) x BN tokens of one expert's tile, all of K.
template <int BN, bool GATE, bool F16>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_wgmma_kernel(GemmArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  constexpr int NB = BN * 8 / kThreads;  // 16-byte B chunks per thread per stage
  constexpr int kBStage = BN * kBK * 2;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ int s_pair[BN];
  __shared__ float s_w[BN];

  TokenTile tt;
  if (!load_token_tile<BN, GATE>(a, tt, s_pair, s_w)) return;
  const int e = tt.e, pos0 = tt.pos0, nvalid = tt.nvalid;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

  const DevExpert ex = a.experts[e];
  const int K = a.K, nk = K / kBK;
  constexpr bool kRing = kWeightRing<BN>;
  const uint32_t sB = (smem_u32(smem) + 1023) & ~1023u;
  const WeightRing<GATE, kWStages> wring(ex, K, warp, g, t4, sB + kStages * kBStage);
  const WeightRows<GATE>& wrows = wring.rows;
  auto load_w = [&](int kt, RawA& r) {
    if constexpr (kRing) wring.load(kt, r);
    else wrows.load(kt, r);
  };

  const ActCopy<NB, GATE> bcopy(a, tt);
  // B of k-tiles kt and kt + 1 into the stage pair at st (nk is even: K is a multiple of 128) and, with the weight
  // ring, the weights of k-tiles kt + 4 and kt + 5 (in the loop, eight k-tiles ahead of the pair it runs in; the
  // wait for kt's B then also covers the weights that pair loads, kt + 3 and kt + 4); always commits a group
  // (empty past the end): uniform wait_group counts.
  auto cpB2 = [&](int kt, uint32_t st) {
    if (kt < nk) bcopy.copy(kt, st), bcopy.copy(kt + 1, st + kBStage);
    if constexpr (kRing) {
      if (kt + 4 < nk) wring.copy(kt + 4), wring.copy(kt + 5);
    }
    cp_commit();
  };

  // acc[4 j + 2 hh + c] = (MMA row g + 8 hh of the warp, token 8 j + 2 t4 + c), as kernel 2's acc[j][2 hh + c].
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

  // Prologue: B of k-tiles 0-3 in flight, the weights of 0 converted, of 1 and 2 in registers.
  // With the weight ring: the weights of k-tiles 0-3 join B's first group, and that group is waited for here.
  RawA ra0, ra1;
  uint32_t af0[4][4], af1[4][4];
  if constexpr (kRing) {
    for (int kt = 0; kt < 4 && kt < nk; ++kt) wring.copy(kt);
  }
  cpB2(0, sB), cpB2(2, sB + 2 * kBStage);
  if constexpr (kRing) asm volatile("cp.async.wait_group 1;" ::: "memory");
  load_w(0, ra0);
  if (nk > 1) load_w(1, ra1);
  raw_to_frags<F16>(ra0, af0);
  if (nk > 2) load_w(2, ra0);
  // Iteration kt: four wgmmas on kt's fragments and B stage st; while they run, k-tile kt + 1's weights become the
  // other fragments and their registers take kt + 3's.
  auto iter = [&](int kt, uint32_t st, const uint32_t (&af)[4][4], uint32_t (&af_next)[4][4], RawA& r_next) {
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma::mma_rs<BN, F16>(acc, af[kk], wgmma::sw128_desc(st + 32 * kk));
    wgmma::commit();
    if (kt + 1 < nk) {
      raw_to_frags<F16>(r_next, af_next);
      if (kt + 3 < nk) load_w(kt + 3, r_next);
    }
    wgmma::wait0();
  };
  // Per pair of k-tiles kt, kt + 1: their B landed for every thread (wait, proxy fence for the tensor cores'
  // reads, one barrier, which also frees the pair of kt - 2: its wgmmas completed); B of kt + 4, kt + 5 goes there.
  const uint32_t pair_last = sB + 4 * kBStage;
  uint32_t st = sB, st_cp = pair_last;  // stage pairs of k-tiles kt and kt + 4 (= kt - 2)
  for (int kt = 0; kt < nk; kt += 2) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    wgmma::fence_proxy_async();
    __syncthreads();
    cpB2(kt + 4, st_cp);
    iter(kt, st, af0, af1, ra1);                // k-tile kt + 1's raw weights are in ra1
    iter(kt + 1, st + kBStage, af1, af0, ra0);  // kt + 2's in ra0
    st_cp = st;
    st = st == pair_last ? sB : st + 2 * kBStage;
  }
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) wgmma::fence_operand(acc[i]);

  // Epilogue (as kernel 2's; GATE stores h at its permuted position for the w2 GEMM's B).
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * j + 2 * t4 + c;
      if (col >= nvalid) continue;
      if (GATE) {
        const float hv = swiglu_weighted(acc[4 * j + c], acc[4 * j + 2 + c], a.limit, s_w[col]);
        const int f = blockIdx.x * (kBM / 2) + 8 * warp + g;
        a.h[size_t(pos0 + col) * a.n_out + act_pos(f)] = cuda::ptx::act16_bits_rn(hv, F16);
      } else {
        const size_t yrow = size_t(s_pair[col]) * a.n_out + blockIdx.x * kBM + 16 * warp + g;
        a.ybuf[yrow] = acc[4 * j + c];
        a.ybuf[yrow + 8] = acc[4 * j + 2 + c];
      }
    }
#elif defined(__CUDA_ARCH__)
  __trap();  // launched only on compute capability 9.0 (wgmma_supported)
#endif
}

template <int BN, bool GATE, bool F16>
void set_attr() {
  static_assert(wgmma_smem<BN>() + 8 * BN <= 99 * 1024, "shared memory over 99 KB per block");
  set_gemm_smem(moe_gemm_wgmma_kernel<BN, GATE, F16>, wgmma_smem<BN>());
}
template <int BN>
void set_attrs() {
  set_attr<BN, true, true>(), set_attr<BN, false, true>(), set_attr<BN, true, false>(), set_attr<BN, false, false>();
}

template <int BN, bool GATE, bool F16>
void launch(const GemmArgs& a, int grid_x, int max_tiles, cudaStream_t stream) {
  launch_gemm_grid(moe_gemm_wgmma_kernel<BN, GATE, F16>, wgmma_smem<BN>(), a, grid_x, max_tiles, stream,
                   "moe_gemm_wgmma_kernel launch");
}

}  // namespace

bool wgmma_supported() { return device_info().cc == 90; }

void wgmma_set_attrs() {
  if (!wgmma_supported()) return;
  set_attrs<32>(), set_attrs<64>(), set_attrs<128>();
}

void permute_act(const void* x, bool x_f32, uint16_t* y, int64_t n, cudaStream_t stream) {
  const int64_t n2 = n / 2;
  const int blocks = static_cast<int>(std::min<int64_t>((n2 + 255) / 256, 8192));
  if (x_f32)
    check_cuda(cuda::launch(permute_act_kernel<float, true>, dim3(blocks), dim3(256), 0, stream,
                            static_cast<const float*>(x), reinterpret_cast<uint32_t*>(y), n2),
               "permute_act launch");
  else
    check_cuda(cuda::launch(permute_act_kernel<uint16_t, false>, dim3(blocks), dim3(256), 0, stream,
                            static_cast<const uint16_t*>(x), reinterpret_cast<uint32_t*>(y), n2),
               "permute_act launch");
}

void launch_gemm_wgmma(int BN, bool gate, const GemmArgs& g, int gx, int max_tiles, bool f16, cudaStream_t st) {
  auto one = [&](auto bn) {
    constexpr int B = decltype(bn)::value;
    if (gate) f16 ? launch<B, true, true>(g, gx, max_tiles, st) : launch<B, true, false>(g, gx, max_tiles, st);
    else f16 ? launch<B, false, true>(g, gx, max_tiles, st) : launch<B, false, false>(g, gx, max_tiles, st);
  };
  switch (BN) {
    case 32: one(std::integral_constant<int, 32>{}); break;
    case 64: one(std::integral_constant<int, 64>{}); break;
    default: one(std::integral_constant<int, 128>{}); break;
  }
}

}  // namespace dsv4::cudalin::moep
