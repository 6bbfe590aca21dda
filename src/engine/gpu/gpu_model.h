// The GPU backend of the engine: the same forward as Model::forward (engine/forward.cc, attention.cc) over
// device weights and device sequence state, with the kernels of src/backend/cuda/ and the glue kernels of
// src/backend/cuda/glue/. See docs/GPU_ENGINE.md.
//
// A batch is processed as steps: each takes up to `prefill_chunk` (default 1) next tokens of every chunk
// that has some, so by default a prompt is prefilled token by token and decode steps carry one token per
// sequence. The result does not depend on how a sequence's tokens were split into chunks or steps, or
// batched with others (up to fp32 summation order in the chunked path).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/memory_plan.h"
#include "engine/model.h"
#include "engine/sampler.h"

namespace dsv4::gpu {

struct GpuOptions {
  KvDtype kv_dtype = KvDtype::kBF16;
  int max_seqs = 4;                // sequences held at once = most tokens per step (1..64)
  int64_t max_model_len = 4096;    // positions per sequence
  // Every linear layer and the routed experts in fp32 activations through the glue kernels (slow; for
  // checking the engine against the CPU without the bf16 activation rounding of the GEMV kernels). Above 64
  // tokens the router's and weights_proj's linears stay on the fp32 cuBLAS GEMM while gemm_f32_linears is on
  // (also no 16-bit rounding).
  bool exact_linear = false;
  bool exact_moe = false;          // only the routed experts through the fp32 glue (implied by exact_linear)
  // DeepSeek's reference numerics for the quantized linears, as EngineOptions::act_quant on the CPU (spec 3.3):
  // the input of every FP8 linear but wo_a, and of every routed expert matrix, quantized per token to e4m3 in
  // blocks of 128 (glue::act_quant_rows) and dequantized again. The FP8 GEMVs / GEMMs then read those values in
  // bf16 (exact), so only summation order differs from the CPU mode; the routed experts take the fp32 glue
  // (GpuOptions::exact_moe's kernels, slower: the MXFP4 kernels round h to 16 bits before w2). Not with
  // exact_linear; refused at load where an FP8 linear has no GEMV shape (rows % 16, cols % 128).
  bool act_quant = false;
  // The CSA indexer with q quantized per head to e4m3 (as vLLM and DeepGEMM do; DeepSeek's own inference code
  // even simulates FP4) on FP8 tensor cores: cuda::IndexerArgs::fp8_q, compute capability 9.0 and FP8 index keys
  // only (refused at load otherwise), off under exact_linear. Off: q rounded to fp16 (the CPU path's scores to
  // ~2^-11), so the top-k matches the CPU engine's except on near-ties.
  bool indexer_fp8_q = false;
  bool progress = false;           // weight upload progress on stderr
  bool poison = true;              // fill state and scratch with NaN bytes before first use
  // Replay each decode step from a CUDA graph captured per (tokens in the step, context bucket): one
  // launch instead of ~50 per layer. Off: every kernel is launched eagerly (same results, bit for bit).
  bool cuda_graphs = true;
  // Chunked prefill: up to this many tokens of one sequence per step (0 or 1: one, i.e. token by token).
  // Steps of several tokens per sequence run eagerly; above 64 tokens in a step the linears dequantize to
  // bf16 and multiply with cuBLAS and the routed experts take the grouped MoE prefill GEMM; the window ring
  // is widened by chunk - 1 rows (engine/step_plan.h); the LM head runs only on the rows whose logits are
  // needed, at most max_seqs + 512 per step (kPrefillLogitsRows: an all_logits chunk longer than that goes in
  // several steps, so the logits buffer and its pinned host copy do not grow with the chunk).
  int prefill_chunk = 0;
  // Benchmarks: record a CUDA event after every operation of a step (implies eager launches);
  // step_profile_ms() reads them.
  bool profile_layers = false;
  // Benchmarks: run the checkpoint's layers this many times over (the copies share the device weights,
  // each has its own state), so a checkpoint of a few full-width layers measures a model of as many layers
  // as the device holds state for. 1 = the checkpoint as it is.
  int repeat_layers = 1;
  // Decode steps (<= 64 tokens) run independent operations on a second stream, joined by events (a fork
  // and join inside the captured graph): the indexer branch of a CSA layer beside the q/kv/compressor
  // path, the shared expert beside the router. Off: one stream (same results, bit for bit).
  bool overlap_branches = true;
  // Decode steps (<= 64 tokens) feed the FP8 GEMVs f16 activations instead of bf16 (cudalin::ActFormat):
  // e4m3 -> f16 is one instruction per weight pair, and f16 rounds 8x finer than bf16, but an activation
  // beyond +-65504 overflows to inf (the step then reports non-finite logits). Off: bf16 everywhere.
  bool f16_activations = true;
  // One-token steps run each hc_pre / hc_head as one kernel (cuda::HcArgs::counter: the last block of the
  // mixes does the finish) instead of two. Off: two launches (same results, bit for bit).
  bool hc_one_kernel = true;
  // With overlap_branches and the stacked wq_a | wkv GEMV, the window KV row's encode (kv_norm + RoPE + the
  // ring write) runs on the compressor's stream once the GEMV has written kv, off the main stream's q chain.
  // Same results, bit for bit. H200 run 24: batch-1 step 7.311 -> 7.220 ms. Off: on the main stream.
  bool kv_row_on_side = true;
  // With overlap_branches the shared expert's stream is joined just before the routed experts' w2 (the first
  // kernel that adds into the shared expert's output) instead of before their w1/w3, so w1/w3 run beside the
  // shared expert (~20 us of GEMVs at batch 1, against the router's ~8). Same results, bit for bit (the same
  // kernels and sums; only a dependency moves). H200 (twentieth session, runs 120-121, batch 1, two processes
  // each): context 259 6.99 -> 6.82-6.83 ms per step, 8,193 8.07-8.13 -> 7.68-7.70, 65,537 8.08-8.12 -> 7.91-7.98;
  // batch 16 unchanged. Off: joined before w1/w3.
  bool shared_join_at_w2 = true;
  // With overlap_branches, which stream has the device's greatest stream priority, kept in the captured graphs
  // (node priorities): when SM slots free up, its pending blocks go first. Same results, bit for bit.
  //  kBranch (the default): the indexer branch (`side`); the FFN's shared expert then runs on side2 (default
  //    priority) so that it does not take SM slots before the routed experts' w1/w3. H200 runs 122-123, batch 1,
  //    four processes each: context 259 6.73-6.75 ms per step against 6.80-6.83 with kNone; 8,193 7.77-8.00
  //    against 7.70-8.00 and 65,537 7.98-8.24 against 7.89-8.25 (noise between processes); batch 16 28.58-28.59
  //    against 28.67-28.74.
  //  kMain: the main chain (`stream`); the branches fill the slots it leaves. Run 123: 6.97 ms at context 259, a
  //    loss.
  //  kNone: every stream at the default priority.
  enum class PriorityStream { kNone, kBranch, kMain };
  PriorityStream priority_stream = PriorityStream::kBranch;
  // With overlap_branches the slot lists are built on the branch stream that is joined before the attention
  // (CSA: the indexer's, after the top-k; HCA: the compressor's), off the main stream. Same results, bit for
  // bit. Off: on the main stream after the joins.
  bool slots_on_branches = true;
  // CSA layers: the top-k writes the selected pool rows straight into the slot lists (cuda::TopkOutput), and the
  // slot-list kernel writes only the window rows, on the compressor's stream with slots_on_branches, so no launch
  // remains between the top-k and the join on the indexer's stream (the critical one: --timeline). Same results,
  // bit for bit. Off: the top-k writes s.sel and the slot-list kernel maps it after the top-k.
  bool topk_writes_slots = true;
  // CSA layers with FP8 index keys: the index q's RoPE is applied by the scores kernel as it loads q
  // (cuda::IndexerArgs::rope_cs, with factors computed once per step), one launch fewer per CSA layer on the
  // indexer's stream, the critical one. Same results, bit for bit. Run 133 (H200, alternating processes): batch 1
  // 6.780-6.785 / 7.041-7.057 / 7.378-7.385 ms at contexts 259 / 8K / 64K against 6.784-6.794 / 7.063-7.072 /
  // 7.410-7.418 off, batch 16 28.66-28.69 against 28.74-28.78, prefill 8K / 64K +0.6-0.7%. Off: glue::heads_norm_rope
  // rotates q in place first.
  bool index_rope_in_scores = true;
  // CSA layers whose score rows have at most index_topk columns (context buckets up to 4 x index_topk: 2,048
  // tokens at V4-Flash width): the top-k would select every visible key whatever the (finite) scores, so the
  // indexer's head weights, index q GEMV (8 MB at V4-Flash width) and scores are skipped, and
  // cuda::select_all_rows writes the selection on the indexer's stream at the layer's start; the indexer's
  // compressor still runs. Same results bit for bit unless a score were NaN or -inf, which only non-finite
  // activations give (the top-k drops such keys; this keeps them). H200 run 145 (alternating processes, 42
  // layers): batch 1 6.602-6.620 / 6.613-6.630 ms at contexts 259 / 1,027 against 6.686-6.695 / 6.711-6.730 off,
  // batch 16 28.63-28.65 against 28.80, prefill 1K +0.4-0.8%; context 4,099 (the top-k) unchanged. Off: the
  // scores and the top-k at every context.
  bool index_all_when_short = true;
  // In steps of more than 64 tokens the BF16 linears that read the fp32 x, the router's and the CSA indexer's
  // weights_proj, run through cuBLAS in fp32 (cudalin::gemm_f32 on the weight widened exactly to fp32,
  // CUBLAS_COMPUTE_32F_PEDANTIC: no TF32) instead of the fp32 glue linear, which streams the weight once per 8
  // tokens. Same function up to fp32 summation order. H200 run 39 (chunks of 2048 at V4-Flash width): the
  // router's share of a chunk 39.5 -> 6.7 ms over 42 layers, 8K prefill 4,772 -> 4,806 tok/s; weights_proj:
  // docs/PERFORMANCE.md run 106. Off: the glue linear at every size.
  bool gemm_f32_linears = true;
  // With f16_activations, steps of more than 64 tokens run the routed experts through cudalin::moe_prefill_f16
  // (x and h in f16, weights converted exactly to f16, f16 MMAs: moe_decode's f16 numerics) in layers whose
  // expert scales allow it (DevLayer::experts_fit_f16); its weight conversion takes half the instructions of
  // the bf16 one. Off: cudalin::moe_prefill on the bf16 copy of x.
  bool moe_prefill_f16 = true;
  // Benchmarks: timing events at each layer's attention join, recorded inside the captured decode graphs as
  // external event nodes (branch_timeline() reads them): when the main stream reached the join, and when the
  // indexer's and the compressor's streams finished. Each node on the main stream can cost it the PDL overlap
  // with the next kernel (compare the step time with it off). Off: none.
  bool branch_timeline = false;
  // Upload the checkpoint's MTP block (mtp.0: its layer, e_proj / h_proj, enorm / hnorm, hc_head, norm) and hold
  // its per-sequence state, for GpuModel::mtp_forward (speculative decoding's draft). Off: neither (the memory
  // plan counts them either way); mtp_forward then refuses.
  bool load_mtp = false;
};

struct SlotPool;

class GpuSequence {
 public:
  ~GpuSequence();
  int64_t length = 0;  // tokens processed
  int64_t mtp_length = 0;  // positions the MTP block has processed (GpuModel::mtp_forward)
  uint64_t draws = 0;  // tokens drawn so far: the position in the sampling stream (seed, draws)
  int slot() const { return slot_; }

 private:
  friend class GpuModel;
  std::shared_ptr<SlotPool> pool_;
  int slot_ = -1;
};

struct GpuSeqChunk {
  GpuSequence* seq = nullptr;
  std::vector<int32_t> tokens;  // at positions seq->length, seq->length + 1, ...
  bool all_logits = false;      // logits for every new token (else only for the last one)
  bool return_logits = true;    // false: no logits are copied to the host (use `next_token`)
  SamplingParams sampling;      // how `next_token` is drawn (default greedy); validated before any work
  // Out: the next token drawn on the device from the last token's logits (glue::sample_rows, the CPU
  // sampler's rule; a row whose kept set exceeds the GPU's 2048 candidates is drawn on the host). A NaN or
  // +inf logit gives next_token = -1 and `error` set, never token 0.
  int32_t next_token = -1;
  std::string error;
  bool keep_streams = false;    // also return the pre-head hyper-connection streams (ChunkOutput::streams)
};

// One MTP draft chunk, as MtpChunk on the CPU (engine/model.h): for positions p..p+S-1 of a sequence
// (p = seq->mtp_length), the main model's pre-head streams at those positions (GpuSeqChunk::keep_streams) and the
// tokens at p+1..p+S; the logits are for the tokens at p+2..p+S+1 (the last row only unless all_logits).
struct GpuMtpChunk {
  GpuSequence* seq = nullptr;
  std::vector<int32_t> next_tokens;  // [S]
  std::vector<float> streams;        // [S, hc_mult, hidden]
  bool all_logits = false;
};

class GpuModel {
 public:
  // Loads the checkpoint, checks the memory plan against the device's free memory (refuses with
  // dsv4::Error naming needed and available bytes), uploads the weights and allocates the state.
  static std::unique_ptr<GpuModel> load(const std::string& dir, const GpuOptions& opt = {});
  ~GpuModel();

  // The checkpoint's config (with repeat_layers: its layers repeated).
  const ModelConfig& config() const { return cfg_; }
  const GpuOptions& options() const { return opt_; }
  size_t weight_bytes() const;
  size_t state_bytes() const;
  // The plan the load checked against the free device memory (with repeat_layers: the KV of every copy).
  const MemoryPlan& memory_plan() const { return plan_; }

  // A new sequence in a free slot; throws when all max_seqs slots are taken.
  std::unique_ptr<GpuSequence> new_sequence();

  // Same contract as Model::forward. Logits rows are fp32 [rows, vocab].
  std::vector<ChunkOutput> forward(std::vector<GpuSeqChunk>& batch);
  // Same contract as Model::mtp_forward: runs the MTP block on each chunk and advances seq->mtp_length. Needs
  // GpuOptions::load_mtp and a checkpoint with an MTP layer. Steps as forward's (prefill_chunk tokens of a chunk
  // per step), always eager (no CUDA graphs).
  std::vector<ChunkOutput> mtp_forward(std::vector<GpuMtpChunk>& batch);

  // With profile_layers: (operation, milliseconds) of the last step, in launch order. Names are
  // "embed", "L<i>.<op>" for layer i, "head".
  std::vector<std::pair<std::string, double>> step_profile_ms() const;

  // With branch_timeline, per layer of the last decode step that overlapped its branches: microseconds by which
  // the indexer's stream (CSA layers) and the compressor's stream finished after the main stream reached the
  // attention's join (negative: before it, i.e. hidden). NaN where the layer has no such branch.
  // CSA layers also: the q path after q_norm, in microseconds after q_norm ended on the main stream (the
  // indexer's q part starts there): when the index wq_b GEMV, the scores and the top-k ended on the indexer's
  // stream, when the main wq_b GEMV and its heads norm/RoPE ended, and when the main stream reached the join.
  struct BranchTiming {
    float indexer_us, compressor_us;
    float index_gemv_us, index_scores_us, index_topk_us, main_wqb_us, main_q_us, main_join_us;
  };
  std::vector<BranchTiming> branch_timeline() const;

  struct Impl;

 private:
  GpuModel() = default;
  // The checks of forward / mtp_forward before any state changes (`what` names the caller); `length`: the
  // positions the sequence's state has (GpuSequence::length, or mtp_length).
  void check_batch_size(const char* what, size_t n) const;
  void check_chunk(const char* what, const GpuSequence* seq, const std::vector<int32_t>& tokens, int64_t length,
                   std::set<const GpuSequence*>& seen) const;
  std::unique_ptr<Model> host_;  // checkpoint mmap, bound weights, config
  ModelConfig cfg_;
  GpuOptions opt_;
  MemoryPlan plan_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::gpu
