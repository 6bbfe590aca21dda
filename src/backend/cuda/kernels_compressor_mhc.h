// Host entry points of the CUDA compressor and mHC kernels (docs/KERNELS.md, "Compressor and mHC").
// Same conventions as kernels.h: device pointers, asynchronous on `stream`, no allocation, no host sync, no
// host branching on device data (graph-capturable); unsupported shapes raise dsv4::Error naming the shape.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace dsv4::cuda {

// ---- KV compressor (reference: cpu::compressor_push + RMSNorm + RoPE + KvCodec::encode, engine/attention.cc) --
// Supported shapes: (ratio 4 overlap, head 512) main CSA, (ratio 128, head 512) main HCA, (ratio 4, head 128)
// indexer. width = 2*head for ratio 4, head for ratio 128.
//
// Device state, one slot of compressor_state_floats(ratio, head) fp32 values per sequence, laid out exactly
// like cpu::CompressorState's vectors, back to back:
//   kv    [ratio][width]   rows of the open block (row = position % ratio)
//   score [ratio][width]   their gate + ape
//   prev_kv, prev_score [ratio][head]   ratio 4 only: the first half of the last closed block
// There are no flags: a row r of the open block is valid iff r < start % ratio, and prev_* is valid iff the
// open block is not block 0 (start >= ratio). A fresh sequence needs no initialisation.
//
// One launch takes a batch of tokens of n_seqs sequences (decode: one token each; prefill: chunks of any size,
// which may cut blocks). Sequence s owns token rows seq_first[s] .. + seq_count[s] - 1 at positions
// seq_start[s] .. ; every block it closes becomes one entry, written to row out_first[s] + e of `out` (e = 0,1,..
// in block order), and its state slot is advanced past the batch.
struct CompressorArgs {
  int ratio = 0;
  int head = 0;
  const float* kv = nullptr;    // [n_tokens, row_stride] projected kv rows (width used)
  const float* gate = nullptr;  // [n_tokens, row_stride] projected gate rows, ape not yet added
  int64_t row_stride = 0;       // floats between token rows, >= width, a multiple of 4 (float4 loads: kv, gate,
                                // ape, norm and state must be 16-byte aligned)
  const float* ape = nullptr;   // [ratio, width]
  const float* norm = nullptr;  // [head] RMSNorm weight
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [n_freq]; RoPE rotates the last 2*n_freq dims at the block's first position
  int n_freq = 32;
  int n_seqs = 0;
  const int32_t* seq_first = nullptr;  // [n_seqs]
  const int32_t* seq_count = nullptr;  // [n_seqs]
  const int64_t* seq_start = nullptr;  // [n_seqs]
  int max_count = 1;                   // host bound on seq_count: sizes the grid only (larger counts still work)
  float* state = nullptr;              // [slots, compressor_state_floats]
  const int32_t* state_slot = nullptr; // [n_seqs] or nullptr (slot = s)
  uint8_t* out = nullptr;              // entry rows, stride out_row_bytes
  int64_t out_row_bytes = 0;
  const int64_t* out_first = nullptr;  // [n_seqs]
  KvRowFormat format = KvRowFormat::kFP8;
  int fp8_rope_dims = 64;    // KvCodec rope_dim: trailing dims stored bf16 (main 64, indexer 0)
  int fp8_scale_block = 64;  // KvCodec scale block (main 64, indexer 128)
};
size_t compressor_state_floats(int ratio, int head);
// Bytes of one row in `format` (equals KvCodec(dtype, head, fp8_rope_dims, fp8_scale_block).row_bytes()).
size_t compressor_row_bytes(KvRowFormat format, int head, int fp8_rope_dims, int fp8_scale_block);
void compressor(const CompressorArgs& a, cudaStream_t stream);

// ---- mHC (reference: cpu::hc_pre / hc_post / hc_head / sinkhorn, spec 2.3 and 2.6) ----------------------------
// Streams h: [n_tokens, 4, dim] fp32. hc_mult must be 4; dim a multiple of 32, at most 7168.
struct HcArgs {
  int n_tokens = 0;
  int64_t dim = 0;
  int n = 4;                   // hc_mult
  const float* h = nullptr;    // [n_tokens, n, dim] (written first when prev_y is set)
  const float* fn = nullptr;   // [mix, n*dim]: mix = 24 (hc_pre) or 4 (hc_head)
  const float* base = nullptr; // [mix]
  const float* scale = nullptr;// [3] (hc_pre) or [1] (hc_head)
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  float* x = nullptr;          // [n_tokens, dim]: hc_pre's sub-layer input / hc_head's y
  float* post = nullptr;       // [n_tokens, n]    (hc_pre only)
  float* comb = nullptr;       // [n_tokens, n*n]  (hc_pre only)
  void* workspace = nullptr;   // hc_workspace_bytes(n, dim) bytes for some n >= n_tokens (split-K partials)
  // Optional fusions of what follows in the block (spec 2.3): x = RMSNorm(x) * norm_w with norm_eps
  // (cpu::rmsnorm's formula) when norm_w is set, xb = bf16(x) (round to nearest even) when xb is set, and
  // xh = f16(x) (nearest even; the FP8 GEMVs' f16 activations) when xh is set.
  const float* norm_w = nullptr;  // [dim]
  uint16_t* xb = nullptr;         // [n_tokens, dim]
  uint16_t* xh = nullptr;         // [n_tokens, dim]
  // Optional: the previous sub-layer's hc_post in front (one launch fewer at decode): h = post ⊗ y + combᵀ · res
  // (hc_post's formula) is written to h, which must not alias prev_res, before the mixes read it.
  const float* prev_y = nullptr;     // [n_tokens, dim]
  const float* prev_res = nullptr;   // [n_tokens, n, dim]
  const float* prev_post = nullptr;  // [n_tokens, n]
  const float* prev_comb = nullptr;  // [n_tokens, n*n]
  // Optional: a device int, zero before the first launch; every launch leaves it zero. With it a one-token
  // launch runs as one kernel (the last block to finish its mixes does the finish) instead of two. It must
  // not be shared by launches that may run at the same time.
  int* counter = nullptr;
};
// hc_pre / hc_head fuse the previous hc_post (HcArgs::prev_*) into their decode mix kernel for at most this
// many tokens; above it they launch hc_post on its own first. Callers that defer hc_post (the GPU engine)
// gain a launch only up to here.
constexpr int kHcFusedPostTokens = 8;
// Enough for any launch of up to n_tokens tokens (the split-K factor depends on the token count).
size_t hc_workspace_bytes(int n_tokens, int64_t dim);
void hc_pre(const HcArgs& a, cudaStream_t stream);
void hc_head(const HcArgs& a, cudaStream_t stream);
// out [n_tokens, n, dim] = post ⊗ y + combᵀ · res; out must not alias res.
void hc_post(int n_tokens, int64_t dim, int n, const float* y, const float* res, const float* post, const float* comb,
             float* out, cudaStream_t stream);
// comb [n_mats, 4, 4] = Sinkhorn(logits) exactly as hc_pre does it (exposed for the float64 test).
void hc_sinkhorn(const float* logits, float* comb, int n_mats, int iters, float eps, cudaStream_t stream);

}  // namespace dsv4::cuda
