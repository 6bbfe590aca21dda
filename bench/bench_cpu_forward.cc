// CPU forward benchmark (not a test): prefill and decode tokens per second of one sequence, with the
// decode rate set against the weight-bandwidth floor measured in the same run (bytes of weights a decode
// step reads / memcpy bandwidth of this machine).
//
//   bench_cpu_forward [--model DIR] [--prompt-len 512] [--decode 32] [--kv-cache-dtype bf16] [--repeat 3]
// Without --model the embedded default model is used (written on first use, see `dsv4 run`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model.h"
#include "engine/sampler.h"

using namespace dsv4;
using clock_type = std::chrono::steady_clock;

static double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Copy bandwidth (read + write bytes per second) over a buffer much larger than the caches.
static double memcpy_bandwidth() {
  const size_t n = size_t(512) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = clock_type::now();
    std::memcpy(b.data(), a.data(), n);
    auto t1 = clock_type::now();
    best = std::max(best, 2.0 * n / seconds(t0, t1));
  }
  return best;
}

// Weight bytes one decode step reads: everything but the embedding table and the routed experts, plus
// top_k routed experts per MoE layer (one row of the embedding is negligible).
static double decode_weight_bytes(const Model& m) {
  const ModelConfig& c = m.config();
  double total = 0, experts = 0, one_expert = 0;
  for (const auto& [name, t] : m.checkpoint().tensors()) {
    if (name == "embed.weight" || name.rfind("mtp.", 0) == 0) continue;
    if (name.find(".ffn.experts.") != std::string::npos) experts += t->nbytes;
    else total += t->nbytes;
  }
  one_expert = experts / (static_cast<double>(c.n_routed_experts) * c.num_hidden_layers);
  return total + one_expert * c.num_experts_per_tok * c.num_hidden_layers;
}

int main(int argc, char** argv) {
  try {
    cli::Args a(argc, argv, 1, {"model", "prompt-len", "decode", "kv-cache-dtype", "repeat"}, {});
    EngineOptions opt;
    opt.kv_dtype = parse_kv_dtype(a.get("kv-cache-dtype", "bf16"));
    const int P = static_cast<int>(a.get_int("prompt-len", 512));
    const int N = static_cast<int>(a.get_int("decode", 32));
    const int R = static_cast<int>(a.get_int("repeat", 3));
    auto m = Model::load(cli::resolve_model_dir(a.get("model")), opt);
    const ModelConfig& c = m->config();
    std::vector<int32_t> prompt(P);
    for (int i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);

    std::vector<double> pf, dc;
    for (int r = 0; r < R; ++r) {
      auto s = m->new_sequence();
      std::vector<SeqChunk> b(1);
      b[0].seq = s.get();
      b[0].tokens = prompt;
      auto t0 = clock_type::now();
      auto logits = m->forward(b)[0].logits;
      auto t1 = clock_type::now();
      for (int i = 0; i < N; ++i) {
        b[0].tokens = {argmax(logits.data(), c.vocab_size)};
        logits = m->forward(b)[0].logits;
      }
      auto t2 = clock_type::now();
      pf.push_back(P / seconds(t0, t1));
      dc.push_back(N / seconds(t1, t2));
    }
    std::sort(pf.begin(), pf.end());
    std::sort(dc.begin(), dc.end());
    const double bw = memcpy_bandwidth();
    const double bytes = decode_weight_bytes(*m);
    const double floor_tps = bw / 2 / bytes;  // a decode step reads its weights once (read bandwidth = copy / 2)
    std::printf("model %s (hidden %lld, %d layers), kv %s, %d threads\n", m->checkpoint().dir().c_str(),
                static_cast<long long>(c.hidden_size), c.num_hidden_layers, kv_dtype_name(opt.kv_dtype),
#ifdef _OPENMP
                omp_get_max_threads()
#else
                1
#endif
    );
    std::printf("| phase | tok/s (median of %d) | note |\n|---|---|---|\n", R);
    std::printf("| prefill %d tokens | %.1f | |\n", P, pf[pf.size() / 2]);
    std::printf("| decode %d tokens after %d | %.2f | %.1f MB weights/token; floor %.1f tok/s at %.1f GB/s copy; %.1f%% of floor |\n",
                N, P, dc[dc.size() / 2], bytes / 1e6, floor_tps, bw / 1e9, 100.0 * dc[dc.size() / 2] / floor_tps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_forward: %s\n", e.what());
    return 1;
  }
}
