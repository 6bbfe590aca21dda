// Thin host-side entry points of the CUDA kernels for the sparse-attention path (docs/KERNELS.md).
// Every pointer is a device pointer; every call is asynchronous on `stream` and performs no allocation, no
// host synchronisation and no host-side branching on device data, so each call can be captured in a CUDA
// graph and replayed with new device-side lengths. Shapes a kernel does not support raise dsv4::Error naming
// the shape (never a silent fallback). Each operation computes the same function as its CPU reference.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsv4::cuda {

// ---- device gate -----------------------------------------------------------------------------------------
// The kernels are built for sm_90a, sm_120a and sm_121a only. Returns the configuration for the current
// device, chosen by its exact compute capability; throws naming the capability for any other part.
struct DeviceConfig {
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t smem_optin = 0;  // sharedMemPerBlockOptin
  const char* arch = "";  // "sm_90a" | "sm_120a" | "sm_121a"
};
const DeviceConfig& device_config();
// Throws dsv4::Error with `what` and the CUDA error string when `err` is not cudaSuccess.
void check(cudaError_t err, const char* what);
// Programmatic dependent launch for every kernel of the backend (backend/cuda/pdl.cuh), process-wide,
// default on; off launches with plain stream order (benchmarks compare the two).
void set_pdl(bool on);
bool pdl_enabled();

// ---- exact top-k per row (reference: cpu::topk_row) ---------------------------------------------------------
// scores: [rows, row_stride] fp32; row r holds lengths[r] entries (lengths == nullptr: all `cols`; values
// above `cols` are clamped). out: [rows, k] int32 = the selected indices in ascending order, then -1.
// Exact for any input (nothing is ever truncated), lowest index wins among equal values, NaN/-inf never
// selected. One CTA (rows of <= 4096 entries, or any row on parts with < 128 KB of shared memory per block) or
// one thread-block cluster (<= 8 CTAs) per row, exchanging data
// only through distributed shared memory and the cluster barrier (no global workspace, no spin loop); the kernel
// is chosen from the shapes (topk.cu: a compaction for rows no longer than k, one CTA per row up to 4096 entries,
// a register-resident cluster for a few rows of 16K-64K, else a streaming kernel that reads each row once).
// Supported: 1 <= k <= 2048, cols <= 2^24, rows < 2^28.
// TopkOutput places the output (the default: the plain [rows, k] list): row r's i-th entry goes to
// out[r * stride + i] (stride 0: k; else stride >= k, the entries between untouched), and a selected index j is
// written as j + add + row_add[r] (row_add may be null; the sum must fit int32), -1 as -1. The engine writes its
// slot lists' selected pool rows this way, straight from the top-k.
struct TopkOutput {
  int64_t stride = 0;
  int64_t add = 0;
  const int64_t* row_add = nullptr;
};
void topk_rows(const float* scores, int64_t row_stride, int64_t cols, const int32_t* lengths, int rows, int k,
               int32_t* out, cudaStream_t stream, const TopkOutput& placement = {});
// The CTAs topk_rows runs per row for this shape on the current device: 1, or the size of the row's thread-block
// cluster. Parts with less than 128 KB of shared memory per block (SM12x, ~99 KB) run one CTA per row for every
// shape (issue #4), and so does any part under DSV4_TOPK_ONE_CTA=1 (a test and benchmark knob, read per call).
int topk_ctas_per_row(int64_t cols, int rows, int k);
// What topk_rows selects for rows no longer than k (cols <= k) when no score is NaN or -inf, without scores:
// every index below the row's length (lengths as above), ascending, then -1 up to k, placed as TopkOutput says.
// The CSA indexer's short contexts need no scores at all (GpuOptions::index_all_when_short).
void select_all_rows(int64_t cols, const int32_t* lengths, int rows, int k, int32_t* out, cudaStream_t stream,
                     const TopkOutput& placement = {});

// ---- sparse attention with per-head sinks (reference: cpu::sparse_attention) ---------------------------------
// K = V rows of 512 dims stored in one of the KvCodec layouts (engine/kv_state.h):
enum class KvRowFormat { kF32, kBF16, kFP8 };  // fp8: 448 e4m3 + 64 bf16 RoPE + 7 UE8M0 scales (584 B)
// Arithmetic of the product Q K^T and P V (docs/KERNELS.md, "Sparse attention"). K / V rows of the fp8 and bf16
// layouts are exact in bf16, so only q and the probabilities P are rounded:
//   kSplitBf16 (default): bf16 tensor cores, q and P split into bf16 hi + lo (relative error <= 2^-16 each);
//   kBf16: bf16 tensor cores, q and P rounded once to bf16 (relative error <= 2^-8, as FlashMLA);
//   kFp32: the CUDA-core fp32 kernel (slow; the exact reference path).
enum class AttnPrecision { kSplitBf16, kBf16, kFp32 };
struct SparseAttentionArgs {
  const float* q = nullptr;        // [n_queries, 64, 512]
  const uint8_t* kv = nullptr;     // [n_rows, row_bytes]
  int64_t n_rows = 0;
  int64_t row_bytes = 0;           // >= the format's row size; must keep rows 8-byte aligned (16 for f32)
  KvRowFormat format = KvRowFormat::kFP8;
  const int32_t* slots = nullptr;  // [n_queries, n_slots] row indices; < 0 or >= n_rows: invalid slot
  const int32_t* valid_len = nullptr;  // [n_queries] or nullptr: slots at or past valid_len[q] are invalid
  int n_slots = 0;
  const float* sink = nullptr;     // [64] per-head sink logits (natural-log domain); -inf allowed
  float scale = 0.0f;              // softmax scale, 512^-0.5 for DeepSeek-V4
  float* out = nullptr;            // [n_queries, 64, 512]
  int n_queries = 0;
  void* workspace = nullptr;       // sparse_attention_workspace_bytes(...) bytes (split-K partials)
  AttnPrecision precision = AttnPrecision::kSplitBf16;  // fp8 / bf16 rows only; f32 rows always use kFp32
  // Optional output epilogue (the engine's inverse RoPE and the 16-bit copy for wo_a, without their own
  // launch when the slots are split, which the combine kernel then finishes): the last 2 * rope_n_freq dims
  // of every head of out rotated back by rope_pos[query] * rope_inv_freq[i] (glue::heads_norm_rope with
  // inverse = true, bit for bit: backend/cuda/rope.cuh), then out16 = out rounded to bf16 (f16 when
  // out16_f16). rope_pos == nullptr: no rotation; out16 == nullptr: no copy. rope_n_freq even, <= 256.
  const int64_t* rope_pos = nullptr;  // [n_queries]
  const float* rope_inv_freq = nullptr;  // [rope_n_freq]
  int rope_n_freq = 0;
  uint16_t* out16 = nullptr;  // [n_queries, 64, 512], 8-byte aligned
  bool out16_f16 = false;
};
constexpr int kAttnHeads = 64;
constexpr int kAttnDim = 512;
size_t sparse_attention_workspace_bytes(int n_queries, int n_slots);
void sparse_attention(const SparseAttentionArgs& a, cudaStream_t stream);

// ---- lightning indexer scores (reference: cpu::indexer_scores_fp8 / cpu::indexer_scores_mxfp4) ---------------
// I(s,t) = sum_h w[s,h] * ReLU(q[s,h] . k[t]) * d^-0.5 over key rows in one of two layouts:
//   kFP8:   128 e4m3 bytes then one UE8M0 scale byte (KvCodec(kFP8, 128, 0, 128): 136 B); k = e4m3 * 2^(e-127).
//           row_bytes >= 136, multiple of 8; keys 8-byte aligned.
//   kMXFP4: 64 bytes of e2m1 pairs (low nibble = even element) then 4 UE8M0 scales, one per 32 elements
//           (68 B); row_bytes >= 68, multiple of 4; keys 4-byte aligned.
// Query s sees keys t < n_visible[s] (nullptr: all n_keys; causal prefill passes (p+1)/4); the rest get -inf.
// Key t of query s is row r of `keys` (byte offset r * row_bytes):
//   block_table != nullptr: r = block_table[s * max_blocks + t / block_size] * block_size + t % block_size
//                           (paged; only entries of visible keys are read, so unused entries may hold -1);
//   otherwise:              r = (key_offset ? key_offset[s] : 0) + t.
// One launch thus serves a batch of decode queries from different sequences (graph-capturable: every
// per-query quantity is read on the device).
// Arithmetic (docs/KERNELS.md, "Indexer"): keys are exact in fp16; q is rounded once to fp16 after a per-head
// power-of-two scale (relative error <= 2^-11 per element, fp32 accumulation), unless exact_q: then the older
// kernel carries q as bf16 hi + lo (~2^-16; about 2x the tensor-core work, kFP8 only). fp8_q (kFP8 keys, compute
// capability 9.0 only: indexer_fp8_q_supported): q quantized per (query, head) to e4m3 with a power-of-two scale,
// as cpu::act_quant_e4m3(q_h, 128, 128) (DeepSeek's act_quant; vLLM's and DeepGEMM's indexer numerics), then FP8
// tensor cores (indexer_wgmma.cu). queries_share_keys: a hint that consecutive queries mostly have equal
// key_offset (one sequence's prefill), so the fp8_q kernel serves four queries per key tile; correct either way.
enum class IndexerKeyFormat { kFP8, kMXFP4 };
struct IndexerArgs {
  const float* q = nullptr;   // [n_queries, 64, 128], 16-byte aligned
  // Optional RoPE of q, applied as the kernels load it (no launch of its own): with rope_cs set, the last
  // 2 * rope_n_freq dims of every head are rotated in pairs (2i, 2i + 1) of that block by the factors
  // rope_cs[query * rope_n_freq + i] = (cos, sin) of the query's angle i (glue::rope_table: the same bits as
  // glue::heads_norm_rope without the norm, rope.cuh). 1 <= rope_n_freq <= 64. nullptr: q is used as given.
  const float2* rope_cs = nullptr;
  int rope_n_freq = 0;
  const float* w = nullptr;   // [n_queries, 64] head weights
  // Multiplies each head weight as it is loaded (fp32, one rounding: the engine's 1/sqrt(heads), the same
  // product as the CPU path's iw *= ws, so no scaling launch of its own).
  float w_scale = 1.0f;
  const uint8_t* keys = nullptr;
  int64_t n_keys = 0;         // columns of `scores` (the largest key count of any query)
  int64_t row_bytes = 136;
  const int32_t* n_visible = nullptr;  // [n_queries] or nullptr
  float* scores = nullptr;    // [n_queries, score_stride]
  int64_t score_stride = 0;
  int n_queries = 0;
  const int64_t* key_offset = nullptr;   // [n_queries] first row of each query's keys, or nullptr (0)
  const int32_t* block_table = nullptr;  // [n_queries, max_blocks] or nullptr (excludes key_offset)
  int max_blocks = 0;
  int block_size = 0;                    // rows per block (> 0 with block_table)
  IndexerKeyFormat format = IndexerKeyFormat::kFP8;
  bool exact_q = false;
  bool fp8_q = false;
  bool queries_share_keys = false;
};
constexpr int kIndexerHeads = 64;
constexpr int kIndexerDim = 128;
// Serves both key formats (the name predates kMXFP4).
void indexer_scores_fp8(const IndexerArgs& a, cudaStream_t stream);
// Whether this device runs IndexerArgs::fp8_q (compute capability 9.0).
bool indexer_fp8_q_supported();

}  // namespace dsv4::cuda
