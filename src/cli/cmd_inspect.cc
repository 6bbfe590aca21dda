// dsv4 inspect: what a checkpoint holds and what it needs: config summary, tensor table, bytes per
// component, KV bytes per token of context, and memory for a given context length.
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/runner.h"
#include "engine/memory_plan.h"
#include "engine/model.h"

namespace dsv4::cli {

int cmd_inspect(int argc, char** argv) {
  Args a(argc, argv, 2, {"model", "context", "kv-cache-dtype", "sequences", "device-memory-gib", "chunk"}, {"help", "tensors"});
  if (a.has("help")) {
    std::printf("dsv4 inspect [--model DIR] [--tensors] [--context 1048576] [--sequences 1] [--kv-cache-dtype bf16|fp8|f32]\n"
                "             [--chunk 2048 (cuda prefill chunk: the workspace is sized for steps of sequences + chunk\n"
                "              tokens, as dsv4 run --device cuda takes them)]\n"
                "             [--device-memory-gib 141 (check the plan against a device of this size)]\n");
    return 0;
  }
  EngineOptions opt;
  opt.kv_dtype = parse_kv_dtype(a.get("kv-cache-dtype", "bf16"));
  const long long context = a.get_int("context", 0);
  const long long sequences = a.get_int("sequences", 1);
  if (context < 0 || sequences < 1) fail("--context must be >= 0 and --sequences >= 1");
  const long long chunk_arg = a.get_int("chunk", 0);
  if (chunk_arg < 0 || chunk_arg > 8192) fail("--chunk must be in 0 .. 8192 (the GPU engine's range)");
  if (sequences > (1 << 20)) fail("--sequences must be at most 2^20");
  const int chunk = chunk_arg == 0 ? kDefaultCudaPrefillChunk : static_cast<int>(chunk_arg);
  auto model = Model::load(resolve_model_dir(a.get("model")), opt);
  const ModelConfig& c = model->config();
  const Checkpoint& ck = model->checkpoint();

  int n_win = 0, n_csa = 0, n_hca = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    AttnKind k = c.attn_kind(i);
    (k == AttnKind::kWindow ? n_win : k == AttnKind::kCSA ? n_csa : n_hca)++;
  }
  std::printf("model: %s\n", ck.dir().c_str());
  std::printf("  hidden %lld, layers %d (+%d MTP): %d window, %d CSA, %d HCA; heads %d x %d (rope %d)\n",
              static_cast<long long>(c.hidden_size), c.num_hidden_layers, c.num_nextn_predict_layers, n_win, n_csa,
              n_hca, c.num_attention_heads, c.head_dim, c.rope_head_dim);
  std::printf("  experts %d routed (top %d) + %d shared, width %d, %d hash layers; vocab %lld\n",
              c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size,
              c.num_hash_layers, static_cast<long long>(c.vocab_size));
  std::printf("  indexer %d heads x %d, top-k %d; window %d; mHC %d streams, %d Sinkhorn iterations\n",
              c.index_n_heads, c.index_head_dim, c.index_topk, c.sliding_window, c.hc_mult, c.hc_sinkhorn_iters);
  std::printf("  rope theta %g (window) / %g (compressed, YaRN %s factor %g)\n", c.rope_theta, c.compress_rope_theta,
              c.yarn.enabled ? "on" : "off", c.yarn.factor);

  const MemoryPlan plan =
      plan_memory(*model, gpu_step_capacity(static_cast<int>(sequences), chunk, c.sliding_window));
  std::printf("\nbytes per component (as stored):\n");
  for (const auto& [comp, b] : plan.weights_by_component)
    std::printf("  %-16s %14zu  %s\n", comp.c_str(), b, human_bytes(b).c_str());
  std::printf("  %-16s %14zu  %s\n", "total", plan.weights, human_bytes(plan.weights).c_str());
  std::printf("\nKV cache (%s): %.1f bytes per token of context; %s fixed per sequence (window rings, compressor rows)\n",
              kv_dtype_name(opt.kv_dtype), plan.kv_bytes_per_token, human_bytes(plan.kv_fixed_per_sequence).c_str());
  std::printf("workspace for steps of %lld tokens (%lld sequences + a prefill chunk of %d): %s + %.2f bytes per token "
              "of context\n", static_cast<long long>(plan.step.step_tokens), sequences, chunk,
              human_bytes(plan.workspace).c_str(), plan.workspace_per_context);
  if (context > 0)
    std::printf("memory for %lld sequence(s) x %lld tokens: weights on the device %s + KV %s + workspace %s = %s\n",
                sequences, context, human_bytes(plan.device_weights).c_str(), human_bytes(plan.kv(context, sequences)).c_str(),
                human_bytes(plan.workspace_at(context)).c_str(), human_bytes(plan.total(context, sequences)).c_str());
  if (a.has("device-memory-gib")) {
    const double gib = a.get_double("device-memory-gib", 0);
    if (gib <= 0) fail("--device-memory-gib must be positive");
    const size_t dev = static_cast<size_t>(gib * (1ull << 30));
    check_fits(plan, context, sequences, dev, "a " + human_bytes(dev) + " device");
    std::printf("fits a %s device; longest context per sequence: %lld tokens\n", human_bytes(dev).c_str(),
                static_cast<long long>(plan.max_context(sequences, dev)));
  }
  if (a.has("tensors")) {
    std::printf("\n%-60s %-8s %-22s %12s  %s\n", "tensor", "dtype", "shape", "bytes", "file");
    for (const auto& [name, t] : ck.tensors())
      std::printf("%-60s %-8s %-22s %12zu  %s\n", name.c_str(), dtype_name(t->dtype), shape_str(t->shape).c_str(),
                  t->nbytes, t->file.c_str());
  }
  return 0;
}

}  // namespace dsv4::cli
