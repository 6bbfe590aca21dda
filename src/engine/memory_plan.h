// Memory planning: the bytes a model needs on a device, per component and per token of context, and the
// refusal (with numbers and a way out) when it does not fit. Pure arithmetic over the checkpoint and the
// config, so it runs and is tested without a GPU.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "engine/model.h"

namespace dsv4 {

// The step shape the device engine is built for (GpuModel: max_seqs + prefill_chunk tokens per step when the
// chunk is above 1, and a window ring widened by chunk - 1 rows). The per-step scratch grows with both.
struct StepCapacity {
  int64_t step_tokens = 1;  // most tokens in one step
  int64_t ring_rows = 0;    // window ring rows per sequence and layer (0 = the window)
  int64_t logits_rows = 1;  // most logits rows in one step (engine/step_plan.h next_step's out_cap)
};
// Logits rows a prefill step may carry beyond one per sequence (an all_logits chunk longer than this goes in
// several steps): the logits buffer and its pinned host copy stay at (max_seqs + 512) x vocab floats.
constexpr int kPrefillLogitsRows = 512;
// The GPU engine's step capacity for these options (engine/gpu/gpu_model.cc, GpuModel::load).
StepCapacity gpu_step_capacity(int max_seqs, int prefill_chunk, int sliding_window);

struct MemoryPlan {
  std::map<std::string, size_t> weights_by_component;  // bytes as stored (the formats are kept on device)
  size_t weights = 0;         // as stored, every tensor (MTP included)
  size_t device_weights = 0;  // what the GPU engine uploads (model/weights.h device_weight_bytes; MTP if asked)
  double kv_bytes_per_token = 0;    // compressed entries + indexer keys, all layers
  size_t kv_fixed_per_sequence = 0;  // window rings (ring_rows of them) + compressor rows
  StepCapacity step;                 // what the workspace below is sized for
  // Activations and scratch of one step (an upper bound of what GpuModel allocates, see .cc): a fixed part
  // and a part per token of context (max_model_len), the indexer's score rows and the attention's slot lists.
  size_t workspace = 0;
  double workspace_per_context = 0;

  size_t workspace_at(int64_t context) const;
  size_t kv(int64_t context, int64_t sequences) const;
  size_t total(int64_t context, int64_t sequences) const;
  // Longest context per sequence that fits in `device_bytes` (0 when the weights, the workspace and the fixed
  // per-sequence state alone do not).
  int64_t max_context(int64_t sequences, size_t device_bytes) const;
};

// Which component a tensor name belongs to ("routed experts", "attention", ...).
std::string component_of(const std::string& tensor_name);

// include_mtp: the device also holds the MTP block's weights (GpuOptions::load_mtp); its state is always counted.
MemoryPlan plan_memory(const Model& m, const StepCapacity& step, bool include_mtp = false);

// Throws dsv4::Error with the needed and available bytes, and the longest context that would fit, when the
// plan does not fit in `device_bytes`.
void check_fits(const MemoryPlan& plan, int64_t context, int64_t sequences, size_t device_bytes,
                const std::string& device_name);

std::string human_bytes(double b);

}  // namespace dsv4
