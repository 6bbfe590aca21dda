// Memory planning: the bytes a model needs on a device, per component and per token of context, and the
// refusal (with numbers and a way out) when it does not fit. Pure arithmetic over the checkpoint and the
// config, so it runs and is tested without a GPU.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "engine/model.h"

namespace dsv4 {

struct MemoryPlan {
  std::map<std::string, size_t> weights_by_component;  // bytes as stored (the formats are kept on device)
  size_t weights = 0;
  double kv_bytes_per_token = 0;    // compressed entries + indexer keys, all layers
  size_t kv_fixed_per_sequence = 0;  // window rings + compressor rows
  size_t workspace = 0;              // activations and scratch reserved on top (an estimate, see .cc)

  size_t total(int64_t context, int64_t sequences) const;
  // Longest context per sequence that fits in `device_bytes` (0 when even the weights do not fit).
  int64_t max_context(int64_t sequences, size_t device_bytes) const;
};

// Which component a tensor name belongs to ("routed experts", "attention", ...).
std::string component_of(const std::string& tensor_name);

MemoryPlan plan_memory(const Model& m);

// Throws dsv4::Error with the needed and available bytes, and the longest context that would fit, when the
// plan does not fit in `device_bytes`.
void check_fits(const MemoryPlan& plan, int64_t context, int64_t sequences, size_t device_bytes,
                const std::string& device_name);

std::string human_bytes(double b);

}  // namespace dsv4
