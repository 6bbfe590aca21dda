// Small CUDA kernels the GPU engine needs between the big ones (src/engine/gpu/): embedding gather,
// RMSNorm, per-head norm + RoPE, KV row encoding into a row pool, slot lists for the sparse attention
// kernel, indexer scores over f32/bf16 keys, router, SwiGLU, and an fp32-activation linear for BF16 weights
// (and, in the engine's exact mode, for FP8/MXFP4 weights and routed experts too).
// Host API only (plain C++). Every pointer is a device pointer, every call is asynchronous on `stream`,
// allocates nothing and does not branch on device data. Each computes the same function as the CPU code
// named in its comment, in fp32 (reductions in a fixed order, so results are reproducible).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsv4::glue {

// A weight in its shipped format (model/weights.h LinearWeight, on the device).
enum class WFormat : int { kBF16 = 0, kFP8Block = 1, kFP4 = 2 };
struct Weight {
  WFormat fmt = WFormat::kBF16;
  int64_t rows = 0, cols = 0;
  const uint8_t* w = nullptr;      // bf16 [rows, cols] | e4m3 [rows, cols] | e2m1 [rows, cols/2]
  const uint8_t* scale = nullptr;  // FP8 [ceil(rows/block), ceil(cols/block)] u8 or f32 | FP4 u8 [rows, cols/32]
  bool scale_f32 = false;
  int block = 128;
};

// cpu::linear_rows: y[t, r] = sum_k x[t, k] W[row_begin + r, k], t < T, r < rows; fp32 x, exact dequant.
void linear(const Weight& w, int64_t row_begin, int64_t rows, const float* x, int64_t T, int64_t ldx, float* y,
            int64_t ldy, cudaStream_t stream);

// core/numerics act_quant_e4m3(row, cols, 128, out) on each of `rows` rows (DeepSeek's act_quant, spec 3.3):
// every block of 128 columns quantized to e4m3 with the scale 2^ceil(log2(max(amax, 1e-4) / 448)) and
// dequantized again, bit for bit. Writes y (fp32, row stride ldy; may be x itself with ldy == ldx) and / or yb
// (the same values in bf16, exactly; row stride ldyb); either may be null. Columns >= cols are not touched.
void act_quant_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* y, int64_t ldy, uint16_t* yb,
                    int64_t ldyb, cudaStream_t stream);

// One routed expert's three weights (exact-mode MoE).
struct Expert {
  Weight w1, w2, w3;
};
// cpu::moe_forward without the shared expert, fp32 throughout: out[t] (+)= sum_k expert_{idx[t,k]}(x[t]).
// h: scratch [T*top_k, inter] floats. experts: device array [n_experts].
// act_quant: as the CPU with EngineOptions::act_quant, h (routing weight applied) goes through act_quant_rows
// before w2; x must then be quantized by the caller (the same x feeds every expert's w1 and w3).
void moe_exact(const Expert* experts, int64_t hidden, int64_t inter, int top_k, float limit, const float* x,
               const int32_t* idx, const float* weights, int T, float* h, float* out, bool accumulate,
               cudaStream_t stream, bool act_quant = false);

// embed bf16 [vocab, dim]; out [T, n_streams, dim]: every stream gets the token's row (forward.cc).
void embed_streams(const uint16_t* embed, const int32_t* tokens, int T, int64_t dim, int n_streams, float* out,
                   cudaStream_t stream);

// h [T, n_streams, dim] += e [T, dim] in every stream (the MTP block's input, engine/forward.cc: the fp32 sum
// e + h, the same bits in either order).
void add_to_streams(const float* e, int T, int64_t dim, int n_streams, float* h, cudaStream_t stream);

// cpu::rmsnorm over `rows` rows of n (x row stride ldx, y row stride ldy; may alias); w may be null.
// yb (optional): also y rounded to bf16 (nearest even; f16 when f16), same row stride ldy, for the linears
// that read it.
void rmsnorm_rows(const float* x, int64_t ldx, const float* w, int rows, int64_t n, float eps, float* y,
                  int64_t ldy, cudaStream_t stream, uint16_t* yb = nullptr, bool f16 = false);

// x [T, heads, dim]: optional unweighted RMSNorm per head, then cpu::rope on the last 2*n_freq dims at
// position pos[t] (inverse: the conjugate rotation).
// xb (optional): also the result rounded to bf16 (nearest even; f16 when f16), [T, heads, dim].
void heads_norm_rope(float* x, int T, int heads, int dim, const int64_t* pos, const float* inv_freq, int n_freq,
                     bool norm, float eps, bool inverse, cudaStream_t stream, uint16_t* xb = nullptr,
                     bool f16 = false);
// out[t * n_freq + i] = (cos, sin) of the angle pos[t] * inv_freq[i] (rope.cuh's rope_cos_sin, the factors
// heads_norm_rope rotates with), for kernels that rotate as they load (cuda::IndexerArgs::rope_cs).
void rope_table(const int64_t* pos, int T, const float* inv_freq, int n_freq, float2* out, cudaStream_t stream);
// Tests: heads_norm_rope on its generic kernel for every shape (the default takes a kernel that holds a
// float4 per thread where the shape allows; both give the same bits, which the glue test checks).
void set_heads_norm_rope_generic(bool on);

// KvCodec::encode of x [T, dim] into row row_index[t] of `pool` (row stride row_bytes).
// fmt: 0 f32, 1 bf16, 2 fp8 (e4m3 with UE8M0 per scale_block, trailing rope_dim dims bf16).
void kv_encode(const float* x, int T, int dim, int fmt, int rope_dim, int scale_block, uint8_t* pool,
               int64_t row_bytes, const int64_t* row_index, cudaStream_t stream);

// The window KV row of each token in one launch: y = rmsnorm_rows(x, w) (y [T, dim], row stride dim), then
// heads_norm_rope(y, 1 head, no norm) at pos[t], then kv_encode(y) into row row_index[t] of pool; the same
// arithmetic as those three calls (which it makes itself when dim or the alignment does not suit the kernel).
void rmsnorm_rope_encode(const float* x, int64_t ldx, const float* w, int T, int dim, float eps, float* y,
                         const int64_t* pos, const float* inv_freq, int n_freq, int fmt, int rope_dim,
                         int scale_block, uint8_t* pool, int64_t row_bytes, const int64_t* row_index,
                         cudaStream_t stream);

// cpu::indexer_scores against keys stored as f32 (fmt 0), bf16 (1) or fp8 (2, KvCodec(kFP8, d, 0, d)).
// Query t reads keys rows key_base[t] + j of `pool`, j < n_visible[t]; scores[t, j] for j < n_cols, -inf
// past n_visible. q [T, H, d], w [T, H], each weight multiplied by w_scale as it is loaded.
void indexer_scores(const float* q, const float* w, float w_scale, int T, int H, int d, const uint8_t* pool,
                    int64_t row_bytes, int fmt, const int64_t* key_base, const int32_t* n_visible, float* scores,
                    int64_t n_cols, cudaStream_t stream);

// Slot lists for cuda::sparse_attention, in the CPU's key order (attention.cc): slots [T, n_slots] int32.
//   j < window: the window rows max(0, p-W+1) .. p -> base[t] + wp % ring, then -1;
//   j >= window: kind 2 (HCA) entries e = j - W < (p+1)/ratio -> base[t] + ring + e;
//                kind 1 (CSA) sel[t, e] >= 0 -> base[t] + ring + sel[t, e]; otherwise -1;
//                kind 3 (CSA, the selection written by cuda::topk_rows through TopkOutput): not written.
// ring >= window: the rows of the window ring (engine/gpu/device_state.h).
void build_slots(int T, const int64_t* pos, const int64_t* base, int window, int ring, int kind, int ratio,
                 const int32_t* sel, int topk, int n_slots, int32_t* slots, cudaStream_t stream);

// n_visible[t] = (pos[t] + 1) / ratio.
void visible_counts(int T, const int64_t* pos, int ratio, int32_t* out, cudaStream_t stream);

// cpu::moe_route on precomputed router logits [T, E]. score_func: 0 sqrtsoftplus, 1 sigmoid, 2 softmax.
// Hash layers pass tid2eid [vocab, K] (bias ignored), others the selection bias [E].
void route(const float* logits, int T, int E, int K, int score_func, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, bool norm_topk, float scaling, int32_t* idx, float* weights, cudaStream_t stream);
// Tests: route with the warp-per-token kernel (E <= 256) instead of the block rank kernel; both pick and weigh
// identically (same scores, same total order, same summation order), which the router test checks bitwise.
void set_route_warp_kernel(bool on);
bool route_warp_kernel_set();

// SwiGLU with the clamp (cpu::swiglu_expert, weight 1): h = silu(min(g, L)) * clamp(u, -L, L); limit 0: none.
void swiglu(const float* g, const float* u, int64_t n, float limit, float* h, cudaStream_t stream);
// The same over rows: h [rows, n] from g and u rows of stride ld (g and u may be halves of one stacked row);
// hb (optional): also h rounded to bf16 (nearest even; f16 when f16).
void swiglu_rows(const float* g, const float* u, int64_t rows, int64_t n, int64_t ld, float limit, float* h,
                 cudaStream_t stream, uint16_t* hb = nullptr, bool f16 = false);

// out[i] = argmax over row i of x [rows, n] (lowest index among equal maxima).
void argmax_rows(const float* x, int rows, int64_t n, int32_t* out, cudaStream_t stream);

}  // namespace dsv4::glue
