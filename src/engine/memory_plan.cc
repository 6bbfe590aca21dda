#include "engine/memory_plan.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace dsv4 {

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, unit[u]);
  return buf;
}

std::string component_of(const std::string& name) {
  if (name.rfind("mtp.", 0) == 0) return "mtp block";
  if (name == "embed.weight") return "embedding";
  if (name == "head.weight") return "lm head";
  if (name.find(".ffn.experts.") != std::string::npos) return "routed experts";
  if (name.find(".ffn.shared_experts.") != std::string::npos) return "shared experts";
  if (name.find(".ffn.gate.") != std::string::npos) return "router";
  if (name.find(".attn.indexer.") != std::string::npos) return "indexer";
  if (name.find(".attn.compressor.") != std::string::npos) return "compressor";
  if (name.find(".attn.") != std::string::npos) return "attention";
  return "norms and mHC";
}

size_t MemoryPlan::total(int64_t context, int64_t sequences) const {
  const double kv = (kv_bytes_per_token * static_cast<double>(context) + static_cast<double>(kv_fixed_per_sequence)) *
                    static_cast<double>(sequences);
  return weights + workspace + static_cast<size_t>(std::ceil(kv));
}

int64_t MemoryPlan::max_context(int64_t sequences, size_t device_bytes) const {
  const double fixed = static_cast<double>(weights + workspace) + static_cast<double>(kv_fixed_per_sequence) * sequences;
  if (fixed > static_cast<double>(device_bytes)) return 0;
  if (kv_bytes_per_token <= 0) return INT64_MAX;
  return static_cast<int64_t>((static_cast<double>(device_bytes) - fixed) / (kv_bytes_per_token * sequences));
}

MemoryPlan plan_memory(const Model& m) {
  MemoryPlan p;
  for (const auto& [name, t] : m.checkpoint().tensors()) {
    p.weights_by_component[component_of(name)] += t->nbytes;
    p.weights += t->nbytes;
  }
  p.kv_bytes_per_token = m.kv_bytes_per_token();
  p.kv_fixed_per_sequence = m.kv_fixed_bytes_per_sequence();
  // Workspace: a conservative allowance for activations of one 8K-token prefill chunk at hidden width
  // (hc_mult streams, attention output H*head_dim, expert intermediates), plus 512 MiB for library handles.
  const ModelConfig& c = m.config();
  const double chunk = 8192;
  const double per_token = 4.0 * (c.hc_mult * c.hidden_size * 3 + double(c.num_attention_heads) * c.head_dim * 2 +
                                  c.num_experts_per_tok * double(c.moe_intermediate_size) * 3);
  p.workspace = static_cast<size_t>(chunk * per_token) + (size_t(512) << 20);
  return p;
}

void check_fits(const MemoryPlan& plan, int64_t context, int64_t sequences, size_t device_bytes,
                const std::string& device_name) {
  const size_t need = plan.total(context, sequences);
  if (need <= device_bytes) return;
  const int64_t fit = plan.max_context(sequences, device_bytes);
  std::string msg = "the model does not fit on " + device_name + ": it needs " + human_bytes(need) + " (weights " +
                    human_bytes(plan.weights) + ", KV " +
                    human_bytes(plan.kv_bytes_per_token * context * sequences +
                                double(plan.kv_fixed_per_sequence) * sequences) +
                    " for " + std::to_string(sequences) + " x " + std::to_string(context) + " tokens, workspace " +
                    human_bytes(plan.workspace) + ") and " + human_bytes(device_bytes) + " are available";
  if (fit > 0) msg += "; at most " + std::to_string(fit) + " tokens per sequence fit (--max-model-len)";
  else msg += "; the weights alone do not fit: use more devices (--tensor-parallel-size)";
  fail(msg);
}

}  // namespace dsv4
