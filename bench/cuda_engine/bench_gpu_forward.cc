// GPU forward benchmark on a V4-Flash-width checkpoint (random weights in the official formats; see
// scripts/gpu/bench_flash.sh): per-layer time, batch-1 decode against the weight-bytes floor, decode tok/s at
// several batch sizes, prefill tok/s at each length of --prefill (then batch-1 decode at that context), and
// the extrapolation to the full 43-layer model.
// Not a test: numbers only (docs/PERFORMANCE.md).
//
//   bench_gpu_forward --model DIR [--kv fp8|bf16] [--batches 1,4,16,64] [--prompt 512] [--decode 32]
//                     [--prefill 8192,65536] [--prefill-chunk 0] [--full-layers 43] [--repeat-layers 1]
//                     [--no-pdl] [--moe-ks N] [--no-overlap] [--bf16-act] [--moe-warps 8] [--gemv-warps 4]
//                     [--moe-lean off|w2|w13|all[:TOKENS]] [--hc-two-kernels] [--moe-max-nt N] [--wave-div N]
//                     [--moe-split off|LIGHT[:TOKENS[:WIDE[:WIDER[:LEAN]]]]] [--kv-row-on-main] [--glue-f32-linears] [--moe-prefill-bf16]
//                     [--moe-prefill-kernel N] [--moe-prefill-tile N] [--moe-prefill-plain-tiles] [--slots-on-main] [--shared-join-before-moe] [--no-priority]
//                     [--main-priority] [--timeline] [--topk-index-list] [--index-rope-launch]
//                     [--index-scores-always] [--moe-prefill-stats]
//                     [--max-model-len N]
// --repeat-layers K: GpuOptions::repeat_layers (the checkpoint's layers run K times over, same weights), so
//   the step times are those of a K x L-layer model measured directly (the disk limits the checkpoint).
// --prefill-chunk N: GpuOptions::prefill_chunk (0: token-by-token prefill through the decode graphs).
// --max-model-len N: GpuOptions::max_model_len (default: the longest row + decode + 8). It caps the context
//   bucket, and so the indexer's score columns (bucket / 4): a server's large max_model_len gives power-of-two
//   buckets, e.g. 32,768 columns at contexts 64K-128K, where the default gives 16,390 at context 65,539.
// --moe-prefill-stats: after each --prefill row, the routed experts' loads over its chunks (active experts, the
//   largest load, tiles; cudalin::set_moe_prefill_route_stats: one stream synchronization per layer, so that
//   row's time is not a speed figure).
// --no-pdl: launch every kernel in plain stream order (no programmatic dependent launch), to compare.
// --moe-ks N: force the MoE decode kernels' K splits (cudalin::set_moe_ksplit; 0 = the heuristic).
// --no-overlap: GpuOptions::overlap_branches off (one stream).
// --bf16-act: GpuOptions::f16_activations off (the FP8 GEMVs read bf16 activations, as before 2026-11-30).
// --moe-warps N: warps per block of the MoE decode kernels (cudalin::set_moe_block_warps; default 4).
// --gemv-warps N: warps per block of the decode GEMV (cudalin::set_gemv_block_warps; default 8).
// --moe-split SPEC: the MoE decode kernels chosen per expert by its load (cudalin::set_moe_split; light
//   experts: <= LIGHT pairs up to 8 tokens, <= WIDE at 9-32, <= WIDER at 33-64; the light launches lean up to
//   LEAN tokens) for launches of 2 .. TOKENS tokens (default 2:64:8:16:64), or off.
// --kv-row-on-main: GpuOptions::kv_row_on_side off (the window KV row's encode on the main stream).
// --slots-on-main: GpuOptions::slots_on_branches off (the slot lists on the main stream after the joins).
// --shared-join-before-moe: GpuOptions::shared_join_at_w2 off (the shared expert joined before the routed w1/w3).
// --no-priority / --main-priority: GpuOptions::priority_stream kNone / kMain (every stream at the default priority /
//   the main stream at the greatest; the default kBranch raises the indexer branch).
// --wave-div N: the GEMV / MoE decode grids sized to 1/N of the resident slots (cudalin::set_decode_wave_div).
// --moe-max-nt N: at most N n-tiles of 8 tokens per MoE decode expert pass (cudalin::set_moe_max_ntiles).
// --hc-two-kernels: GpuOptions::hc_one_kernel off (one-token hc_pre / hc_head as two launches).
// --glue-f32-linears: GpuOptions::gemm_f32_linears off (steps of > 64 tokens keep the router's and weights_proj's
//   fp32 glue linears instead of cuBLAS in fp32).
// --indexer-fp8-q: GpuOptions::indexer_fp8_q on (the CSA indexer's q in e4m3 on FP8 tensor cores; sm_90).
// --moe-prefill-bf16: GpuOptions::moe_prefill_f16 off (steps of > 64 tokens run the routed experts in bf16).
// --moe-prefill-kernel N: the MoE prefill GEMM kernel (cudalin::set_moe_prefill_kernel; 0 = the default).
// --moe-prefill-tile N: its token tile (32, 64 or 128; cudalin::set_moe_prefill_tile_n; 0 = chosen by the step's
//   tokens): the engine's skewed routes leave 64-wide tiles 56% full (run 158), so tile 32 may win there.
// --moe-prefill-plain-tiles: cudalin::set_moe_prefill_mixed_tiles(false) (the default since run 167 runs each
//   expert's last 1..32 rows at tile 32 when kernel 3 takes tiles of 64; same bits).
// --topk-index-list: GpuOptions::topk_writes_slots off (the top-k writes its index list, the slot-list kernel maps
//   it after the top-k on the indexer's stream).
// --index-rope-launch: GpuOptions::index_rope_in_scores off (the index q rotated by its own launch first).
// --index-scores-always: GpuOptions::index_all_when_short off (the indexer's scores and top-k even where the
//   top-k keeps every key).
// --timeline: GpuOptions::branch_timeline (timing events at each attention join in the graphs): after the batch-1
//   and the prefill rows, how long the main stream waited for the indexer's and the compressor's streams.
// --moe-lean SPEC: which lean MoE decode kernels run (cudalin::set_moe_lean), for launches of up to TOKENS
//   tokens (default 1): off, w2, w13 or all (the default).
#include <cuda_runtime.h>
#include <execinfo.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "core/error.h"
#include "engine/gpu/gpu_model.h"

using namespace dsv4;

namespace {

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(std::atoi(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

// Device copy bandwidth (read + write bytes / time) of a 1 GiB cudaMemcpy, best of 10.
double copy_gbs() {
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / (best * 1e-3) / 1e9;
}

// Weight bytes one batch-1 decode step reads, from the checkpoint: every tensor except the embedding table
// (one row) and the routed experts (top_k of n_experts per layer).
struct FloorBytes {
  double per_layer = 0, head = 0;  // per_layer: mean over the layers
};
FloorBytes floor_bytes(const Model& host) {
  const ModelConfig& c = host.config();  // the checkpoint's layers (not repeated)
  double layers = 0, head = 0, experts = 0;
  for (const auto& [name, t] : host.checkpoint().tensors()) {
    if (name.rfind("mtp.", 0) == 0) continue;
    const double b = static_cast<double>(t->nbytes);
    if (name.find(".ffn.experts.") != std::string::npos) experts += b;
    else if (name.find("embed") != std::string::npos) head += b / static_cast<double>(c.vocab_size);
    else if (name.rfind("layers.", 0) == 0) layers += b;
    else head += b;
  }
  FloorBytes f;
  f.per_layer = (layers + experts * c.num_experts_per_tok / std::max(1, c.n_routed_experts)) / c.num_hidden_layers;
  f.head = head;
  return f;
}

// A crash prints its stack (the device machine has no gdb).
void on_crash(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char msg[] = "bench_gpu_forward: fatal signal, stack:\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  backtrace_symbols_fd(frames, n, 2);
  _exit(128 + sig);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --timeline (GpuModel::branch_timeline): in the last decode step, by how many microseconds each branch stream
// finished after the main stream reached the attention's join (> 0: the main stream waited), mean [min, max]
// over the CSA and the HCA layers.
void print_timeline(const gpu::GpuModel& m, int context) {
  const auto t = m.branch_timeline();
  if (t.empty()) return;
  struct Acc {
    double sum = 0, lo = 1e30, hi = -1e30;
    int n = 0;
    void add(float v) {
      if (!std::isfinite(v)) return;
      sum += v, lo = std::min<double>(lo, v), hi = std::max<double>(hi, v), ++n;
    }
    std::string str() const {
      if (n == 0) return "-";
      char b[64];
      std::snprintf(b, sizeof(b), "%.1f [%.1f, %.1f]", sum / n, lo, hi);
      return b;
    }
  };
  Acc csa_index, csa_comp, hca_comp, igemv, iscores, itopk, wqb, qdone, join;
  for (size_t li = 0; li < t.size(); ++li) {
    const AttnKind k = m.config().attn_kind(static_cast<int>(li));
    if (k == AttnKind::kCSA) {
      csa_index.add(t[li].indexer_us), csa_comp.add(t[li].compressor_us);
      igemv.add(t[li].index_gemv_us), iscores.add(t[li].index_scores_us), itopk.add(t[li].index_topk_us);
      wqb.add(t[li].main_wqb_us), qdone.add(t[li].main_q_us), join.add(t[li].main_join_us);
    }
    if (k == AttnKind::kHCA) hca_comp.add(t[li].compressor_us);
  }
  std::printf("branch timeline, context %d, us after the main stream reached the attention join (> 0: it waited): "
              "CSA indexer %s, CSA compressor %s, HCA compressor %s\n", context, csa_index.str().c_str(),
              csa_comp.str().c_str(), hca_comp.str().c_str());
  std::printf("  CSA q path, us after q_norm ended: indexer's stream: wq_b GEMV %s, scores %s, top-k %s; main stream: "
              "wq_b GEMV %s, heads norm/RoPE %s, at the join %s\n", igemv.str().c_str(), iscores.str().c_str(),
              itopk.str().c_str(), wqb.str().c_str(), qdone.str().c_str(), join.str().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, kv = "fp8";
  std::vector<int> batches = {1, 4, 16, 64};
  int prompt = 512, decode = 32, full_layers = 43, prefill_chunk = 0, repeat_layers = 1;
  bool route_stats = false;  // --moe-prefill-stats: the routed experts' loads in each prefill (syncs per layer)
  bool overlap = true, f16_act = true, hc_one_kernel = true, kv_side = true, indexer_fp8_q = false;
  gpu::GpuOptions defaults;
  bool slots_branches = defaults.slots_on_branches, shared_join_w2 = defaults.shared_join_at_w2;
  bool timeline = false, topk_slots = defaults.topk_writes_slots, index_rope = defaults.index_rope_in_scores;
  bool index_all_short = defaults.index_all_when_short;
  gpu::GpuOptions::PriorityStream priority_stream = defaults.priority_stream;
  bool gemm_f32_linears = true, moe_prefill_f16 = true;
  std::vector<int> prefills = {8192};
  long long max_model_len = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "missing value after %s\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--kv") kv = next();
    else if (a == "--batches") batches = parse_list(next());
    else if (a == "--prompt") prompt = std::atoi(next().c_str());
    else if (a == "--decode") decode = std::atoi(next().c_str());
    else if (a == "--prefill") prefills = parse_list(next());
    else if (a == "--max-model-len") max_model_len = std::atoll(next().c_str());
    else if (a == "--full-layers") full_layers = std::atoi(next().c_str());
    else if (a == "--prefill-chunk") prefill_chunk = std::atoi(next().c_str());
    else if (a == "--repeat-layers") repeat_layers = std::atoi(next().c_str());
    else if (a == "--no-pdl") cuda::set_pdl(false);
    else if (a == "--moe-ks") cudalin::set_moe_ksplit(std::atoi(next().c_str()));
    else if (a == "--moe-max-nt") cudalin::set_moe_max_ntiles(std::atoi(next().c_str()));
    else if (a == "--wave-div") cudalin::set_decode_wave_div(std::atoi(next().c_str()));
    else if (a == "--moe-split") {
      const std::string v = next();
      cudalin::MoeSplit split;
      if (v == "off") split.on = false;
      else split.light_tokens = std::atoi(v.c_str());
      const size_t c1 = v.find(':'), c2 = c1 == std::string::npos ? c1 : v.find(':', c1 + 1);
      if (c1 != std::string::npos) split.max_tokens = std::atoi(v.c_str() + c1 + 1);
      const size_t c3 = c2 == std::string::npos ? c2 : v.find(':', c2 + 1);
      const size_t c4 = c3 == std::string::npos ? c3 : v.find(':', c3 + 1);
      if (c2 != std::string::npos) split.wide_light_tokens = std::atoi(v.c_str() + c2 + 1);
      if (c3 != std::string::npos) split.wider_light_tokens = std::atoi(v.c_str() + c3 + 1);
      if (c4 != std::string::npos) split.lean_light_tokens = std::atoi(v.c_str() + c4 + 1);
      cudalin::set_moe_split(split);
    }
    else if (a == "--no-overlap") overlap = false;
    else if (a == "--bf16-act") f16_act = false;
    else if (a == "--hc-two-kernels") hc_one_kernel = false;
    else if (a == "--kv-row-on-main") kv_side = false;
    else if (a == "--slots-on-main") slots_branches = false;
    else if (a == "--shared-join-before-moe") shared_join_w2 = false;
    else if (a == "--no-priority") priority_stream = gpu::GpuOptions::PriorityStream::kNone;
    else if (a == "--main-priority") priority_stream = gpu::GpuOptions::PriorityStream::kMain;
    else if (a == "--timeline") timeline = true;
    else if (a == "--index-rope-launch") index_rope = false;
    else if (a == "--index-scores-always") index_all_short = false;
    else if (a == "--topk-index-list") topk_slots = false;
    else if (a == "--glue-f32-linears") gemm_f32_linears = false;
    else if (a == "--indexer-fp8-q") indexer_fp8_q = true;
    else if (a == "--moe-prefill-bf16") moe_prefill_f16 = false;
    else if (a == "--moe-prefill-stats") route_stats = true;
    else if (a == "--moe-prefill-kernel") cudalin::set_moe_prefill_kernel(std::atoi(next().c_str()));
    else if (a == "--moe-prefill-tile") cudalin::set_moe_prefill_tile_n(std::atoi(next().c_str()));
    else if (a == "--moe-prefill-plain-tiles") cudalin::set_moe_prefill_mixed_tiles(false);
    else if (a == "--moe-warps") cudalin::set_moe_block_warps(std::atoi(next().c_str()));
    else if (a == "--moe-lean") {
      const std::string v = next(), kind = v.substr(0, v.find(':'));
      cudalin::MoeLean lean{kind == "w13" || kind == "all", kind == "w2" || kind == "all", 1};
      if (v.find(':') != std::string::npos) lean.max_tokens = std::atoi(v.c_str() + v.find(':') + 1);
      if (kind != "off" && kind != "w2" && kind != "w13" && kind != "all") {
        std::fprintf(stderr, "--moe-lean %s: expected off, w2, w13 or all, optionally :TOKENS\n", v.c_str());
        return 2;
      }
      cudalin::set_moe_lean(lean);
    }
    else if (a == "--gemv-warps") cudalin::set_gemv_block_warps(std::atoi(next().c_str()));
    else { std::fprintf(stderr, "unknown flag %s\n", a.c_str()); return 2; }
  }
  if (model.empty()) { std::fprintf(stderr, "--model DIR is required\n"); return 2; }
  std::signal(SIGSEGV, on_crash);
  std::signal(SIGABRT, on_crash);
  try {
    const double bw = copy_gbs();
    gpu::GpuOptions o;
    o.kv_dtype = kv == "bf16" ? KvDtype::kBF16 : kv == "f32" ? KvDtype::kF32 : KvDtype::kFP8;
    o.max_seqs = *std::max_element(batches.begin(), batches.end());
    const int longest = prefills.empty() ? 0 : *std::max_element(prefills.begin(), prefills.end());
    o.max_model_len = std::max(prompt + decode + 8, longest + decode + 8);
    if (max_model_len > 0) {
      if (max_model_len < o.max_model_len) {
        std::fprintf(stderr, "--max-model-len %lld is below the longest row (%lld tokens)\n", max_model_len,
                     static_cast<long long>(o.max_model_len));
        return 2;
      }
      o.max_model_len = max_model_len;
    }
    o.progress = true;
    o.poison = false;
    o.prefill_chunk = prefill_chunk;
    o.repeat_layers = repeat_layers;
    o.overlap_branches = overlap;
    o.f16_activations = f16_act;
    o.hc_one_kernel = hc_one_kernel;
    o.kv_row_on_side = kv_side;
    o.slots_on_branches = slots_branches;
    o.shared_join_at_w2 = shared_join_w2;
    o.priority_stream = priority_stream;
    o.gemm_f32_linears = gemm_f32_linears;
    o.moe_prefill_f16 = moe_prefill_f16;
    o.indexer_fp8_q = indexer_fp8_q;
    o.branch_timeline = timeline;
    o.topk_writes_slots = topk_slots;
    o.index_rope_in_scores = index_rope;
    o.index_all_when_short = index_all_short;
    size_t free_before = 0, total_mem = 0;
    cudaMemGetInfo(&free_before, &total_mem);
    const double t_load = now_s();
    auto m = gpu::GpuModel::load(model, o);
    std::printf("loaded in %.1f s: weights %.2f GB, state %.2f GB\n", now_s() - t_load, m->weight_bytes() / 1e9,
                m->state_bytes() / 1e9);
    EngineOptions eo;
    auto host = Model::load(model, eo);
    const ModelConfig c = m->config();  // a copy: the model is released before the profile section
    const FloorBytes fb = floor_bytes(*host);
    host.reset();
    const int L = c.num_hidden_layers;
    std::printf("copy bandwidth %.0f GB/s; batch-1 weight bytes per layer %.1f MB, head+norms %.1f MB; %d layers "
                "on the device (%dx the checkpoint's)\n", bw, fb.per_layer / 1e6, fb.head / 1e6, L, repeat_layers);

    std::printf("\n| batch | context | ms/step (graphs) | tok/s | per layer ms (eager profile) | head ms |\n"
                "| --- | --- | --- | --- | --- | --- |\n");
    double layer_ms_b1 = 0, head_ms_b1 = 0, step_ms_b1 = 0;
    for (int B : batches) {
      // Sequences of this batch size, freed at the end of the iteration.
      std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
      std::vector<gpu::GpuSeqChunk> b(B);
      for (int i = 0; i < B; ++i) {
        seqs.push_back(m->new_sequence());
        b[i].seq = seqs.back().get();
        b[i].return_logits = false;
        for (int k = 0; k < prompt; ++k) b[i].tokens.push_back(2 + (k * 7 + i) % (c.vocab_size - 2));
      }
      m->forward(b);  // prompt, token-by-token steps of B tokens
      for (auto& ch : b) ch.tokens = {ch.next_token};
      m->forward(b);  // warm-up (first use of this graph key captures)
      m->forward(b);
      cudaDeviceSynchronize();
      const double t0 = now_s();
      for (int k = 0; k < decode; ++k) {
        for (auto& ch : b) ch.tokens = {ch.next_token};
        m->forward(b);
      }
      const double ms = 1e3 * (now_s() - t0) / decode;
      std::printf("| %d | %d | %.3f | %.1f | | |\n", B, prompt + 3, ms, B * 1e3 / ms);
      std::fprintf(stderr, "\nbatch %d done\n", B);
      if (B == 1) {
        step_ms_b1 = ms;
        print_timeline(*m, prompt + 2 + decode);
      }
      std::fflush(stdout);
    }
    // Prefill from an empty sequence (token by token through the decode graphs, or chunks of prefill_chunk),
    // then batch-1 decode at that context.
    std::vector<std::pair<int, double>> prefill_tps;
    for (int prefill : prefills) {
      if (prefill <= 0) continue;
      std::fprintf(stderr, "\nprefill %d tokens\n", prefill);
      auto s2 = m->new_sequence();
      std::vector<gpu::GpuSeqChunk> pb(1);
      pb[0].seq = s2.get();
      pb[0].return_logits = false;
      for (int k = 0; k < prefill; ++k) pb[0].tokens.push_back(2 + (k * 13) % (c.vocab_size - 2));
      cudaDeviceSynchronize();
      if (route_stats) cudalin::set_moe_prefill_route_stats(true);  // (resets the summary)
      const double t0 = now_s();
      m->forward(pb);
      const double sec = now_s() - t0;
      if (route_stats) {
        std::printf("prefill %d: %s\n", prefill, cudalin::moe_prefill_route_stats().c_str());
        cudalin::set_moe_prefill_route_stats(false);
      }
      prefill_tps.emplace_back(prefill, prefill / sec);
      // Two warm-up steps, as for the batch rows: the first use of a (tokens, context bucket) graph key runs
      // eagerly and the second captures (gpu_model.cc), so with one the timed loop included a capture (until
      // run 125 the context-8,193 / 65,537 rows carried it: ~0.4-0.8 ms per step over 16 steps).
      for (int w = 0; w < 2; ++w) {
        pb[0].tokens = {pb[0].next_token};
        m->forward(pb);
      }
      cudaDeviceSynchronize();
      const double t1 = now_s();
      for (int k = 0; k < decode; ++k) {
        pb[0].tokens = {pb[0].next_token};
        m->forward(pb);
      }
      const double ms = 1e3 * (now_s() - t1) / decode;
      std::printf("| 1 | %d | %.3f | %.1f | | |\n", prefill + 3, ms, 1e3 / ms);
      print_timeline(*m, prefill + 2 + decode);
      std::printf("prefill %d tokens, %s, %d layers: %.2f s = %.0f tok/s\n", prefill,
                  prefill_chunk > 1 ? ("chunks of " + std::to_string(prefill_chunk)).c_str()
                                    : "token by token with graphs", L, sec, prefill / sec);
      std::fflush(stdout);
    }
    {  // the memory plan against what the engine took (docs/GPU_ENGINE.md; test_gpu_memory_plan asserts it)
      size_t free_after = 0;
      cudaDeviceSynchronize();
      cudaMemGetInfo(&free_after, &total_mem);
      const MemoryPlan& mp = m->memory_plan();
      std::printf("memory: the engine took %.2f GB of the device after these steps; the plan said %.2f GB (weights %.2f, "
                  "KV %.2f, workspace %.2f for steps of %lld tokens)\n", (free_before - free_after) / 1e9,
                  mp.total(o.max_model_len, o.max_seqs) / 1e9, mp.device_weights / 1e9,
                  mp.kv(o.max_model_len, o.max_seqs) / 1e9, mp.workspace_at(o.max_model_len) / 1e9,
                  static_cast<long long>(mp.step.step_tokens));
    }
    m.reset();

    // Per-layer split at batch 1 (eager launches with events between layers).
    {
      gpu::GpuOptions po = o;
      po.max_seqs = 1;
      po.profile_layers = true;
      po.progress = false;
      auto pm = gpu::GpuModel::load(model, po);
      auto seq = pm->new_sequence();
      std::vector<gpu::GpuSeqChunk> b(1);
      b[0].seq = seq.get();
      b[0].return_logits = false;
      for (int k = 0; k < prompt; ++k) b[0].tokens.push_back(2 + (k * 7) % (c.vocab_size - 2));
      pm->forward(b);
      // Mean ms per operation over the decode steps, in launch order.
      std::vector<std::pair<std::string, double>> sum;
      for (int k = 0; k < decode; ++k) {
        b[0].tokens = {b[0].next_token};
        pm->forward(b);
        const auto p = pm->step_profile_ms();
        if (sum.empty()) sum = p, std::for_each(sum.begin(), sum.end(), [&](auto& e) { e.second = 0; });
        for (size_t i = 0; i < p.size() && i < sum.size(); ++i) sum[i].second += p[i].second / decode;
      }
      double eager_total = 0;
      std::vector<double> layer_ms(L, 0.0);
      std::printf("\neager profile, batch 1, context %d, mean of %d steps (ms per operation, launch gaps included):\n",
                  prompt, decode);
      for (const auto& [name, v] : sum) {
        eager_total += v;
        if (name.size() > 1 && name[0] == 'L') {
          const int li = std::atoi(name.c_str() + 1);
          if (li >= 0 && li < L) layer_ms[li] += v;
        } else {
          head_ms_b1 += v;
        }
        std::printf("  %-24s %8.4f\n", name.c_str(), v);
      }
      for (int li = 0; li < L; ++li) {
        std::printf("  layer %d (%s) total %.3f\n", li, c.attn_kind(li) == AttnKind::kCSA ? "CSA" :
                    c.attn_kind(li) == AttnKind::kHCA ? "HCA" : "window", layer_ms[li]);
        layer_ms_b1 += layer_ms[li] / L;
      }
      // Graph replay removes launch gaps: scale the eager split to the graph step time.
      const double scale = step_ms_b1 > 0 ? step_ms_b1 / eager_total : 1.0;
      const double layer_g = layer_ms_b1 * scale, head_g = head_ms_b1 * scale;
      const double floor_ms_layer = fb.per_layer / (bw * 1e9) * 1e3, floor_ms_head = fb.head / (bw * 1e9) * 1e3;
      const double full_ms = full_layers * layer_g + head_g;
      const double full_floor = full_layers * floor_ms_layer + floor_ms_head;
      std::printf("\nbatch-1 decode: eager step %.3f ms, graph step %.3f ms; per layer %.3f ms (graph-scaled) vs floor "
                  "%.3f ms = %.0f%% of the weight-bandwidth floor\n", eager_total, step_ms_b1, layer_g,
                  floor_ms_layer, 100 * floor_ms_layer / layer_g);
      std::printf("extrapolated to %d layers + head: %.2f ms/token = %.1f tok/s; floor %.2f ms (%.2f GB) -> %.0f%% "
                  "of the floor\n", full_layers, full_ms, 1e3 / full_ms, full_floor,
                  (full_layers * fb.per_layer + fb.head) / 1e9, 100 * full_floor / full_ms);
      // A prefill step computes the head for one token only, so its time is the layers': scale by L / 43.
      for (const auto& [n, tps] : prefill_tps)
        std::printf("prefill %d tokens extrapolated to %d layers: %.0f tok/s\n", n, full_layers,
                    tps * L / full_layers);
      // Where a prefill chunk's time goes: the last chunk of a 4-chunk prompt, summed over the layers per
      // operation name (eager, events between operations); needs the prefill rows' max_model_len (--prefill).
      if (prefill_chunk > 64 && 4 * prefill_chunk + 1 > o.max_model_len) {
        std::printf("\nprefill chunk profile skipped: 4 chunks of %d exceed max_model_len %lld (set by --prompt and "
                    "--prefill)\n", prefill_chunk, static_cast<long long>(o.max_model_len));
      } else if (prefill_chunk > 64) {
        seq.reset();  // the profile model has one sequence slot
        auto ps = pm->new_sequence();
        std::vector<gpu::GpuSeqChunk> pb(1);
        pb[0].seq = ps.get();
        pb[0].return_logits = false;
        for (int k = 0; k < 4 * prefill_chunk; ++k) pb[0].tokens.push_back(2 + (k * 13) % (c.vocab_size - 2));
        pm->forward(pb);
        std::vector<std::pair<std::string, double>> per_op;
        double total = 0;
        for (const auto& [name, v] : pm->step_profile_ms()) {
          const size_t dot = name.find('.');
          const std::string op = name.size() > 1 && name[0] == 'L' && dot != std::string::npos ? name.substr(dot + 1)
                                                                                               : name;
          auto it = std::find_if(per_op.begin(), per_op.end(), [&](const auto& e) { return e.first == op; });
          if (it == per_op.end()) per_op.emplace_back(op, v);
          else it->second += v;
          total += v;
        }
        std::sort(per_op.begin(), per_op.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        std::printf("\nprefill chunk profile: last %d-token chunk of %d (context %d..%d), %d layers, %.2f ms "
                    "(%.0f tok/s), ms per operation summed over the layers:\n", prefill_chunk, 4 * prefill_chunk,
                    3 * prefill_chunk, 4 * prefill_chunk, L, total, prefill_chunk / total * 1e3);
        for (const auto& [op, v] : per_op) std::printf("  %-24s %8.3f  %4.1f%%\n", op.c_str(), v, 100 * v / total);
      }

    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
