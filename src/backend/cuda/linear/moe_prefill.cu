// MXFP4 MoE prefill (many tokens, compute bound): device-side token permutation + grouped GEMM over experts
// with the MXFP4 weights dequantized exactly to bf16 inside the GEMM (never written to memory), bf16
// tensor-core MMA (mma.sync m16n8k16, fp32 accumulation), SwiGLU + clamp + routing weight fused into the
// w1/w3 GEMM, a deterministic combine. No host synchronization anywhere: every size the GPU needs (expert
// counts, offsets, the tile list) lives in device memory, the grids are sized for the worst case from T
// alone, so the whole call can be captured in a CUDA graph. docs/GEMM_MOE.md ("MoE prefill") has the design.
//
// Kernels, in launch order:
//   cast / permute_act                x to f16 (moe_prefill_f16) or into kernel 3's pair order, into ybuf
//   memset(mark)                      mark[e][t] = how often token t lists expert e (u8)
//   mark_kernel        (T threads)    fills mark
//   rank_kernel        (E blocks)     per expert: a scan over tokens -> rank of each pair inside its expert
//                                     (pairs ordered by (t, k)), counts[e]
//   offsets_kernel     (1 block)      exclusive scans: expert offsets, token-tile list for the GEMMs (and, with
//                                     mixed tiles, a second list of half-width last tiles: two more GEMM launches)
//   place_kernel       (P threads)    perm[offsets[e] + rank] = pair  (pairs sorted by (expert, t, k))
//   gemm<GATE=true>                   h[pos] = 16bit(silu(min(x W1ᵀ, L)) * clamp(x W3ᵀ, -L, L) * w)   (x gathered by perm)
//   gemm<GATE=false>                  ybuf[pair] = h[pos] W2ᵀ   (fp32, row of the pair t*top_k+k)
//   combine_kernel                    out[t] (+)= sum_{k ascending} ybuf[t*top_k+k]
// Three GEMM kernels: moe_gemm_kernel (kernel 1: weights dequantized into shared memory, ldmatrix for both
// operands), moe_gemm_v2_kernel (kernel 2: each warp converts its own weight rows from registers straight into
// MMA fragments) and, in moe_prefill_wgmma.cu, kernel 3 (kernel 2's fragments multiplied by Hopper's wgmma; x and
// h stored in its pair order). The default: kernel 3 on compute capability 9.0 (tiles up to 64), elsewhere
// kernel 2 for token tiles up to 64 and kernel 1 at 128. Each runs in bf16 (moe_prefill) or f16
// (moe_prefill_f16, which first rounds the fp32 x to f16 into ybuf). Pieces they share: moe_prefill_gemm.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/frag.cuh"
#include "backend/cuda/linear/linear_cuda.h"
#include "backend/cuda/linear/moe_prefill_gemm.cuh"
#include "core/error.h"

namespace dsv4::cudalin {
namespace {
using namespace moep;

int g_tile_n = 0;           // benchmark/test knob: 0 = heuristic
int g_pipeline = 0;         // 0: register-staged weights (default); 1: cp.async ring (opt-in; exact, slower: run 16)
// GEMM kernel: 1 = weights dequantized into shared memory (moe_gemm_kernel), 2 = straight into A fragments
// (moe_gemm_v2_kernel), 3 = kernel 2 on wgmma (moe_prefill_wgmma.cu, compute capability 9.0), 0 = 3 where it
// runs (H200 run 50, bench_cuda_moe_prefill, f16: 2.12 / 2.53 / 8.88 ms at T = 512 / 2048 / 8192 against the
// previous default's 2.33 / 3.33 (kernel 2) / 10.43 (kernel 1)), else by tile width: 2 up to 64 tokens, 1 at 128
// (run 41: kernel 2 1.26x / 1.14x faster at T = 512 / 2048 (tiles 32 / 64), 0.90x at T = 8192 (tile 128, where it
// spills)).
int g_kernel = 0;
// Kernel 3 at tiles of 64: an expert's last tile of 1..32 rows runs at tile 32 (a second tile list and launch per
// GEMM; the kernel's tile widths give the same bits). set_moe_prefill_mixed_tiles. On by default since run 167
// (twenty-eighth session): the engine's skewed routes leave tiles of 64 56% full (run 158), and its 8K prefill
// went 7,887-7,896 -> 8,006-8,022 tok/s; the kernel bench's uniform routes: T = 512 at tile 64 -11%, T = 2048 /
// 8192 +1% (docs/GEMM_MOE.md).
bool g_mixed_tiles = true;

int pad4(int T) { return (T + 3) & ~3; }

// ------------------------------------------------------------------ permutation
__global__ void mark_kernel(const int32_t* idx, int T, int K, int E, int ldm, uint8_t* mark) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  for (int k = 0; k < K; ++k) {
    const int e = idx[t * K + k];
    if (e < 0 || e >= E) continue;
    int c = 0;
    for (int j = 0; j < K; ++j) c += idx[t * K + j] == e;
    mark[size_t(e) * ldm + t] = uint8_t(c);  // duplicates write the same value
  }
}

// Block exclusive scan of one int per thread (blockDim.x a multiple of 32, <= 1024); returns the total.
__device__ int block_exclusive_scan(int v, int& excl, int* s_warp) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();  // s_warp reuse across calls
  if (lane == 31) s_warp[w] = inc;
  __syncthreads();
  int wbase = 0, total = 0;
  for (int i = 0; i < nw; ++i) {
    const int s = s_warp[i];
    if (i < w) wbase += s;
    total += s;
  }
  excl = wbase + inc - v;
  return total;
}

// One block per expert: rank[p] = position of pair p = (t, k) among the pairs of expert e ordered by (t, k).
__global__ void rank_kernel(const int32_t* idx, const uint8_t* mark, int T, int K, int ldm, int* rank, int* counts) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ int s_warp[32];
  const int e = blockIdx.x;
  const uint8_t* row = mark + size_t(e) * ldm;
  int carry = 0;
  for (int t0 = 0; t0 < ldm; t0 += 4 * blockDim.x) {
    const int t = t0 + 4 * threadIdx.x;
    uchar4 m = make_uchar4(0, 0, 0, 0);
    if (t < ldm) m = *reinterpret_cast<const uchar4*>(row + t);
    const int c[4] = {m.x, m.y, m.z, m.w};
    int excl;
    const int total = block_exclusive_scan(c[0] + c[1] + c[2] + c[3], excl, s_warp);
    int base = carry + excl;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (c[i] != 0) {
        int j = 0;
        for (int k = 0; k < K; ++k)
          if (idx[(t + i) * K + k] == e) rank[(t + i) * K + k] = base + j++;
      }
      base += c[i];
    }
    carry += total;
  }
  if (threadIdx.x == 0) counts[e] = carry;
}

// One block: offsets[e] (exclusive scan of counts), the token-tile list {expert, first row in the expert}
// for tiles of tile_n rows, and the tile count. With half_tiles (set_moe_prefill_mixed_tiles): an expert's last
// tile goes to the second list, for tiles of tile_n / 2 rows, where its rows fit there (1 .. tile_n / 2 left).
__global__ void offsets_kernel(const int* counts, int E, int tile_n, int* offsets, int2* tiles, int* n_tiles,
                               int2* half_tiles, int* n_half_tiles) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ int s_warp[32];
  int carry_rows = 0, carry_tiles = 0, carry_half = 0;
  for (int e0 = 0; e0 < E; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    const int c = e < E ? counts[e] : 0;
    const int rem = c % tile_n;
    const int nh = half_tiles && rem > 0 && rem <= tile_n / 2 ? 1 : 0;
    const int nt = (c + tile_n - 1) / tile_n - nh;
    int ex_rows, ex_tiles, ex_half;
    const int tot_rows = block_exclusive_scan(c, ex_rows, s_warp);
    const int tot_tiles = block_exclusive_scan(nt, ex_tiles, s_warp);
    const int tot_half = half_tiles ? block_exclusive_scan(nh, ex_half, s_warp) : 0;
    if (e < E) {
      offsets[e] = carry_rows + ex_rows;
      for (int j = 0; j < nt; ++j) tiles[carry_tiles + ex_tiles + j] = make_int2(e, j * tile_n);
      if (nh) half_tiles[carry_half + ex_half] = make_int2(e, nt * tile_n);
    }
    carry_rows += tot_rows, carry_tiles += tot_tiles, carry_half += tot_half;
  }
  if (threadIdx.x == 0) {
    offsets[E] = carry_rows, *n_tiles = carry_tiles;
    if (half_tiles) *n_half_tiles = carry_half;
  }
}

__global__ void place_kernel(const int32_t* idx, int P, int E, const int* rank, const int* offsets, int* perm) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  const int e = idx[p];
  if (e < 0 || e >= E) return;
  perm[offsets[e] + rank[p]] = p;
}

// ------------------------------------------------------------------ grouped GEMM
// Shared-memory helpers of kernels 1 and 2 (kernel 3's tensor cores read shared memory themselves).
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}
__device__ __forceinline__ void lds128(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// One block: kBM weight rows x BN token rows of one expert's tile, all of K. A (weights): MXFP4 loaded to
// registers two stages ahead, dequantized exactly and stored to shared memory as bf16; B (activations):
// cp.async (zero-filled past the expert's rows). Double-buffered shared memory, ldmatrix + mma.sync.
//
// PIPE = 0 (default, validated on the H200): weights in registers two k-tiles ahead, B one k-tile ahead, one
// wait for all copies per k-tile. PIPE = S >= 3 (opt-in, set_moe_prefill_pipeline): an S-slot cp.async ring
// for both the raw MXFP4 bytes (+ their scale word) and B, S-1 k-tiles in flight; every thread dequantizes
// exactly the raw bytes it copied itself (so cp.async.wait_group suffices, no extra barrier) into a
// double-buffered bf16 A tile; one __syncthreads per k-tile.
// F16 (PIPE = 0 only): activations, weights and h in f16 (fp4_word_to_f16), f16 MMAs; otherwise bf16.
template <int BN, bool GATE, int PIPE, bool F16 = false>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_kernel(GemmArgs a) {
  static_assert(!F16 || PIPE == 0, "the f16 path runs on the default pipeline only");
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  constexpr int NT = BN / 16;          // n8 tiles per warp (warp covers BN/2 tokens)
  constexpr int NB = BN * 8 / kThreads;  // 16-byte B chunks per thread per stage
  constexpr int kAStage = kBM * kBK * 2, kBStage = BN * kBK * 2;
  constexpr int kRaw = kBM * kBK / 2, kScl = kThreads * 4;  // PIPE: raw MXFP4 bytes, one scale word per thread
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_pair[BN];
  __shared__ float s_w[BN];

  TokenTile tt;
  if (!load_token_tile<BN, GATE>(a, tt, s_pair, s_w)) return;
  const int e = tt.e, pos0 = tt.pos0, nvalid = tt.nvalid;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;

  const DevExpert ex = a.experts[e];
  const int K = a.K, nk = K / kBK;
  // A source row of this thread: row_a of the block tile, half = which 32 of the stage's 64 k.
  const int row_a = tid >> 1, half = tid & 1;
  const uint8_t *wsrc, *ssrc;
  if (GATE) {
    const int j = row_a >> 4;
    const int r = blockIdx.x * (kBM / 2) + 16 * (j >> 1) + (row_a & 15);
    wsrc = ((j & 1) ? ex.w3 : ex.w1) + size_t(r) * (K / 2) + half * 16;
    ssrc = ((j & 1) ? ex.s3 : ex.s1) + size_t(r) * (K / 32) + half;
  } else {
    const int r = blockIdx.x * kBM + row_a;
    wsrc = ex.w2 + size_t(r) * (K / 2) + half * 16;
    ssrc = ex.s2 + size_t(r) * (K / 32) + half;
  }
  const ActCopy<NB, GATE> bcopy(a, tt);

  const uint32_t sA = smem_u32(smem), sB = sA + 2 * kAStage;
  // Two register slots of raw weights (named, so no dynamic register indexing): tile kt lives in slot kt & 1.
  uint4 raw0, raw1;
  uint32_t rsc0, rsc1;
  auto ldA = [&](int kt, uint4& r, uint32_t& sc) {
    r = dev::ld_stream(wsrc + kt * 32);
    sc = __ldg(ssrc + kt * 2);
  };
  auto stA = [&](const uint4& r, uint32_t sc, int stage) {
    const uint32_t wd[4] = {r.x, r.y, r.z, r.w};
    if constexpr (F16) {
      const uint32_t factor = dev::fp4_f16_factor(sc);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t o[4];
        fp4_word_to_f16(wd[q], factor, o);
        st_shared_v4(sA + stage * kAStage + tile_off(row_a, half * 4 + q), o[0], o[1], o[2], o[3]);
      }
    } else {
      const dev::Fp4Scale s = dev::fp4_scale(sc);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t o[4];
        fp4_word_to_bf16(wd[q], s, o);
        st_shared_v4(sA + stage * kAStage + tile_off(row_a, half * 4 + q), o[0], o[1], o[2], o[3]);
      }
    }
  };
  auto cpB = [&](int kt, int stage) {
    bcopy.copy(kt, sB + stage * kBStage);
    cp_commit();
  };

  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  auto compute = [&](int a_stage, int b_stage) {
    const uint32_t a_base = sA + a_stage * kAStage, b_base = sB + b_stage * kBStage;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldsm_x4(a_base + tile_off(32 * wm + 16 * i + (lane & 15), 2 * kk + (lane >> 4)), af[i][0], af[i][1], af[i][2],
                af[i][3]);
      uint32_t bf[NT][2];
#pragma unroll
      for (int jj = 0; jj < NT / 2; ++jj) {
        const int q = lane >> 3;
        ldsm_x4(b_base + tile_off(wn * (BN / 2) + 16 * jj + (q >> 1) * 8 + (lane & 7), 2 * kk + (q & 1)), bf[2 * jj][0],
                bf[2 * jj][1], bf[2 * jj + 1][0], bf[2 * jj + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if constexpr (F16) dev::mma_f16(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][0], bf[j][1]);
          else dev::mma(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][0], bf[j][1]);
        }
    }
  };

  if constexpr (PIPE == 0) {
    // Prologue: tile 0 -> stage 0; tiles 1 and 2 in registers.
    ldA(0, raw0, rsc0);
    if (nk > 1) ldA(1, raw1, rsc1);
    cpB(0, 0);
    stA(raw0, rsc0, 0);
    if (nk > 2) ldA(2, raw0, rsc0);
    cp_wait_all();
    __syncthreads();

    // Iteration kt: B of kt+1 in flight (cp.async), MMAs on stage kt&1, then tile kt+1's weights (loaded two
    // iterations ago) dequantized into the other stage and tile kt+3's weights requested into the freed slot.
    auto iter = [&](int kt, uint4& r_next, uint32_t& sc_next) {
      const int s = kt & 1;
      if (kt + 1 < nk) cpB(kt + 1, s ^ 1);
      compute(s, s);
      if (kt + 1 < nk) {
        stA(r_next, sc_next, s ^ 1);
        if (kt + 3 < nk) ldA(kt + 3, r_next, sc_next);
      }
      cp_wait_all();
      __syncthreads();
    };
    for (int kt = 0; kt < nk; kt += 2) {
      iter(kt, raw1, rsc1);                      // tile kt+1 is in slot 1
      if (kt + 1 < nk) iter(kt + 1, raw0, rsc0);  // tile kt+2 is in slot 0
    }

  } else {
    constexpr int S = PIPE;
    static_assert(S >= 3, "PIPE: 0 or a ring of at least 3 slots");
    const uint32_t sRaw = sB + S * kBStage, sScl = sRaw + S * kRaw;
    // Scale word: the 4 bytes at [row][4 * (kt / 2)] hold k-tiles 2*(kt/2) and 2*(kt/2)+1, halves 0 and 1 each
    // (needs the scale array 4-byte aligned); every thread copies its own word per k-tile.
    const uint8_t* srow = ssrc - half;
    auto issue = [&](int kt) {
      if (kt < nk) {
        const int slot = kt % S;
        cp_async16(sRaw + slot * kRaw + tid * 16, wsrc + kt * 32, true);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sScl + slot * kScl + tid * 4),
                     "l"(srow + 4 * (kt >> 1)));
        bcopy.copy(kt, sB + slot * kBStage);
      }
      cp_commit();  // empty groups past the end keep the group count uniform
    };
    auto convert = [&](int kt) {  // own raw bytes of k-tile kt -> bf16 A buffer kt & 1
      const int slot = kt % S;
      uint4 r;
      uint32_t w;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(sRaw + slot * kRaw + tid * 16));
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w) : "r"(sScl + slot * kScl + tid * 4));
      stA(r, (w >> (8 * (2 * (kt & 1) + half))) & 0xFFu, kt & 1);
    };
#pragma unroll 1
    for (int i = 0; i < S - 1; ++i) issue(i);
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
    convert(0);
    __syncthreads();
#pragma unroll 1
    for (int kt = 0; kt < nk; ++kt) {
      issue(kt + S - 1);  // into the slot of k-tile kt-1, released by the barrier that ended iteration kt-1
      compute(kt & 1, kt % S);
      asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");  // own copies of k-tile kt+1 landed
      if (kt + 1 < nk) convert(kt + 1);
      __syncthreads();
    }
  }

  // Epilogue. Fragment: acc[i][j][2*hh + c] = (row 16 i + g + 8 hh of the warp, token col 8 j + 2 t + c).
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = wn * (BN / 2) + 8 * j + 2 * t4 + c;
      if (col >= nvalid) continue;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (GATE) {
          const float hv = swiglu_weighted(acc[0][j][2 * hh + c], acc[1][j][2 * hh + c], a.limit, s_w[col]);
          const int f = blockIdx.x * (kBM / 2) + 16 * wm + g + 8 * hh;
          a.h[size_t(pos0 + col) * a.n_out + f] = cuda::ptx::act16_bits_rn(hv, F16);
        } else {
          const size_t yrow = size_t(s_pair[col]) * a.n_out;
#pragma unroll
          for (int i = 0; i < 2; ++i) a.ybuf[yrow + blockIdx.x * kBM + 32 * wm + 16 * i + g + 8 * hh] = acc[i][j][2 * hh + c];
        }
      }
    }
}

// ------------------------------------------------------------------ grouped GEMM, kernel 2
// Kernel 2 (set_moe_prefill_kernel(2)): the weights never pass through shared memory. Each warp owns 16 weight
// rows (GATE: 8 features of w1 in MMA rows 0-7 and the same 8 of w3 in rows 8-15, so a thread holds g and u of
// one (feature, token)) and all BN tokens; it loads its rows' MXFP4 bytes from global memory into registers
// two k-tiles ahead and converts them exactly into A fragments itself. That works because an MMA only needs
// A and B to agree on which k sits in which fragment slot: lane t of a k-tile of 64 takes the 16 consecutive k
// 16t .. 16t+15 for both operands (MMA kk's slots k 2t, 2t+1 / 8+2t, 9+2t hold k 16t+4kk+0, 1 / +2, 3), so
// its A bytes are 8 contiguous bytes of a row (one UE8M0 group) and its B values 32 contiguous bytes of a
// token row in shared memory (two 16-byte loads per n8 tile, conflict-free with tile_off's swizzle). The
// dot products are the same sums over k in another order inside each MMA: no longer bit-identical to kernel 1,
// but bit-identical across tile widths. B streams through a 3-stage cp.async ring, one barrier per k-tile;
// each weight is converted once per block (the warps split the rows, not the tokens).
constexpr int kV2Stages = 3;  // B ring depth
template <int BN>
constexpr int gemm_v2_smem() {
  return kV2Stages * BN * kBK * 2;
}

template <int BN, bool GATE, bool F16>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_v2_kernel(GemmArgs a) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  constexpr int NT = BN / 8;               // n8 tiles per warp (every warp covers all BN tokens)
  constexpr int NB = BN * 8 / kThreads;    // 16-byte B chunks per thread per stage
  constexpr int kBStage = BN * kBK * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_pair[BN];
  __shared__ float s_w[BN];

  TokenTile tt;
  if (!load_token_tile<BN, GATE>(a, tt, s_pair, s_w)) return;
  const int e = tt.e, pos0 = tt.pos0, nvalid = tt.nvalid;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

  const DevExpert ex = a.experts[e];
  const int K = a.K, nk = K / kBK;
  const WeightRows<GATE> wrows(ex, K, warp, g, t4);
  const ActCopy<NB, GATE> bcopy(a, tt);
  const uint32_t sB = smem_u32(smem);
  // Shared-memory offsets of the two 16-byte chunks a lane reads per n8 tile (row g, + 8 j rows = + 1024 j bytes;
  // row & 7 = g).
  const uint32_t rd_off0 = tile_off(g, 2 * t4), rd_off1 = tile_off(g, 2 * t4 + 1);
  auto cpB = [&](int kt, uint32_t st) {  // always commits a group (empty past the end): uniform wait_group counts
    if (kt < nk) bcopy.copy(kt, st);
    cp_commit();
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[j][q] = 0.f;

  auto compute = [&](uint32_t st, const uint32_t (&af)[4][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t b[2][4];  // token row 8 j + g's k 16 t4 .. 16 t4 + 15: pairs 0..3, then 4..7
      lds128(st + rd_off0 + 1024 * j, b[0]);
      lds128(st + rd_off1 + 1024 * j, b[1]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t b0 = b[kk >> 1][2 * (kk & 1)], b1 = b[kk >> 1][2 * (kk & 1) + 1];
        if constexpr (F16) dev::mma_f16(acc[j], af[kk][0], af[kk][1], af[kk][2], af[kk][3], b0, b1);
        else dev::mma(acc[j], af[kk][0], af[kk][1], af[kk][2], af[kk][3], b0, b1);
      }
    }
  };

  // Prologue: B of k-tiles 0 and 1 in flight, weights of 0 and 1 in registers.
  static_assert(kV2Stages == 3, "the stage rotation below assumes 3 stages");
  RawA ra0, ra1;
  cpB(0, sB), cpB(1, sB + kBStage);
  wrows.load(0, ra0);
  if (nk > 1) wrows.load(1, ra1);
  uint32_t st_cur = sB, st_old = sB + 2 * kBStage;  // stages of k-tiles kt and kt - 1 (= kt + 2)
  // Iteration kt: B(kt) landed for every thread (wait + barrier, which also frees the stage of kt-1 for kt+2);
  // the weights of kt (loaded two iterations ago) become A fragments and their registers take kt+2's.
  auto iter = [&](int kt, RawA& r) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    cpB(kt + 2, st_old);
    uint32_t af[4][4];
    raw_to_frags<F16>(r, af);
    if (kt + 2 < nk) wrows.load(kt + 2, r);
    compute(st_cur, af);
    st_old = st_cur;
    st_cur = st_cur == sB + 2 * kBStage ? sB : st_cur + kBStage;
  };
  for (int kt = 0; kt < nk; kt += 2) {
    iter(kt, ra0);
    if (kt + 1 < nk) iter(kt + 1, ra1);
  }

  // Epilogue. acc[j][2 hh + c] = (MMA row g + 8 hh of the warp, token 8 j + 2 t4 + c).
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * j + 2 * t4 + c;
      if (col >= nvalid) continue;
      if (GATE) {
        const float hv = swiglu_weighted(acc[j][c], acc[j][2 + c], a.limit, s_w[col]);
        const int f = blockIdx.x * (kBM / 2) + 8 * warp + g;
        a.h[size_t(pos0 + col) * a.n_out + f] = cuda::ptx::act16_bits_rn(hv, F16);
      } else {
        const size_t yrow = size_t(s_pair[col]) * a.n_out + blockIdx.x * kBM + 16 * warp + g;
        a.ybuf[yrow] = acc[j][c];
        a.ybuf[yrow + 8] = acc[j][2 + c];
      }
    }
}

// out[t, d] (+)= sum over k ascending of ybuf[t*K + k, d] (pairs with an invalid expert id contribute 0).
__global__ void combine_kernel(const float* ybuf, const int32_t* idx, int T, int K, int E, int hidden, float* out,
                               bool accumulate) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int n4 = hidden / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(T) * n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i / n4), d4 = int(i % n4);
    float4 s = accumulate ? reinterpret_cast<const float4*>(out)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < K; ++k) {
      const int e = idx[t * K + k];
      if (e < 0 || e >= E) continue;
      const float4 y = reinterpret_cast<const float4*>(ybuf + size_t(t * K + k) * hidden)[d4];
      s.x += y.x, s.y += y.y, s.z += y.z, s.w += y.w;
    }
    reinterpret_cast<float4*>(out)[i] = s;
  }
}

template <int BN, int PIPE>
constexpr int gemm_smem() {
  if (PIPE == 0) return 2 * (kBM * kBK * 2 + BN * kBK * 2);  // two stages of A (bf16) and B
  return 2 * kBM * kBK * 2 + PIPE * (BN * kBK * 2 + kBM * kBK / 2 + kThreads * 4);  // A x2, ring of B + raw + scales
}
// Ring depth of the opt-in pipeline per tile width: the most slots under 99 KB per block (sm_120) with two
// blocks per SM on sm_90 (static shared memory adds 2 * 4 * BN bytes).
template <int BN>
constexpr int pipe_slots() {
  return BN == 128 ? 3 : 4;
}

template <int BN, bool GATE, int PIPE, bool F16 = false>
void set_smem_attr() {
  static_assert(gemm_smem<BN, PIPE>() + 8 * BN <= 99 * 1024, "shared memory over 99 KB per block");
  set_gemm_smem(moe_gemm_kernel<BN, GATE, PIPE, F16>, gemm_smem<BN, PIPE>());
}

template <int BN, bool GATE, bool F16>
void set_smem_attr_v2() {
  static_assert(gemm_v2_smem<BN>() + 8 * BN <= 99 * 1024, "shared memory over 99 KB per block");
  set_gemm_smem(moe_gemm_v2_kernel<BN, GATE, F16>, gemm_v2_smem<BN>());
}

template <int BN>
void set_smem_attrs() {
  set_smem_attr_v2<BN, true, false>(), set_smem_attr_v2<BN, false, false>();
  set_smem_attr_v2<BN, true, true>(), set_smem_attr_v2<BN, false, true>();
  set_smem_attr<BN, true, 0>(), set_smem_attr<BN, false, 0>();
  set_smem_attr<BN, true, 0, true>(), set_smem_attr<BN, false, 0, true>();
  set_smem_attr<BN, true, pipe_slots<BN>()>(), set_smem_attr<BN, false, pipe_slots<BN>()>();
}

template <int BN, bool GATE, int PIPE, bool F16 = false>
void launch_gemm(const GemmArgs& a, int grid_x, int max_tiles, cudaStream_t stream) {
  launch_gemm_grid(moe_gemm_kernel<BN, GATE, PIPE, F16>, gemm_smem<BN, PIPE>(), a, grid_x, max_tiles, stream,
                   "moe_gemm_kernel launch");
}

template <int BN, bool GATE, bool F16>
void launch_gemm_v2(const GemmArgs& a, int grid_x, int max_tiles, cudaStream_t stream) {
  launch_gemm_grid(moe_gemm_v2_kernel<BN, GATE, F16>, gemm_v2_smem<BN>(), a, grid_x, max_tiles, stream,
                   "moe_gemm_v2_kernel launch");
}

// The w1/w3 then the w2 GEMM: kernel 2 (either format), else kernel 1 in f16 (default pipeline), or in bf16 on
// the default or the opt-in pipeline.
template <int BN>
void launch_both(int kernel, const GemmArgs& g1, int gx1, const GemmArgs& g2, int gx2, int max_tiles, bool pipe,
                 bool f16, cudaStream_t st) {
  if (kernel == 2) {
    if (f16) launch_gemm_v2<BN, true, true>(g1, gx1, max_tiles, st), launch_gemm_v2<BN, false, true>(g2, gx2, max_tiles, st);
    else launch_gemm_v2<BN, true, false>(g1, gx1, max_tiles, st), launch_gemm_v2<BN, false, false>(g2, gx2, max_tiles, st);
  } else if (f16) {
    launch_gemm<BN, true, 0, true>(g1, gx1, max_tiles, st);
    launch_gemm<BN, false, 0, true>(g2, gx2, max_tiles, st);
  } else if (pipe) {
    launch_gemm<BN, true, pipe_slots<BN>()>(g1, gx1, max_tiles, st);
    launch_gemm<BN, false, pipe_slots<BN>()>(g2, gx2, max_tiles, st);
  } else {
    launch_gemm<BN, true, 0>(g1, gx1, max_tiles, st);
    launch_gemm<BN, false, 0>(g2, gx2, max_tiles, st);
  }
}

// Kernel 3 (wgmma) is the default where it runs; it is fastest at tiles of 64 even with 192 rows per expert
// (T = 8192 at V4-Flash width; its tile of 128 spills), kernels 1 and 2 take 128 there.
bool kernel3_by_default() { return g_kernel == 0 && wgmma_supported(); }
int pick_tile_n(const MoeShape& s, int T) {
  if (g_tile_n) return g_tile_n;
  const double avg = double(T) * s.top_k / s.n_experts;  // rows per expert under uniform routing
  const bool cap64 = g_kernel == 3 || kernel3_by_default();
  return avg <= 40 ? 32 : avg <= 96 || cap64 ? 64 : 128;
}

void check_shape(const MoeShape& s, const char* who) {
  if (s.hidden <= 0 || s.inter <= 0 || s.hidden % 128 != 0 || s.inter % 128 != 0 || s.n_experts <= 0 ||
      s.n_experts > 65535 || s.top_k <= 0 || s.top_k > 255)
    throw Error(str_cat("cuda ", who, ": MoE shape hidden ", s.hidden, " inter ", s.inter, " experts ", s.n_experts,
                        " top_k ", s.top_k, " unsupported (hidden, inter multiples of 128; top_k <= 255)"));
}

}  // namespace

void set_moe_prefill_tile_n(int n) {
  if (n != 0 && n != 32 && n != 64 && n != 128) throw Error(str_cat("set_moe_prefill_tile_n: ", n, " not 0, 32, 64 or 128"));
  g_tile_n = n;
}

void set_moe_prefill_kernel(int k) {
  if (k < 0 || k > 3) throw Error(str_cat("set_moe_prefill_kernel: ", k, " not 0 (the default), 1, 2 or 3"));
  // Refused here, when it is set, rather than at every moe_prefill call.
  if (k == 3 && !wgmma_supported())
    throw Error(str_cat("set_moe_prefill_kernel: kernel 3 (wgmma) needs compute capability 9.0; this device is ",
                        device_info().cc / 10, ".", device_info().cc % 10));
  g_kernel = k;
}

void set_moe_prefill_mixed_tiles(bool on) { g_mixed_tiles = on; }
bool moe_prefill_mixed_tiles() { return g_mixed_tiles; }

void set_moe_prefill_pipeline(int p) {
  if (p != 0 && p != 1) throw Error(str_cat("set_moe_prefill_pipeline: ", p, " not 0 or 1"));
  g_pipeline = p;
}

MoePrefillWorkspace moe_prefill_workspace_create(const MoeShape& s, int max_tokens) {
  check_shape(s, "moe_prefill_workspace_create");
  if (max_tokens <= 0) throw Error(str_cat("moe_prefill_workspace_create: max_tokens ", max_tokens));
  set_smem_attrs<32>(), set_smem_attrs<64>(), set_smem_attrs<128>();
  wgmma_set_attrs();
  MoePrefillWorkspace ws;
  ws.shape = s;
  ws.max_tokens = max_tokens;
  const size_t P = size_t(max_tokens) * s.top_k;
  // The tile lists: tiles of BN (>= 32) rows, then (mixed tiles) at most one half tile per expert.
  const size_t max_tiles = P / 32 + 1 + 2 * std::min<size_t>(s.n_experts, P);
  auto alloc = [](void** p, size_t bytes, const char* what) { check_cuda(cudaMalloc(p, std::max<size_t>(bytes, 16)), what); };
  alloc(reinterpret_cast<void**>(&ws.mark), size_t(s.n_experts) * pad4(max_tokens), "moe_prefill mark");
  alloc(reinterpret_cast<void**>(&ws.rank), P * 4, "moe_prefill rank");
  alloc(reinterpret_cast<void**>(&ws.perm), P * 4, "moe_prefill perm");
  alloc(reinterpret_cast<void**>(&ws.counts), size_t(s.n_experts) * 4, "moe_prefill counts");
  alloc(reinterpret_cast<void**>(&ws.offsets), size_t(s.n_experts + 1) * 4, "moe_prefill offsets");
  alloc(reinterpret_cast<void**>(&ws.tiles), max_tiles * 8, "moe_prefill tiles");
  alloc(reinterpret_cast<void**>(&ws.n_tiles), 8, "moe_prefill n_tiles");  // [0] tiles, [1] half tiles
  alloc(reinterpret_cast<void**>(&ws.h), P * s.inter * 2, "moe_prefill h");
  alloc(reinterpret_cast<void**>(&ws.ybuf), P * s.hidden * 4, "moe_prefill ybuf");
  return ws;
}

void moe_prefill_workspace_destroy(MoePrefillWorkspace& ws) {
  for (void* p : {static_cast<void*>(ws.mark), static_cast<void*>(ws.rank), static_cast<void*>(ws.perm),
                  static_cast<void*>(ws.counts), static_cast<void*>(ws.offsets), static_cast<void*>(ws.tiles),
                  static_cast<void*>(ws.n_tiles), static_cast<void*>(ws.h), static_cast<void*>(ws.ybuf)})
    cudaFree(p);
  ws = MoePrefillWorkspace{};
}

namespace {
bool g_route_stats = false;
struct RouteStats {
  int64_t calls = 0, tokens = 0, active = 0, tiles = 0, pairs = 0, slots = 0, max_load = 0, max_load_max = 0;
} g_stats;
// set_moe_prefill_route_stats: the expert loads of this call (one stream synchronization; skipped while capturing).
void add_route_stats(const MoePrefillWorkspace& ws, int E, int T, int BN, bool mixed, cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &cs), "moe_prefill route stats");
  if (cs != cudaStreamCaptureStatusNone) return;
  std::vector<int> counts(E);
  int n_tiles[2] = {0, 0};  // offsets_kernel's lists: tiles of BN, half tiles (mixed)
  check_cuda(cudaMemcpyAsync(counts.data(), ws.counts, E * sizeof(int), cudaMemcpyDeviceToHost, stream),
             "moe_prefill route stats");
  check_cuda(cudaMemcpyAsync(n_tiles, ws.n_tiles, (mixed ? 2 : 1) * sizeof(int), cudaMemcpyDeviceToHost, stream),
             "moe_prefill route stats");
  check_cuda(cudaStreamSynchronize(stream), "moe_prefill route stats");
  int64_t mx = 0;
  g_stats.calls++, g_stats.tokens += T;
  for (int c : counts) {
    if (c <= 0) continue;
    g_stats.active++, g_stats.pairs += c, mx = std::max<int64_t>(mx, c);
  }
  g_stats.tiles += n_tiles[0] + n_tiles[1], g_stats.slots += int64_t(n_tiles[0]) * BN + int64_t(n_tiles[1]) * (BN / 2);
  g_stats.max_load += mx, g_stats.max_load_max = std::max(g_stats.max_load_max, mx);
}
}  // namespace

void set_moe_prefill_route_stats(bool on) {
  g_route_stats = on;
  g_stats = RouteStats{};
}
std::string moe_prefill_route_stats() {
  const RouteStats& r = g_stats;
  if (r.calls == 0) return "moe_prefill route stats: no calls";
  const double n = double(r.calls);
  return str_cat("moe_prefill route stats over ", r.calls, " calls (", r.tokens / r.calls, " tokens each): ",
                 r.active / n, " active experts, largest load ", r.max_load / n, " pairs (max ", r.max_load_max,
                 "), ", r.tiles / n, " tiles filled ", r.slots ? 100.0 * r.pairs / r.slots : 0.0, "%");
}

namespace {
// x16: bf16 x, or (x32 set) nullptr: x32 is rounded to f16 into the workspace's ybuf, which the w2 GEMM only
// writes after the w1/w3 GEMM has read x.
void moe_prefill_impl(const MoeShape& s, const DevExpert* experts, const uint16_t* x16, const float* x32,
                      const int32_t* idx, const float* weights, int T, float* out, bool accumulate,
                      MoePrefillWorkspace& ws, cudaStream_t stream) {
  require_supported_device();
  check_shape(s, "moe_prefill");
  const MoeShape& w = ws.shape;
  if (w.hidden != s.hidden || w.inter != s.inter || w.n_experts != s.n_experts || w.top_k != s.top_k)
    throw Error("cuda moe_prefill: workspace was created for another MoE shape");
  if (T < 0 || T > ws.max_tokens)
    throw Error(str_cat("cuda moe_prefill: T = ", T, " outside [0, ", ws.max_tokens, "] (workspace size)"));
  if (T == 0) return;
  const int K = s.top_k, E = s.n_experts, P = T * K, ldm = pad4(T);
  const int BN = pick_tile_n(s, T);
  const int max_tiles = (P + BN - 1) / BN + std::min(E, P);  // >= sum over experts of ceil(count / BN)
  if (max_tiles > 65535) throw Error(str_cat("cuda moe_prefill: T = ", T, " needs ", max_tiles, " tile rows (> 65535)"));

  const bool f16 = x32 != nullptr;
  const int kernel = g_kernel ? g_kernel : kernel3_by_default() ? 3 : BN <= 64 ? 2 : 1;
  if (kernel == 3 && !wgmma_supported())
    throw Error("cuda moe_prefill: GEMM kernel 3 (wgmma) needs compute capability 9.0 (set_moe_prefill_kernel)");
  uint16_t* x_ws = reinterpret_cast<uint16_t*>(ws.ybuf);  // free until the w2 GEMM writes it
  if (kernel == 3) {  // x in kernel 3's pair order (moe_prefill_wgmma.cu), rounded to f16 or copied
    permute_act(f16 ? static_cast<const void*>(x32) : x16, f16, x_ws, int64_t(T) * s.hidden, stream);
    x16 = x_ws;
  } else if (f16) {
    cast_f32_to_f16(x32, x_ws, int64_t(T) * s.hidden, stream);
    x16 = x_ws;
  }
  check_cuda(cudaMemsetAsync(ws.mark, 0, size_t(E) * ldm, stream), "moe_prefill memset");
  check_cuda(cuda::launch(mark_kernel, dim3((T + 255) / 256), dim3(256), 0, stream, idx, T, K, E, ldm, ws.mark), "mark_kernel launch");
  check_cuda(cuda::launch(rank_kernel, dim3(E), dim3(256), 0, stream, idx, ws.mark, T, K, ldm, ws.rank, ws.counts), "rank_kernel launch");
  // Mixed tiles (kernel 3 at 64): the half tiles after the largest possible list of full ones.
  const bool mixed = kernel == 3 && BN == 64 && g_mixed_tiles;
  const int max_half = std::min(E, P);
  int2* half_tiles = mixed ? reinterpret_cast<int2*>(ws.tiles) + max_tiles : nullptr;
  check_cuda(cuda::launch(offsets_kernel, dim3(1), dim3(1024), 0, stream, ws.counts, E, BN, ws.offsets,
                          reinterpret_cast<int2*>(ws.tiles), ws.n_tiles, half_tiles, ws.n_tiles + 1),
             "offsets_kernel launch");
  if (g_route_stats) add_route_stats(ws, E, T, BN, mixed, stream);
  check_cuda(cuda::launch(place_kernel, dim3((P + 255) / 256), dim3(256), 0, stream, idx, P, E, ws.rank, ws.offsets, ws.perm), "place_kernel launch");

  GemmArgs a{};
  a.experts = experts;
  a.top_k = K;
  a.perm = ws.perm, a.counts = ws.counts, a.offsets = ws.offsets;
  a.tiles = reinterpret_cast<const int2*>(ws.tiles), a.n_tiles = ws.n_tiles;
  a.weights = weights, a.h = ws.h, a.ybuf = ws.ybuf, a.limit = s.swiglu_limit;
  GemmArgs g1 = a, g2 = a;
  g1.act = x16, g1.K = s.hidden, g1.n_out = s.inter;
  g2.act = ws.h, g2.K = s.inter, g2.n_out = s.hidden;
  const int gx1 = s.inter / (kBM / 2), gx2 = s.hidden / kBM;
  const bool pipe = g_pipeline == 1;
  if (kernel == 3) {
    // Mixed tiles: w1/w3 over both lists before w2 over either (the w2 GEMM writes ybuf, which holds x until then).
    GemmArgs h1 = g1, h2 = g2;
    h1.tiles = h2.tiles = half_tiles, h1.n_tiles = h2.n_tiles = ws.n_tiles + 1;
    launch_gemm_wgmma(BN, true, g1, gx1, max_tiles, f16, stream);
    if (mixed) launch_gemm_wgmma(BN / 2, true, h1, gx1, max_half, f16, stream);
    launch_gemm_wgmma(BN, false, g2, gx2, max_tiles, f16, stream);
    if (mixed) launch_gemm_wgmma(BN / 2, false, h2, gx2, max_half, f16, stream);
  } else switch (BN) {
    case 32: launch_both<32>(kernel, g1, gx1, g2, gx2, max_tiles, pipe, f16, stream); break;
    case 64: launch_both<64>(kernel, g1, gx1, g2, gx2, max_tiles, pipe, f16, stream); break;
    default: launch_both<128>(kernel, g1, gx1, g2, gx2, max_tiles, pipe, f16, stream); break;
  }
  const int64_t n4 = int64_t(T) * s.hidden / 4;
  check_cuda(cuda::launch(combine_kernel, dim3(static_cast<int>(std::min<int64_t>((n4 + 255) / 256, 8192))), dim3(256), 0, stream, 
      ws.ybuf, idx, T, K, E, s.hidden, out, accumulate), "combine_kernel launch");
}
}  // namespace

void moe_prefill(const MoeShape& s, const DevExpert* experts, const uint16_t* x, const int32_t* idx, const float* weights,
                 int T, float* out, bool accumulate, MoePrefillWorkspace& ws, cudaStream_t stream) {
  moe_prefill_impl(s, experts, x, nullptr, idx, weights, T, out, accumulate, ws, stream);
}

void moe_prefill_f16(const MoeShape& s, const DevExpert* experts, const float* x, const int32_t* idx,
                     const float* weights, int T, float* out, bool accumulate, MoePrefillWorkspace& ws,
                     cudaStream_t stream) {
  if (T > 0 && !x) throw Error("cuda moe_prefill_f16: x is null");
  moe_prefill_impl(s, experts, nullptr, x, idx, weights, T, out, accumulate, ws, stream);
}

}  // namespace dsv4::cudalin
