#include "engine/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "engine/step_plan.h"

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

StepCapacity gpu_step_capacity(int max_seqs, int prefill_chunk, int sliding_window) {
  const int chunk = std::max(1, prefill_chunk);
  const int64_t extra = chunk > 1 ? chunk : 0;
  return {max_seqs + extra, ring_rows(sliding_window, chunk), max_seqs + std::min<int64_t>(extra, kPrefillLogitsRows)};
}

size_t MemoryPlan::workspace_at(int64_t context) const {
  return workspace + static_cast<size_t>(std::ceil(workspace_per_context * static_cast<double>(context)));
}

size_t MemoryPlan::kv(int64_t context, int64_t sequences) const {
  return static_cast<size_t>(std::ceil((kv_bytes_per_token * static_cast<double>(context) +
                                        static_cast<double>(kv_fixed_per_sequence)) * static_cast<double>(sequences)));
}

size_t MemoryPlan::total(int64_t context, int64_t sequences) const {
  return device_weights + workspace_at(context) + kv(context, sequences);
}

int64_t MemoryPlan::max_context(int64_t sequences, size_t device_bytes) const {
  const double fixed =
      static_cast<double>(device_weights + workspace) + static_cast<double>(kv_fixed_per_sequence) * sequences;
  if (fixed > static_cast<double>(device_bytes)) return 0;
  const double per_token = kv_bytes_per_token * sequences + workspace_per_context;
  if (per_token <= 0) return INT64_MAX;
  int64_t n = static_cast<int64_t>((static_cast<double>(device_bytes) - fixed) / per_token);
  while (n > 0 && total(n, sequences) > device_bytes) --n;  // the ceilings in total()
  return n;
}

namespace {

// An upper bound of the scratch GpuModel::Impl::alloc_scratch allocates for steps of T tokens (keep the two
// together: test_gpu_memory_plan checks the bound on the device, after steps that create the library handles
// and capture CUDA graphs). Returned as bytes fixed + bytes per token of context.
std::pair<double, double> gpu_scratch(const Model& m, const StepCapacity& step) {
  const double T = static_cast<double>(std::max<int64_t>(1, step.step_tokens));
  const ModelConfig& c = m.config();
  const double D = c.hidden_size, n = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  const double qlr = c.q_lora_rank, IH = std::max(1, c.index_n_heads), Id = std::max(1, c.index_head_dim);
  const double E = c.n_routed_experts, K = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const double G = c.o_groups, olr = c.o_lora_rank, V = static_cast<double>(c.vocab_size);
  const double Is = std::max(1, c.n_shared_experts) * I, topk = std::max(1, c.index_topk), W = c.sliding_window;
  const double widest = std::max({D, qlr, H * hd, G * olr, Is, I});
  // fp32 activations per token: streams h and res, x, y, mHC post / comb, q path, kv, compressor and
  // indexer rows, the index q's RoPE factors (Scratch::rope_cs), attention output, z, router, shared expert, the
  // exact MoE's h.
  const double f32 = 2 * n * D + 2 * D + n + n * n + 2 * qlr + hd + H * hd + hd + 4 * hd + 4 * Id + IH * Id + IH +
                     c.rope_head_dim + H * hd + G * olr + E + K + 4 * Is + K * I;
  const double b16 = widest + D + qlr;                    // 16-bit copies (xb, xbx, xbq)
  const double i32 = K + topk + (W + topk) + 2;           // routes, selections, slot lists (fixed part), next
  const double small = 256;                               // step metadata, sampling parameters
  const double sample = std::min(2048.0, V) * 4;          // sampling candidate lists
  const double hc = std::min(128.0, std::max(1.0, n * D / 256)) * 25 * 4;  // hc_pre split-K partials
  double fixed = T * (4 * f32 + 2 * b16 + 4 * i32 + small + sample + hc);
  fixed += static_cast<double>(std::max<int64_t>(1, step.logits_rows)) * V * 4;  // logits
  const double per_context = T * (4.0 / 4 + 4.0 / 128);  // score rows (context / 4 floats), slots (context / 128)
  // Buffers of at most 64 rows: the side streams' 16-bit buffers, xhx, zb, the MoE decode workspace. Above
  // 64 tokens: the MoE prefill workspace and the bf16 copy of the largest dense linear (two stacked at most).
  const double Td = std::min(T, 64.0);
  fixed += Td * 2 * (2 * widest + D + G * olr);
  fixed += Td * K * (2 * I + 4 * D) + 4 * (2 + 2 * E + 2 * Td * K + Td * (D / 16 + 1));
  if (T > 64) {
    fixed += T * K * (2 * I + 4 * D + 8) + E * (T + 4) + 16 * E + 8 * (T * K / 32 + 1 + E) + 64;
    double most = 0;
    for (const auto& [name, t] : m.checkpoint().tensors())
      if ((name.find(".attn.") != std::string::npos || name.find(".shared_experts.") != std::string::npos) &&
          t->shape.size() == 2)
        most = std::max(most, static_cast<double>(t->numel()));
    // + the router's and the indexer's weights_proj weights in fp32 (GpuOptions::gemm_f32_linears)
    fixed += 2 * most * 2 + (E + IH) * D * 4;
  }
  // Split-K partials of the attention (at most the SM count x 64 heads x 514 floats, 256 SMs assumed), the two
  // GEMV workspaces (cudalin::workspace_create's 16 Mi floats + 64 Ki counters each), and 512 MiB for the
  // library handles (cuBLAS), CUDA graphs and allocation granularity.
  fixed += 256.0 * 64 * 514 * 4 + 2 * (16.0 * (1 << 20) * 4 + (1 << 16) * 4) + 512.0 * (1 << 20);
  return {fixed, per_context};
}

}  // namespace

MemoryPlan plan_memory(const Model& m, const StepCapacity& step, bool include_mtp) {
  MemoryPlan p;
  for (const auto& [name, t] : m.checkpoint().tensors()) {
    p.weights_by_component[component_of(name)] += t->nbytes;
    p.weights += t->nbytes;
  }
  const ModelConfig& c = m.config();
  p.device_weights = device_weight_bytes(m.weights(), c.num_hidden_layers, include_mtp ? c.num_nextn_predict_layers : 0);
  p.step = step;
  p.kv_bytes_per_token = m.kv_bytes_per_token();
  p.kv_fixed_per_sequence = m.kv_fixed_bytes_per_sequence();
  if (step.ring_rows > c.sliding_window)  // the ring widened for chunked prefill, every layer
    p.kv_fixed_per_sequence += static_cast<size_t>(step.ring_rows - c.sliding_window) * m.kv_row_bytes() *
                               static_cast<size_t>(c.num_layers_total());
  const auto [fixed, per_context] = gpu_scratch(m, step);
  p.workspace = static_cast<size_t>(std::ceil(fixed));
  p.workspace_per_context = per_context;
  return p;
}

void check_fits(const MemoryPlan& plan, int64_t context, int64_t sequences, size_t device_bytes,
                const std::string& device_name) {
  const size_t need = plan.total(context, sequences);
  if (need <= device_bytes) return;
  const int64_t fit = plan.max_context(sequences, device_bytes);
  std::string msg = "the model does not fit on " + device_name + ": it needs " + human_bytes(need) + " (weights " +
                    human_bytes(plan.device_weights) + ", KV " + human_bytes(plan.kv(context, sequences)) + " for " +
                    std::to_string(sequences) + " x " + std::to_string(context) + " tokens, workspace " +
                    human_bytes(plan.workspace_at(context)) + " for steps of " + std::to_string(plan.step.step_tokens) +
                    " tokens) and " + human_bytes(device_bytes) + " are available";
  const bool chunked = plan.step.step_tokens > 64;
  if (fit > 0) {
    msg += "; at most " + std::to_string(fit) + " tokens per sequence fit (--max-model-len)";
    if (chunked) msg += "; a smaller prefill chunk shrinks the workspace";
  } else if (plan.device_weights > device_bytes) {
    msg += "; the weights alone do not fit: use more devices (--tensor-parallel-size)";
  } else {
    msg += "; the weights, the step workspace and the fixed per-sequence state leave no room for context";
    if (chunked) msg += "; a smaller prefill chunk shrinks the workspace";
    if (sequences > 1) msg += "; fewer sequences shrink the state";
  }
  fail(msg);
}

}  // namespace dsv4
