// dsv4 inspect: what a checkpoint holds and what it needs: config summary, tensor table, bytes per
// component, KV bytes per token of context, and memory for a given context length.
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model.h"

namespace dsv4::cli {

// Which component a tensor belongs to, for the byte table.
static std::string component_of(const std::string& name) {
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

static std::string human(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, unit[u]);
  return buf;
}

int cmd_inspect(int argc, char** argv) {
  Args a(argc, argv, 2, {"model", "context", "kv-cache-dtype", "sequences"}, {"help", "tensors"});
  if (a.has("help")) {
    std::printf("dsv4 inspect [--model DIR] [--tensors] [--context 1048576] [--sequences 1] [--kv-cache-dtype bf16|fp8|f32]\n");
    return 0;
  }
  EngineOptions opt;
  opt.kv_dtype = parse_kv_dtype(a.get("kv-cache-dtype", "bf16"));
  const long long context = a.get_int("context", 0);
  const long long sequences = a.get_int("sequences", 1);
  if (context < 0 || sequences < 1) fail("--context must be >= 0 and --sequences >= 1");
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

  std::map<std::string, size_t> by_comp;
  for (const auto& [name, t] : ck.tensors()) by_comp[component_of(name)] += t->nbytes;
  std::printf("\nbytes per component (as stored):\n");
  for (const auto& [comp, b] : by_comp) std::printf("  %-16s %14zu  %s\n", comp.c_str(), b, human(b).c_str());
  std::printf("  %-16s %14zu  %s\n", "total", ck.total_bytes(), human(ck.total_bytes()).c_str());

  const double per_token = model->kv_bytes_per_token();
  const size_t fixed = model->kv_fixed_bytes_per_sequence();
  std::printf("\nKV cache (%s): %.1f bytes per token of context; %s fixed per sequence (window rings, compressor rows)\n",
              kv_dtype_name(opt.kv_dtype), per_token, human(fixed).c_str());
  if (context > 0) {
    const double kv = (per_token * context + fixed) * sequences;
    std::printf("memory for %lld sequence(s) x %lld tokens: weights %s + KV %s = %s\n", sequences, context,
                human(ck.total_bytes()).c_str(), human(kv).c_str(), human(ck.total_bytes() + kv).c_str());
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
