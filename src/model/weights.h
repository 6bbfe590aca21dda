// Typed views of one checkpoint's weights, grouped per layer. Large matrices stay in the memory-mapped
// checkpoint in their shipped format (LinearWeight) and are dequantized by the backend as they are used;
// small vectors (norms, mHC parameters, biases, sinks) are copied to float.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"

namespace dsv4 {

struct LinearWeight {
  std::string name;
  WeightFormat fmt = WeightFormat::kBF16;
  int64_t rows = 0, cols = 0;         // [out, in]
  const uint8_t* w = nullptr;         // BF16 [rows, cols] | e4m3 [rows, cols] | packed e2m1 [rows, cols/2]
  const uint8_t* scale = nullptr;     // FP8: [ceil(rows/B), ceil(cols/B)]; FP4: [rows, cols/32]
  bool scale_is_f32 = false;          // FP8 only: float32 scales (Flash-Base) instead of UE8M0
  int block = 128;                    // FP8 tile edge B
  // FP8 / FP4 only: what the activations go through before the product. kE4m3: quantized per token to e4m3
  // in blocks of 128, as DeepSeek's reference does (act_quant; EngineOptions::act_quant). kBf16: rounded to
  // bf16, as the GPU kernels do with bf16 activations (EngineOptions::bf16_activations, a test reference).
  // kF32 (default): unchanged, as transformers.
  enum class ActInput { kF32, kE4m3, kBf16 };
  ActInput act = ActInput::kF32;
  size_t bytes() const;
};

struct HcWeights {
  std::vector<float> fn;     // [mix, hc*D]
  std::vector<float> base;   // [mix]
  std::vector<float> scale;  // [3] (or [1] for the head)
};

struct CompressorWeights {
  int ratio = 0;
  int head = 0;          // output width: head_dim (main) or index_head_dim (indexer)
  LinearWeight wkv, wgate;  // [c*head, D], c = 2 when ratio == 4
  std::vector<float> ape;   // [ratio, c*head]
  std::vector<float> norm;  // [head]
};

struct ExpertWeights {
  LinearWeight w1, w2, w3;
};

struct LayerWeights {
  int index = 0;
  int ratio = 0;
  AttnKind kind = AttnKind::kWindow;
  bool hash = false;
  std::vector<float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;

  std::vector<float> attn_sink;
  LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm;
  CompressorWeights compressor;  // ratio != 0
  LinearWeight index_wq_b, index_weights_proj;  // CSA only
  CompressorWeights index_compressor;           // CSA only

  LinearWeight gate;
  std::vector<float> gate_bias;    // non-hash layers
  std::vector<int32_t> tid2eid;    // hash layers: [vocab, top_k]
  bool has_shared = false;
  ExpertWeights shared;
  std::vector<ExpertWeights> experts;

  // MTP block only.
  bool is_mtp = false;
  LinearWeight e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  HcWeights hc_head;
};

struct ModelWeights {
  LinearWeight embed, head;
  std::vector<float> norm;
  HcWeights hc_head;
  std::vector<LayerWeights> layers;  // main layers, then MTP layers
};

ModelWeights bind_weights(const Checkpoint& ck);

// Bytes the GPU engine uploads (engine/gpu/device_weights.cc): the main layers' matrices as stored, every
// small vector as float (the checkpoint's BF16 norms double), the kernels' pointer tables of the routed
// experts (at most kDeviceExpertTableBytes per expert; device_weights.cc asserts it); the MTP layers (the
// mtp_layers after the main ones, with their e_proj, h_proj, norms and hc_head) only when asked
// (GpuOptions::load_mtp).
constexpr size_t kDeviceExpertTableBytes = 256;
size_t device_weight_bytes(const ModelWeights& w, int num_hidden_layers, int mtp_layers = 0);

}  // namespace dsv4
