// One sequence on the chosen device, for the CLI: feed tokens, get the logits after the last one.
// `--device cpu` runs engine::Model (the exact reference); `--device cuda` runs gpu::GpuModel (built only
// with DSV4_CUDA; decode-step prefill, see docs/GPU_ENGINE.md).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"

namespace dsv4::cli {

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const ModelConfig& config() const = 0;
  // Runs `tokens` (in chunks of `chunk`, 0 = all at once) and returns the logits after the last one.
  virtual std::vector<float> feed(const std::vector<int32_t>& tokens, size_t chunk) = 0;
};

// `dsv4 run --device cuda` without --chunk: tokens per prefill step. 8K-token prefill at V4-Flash width on an
// H200 (docs/PERFORMANCE.md run 38): 2,608 tok/s in chunks of 512, 4,696 in 2048, 6,502 in 8192; the step
// workspace grows with the chunk (memory plan: ~2.8 GB at 2048 and 8.2K positions, plus 1 byte per
// position per chunk token for the indexer's score rows), so 8192 stays an option.
constexpr int kDefaultCudaPrefillChunk = 2048;

struct RunnerOptions {
  std::string device = "cpu";  // cpu | cuda
  KvDtype kv_dtype = KvDtype::kBF16;
  int64_t max_model_len = 0;   // cuda: positions to reserve (0 = 4096)
  int prefill_chunk = 0;       // cuda: tokens per prefill step (GpuOptions::prefill_chunk; 0 or 1 = token by token)
  bool act_quant = false;      // cpu: EngineOptions::act_quant (the DeepSeek reference's FP8 activations)
  bool indexer_fp8_q = false;  // EngineOptions / GpuOptions::indexer_fp8_q (the indexer's q in e4m3, as vLLM)
};

// Throws dsv4::Error naming the device when it is unknown or not built in.
std::unique_ptr<Runner> make_runner(const std::string& model_dir, const RunnerOptions& opt);

}  // namespace dsv4::cli
