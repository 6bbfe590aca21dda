// The engine's model: a loaded checkpoint plus the forward pass over a ragged batch of sequences
// (spec section 2). Each sequence brings its new tokens and its own state; chunked prefill, token-by-token
// decode and one full prefill are the same computation and give the same logits.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_state.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace dsv4 {

struct EngineOptions {
  KvDtype kv_dtype = KvDtype::kBF16;
  int page_rows = 64;  // compressed entries / indexer keys per page
  // DeepSeek's reference numerics for the FP8 / MXFP4 linears: activations quantized per token to e4m3 in blocks
  // of 128 (act_quant, spec dsv4-model.md 3.3) before every FP8 linear (wo_a excepted: the reference keeps it in
  // bf16) and every expert. Off (default): fp32 activations, as transformers' DeepseekV4. CPU only for now.
  bool act_quant = false;
  // Test reference of the GPU's bf16-activation mode (GpuOptions::f16_activations off): the input of every FP8 /
  // MXFP4 linear, wo_a included, rounded to bf16 (nearest even). Off (default): fp32. Not with act_quant.
  bool bf16_activations = false;
  // The CSA indexer's q quantized per (token, head) to e4m3 with a power-of-two scale (act_quant_e4m3, block 128)
  // before the scores, as vLLM and DeepGEMM run it (DeepSeek's own inference code simulates FP4 there): the CPU
  // reference of GpuOptions::indexer_fp8_q. Off (default): fp32 q, as transformers.
  bool indexer_fp8_q = false;
};

struct SeqChunk {
  SequenceState* seq = nullptr;
  std::vector<int32_t> tokens;  // new tokens, at positions seq->length, seq->length + 1, ...
  bool all_logits = false;      // logits for every new token (else only for the last one)
  bool keep_streams = false;    // also return the pre-head hyper-connection streams (input of the MTP step)
};

struct ChunkOutput {
  int64_t rows = 0;            // logits rows
  std::vector<float> logits;   // [rows, vocab]
  std::vector<float> streams;  // [tokens, hc_mult, hidden] when keep_streams
};

// One MTP draft step: for positions p..p+S-1 of a sequence, the main model's pre-head streams at those
// positions and the tokens at p+1..p+S; returns logits for the tokens at p+2..p+S+1.
struct MtpChunk {
  SequenceState* seq = nullptr;
  std::vector<int32_t> next_tokens;  // [S]
  std::vector<float> streams;        // [S, hc_mult, hidden]
  bool all_logits = false;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& dir, const EngineOptions& opt = {});

  const ModelConfig& config() const { return ck_->config(); }
  const Checkpoint& checkpoint() const { return *ck_; }
  const ModelWeights& weights() const { return w_; }
  const EngineOptions& options() const { return opt_; }

  std::unique_ptr<SequenceState> new_sequence() const;

  // Runs every chunk's tokens through the main layers and advances its sequence.
  std::vector<ChunkOutput> forward(std::vector<SeqChunk>& batch) const;
  // Runs the MTP block (mtp.0) and advances each sequence's MTP state.
  std::vector<ChunkOutput> mtp_forward(std::vector<MtpChunk>& batch) const;

  // Bytes per token of context held in compressed entries and indexer keys, and the fixed per-sequence
  // bytes (window rings, compressor rows), for the chosen KV dtype.
  double kv_bytes_per_token() const;
  size_t kv_fixed_bytes_per_sequence() const;
  size_t kv_row_bytes() const;  // one window / compressed row of the main KV (head_dim wide)

  struct Plan;  // token-level view of a batch (see forward.cc)

 private:
  Model() = default;
  void block(int layer, const Plan& plan, float* h) const;
  void attention(const LayerWeights& L, const Plan& plan, const float* xn, float* out) const;
  void logits_rows(const HcWeights& hc_head, const std::vector<float>& norm, const float* h, int64_t rows,
                   float* logits) const;
  // A chunk's output from the final streams h of the step: the logits of its last token (or of all its
  // tokens), the chunk being tokens [first, first + count) of the step.
  ChunkOutput chunk_logits(const HcWeights& hc_head, const std::vector<float>& norm, const float* h, int64_t first,
                           int64_t count, bool all_logits) const;

  std::unique_ptr<Checkpoint> ck_;
  ModelWeights w_;
  EngineOptions opt_;
  std::vector<float> rope_window_, rope_compressed_;
  std::unique_ptr<KvCodec> kv_codec_, index_codec_;
  std::unique_ptr<PagePool> kv_pool_, index_pool_;
};

}  // namespace dsv4
