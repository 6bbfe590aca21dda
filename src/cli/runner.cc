#include "cli/runner.h"

#include "core/error.h"
#ifdef DSV4_HAVE_CUDA
#include "engine/gpu/gpu_model.h"
#endif

namespace dsv4::cli {

namespace {

EngineOptions engine_options(const RunnerOptions& o) {
  EngineOptions e;
  e.kv_dtype = o.kv_dtype;
  e.act_quant = o.act_quant;
  e.indexer_fp8_q = o.indexer_fp8_q;
  return e;
}

class CpuRunner : public Runner {
 public:
  CpuRunner(const std::string& dir, const RunnerOptions& o)
      : model_(Model::load(dir, engine_options(o))), seq_(model_->new_sequence()) {}
  const ModelConfig& config() const override { return model_->config(); }
  std::vector<float> feed(const std::vector<int32_t>& tokens, size_t chunk) override {
    std::vector<float> last;
    const size_t step = chunk ? chunk : tokens.size();
    for (size_t i = 0; i < tokens.size(); i += step) {
      std::vector<SeqChunk> b(1);
      b[0].seq = seq_.get();
      b[0].tokens.assign(tokens.begin() + i, tokens.begin() + std::min(tokens.size(), i + step));
      last = std::move(model_->forward(b)[0].logits);
    }
    return last;
  }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<SequenceState> seq_;
};

#ifdef DSV4_HAVE_CUDA
class GpuRunner : public Runner {
 public:
  GpuRunner(const std::string& dir, const RunnerOptions& o) {
    gpu::GpuOptions g;
    g.kv_dtype = o.kv_dtype;
    g.max_seqs = 1;
    g.max_model_len = o.max_model_len > 0 ? o.max_model_len : 4096;
    g.prefill_chunk = o.prefill_chunk;
    g.indexer_fp8_q = o.indexer_fp8_q;  // refused at load unless compute capability 9.0 and --kv-cache-dtype fp8
    g.act_quant = o.act_quant;          // GpuOptions::act_quant (routed experts through the fp32 glue: slower)
    g.progress = true;
    model_ = gpu::GpuModel::load(dir, g);
    seq_ = model_->new_sequence();
  }
  const ModelConfig& config() const override { return model_->config(); }
  std::vector<float> feed(const std::vector<int32_t>& tokens, size_t chunk) override {
    if (seq_->length + static_cast<int64_t>(tokens.size()) > model_->options().max_model_len)
      fail("the sequence would exceed --max-model-len ", model_->options().max_model_len);
    std::vector<float> last;
    const size_t step = chunk ? chunk : tokens.size();
    for (size_t i = 0; i < tokens.size(); i += step) {
      std::vector<gpu::GpuSeqChunk> b(1);
      b[0].seq = seq_.get();
      b[0].tokens.assign(tokens.begin() + i, tokens.begin() + std::min(tokens.size(), i + step));
      last = std::move(model_->forward(b)[0].logits);
    }
    return last;
  }

 private:
  std::unique_ptr<gpu::GpuModel> model_;
  std::unique_ptr<gpu::GpuSequence> seq_;
};
#endif

}  // namespace

std::unique_ptr<Runner> make_runner(const std::string& dir, const RunnerOptions& o) {
  if (o.device == "cpu") return std::make_unique<CpuRunner>(dir, o);
  if (o.device == "cuda") {
#ifdef DSV4_HAVE_CUDA
    return std::make_unique<GpuRunner>(dir, o);
#else
    fail("--device cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
#endif
  }
  fail("--device: unknown value '", o.device, "' (expected cpu or cuda)");
}

}  // namespace dsv4::cli
