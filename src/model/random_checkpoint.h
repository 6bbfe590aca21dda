// Deterministic random checkpoints in the official layout (names, FP8/FP4 dtypes, .scale tensors, sharded
// safetensors with an index). Used for the embedded default model, for tests and for benchmarks at full
// V4-Flash width. The same seed gives the same bytes on every machine (own RNG, no std distributions).
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  int shards = 2;
  // When >= 0: keep only layers [0, layers_limit) and no MTP layer (config rewritten accordingly), for
  // benchmarks of single full-width layers.
  int layers_limit = -1;
};

// Writes config.json (the given text) and random weights matching it into `dir` (created if needed).
void write_random_checkpoint(const std::string& config_json, const std::string& dir,
                             const RandomCheckpointOptions& opt);

// The embedded default model: a tiny config with every layer kind (window, CSA, HCA), hash routing, an MTP
// layer, FP8 linears and FP4 experts, and the real DeepSeek-V4 vocabulary size.
const std::string& default_model_config_json();

}  // namespace dsv4
