// Pieces shared by the MoE prefill GEMM kernels (moe_prefill.cu: kernels 1 and 2; moe_prefill_wgmma.cu: kernel 3):
// the kernel arguments, the token tile of a block, the activation copies into the swizzled shared-memory tile,
// the exact MXFP4 -> bf16 / f16 conversion, the raw weight loads of kernels 2 and 3 and their conversion
// into MMA A fragments, and the SwiGLU epilogue. Internal to src/backend/cuda/linear.
#pragma once
#include <cuda_bf16.h>

#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/frag.cuh"
#include "backend/cuda/linear/linear_cuda.h"
#include "backend/cuda/ptx.cuh"

namespace dsv4::cudalin::moep {

constexpr int kBM = 128;    // weight rows per block (GATE: 64 rows of w1 interleaved by 16 with the same 64 of w3)
constexpr int kBK = 64;     // K per pipeline stage (two MXFP4 scale blocks)
constexpr int kThreads = 256;  // 8 warps: 4 along M x 2 along N

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
// Byte offset of the 16-byte chunk `c` (0..7) of row `r` in a [rows][64] bf16 tile, XOR-swizzled so that
// eight consecutive rows' chunk c land in eight different bank groups (conflict-free ldmatrix and stores).
__device__ __forceinline__ uint32_t tile_off(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// 8 e2m1 weights (one 32-bit word, low nibble first) -> 4 bf16x2 words in natural k order, scale applied
// exactly (frag.cuh: the code placed at bf16 bits 15 / 8..6 is value * 2^-126, fp4_apply multiplies by 2^(e-1)).
__device__ __forceinline__ void fp4_word_to_bf16(uint32_t w, const dev::Fp4Scale& s, uint32_t (&o)[4]) {
  const uint32_t p0 = dev::e2m1_pair<0>(w), p1 = dev::e2m1_pair<1>(w);  // (n0, n4), (n1, n5)
  const uint32_t p2 = dev::e2m1_pair<2>(w), p3 = dev::e2m1_pair<3>(w);  // (n2, n6), (n3, n7)
  o[0] = dev::fp4_apply(dev::prmt(p0, p1, 0x5410), s);  // (n0, n1)
  o[1] = dev::fp4_apply(dev::prmt(p2, p3, 0x5410), s);  // (n2, n3)
  o[2] = dev::fp4_apply(dev::prmt(p0, p1, 0x7632), s);  // (n4, n5)
  o[3] = dev::fp4_apply(dev::prmt(p2, p3, 0x7632), s);  // (n6, n7)
}

// The f16 path (F16): 8 e2m1 weights -> 4 f16x2 words in natural k order, exact for UE8M0 scale bytes in
// [104, 136] (frag.cuh: each nibble becomes an e4m3 worth 2^-6 times its value, cvt.rn.f16x2.e4m3x2 converts a
// pair exactly, one f16 multiply by factor = 2^(e-121) applies the scale). Half the instructions of the bf16
// conversion above: the bf16 one builds each pair from shifted masks and needs two multiplies per pair.
__device__ __forceinline__ void fp4_word_to_f16(uint32_t w, uint32_t factor, uint32_t (&o)[4]) {
  const uint32_t ev = dev::e2m1_even_e4m3(w), od = dev::e2m1_odd_e4m3(w);  // (n0, n2, n4, n6), (n1, n3, n5, n7)
  const uint32_t lo = dev::prmt(ev, od, 0x5140), hi = dev::prmt(ev, od, 0x7362);  // (n0..n3), (n4..n7)
  o[0] = dev::hmul2(dev::e4m3x2_f16_lo(lo), factor);  // (n0, n1)
  o[1] = dev::hmul2(dev::e4m3x2_f16_hi(lo), factor);  // (n2, n3)
  o[2] = dev::hmul2(dev::e4m3x2_f16_lo(hi), factor);  // (n4, n5)
  o[3] = dev::hmul2(dev::e4m3x2_f16_hi(hi), factor);  // (n6, n7)
}

struct GemmArgs {
  const DevExpert* experts;
  const uint16_t* act;   // GATE: x [T, hidden]; else h [P, inter] in permuted order (bf16, or f16 with F16)
  int K;                 // reduction length (GATE: hidden, else inter)
  int n_out;             // output features (GATE: inter, else hidden)
  int top_k;
  const int* perm;       // [P] pair id at each permuted position
  const int* counts;     // [E]
  const int* offsets;    // [E+1]
  const int2* tiles;     // {expert, first row inside the expert}
  const int* n_tiles;
  const float* weights;  // [P] routing weights (GATE)
  uint16_t* h;           // GATE out: bf16 (f16 with F16) [P, inter]
  float* ybuf;           // down out: fp32 [P, hidden], row = pair id
  float limit;
};

// The token tile of block row blockIdx.y: its expert, first permuted position and valid rows; s_pair / s_w get
// each row's pair id (-1 past the tile) and, for GATE, its routing weight. False for a surplus block (the grid
// is sized for the worst case; the tile count lives on the device).
struct TokenTile {
  int e, pos0, nvalid;
};
template <int BN, bool GATE>
__device__ __forceinline__ bool load_token_tile(const GemmArgs& a, TokenTile& tt, int* s_pair, float* s_w) {
  if (blockIdx.y >= *a.n_tiles) return false;
  const int2 tile = a.tiles[blockIdx.y];
  tt.e = tile.x;
  tt.pos0 = a.offsets[tt.e] + tile.y;
  tt.nvalid = min(BN, a.counts[tt.e] - tile.y);
  for (int i = threadIdx.x; i < BN; i += kThreads) {
    const int p = i < tt.nvalid ? a.perm[tt.pos0 + i] : -1;
    s_pair[i] = p;
    if (GATE) s_w[i] = p >= 0 ? a.weights[p] : 0.f;
  }
  return true;
}
// This thread's share of the activation (B) tile copies: tile rows (tid >> 3) + 32 i, 16-byte chunk tid & 7 of
// each 64-wide k-tile, into a [BN][64] 16-bit tile in tile_off's layout (row + 32 i = + 4096 i bytes). brow[i]
// is the row's token (GATE) or permuted position, bit 31 set past the tile (the copy then zero-fills).
template <int NB, bool GATE>
struct ActCopy {
  uint32_t brow[NB];
  const uint16_t* src;  // the thread's chunk of row 0
  uint32_t off;         // its chunk's offset in the tile
  int K;
  __device__ __forceinline__ ActCopy(const GemmArgs& a, const TokenTile& tt)
      : src(a.act + (threadIdx.x & 7) * 8), off(tile_off(threadIdx.x >> 3, threadIdx.x & 7)), K(a.K) {
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      const int pos = tt.pos0 + (r < tt.nvalid ? r : 0);
      brow[i] = uint32_t(GATE ? a.perm[pos] / a.top_k : pos) | (r < tt.nvalid ? 0u : 0x80000000u);
    }
  }
  // k-tile kt of the rows into the tile at shared address st (cp.async, not committed).
  __device__ __forceinline__ void copy(int kt, uint32_t st) const {
#pragma unroll
    for (int i = 0; i < NB; ++i)
      cp_async16(st + off + 4096 * i, src + size_t(brow[i] & 0x7FFFFFFFu) * K + kt * kBK, !(brow[i] >> 31));
  }
};
// h = silu(min(g, L)) * clamp(u, -L, L) * w (no clamp when L <= 0).
__device__ __forceinline__ float swiglu_weighted(float gv, float uv, float limit, float w) {
  if (limit > 0.f) gv = fminf(gv, limit), uv = fminf(fmaxf(uv, -limit), limit);
  return gv / (1.0f + expf(-gv)) * uv * w;
}

__device__ __forceinline__ uint2 ld_stream8(const void* p) {  // 8 read-once weight bytes: skip L1
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
// Raw weights of one k-tile for one thread: 8 bytes of each of its two rows and their scale bytes.
struct RawA {
  uint2 w0, w1;
  uint32_t s0, s1;
};

// The two weight rows of lane (g, t4) of warp `warp` in kernels 2 and 3: MMA rows g and g+8 of the warp's 16
// (GATE: feature 8 warp + g of the block's 64, of w1 and of w3, so a thread holds g and u of one (feature,
// token); else rows 16 warp + g and + 8 of the block's 128 of w2), bytes 8 t4 .. 8 t4 + 7 of each k-tile's 32
// (k = 16 t4 .. 16 t4 + 15, inside one UE8M0 group) and the scale byte of that group.
template <bool GATE>
struct WeightRows {
  const uint8_t *w0, *w1, *s0, *s1;
  __device__ __forceinline__ WeightRows(const DevExpert& ex, int K, int warp, int g, int t4) {
    if (GATE) {
      const int f = blockIdx.x * (kBM / 2) + 8 * warp + g;
      w0 = ex.w1 + size_t(f) * (K / 2), s0 = ex.s1 + size_t(f) * (K / 32);
      w1 = ex.w3 + size_t(f) * (K / 2), s1 = ex.s3 + size_t(f) * (K / 32);
    } else {
      const int r = blockIdx.x * kBM + 16 * warp + g;
      w0 = ex.w2 + size_t(r) * (K / 2), s0 = ex.s2 + size_t(r) * (K / 32);
      w1 = w0 + size_t(8) * (K / 2), s1 = s0 + size_t(8) * (K / 32);
    }
    w0 += 8 * t4, w1 += 8 * t4, s0 += t4 >> 1, s1 += t4 >> 1;
  }
  __device__ __forceinline__ void load(int kt, RawA& r) const {
    r.w0 = ld_stream8(w0 + kt * 32), r.w1 = ld_stream8(w1 + kt * 32);
    load_scales(kt, r);
  }
  __device__ __forceinline__ void load_scales(int kt, RawA& r) const {
    r.s0 = __ldg(s0 + kt * 2), r.s1 = __ldg(s1 + kt * 2);
  }
};

// Kernel 3's weights through a per-warp shared-memory ring instead of registers (run 157): stage j holds lane
// (g, t4)'s 8 bytes of rows g and g + 8 (the same bytes WeightRows::load reads) at byte 16 lane of the warp's
// 512-byte stage, copied by that lane (cp.async of 8 bytes) and read back by it alone, so the copies need no
// barrier, only the cp.async group waits the B ring already has. The scale bytes stay plain loads (4 per row
// share a 32-bit word and the test's scale arrays may sit at odd addresses; they are L1 hits after the row's
// first k-tiles).
template <bool GATE, int S>
struct WeightRing {
  static constexpr int kStageBytes = 32 * 16;  // per warp
  WeightRows<GATE> rows;
  uint32_t slot;  // this lane's 16 bytes of stage 0
  __device__ __forceinline__ WeightRing(const DevExpert& ex, int K, int warp, int g, int t4, uint32_t ring)
      : rows(ex, K, warp, g, t4), slot(ring + warp * (S * kStageBytes) + 16 * (threadIdx.x & 31)) {}
  __device__ __forceinline__ void copy(int kt) const {  // not committed
    const uint32_t d = slot + (kt % S) * kStageBytes;
    cuda::ptx::cp_async_s<8>(d, rows.w0 + kt * 32, 8);
    cuda::ptx::cp_async_s<8>(d + 8, rows.w1 + kt * 32, 8);
  }
  __device__ __forceinline__ void load(int kt, RawA& r) const {  // k-tile kt's copies must have landed
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(slot + (kt % S) * kStageBytes));
    r.w0 = make_uint2(v.x, v.y), r.w1 = make_uint2(v.z, v.w);
    rows.load_scales(kt, r);  // (the same scale loads as WeightRows)
  }
};

// A fragments of a k-tile from a thread's raw weights (kernels 2 and 3): af[kk] = {row g k-pair 2kk, row g+8 pair
// 2kk, row g pair 2kk+1, row g+8 pair 2kk+1} of its 8 pairs per row, i.e. MMA kk's slots k 2t, 2t+1 / 8+2t, 9+2t
// hold k 16t+4kk+0, 1 / +2, 3 (the k relabelling of kernel 2).
template <bool F16>
__device__ __forceinline__ void raw_to_frags(const RawA& r, uint32_t (&af)[4][4]) {
  // q[w][i]: k-pair i of word w (row g: words 0, 1; row g+8: words 2, 3); pair 2kk of a row is word kk/2's
  // pair 2 (kk & 1), pair 2kk+1 the one after it.
  uint32_t q[4][4];
  const uint32_t wd[4] = {r.w0.x, r.w0.y, r.w1.x, r.w1.y};
  if constexpr (F16) {
    const uint32_t f0 = dev::fp4_f16_factor(r.s0), f1 = dev::fp4_f16_factor(r.s1);
#pragma unroll
    for (int w = 0; w < 4; ++w) fp4_word_to_f16(wd[w], w < 2 ? f0 : f1, q[w]);
  } else {
    const dev::Fp4Scale c0 = dev::fp4_scale(r.s0), c1 = dev::fp4_scale(r.s1);
#pragma unroll
    for (int w = 0; w < 4; ++w) fp4_word_to_bf16(wd[w], w < 2 ? c0 : c1, q[w]);
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int w = kk >> 1, i = 2 * (kk & 1);
    af[kk][0] = q[w][i], af[kk][1] = q[2 + w][i], af[kk][2] = q[w][i + 1], af[kk][3] = q[2 + w][i + 1];
  }
}

// Host side of every GEMM kernel: the dynamic shared-memory opt-in (above 48 KB; per device, not a stream op)
// and one launch over the grid (feature blocks, the worst-case token-tile count; surplus blocks exit).
template <typename Kernel>
void set_gemm_smem(Kernel* kernel, int smem) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "moe_prefill smem attribute");
}
template <typename Kernel>
void launch_gemm_grid(Kernel* kernel, int smem, const GemmArgs& a, int grid_x, int max_tiles, cudaStream_t stream,
                      const char* what) {
  check_cuda(cuda::launch(kernel, dim3(grid_x, max_tiles), dim3(kThreads), smem, stream, a), what);
}

// Kernel 3 (moe_prefill_wgmma.cu): wgmma needs sm_90a, so it runs on compute capability 9.0 only.
bool wgmma_supported();
void wgmma_set_attrs();  // the dynamic shared-memory opt-ins (no-op where unsupported)
// y = the n 16-bit activations of x (fp32 -> f16 when x_f32, else bf16 copied) with each 64-wide block stored in
// kernel 3's pair order (rows of a multiple of 64 elements).
void permute_act(const void* x, bool x_f32, uint16_t* y, int64_t n, cudaStream_t stream);
// The w1/w3 (gate) or the w2 GEMM on kernel 3 at token tile BN (32, 64, 128); g.act in its pair order.
void launch_gemm_wgmma(int BN, bool gate, const GemmArgs& g, int gx, int max_tiles, bool f16, cudaStream_t st);

}  // namespace dsv4::cudalin::moep
