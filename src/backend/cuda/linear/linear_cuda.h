// GPU GEMMs for the official DeepSeek-V4 weight formats (issue #5, kernels part). Host API only: this
// header compiles with the plain C++ compiler; every function launches on the given stream and returns.
//
// Numerics (docs/GEMM_MOE.md derives the error bounds):
//   * activations enter as bf16, accumulation is fp32 on the tensor cores (mma.sync m16n8k16 bf16);
//   * weights are dequantized EXACTLY to bf16 in registers (every e4m3 and every e2m1·2^e value is a bf16
//     value), so the only rounding versus the CPU reference (fp32 activations) is the bf16 rounding of the
//     activations and the fp32 summation order;
//   * FP8 128x128 tile scales (UE8M0 or f32) are applied in fp32 to each 128-wide K partial sum;
//     MXFP4 per-32 UE8M0 scales are folded into the bf16 weights (exact).
// FP8 weights may instead take f16 activations (ActFormat::kF16): e4m3 -> f16 is one instruction per pair
// (the kernels are instruction-bound at batch 1) and f16 rounds 8x finer than bf16, but |x| > 65504
// overflows to inf (the engine then reports non-finite logits; docs/GEMM_MOE.md).
// We do not quantize activations to FP8 (the DeepSeek reference does): that would add a 2^-4 relative
// rounding per activation, ~60x the bf16 one, and make GPU and CPU paths diverge.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/weights.h"

namespace dsv4::cudalin {

// A weight in device memory, laid out exactly as in the checkpoint (see LinearWeight).
struct DevWeight {
  WeightFormat fmt = WeightFormat::kFP8Block;
  int64_t rows = 0, cols = 0;       // [out, in]
  const uint8_t* w = nullptr;       // e4m3 [rows, cols] | packed e2m1 [rows, cols/2]
  const uint8_t* scale = nullptr;   // FP8: [ceil(rows/128), ceil(cols/128)] (u8 or f32); FP4: u8 [rows, cols/32]
  bool scale_is_f32 = false;
};

// Scratch for the split-K reduction of the decode GEMV (partial sums and per-row-tile arrival counters,
// which the kernels leave at zero). One per stream.
struct Workspace {
  float* partial = nullptr;
  size_t partial_floats = 0;
  int* counters = nullptr;
  int n_counters = 0;
};
Workspace workspace_create(size_t partial_floats = size_t(16) << 20, int n_counters = 1 << 16);
void workspace_destroy(Workspace& ws);

// Fails (dsv4::Error naming the device) unless the current device is sm_90, sm_120 or sm_121: the kernels
// here are built ahead of time for exactly those.
void require_supported_device();

// Element format of the 16-bit activations a GEMV reads.
enum class ActFormat { kBf16, kF16 };
// An optional 16-bit copy of a GEMV's output (same row stride), rounded to nearest even, for the next linear.
struct Out16 {
  uint16_t* p = nullptr;
  ActFormat fmt = ActFormat::kBf16;
};

// Decode-shaped GEMM: y[t, r] = sum_k x[t, k] * W[r, k] for t < T (1..64), every r < w.rows.
// x: bf16 (or f16, FP8 weights only) [T, w.cols] (row stride ldx elements), y: fp32 (row stride ldy). FP8 or
// MXFP4 weights; rows a multiple of 16, cols a multiple of 128 (other shapes fail with a message naming the
// shape).
void gemv(const DevWeight& w, const uint16_t* x, int64_t ldx, int T, float* y, int64_t ldy, Workspace& ws,
          cudaStream_t stream, ActFormat act = ActFormat::kBf16, Out16 y16 = {});

// Grouped form, one launch for a block-diagonal product such as the grouped output projection wo_a:
// y[t, r] = sum_k x[t, g*group_x_stride + k] * W[r, k] with g = r / group_rows, for every r < w.rows
// (group_rows a multiple of 16 dividing w.rows; the groups' column blocks must lie inside ldx).
void gemv_grouped(const DevWeight& w, int64_t group_rows, int64_t group_x_stride, const uint16_t* x, int64_t ldx,
                  int T, float* y, int64_t ldy, Workspace& ws, cudaStream_t stream,
                  ActFormat act = ActFormat::kBf16, Out16 y16 = {});

// Benchmark knobs. Kernel version: 2 (default) = cp.async-ring streaming kernels, 2-launch MoE with the
// slot combine fused into w2; 1 = the first kernels (register loads, 4-launch MoE). Process-wide.
void set_linear_kernel_version(int v);
int linear_kernel_version();
// v2 kernels are launched with programmatic dependent launch (default on): each may start while the
// preceding kernel in the stream finishes, streaming its first weights before waiting for that kernel's
// results (griddepcontrol.wait precedes every read of activations, routes and outputs).
void set_linear_pdl(bool on);
// v1: force the K chunks (of 128) each warp streams (1, 2 or 4); 0 restores the heuristic.
void set_gemv_chunks_per_warp(int cpw);
// v2: force the K splits per 16-row tile (a power of two; > 8 splits K across blocks); 0 = heuristic.
void set_gemv_ksplit(int ks);
// v2: warps per block, 8 (default) or 4 (smaller blocks spread a grid of under one wave over more SMs;
// measured slower at V4-Flash width, run 12 of docs/PERFORMANCE.md).
void set_gemv_block_warps(int warps);
// v2 experiment: the GEMV and MoE decode split pickers size their grids to 1 / div of the resident-block
// slots (default 1: a full wave), so that each call leaves room on every SM for the next kernel's blocks.
// Measured slower (H200 run 24, batch-1 step 7.31 -> 7.75 ms with div 2): kept as a knob.
void set_decode_wave_div(int div);

// y[i] = bf16(x[i]) (round to nearest even).
void cast_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// y[i] = f16(x[i]) (round to nearest even; |x| > 65504 gives inf).
void cast_f32_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// ---------------------------------------------------------------- MoE decode (MXFP4 routed experts)
// Device array of these, one per expert: w1, w3 [inter, hidden], w2 [hidden, inter], packed e2m1 + scales.
struct DevExpert {
  const uint8_t *w1, *s1, *w3, *s3, *w2, *s2;
};
// The MoE decode kernels copy an expert's weights in 16-byte and its scales in 4-byte pieces (cp.async, no
// fallback in the loop): true when every w pointer is 16-byte and every scale pointer 4-byte aligned. The loader
// refuses an expert for which this is false (device_weights.cc); cudaMalloc'd tensors always pass.
bool moe_expert_aligned(const DevExpert& e);

struct MoeShape {
  int hidden = 4096, inter = 2048, n_experts = 256, top_k = 6;
  float swiglu_limit = 10.0f;  // 0 = no clamp
};

// Scratch sized for T tokens (T <= 64).
struct MoeWorkspace {
  int max_tokens = 0;
  int* meta = nullptr;       // v1: n_active, active expert ids, offsets, pair lists; then v2 arrival counters
  uint16_t* h = nullptr;     // bf16 [T*top_k, inter], grouped by expert
  float* ybuf = nullptr;     // fp32 [T*top_k, hidden], indexed by pair t*top_k+k
};
MoeWorkspace moe_workspace_create(const MoeShape& s, int max_tokens);
void moe_workspace_destroy(MoeWorkspace& ws);

// out[t] (+)= sum_k expert_{idx[t,k]}(x[t]) with routing weight w[t,k] applied before w2 (spec 2.5):
//   h = silu(min(w1 x, L)) * clamp(w3 x, -L, L) * w[t,k];  y = w2 h.
// x: bf16 [T, hidden]; idx: int32 [T, top_k]; weights: fp32 [T, top_k]; out: fp32 [T, hidden]
// (overwritten, or accumulated into when `accumulate`). Experts with no token cost nothing.
// act = kF16: x is f16 and h is rounded to f16 (instead of bf16) before w2; the MXFP4 weights are then
// converted to f16 (exact only for UE8M0 scales in [104, 136]: the caller checks with moe_scales_fit_f16).
// v2 knob: force the K splits per 16-row tile of w1/w3 and w2 (1, 2, 4, 8); 0 = heuristic.
void set_moe_ksplit(int ks);
// v2 knob: at most this many n-tiles of 8 tokens per expert pass (1, 2 = the default, 4, 8: T tokens take
// ceil(T / 8) up to this). An expert with more tokens than 8 x the n-tiles streams its weights once per
// group; fewer n-tiles means fewer registers, so more warps per SM. Measured (docs/GEMM_MOE.md): faster for
// spread routes at 17-64 tokens, slower when many tokens share few experts.
void set_moe_max_ntiles(int nt);
// v2 knob: warps per block of the MoE decode kernels, 4 (default) or 8 (the first v2 layout).
void set_moe_block_warps(int warps);
// v2 knob: the lean MoE decode kernels (no activation prefetch, <= 80 registers, 6 blocks of 4 warps per SM,
// so more K splits; w1/w3 with a 3-stage ring) for launches of at most max_tokens (<= 8) tokens. Default:
// both at one token (H200 run 20, docs/GEMM_MOE.md: 58.3 -> 48.6 us per MoE at T = 1, step 7.53 -> 7.33 ms;
// at T = 4 faster with random routing, 175 -> 167 us, but slower with all 4 tokens on the same 6 experts,
// 83 -> 100 us, so not the default there). Same results bit for bit only where the split count does not
// change; otherwise the fp32 partials add in another grouping.
struct MoeLean {
  bool w13 = true;
  bool w2 = true;
  int max_tokens = 1;
};
void set_moe_lean(const MoeLean& lean);
MoeLean moe_lean();
// v2 knob: for launches of 2 .. max_tokens tokens (f16 activations, 4-warp blocks), choose the kernel per
// expert by its pair count on the device, in two launches per matrix: light experts (<= light_tokens pairs
// up to 8 tokens, <= wide_light_tokens pairs at 9 .. 32 tokens, <= wider_light_tokens at 33 .. 64) through the
// one-n-tile kernels (the lean ones up to 8 tokens, as set_moe_lean's kernel flags allow), heavy ones through
// the kernels sized for the token count (set_moe_max_ntiles does not apply). When no expert can pass
// light_tokens (T <= light_tokens) the heavy launches are left out.
// Measured on the H200 (docs/GEMM_MOE.md), MoE against the n-tile cap of 2 alone: run 25, T = 4 random routes
// 180 -> 173 us, all 4 tokens on 6 experts 83 -> 67 us, T = 16 on 6 experts 166 -> 150 us. Run 30: T = 64
// random 1445 -> 1411 us, T = 64 on 6 experts 627 -> 481 us with 16 pairs (light 8 at T = 64: 1428 / 482);
// but at T = 16 on 6 experts a light bound of 16 or 24 pairs loses (150 -> 187 us), so 8 there. Steps
// (run 26, against --moe-split off): batch 4 14.09 -> 13.94 ms, batch 16 30.08 -> 29.60 ms; run 29, batch 64
// 72.97 -> 72.39 ms (light 16 above 8 tokens).
// lean_light_tokens (8..64; 8 = only up to 8 tokens): the light launches take the lean kernels (set_moe_lean's
// kernel flags; w1/w3 only while the launch has <= 128 pairs) up to this many tokens. Default 64: H200 run 33,
// steps against 8 in the same run, batch 16 29.86 -> 28.92 ms, batch 32 46.09 -> 44.69, batch 64 72.15 ->
// 70.16 (SplitByExpertLoad tests both).
struct MoeSplit {
  bool on = true;
  int light_tokens = 2;
  int max_tokens = 64;
  int wide_light_tokens = 8;
  int wider_light_tokens = 16;
  int lean_light_tokens = 64;
};
void set_moe_split(const MoeSplit& split);

// out_ready (optional): an event the producer of `out` recorded (e.g. the shared expert on another stream when
// accumulate is set); the stream waits for it only before the first kernel that reads or writes `out` (w2's
// combine), so w1/w3 run beside that producer. Without it, `out` must be ready when moe_decode is called.
void moe_decode(const MoeShape& s, const DevExpert* experts, const uint16_t* x, const int32_t* idx,
                const float* weights, int T, float* out, bool accumulate, MoeWorkspace& ws, cudaStream_t stream,
                ActFormat act = ActFormat::kBf16, cudaEvent_t out_ready = nullptr);
// Whether every expert's scale bytes (experts: device array of s.n_experts) lie where the f16 path of
// moe_decode is exact: 2^-23 .. 2^9, i.e. UE8M0 bytes 104 .. 136 (checkpoint scales sit near 2^-8; NaN
// scales, 255, are outside). Synchronizes the stream.
bool moe_scales_fit_f16(const MoeShape& s, const DevExpert* experts, cudaStream_t stream);

// ---------------------------------------------------------------- prefill
// Prefill-shaped GEMM through cuBLAS: W dequantized to bf16 into `wbuf` (rows*cols bf16, caller-owned),
// then y[M, rows] (fp32) = x[M, cols] (bf16) · Wᵀ with a bf16 cuBLAS GEMM, fp32 accumulation.
void dequant_to_bf16(const DevWeight& w, uint16_t* out, cudaStream_t stream);
void gemm_bf16(const uint16_t* x, int64_t M, const uint16_t* wbf16, int64_t rows, int64_t cols, float* y,
               cudaStream_t stream);
// The same with row strides: x rows ldx >= cols elements apart, y rows ldy >= rows apart (a column block of
// a wider activation, e.g. one group of the grouped output projection).
void gemm_bf16(const uint16_t* x, int64_t ldx, int64_t M, const uint16_t* wbf16, int64_t rows, int64_t cols, float* y,
               int64_t ldy, cudaStream_t stream);
// The fp32 form for a BF16 weight whose activations must stay fp32 (the router: its expert choices are
// discrete): y[M, rows] = x[M, cols] · Wᵀ with W widened to fp32 (widen_bf16_to_f32, exact) and a pure fp32
// cuBLAS GEMM (no TF32).
void widen_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);
void gemm_f32(const float* x, int64_t M, const float* w, int64_t rows, int64_t cols, float* y, cudaStream_t stream);

// ---------------------------------------------------------------- MoE prefill (MXFP4 routed experts, many tokens)
// Device-side permutation (pairs sorted by (expert, t, k), counting sort, no host synchronization) and a
// grouped bf16 tensor-core GEMM that dequantizes the MXFP4 weights exactly inside the kernel; same numerics as
// moe_decode (bf16 x, h rounded to bf16 before w2, fp32 accumulation). Graph-capturable: the host never reads
// idx or any count. Scratch sized for max_tokens (memory: about T*top_k*(2*inter + 4*hidden + 8) bytes plus
// n_experts*T bytes; 1.4 GB at V4-Flash shapes and T = 8192). Create the workspace on the device that runs it.
struct MoePrefillWorkspace {
  MoeShape shape;
  int max_tokens = 0;
  uint8_t* mark = nullptr;  // u8 [E, T padded to 4]: how often token t lists expert e
  int* rank = nullptr;      // [T*top_k] rank of each pair inside its expert
  int* perm = nullptr;      // [T*top_k] pair id (t*top_k+k) at each permuted position
  int* counts = nullptr;    // [E]
  int* offsets = nullptr;   // [E+1]
  int* tiles = nullptr;     // int2 {expert, first row} per token tile of the GEMMs
  int* n_tiles = nullptr;   // [1]
  uint16_t* h = nullptr;    // bf16 (f16: moe_prefill_f16) [T*top_k, inter] in permuted order
  float* ybuf = nullptr;    // fp32 [T*top_k, hidden], row = pair id (moe_prefill_f16: first x in f16)
};
MoePrefillWorkspace moe_prefill_workspace_create(const MoeShape& s, int max_tokens);
void moe_prefill_workspace_destroy(MoePrefillWorkspace& ws);

// Same contract as moe_decode for any T <= ws.max_tokens: out[t] (+)= sum_k expert_{idx[t,k]}(x[t]) with
//   h = silu(min(w1 x, L)) * clamp(w3 x, -L, L) * w[t,k];  y = w2 h;  slots summed in ascending k.
// x: bf16 [T, hidden]; idx: int32 [T, top_k] (device); weights: fp32 [T, top_k]; out: fp32 [T, hidden].
// Pairs whose expert id is outside [0, n_experts) contribute nothing. Bit-reproducible.
void moe_prefill(const MoeShape& s, const DevExpert* experts, const uint16_t* x, const int32_t* idx,
                 const float* weights, int T, float* out, bool accumulate, MoePrefillWorkspace& ws, cudaStream_t stream);
// The same in f16 (moe_decode's ActFormat::kF16 numerics): x, given in fp32 [T, hidden], is rounded to f16 in
// the workspace, the weights are converted exactly to f16 (every UE8M0 scale byte must lie in [104, 136]: check
// with moe_scales_fit_f16 at load), f16 MMAs, h rounded to f16 (an |x| or |h| past 65504 becomes inf).
// Half the weight-conversion instructions of the bf16 path. Bit-reproducible.
void moe_prefill_f16(const MoeShape& s, const DevExpert* experts, const float* x, const int32_t* idx,
                     const float* weights, int T, float* out, bool accumulate, MoePrefillWorkspace& ws,
                     cudaStream_t stream);

// Test/benchmark knob: token rows per GEMM tile (32, 64 or 128); 0 restores the heuristic (from T*top_k/E).
void set_moe_prefill_tile_n(int n);
// Test/benchmark knob (default on since run 167: engine prefill +1.5%): with GEMM kernel 3 at tiles of 64, an
// expert's last tile of 1..32 rows runs at tile 32 (a second launch per GEMM). Same bits either way.
void set_moe_prefill_mixed_tiles(bool on);
bool moe_prefill_mixed_tiles();
// Test/benchmark knob for GEMM kernel 1: 0 = register-staged weight pipeline (default); 1 = cp.async ring with
// 2-3 k-tiles in flight (opt-in: exact, and 10-20% slower on the H200, docs/GEMM_MOE.md "MoE prefill").
void set_moe_prefill_pipeline(int p);
// Test/benchmark knob: the GEMM kernel. 1: weights dequantized into shared memory, ldmatrix for both operands;
// 2: each warp converts its own weight rows from registers straight into MMA fragments (no shared memory for
// the weights; another k order inside each MMA, so not bit-identical to 1); 3: kernel 2 on Hopper's wgmma
// (compute capability 9.0 only, else moe_prefill throws; x and h stored in its pair order; tiles of at most 64
// tokens by default); 0 (default): 3 on compute capability 9.0, elsewhere 2 for token tiles of up to 64, 1 for
// tiles of 128. The pipeline knob applies to kernel 1.
void set_moe_prefill_kernel(int k);
// Benchmark knob: when on, each moe_prefill call outside a graph capture synchronizes its stream once to read the
// expert loads back, and moe_prefill_route_stats() summarizes them (calls, active experts, the largest load, tiles
// and their fill at the chosen width), to tell a model's routes from the benchmarks' uniform ones.
void set_moe_prefill_route_stats(bool on);
std::string moe_prefill_route_stats();

}  // namespace dsv4::cudalin
