// GpuModel: loading (memory check, weight upload, state), sequence slots, and the batch -> decode steps loop.
#include "engine/gpu/gpu_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "backend/cpu/norm_rope.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "core/error.h"
#include "engine/gpu/gpu_impl.h"
#include "engine/memory_plan.h"

namespace dsv4::gpu {

GpuSequence::~GpuSequence() {
  if (pool_ && slot_ >= 0) pool_->free.push_back(slot_);
}

GpuModel::Impl::~Impl() {
  if (stream) cudaStreamSynchronize(stream);
  for (auto& g : graphs) cudaGraphExecDestroy(g.second);
  for (auto& e : prof) cudaEventDestroy(e.second);
  for (cudaEvent_t e : timeline) cudaEventDestroy(e);
  if (side) cudaStreamSynchronize(side);
  if (side2) cudaStreamSynchronize(side2);
  cudalin::workspace_destroy(ws);
  if (ws_side.partial) cudalin::workspace_destroy(ws_side);
  for (cudaEvent_t e : {ev_fork, ev_mid, ev_join, ev_fork2, ev_join2, ev_kv})
    if (e) cudaEventDestroy(e);
  if (side) cudaStreamDestroy(side);
  if (side2) cudaStreamDestroy(side2);
  if (moe_ws.meta) cudalin::moe_workspace_destroy(moe_ws);
  if (moe_prefill_ws.max_tokens) cudalin::moe_prefill_workspace_destroy(moe_prefill_ws);
  for (void* p : dev_allocs) cudaFree(p);
  for (void* p : host_allocs) cudaFreeHost(p);
  if (stream) cudaStreamDestroy(stream);
}

void* GpuModel::Impl::dalloc(size_t bytes) {
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc (scratch)");
  dev_allocs.push_back(p);
  if (opt.poison) cuda::check(cudaMemset(p, 0xff, std::max<size_t>(bytes, 16)), "poison scratch");
  return p;
}

void* GpuModel::Impl::halloc(size_t bytes) {
  void* p = nullptr;
  cuda::check(cudaMallocHost(&p, std::max<size_t>(bytes, 16)), "cudaMallocHost");
  host_allocs.push_back(p);
  return p;
}

void GpuModel::Impl::alloc_scratch() {
  const int64_t T = cap_tokens, D = c->hidden_size, n = c->hc_mult, H = c->num_attention_heads, hd = c->head_dim;
  const int64_t qlr = c->q_lora_rank, IH = std::max(1, c->index_n_heads), Id = std::max(1, c->index_head_dim);
  const int64_t E = c->n_routed_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
  const int64_t G = c->o_groups, olr = c->o_lora_rank, V = c->vocab_size;
  int64_t Is = 1;
  for (const DevLayer& L : w.layers)
    if (L.has_shared) Is = std::max(Is, L.sh_w1.rows);
  auto f = [&](int64_t count) { return static_cast<float*>(dalloc(sizeof(float) * count)); };
  s.h = f(T * n * D);
  s.res = f(T * n * D);
  s.x = f(T * D);
  s.y = f(T * D);
  s.post = f(T * n);
  s.comb = f(T * n * n);
  s.qr = f(T * qlr);
  s.qkv = f(T * (qlr + hd));
  s.q = f(T * H * hd);
  s.kv = f(T * hd);
  s.ckv = f(T * 2 * hd);
  s.cg = f(T * 2 * hd);
  s.ick = f(T * 2 * Id);
  s.icg = f(T * 2 * Id);
  s.iq = f(T * IH * Id);
  s.iw = f(T * IH);
  if (c->has_csa() && opt.index_rope_in_scores && n_freq >= 1 && n_freq <= 64)
    s.rope_cs = static_cast<float2*>(dalloc(sizeof(float2) * T * n_freq));
  s.score_cols = std::max<int64_t>(1, opt.max_model_len / 4);
  s.scores = f(T * s.score_cols);
  s.o = f(T * H * hd);
  s.z = f(T * G * olr);
  s.router = f(T * E);
  s.wts = f(T * K);
  s.shg = f(T * 2 * Is);  // [g | u] of the stacked shared-expert GEMV
  s.shu = f(T * Is);
  s.shh = f(T * Is);
  s.hexact = f(T * K * I);
  s.logits = f(static_cast<int64_t>(logits_cap) * V);
  const int64_t widest = std::max({D, qlr, H * hd, G * olr, Is, I});
  s.xb = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * T * widest));
  s.small_cap = std::min<int64_t>(T, 64);
  s.xb_side = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * s.small_cap * widest));
  s.xb_side2 = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * s.small_cap * widest));
  s.xbx = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * T * D));
  s.xbq = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * T * qlr));
  s.xhx = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * s.small_cap * D));
  s.zb = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * s.small_cap * G * olr));
  s.idx = static_cast<int32_t*>(dalloc(sizeof(int32_t) * T * K));
  s.sel = static_cast<int32_t*>(dalloc(sizeof(int32_t) * T * std::max(1, c->index_topk)));
  s.max_slots = c->sliding_window + std::max<int64_t>(c->index_topk, opt.max_model_len / 128);
  s.slots = static_cast<int32_t*>(dalloc(sizeof(int32_t) * T * s.max_slots));
  s.hc_ws = dalloc(cuda::hc_workspace_bytes(static_cast<int>(T), D));
  s.hc_counter = static_cast<int*>(dalloc(sizeof(int)));
  cuda::check(cudaMemset(s.hc_counter, 0, sizeof(int)), "zero the hc counter");
  s.attn_ws = dalloc(cuda::sparse_attention_workspace_bytes(static_cast<int>(T), static_cast<int>(s.max_slots)));
  s.logits_host = static_cast<float*>(halloc(sizeof(float) * logits_cap * V));
  s.next = static_cast<int32_t*>(dalloc(sizeof(int32_t) * 2 * T));
  s.next_host = static_cast<int32_t*>(halloc(sizeof(int32_t) * 2 * T));
  s.sample_params = static_cast<glue::SampleRowParams*>(dalloc(sizeof(glue::SampleRowParams) * T));
  s.sample_params_host = static_cast<glue::SampleRowParams*>(halloc(sizeof(glue::SampleRowParams) * T));
  s.sample_ws = dalloc(glue::sample_workspace_bytes(static_cast<int>(T), V));

  meta.cap = static_cast<int>(T);
  meta.h64 = static_cast<int64_t*>(halloc(sizeof(int64_t) * StepMeta::kN64 * T));
  meta.h32 = static_cast<int32_t*>(halloc(sizeof(int32_t) * StepMeta::kN32 * T));
  meta.d64 = static_cast<int64_t*>(dalloc(sizeof(int64_t) * StepMeta::kN64 * T));
  meta.d32 = static_cast<int32_t*>(dalloc(sizeof(int32_t) * StepMeta::kN32 * T));

  if (T > 64) {  // steps of more than 64 tokens multiply through cuBLAS from a bf16 copy of the weight
    int64_t most = 0;
    auto consider = [&](const DevLinear& l) {
      if (gemv_applies(l)) most = std::max(most, l.rows * l.cols);
    };
    for (const DevLayer& L : w.layers) {
      for (const DevLinear* l : {&L.wq_a, &L.wq_b, &L.wkv, &L.wq_a_wkv, &L.wo_b, &L.index_wq_b, &L.sh_w1, &L.sh_w2,
                                 &L.sh_w3, &L.sh_w13, &L.e_proj, &L.h_proj})
        consider(*l);
      most = std::max(most, L.wo_a.rows * L.wo_a.cols / std::max<int64_t>(1, c->o_groups));  // one group
    }
    if (most > 0) s.wbuf = static_cast<uint16_t*>(dalloc(sizeof(uint16_t) * most));
    if (opt.gemm_f32_linears) {
      s.gate_f32 = f(E * D);
      if (c->index_n_heads > 0) s.iwp_f32 = f(static_cast<int64_t>(c->index_n_heads) * D);
    }
  }
  ws = cudalin::workspace_create();
  if (opt.overlap_branches) ws_side = cudalin::workspace_create();
  moe_kernel_ok = D % 128 == 0 && I % 128 == 0 && D <= 4096 && I <= 4096 && E <= 1024;
  const cudalin::MoeShape shape{static_cast<int>(D), static_cast<int>(I), static_cast<int>(E), static_cast<int>(K),
                                static_cast<float>(c->swiglu_limit)};
  if (moe_kernel_ok) moe_ws = cudalin::moe_workspace_create(shape, static_cast<int>(std::min<int64_t>(T, 64)));
  // Layers whose expert scales allow the f16 MoE path (checked on the device, which synchronizes the stream, once
  // per expert set: the layers repeat_layers adds share their weights; kernels chosen at load).
  if (moe_kernel_ok && opt.f16_activations && !opt.exact_linear && !opt.exact_moe) {
    std::map<const cudalin::DevExpert*, bool> fit;  // by device expert array
    auto fits = [&](const cudalin::DevExpert* e) {
      auto it = fit.find(e);
      if (it == fit.end()) it = fit.emplace(e, cudalin::moe_scales_fit_f16(shape, e, stream)).first;
      return it->second;
    };
    for (DevLayer& L : w.layers)
      L.experts_fit_f16 = L.expert_fmt == WeightFormat::kFP4 && L.experts && fits(L.experts);
  }
  if (moe_kernel_ok && T > 64) moe_prefill_ws = cudalin::moe_prefill_workspace_create(shape, static_cast<int>(T));
}

void GpuModel::Impl::set_step(const std::vector<StepSeq>& seqs) {
  const int64_t R = st->ring, L = opt.max_model_len;
  const int ratios[3] = {0, 4, 128};
  int64_t max_pos = 0;
  int t = 0;
  meta.n_seqs = static_cast<int>(seqs.size());
  meta.max_count = 0;
  for (int si = 0; si < meta.n_seqs; ++si) {
    const StepSeq& q = seqs[si];
    const int64_t slot = q.slot;
    int64_t base[3];
    for (int ri = 0; ri < 3; ++ri) base[ri] = slot * (R + (ratios[ri] ? L / ratios[ri] : 0));
    meta.host(StepMeta::kSeqStart, si) = q.start;
    for (int ri = 0; ri < 3; ++ri)
      meta.host(static_cast<StepMeta::I64>(StepMeta::kEntry0 + ri), si) =
          base[ri] + R + (ratios[ri] ? q.start / ratios[ri] : 0);
    meta.host(StepMeta::kKeyFirst, si) = slot * (L / 4) + q.start / 4;
    meta.host(StepMeta::kSeqFirst, si) = t;
    meta.host(StepMeta::kSeqCount, si) = q.count;
    meta.host(StepMeta::kStateSlot, si) = static_cast<int32_t>(slot);
    meta.max_count = std::max(meta.max_count, q.count);
    for (int j = 0; j < q.count; ++j, ++t) {
      const int64_t p = q.start + j;
      meta.host(StepMeta::kPos, t) = p;
      for (int ri = 0; ri < 3; ++ri) {
        meta.host(static_cast<StepMeta::I64>(StepMeta::kBase0 + ri), t) = base[ri];
        meta.host(static_cast<StepMeta::I64>(StepMeta::kRing0 + ri), t) = base[ri] + p % R;
      }
      meta.host(StepMeta::kKeyBase, t) = slot * (L / 4);
      meta.host(StepMeta::kTokens, t) = q.tokens[j];
      meta.host(StepMeta::kVis4, t) = static_cast<int32_t>((p + 1) / 4);
      meta.host(StepMeta::kVis128, t) = static_cast<int32_t>((p + 1) / 128);
      max_pos = std::max(max_pos, p);
    }
  }
  int64_t bucket = 128;
  while (bucket < max_pos + 1) bucket *= 2;
  meta.bucket = std::min(bucket, L);
  cuda::check(cudaMemcpyAsync(meta.d64, meta.h64, sizeof(int64_t) * StepMeta::kN64 * meta.cap,
                              cudaMemcpyHostToDevice, stream), "upload step metadata");
  cuda::check(cudaMemcpyAsync(meta.d32, meta.h32, sizeof(int32_t) * StepMeta::kN32 * meta.cap,
                              cudaMemcpyHostToDevice, stream), "upload step metadata");
}

void GpuModel::Impl::launch_step(int T) {
  // Graphs only for decode steps (one token per sequence, logits for every token): a prefill step's launch
  // sequence depends on how its tokens split into sequences.
  const bool decode_step = meta.n_seqs == T && static_cast<int>(meta.out_rows.size()) == T;
  if (!opt.cuda_graphs || opt.profile_layers || !decode_step) return run_step(T);
  const std::pair<int, int64_t> key{T, meta.bucket};
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    // First use of a key runs eagerly (kernels set their attributes, lazily loaded modules load); the
    // second captures. Relaxed mode: the kernels' entry points may query attributes while capturing.
    if (seen[key]++ == 0) return run_step(T);
    cudaGraph_t g = nullptr;
    cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "begin decode-step capture");
    try {
      run_step(T);
    } catch (...) {
      cudaStreamEndCapture(stream, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    cuda::check(cudaStreamEndCapture(stream, &g), "end decode-step capture");
    cudaGraphExec_t exec = nullptr;
    // GpuOptions::priority_stream: captured kernel nodes carry their stream's priority, used only with this flag.
    const bool prio = opt.priority_stream != GpuOptions::PriorityStream::kNone;
    const cudaError_t err = cudaGraphInstantiate(&exec, g, prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
    cudaGraphDestroy(g);
    cuda::check(err, "instantiate decode-step graph");
    it = graphs.emplace(key, exec).first;
  }
  cuda::check(cudaGraphLaunch(it->second, stream), "launch decode-step graph");
}

std::unique_ptr<GpuModel> GpuModel::load(const std::string& dir, const GpuOptions& opt) {
  if (opt.max_seqs < 1 || opt.max_seqs > 64) fail("GPU engine: max_seqs must be in 1..64 (got ", opt.max_seqs, ")");
  if (opt.max_model_len < 1) fail("GPU engine: max_model_len must be >= 1");
  if (opt.prefill_chunk < 0 || opt.prefill_chunk > 8192)
    fail("GPU engine: prefill_chunk must be in 0..8192 (got ", opt.prefill_chunk, ")");
  if (opt.repeat_layers < 1 || opt.repeat_layers > 1024)
    fail("GPU engine: repeat_layers must be in 1..1024 (got ", opt.repeat_layers, ")");
  std::unique_ptr<GpuModel> m(new GpuModel());
  m->opt_ = opt;
  EngineOptions eo;
  eo.kv_dtype = opt.kv_dtype;
  m->host_ = Model::load(dir, eo);
  const ModelConfig& c = m->host_->config();
  // Shapes the kernels are specialized for (docs/GPU_ENGINE.md).
  if (c.num_attention_heads != cuda::kAttnHeads || c.head_dim != cuda::kAttnDim || c.rope_head_dim != 64)
    fail("GPU engine: the attention kernel needs 64 heads x 512 head_dim with 64 RoPE dims; ", c.source, " has ",
         c.num_attention_heads, " x ", c.head_dim, " (rope ", c.rope_head_dim, ")");
  if (c.hc_mult != 4 || c.hidden_size % 32 != 0 || c.hidden_size > 7168)
    fail("GPU engine: mHC kernels need hc_mult 4 and hidden_size a multiple of 32 up to 7168");
  const bool any_csa = c.has_csa();
  if (any_csa && c.index_head_dim != 128)
    fail("GPU engine: the compressor kernel needs index_head_dim 128 (got ", c.index_head_dim, ")");
  if (any_csa && (c.index_topk < 1 || c.index_topk > 2048)) fail("GPU engine: index_topk must be in 1..2048");
  if (c.num_experts_per_tok > 16) fail("GPU engine: num_experts_per_tok above 16 is not supported");
  if (opt.load_mtp && c.num_nextn_predict_layers < 1)
    fail("GPU engine: load_mtp: ", dir, " has no MTP layer (num_nextn_predict_layers = 0)");

  const cuda::DeviceConfig& dc = cuda::device_config();
  cudalin::require_supported_device();
  if (opt.act_quant && opt.exact_linear)
    fail("GPU engine: act_quant and exact_linear are two different activation formats; choose one");
  if (opt.indexer_fp8_q && any_csa && !opt.exact_linear) {
    if (!cuda::indexer_fp8_q_supported())
      fail("GPU engine: indexer_fp8_q needs compute capability 9.0 (this device is ", dc.major, ".", dc.minor, ")");
    if (opt.kv_dtype != KvDtype::kFP8 || c.index_n_heads != cuda::kIndexerHeads)
      fail("GPU engine: indexer_fp8_q needs the FP8 KV cache and ", cuda::kIndexerHeads, " indexer heads");
  }
  size_t free_b = 0, total_b = 0;
  cuda::check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  MemoryPlan plan =
      plan_memory(*m->host_, gpu_step_capacity(opt.max_seqs, opt.prefill_chunk, c.sliding_window), opt.load_mtp);
  if (opt.repeat_layers > 1) {  // the state of every repeated layer (the weights are shared)
    plan.kv_bytes_per_token *= opt.repeat_layers;
    plan.kv_fixed_per_sequence *= static_cast<size_t>(opt.repeat_layers);
  }
  check_fits(plan, opt.max_model_len, opt.max_seqs, free_b, std::string(prop.name) + " (" + dc.arch + ", free memory)");
  m->plan_ = plan;

  // The config the device runs: the checkpoint's, with its main layers repeated for repeat_layers.
  m->cfg_ = c;
  if (opt.repeat_layers > 1) {
    const int L = c.num_hidden_layers;
    std::vector<int> ratios;
    for (int k = 0; k < opt.repeat_layers; ++k)
      ratios.insert(ratios.end(), c.compress_ratios.begin(), c.compress_ratios.begin() + L);
    ratios.insert(ratios.end(), c.compress_ratios.begin() + L, c.compress_ratios.end());  // MTP layers
    m->cfg_.compress_ratios = ratios;
    m->cfg_.num_hidden_layers = L * opt.repeat_layers;
  }
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.c = &m->cfg_;
  im.opt = opt;
  // GpuOptions::priority_stream: that stream at the device's greatest priority (numerically lowest), the others
  // at the least (the default).
  using Prio = GpuOptions::PriorityStream;
  int least = 0, greatest = 0;
  cuda::check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  const auto priority = [&](Prio p) { return opt.priority_stream == p ? greatest : least; };
  cuda::check(cudaStreamCreateWithPriority(&im.stream, cudaStreamNonBlocking, priority(Prio::kMain)),
              "cudaStreamCreate");
  if (opt.overlap_branches) {
    cuda::check(cudaStreamCreateWithPriority(&im.side, cudaStreamNonBlocking, priority(Prio::kBranch)),
                "cudaStreamCreate (side)");
    cuda::check(cudaStreamCreateWithPriority(&im.side2, cudaStreamNonBlocking, least), "cudaStreamCreate (side2)");
    for (cudaEvent_t* e : {&im.ev_fork, &im.ev_mid, &im.ev_join, &im.ev_fork2, &im.ev_join2, &im.ev_kv})
      cuda::check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate (branches)");
    if (opt.branch_timeline) {
      im.timeline.resize(static_cast<size_t>(c.num_hidden_layers) * opt.repeat_layers * Impl::kTimelinePoints);
      for (cudaEvent_t& e : im.timeline) cuda::check(cudaEventCreate(&e), "cudaEventCreate (timeline)");
      im.timeline_set.assign(im.timeline.size(), 0);
    }
  }
  im.w.upload(m->host_->weights(), c, opt.progress, opt.load_mtp);
  if (opt.repeat_layers > 1) {  // copies of the layer views, same device memory
    const std::vector<DevLayer> base = im.w.layers;
    for (int k = 1; k < opt.repeat_layers; ++k) im.w.layers.insert(im.w.layers.end(), base.begin(), base.end());
  }
  // The MTP block after the main layers: layer index cfg_.num_hidden_layers, as on the CPU (its state and
  // compress ratio follow the main layers' in cfg_ too).
  im.w.layers.insert(im.w.layers.end(), im.w.mtp_layers.begin(), im.w.mtp_layers.end());
  if (opt.act_quant) im.check_act_quant();
  im.cap_tokens = static_cast<int>(plan.step.step_tokens);
  im.logits_cap = static_cast<int>(plan.step.logits_rows);
  im.st = std::make_unique<DeviceState>(m->cfg_, opt.kv_dtype, opt.max_seqs, opt.max_model_len, opt.poison,
                                        plan.step.ring_rows, static_cast<int>(im.w.layers.size()));
  const std::vector<float> fw = cpu::rope_inv_freq(c, false), fc = cpu::rope_inv_freq(c, true);
  im.n_freq = static_cast<int>(fw.size());
  auto up = [&](const std::vector<float>& v) {
    float* p = static_cast<float*>(im.dalloc(v.size() * sizeof(float)));
    cuda::check(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "upload rope");
    return p;
  };
  im.freq_window = up(fw);
  im.freq_comp = up(fc);
  im.alloc_scratch();
  cuda::check(cudaDeviceSynchronize(), "GPU engine load");
  return m;
}

GpuModel::~GpuModel() = default;

void GpuModel::Impl::check_act_quant() const {
  // Every linear `lin` quantizes for GpuOptions::act_quant must take the GEMV / GEMM path (the fp32 glue linear
  // would read the unquantized x).
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const DevLayer& L = w.layers[li];
    const std::pair<const char*, const DevLinear*> lins[] = {
        {"wq_a", &L.wq_a},         {"wkv", &L.wkv},          {"wq_b", &L.wq_b},
        {"wo_b", &L.wo_b},         {"index wq_b", &L.index_wq_b}, {"shared w1", &L.sh_w1},
        {"shared w2", &L.sh_w2},   {"shared w3", &L.sh_w3},  {"MTP e_proj", &L.e_proj},
        {"MTP h_proj", &L.h_proj}};
    for (const auto& [name, l] : lins)
      if (l->rows > 0 && l->fmt != WeightFormat::kBF16 && !gemv_applies(*l))
        fail("GPU engine: act_quant needs every FP8 linear in GEMV shape (rows % 16 == 0, cols % 128 == 0); layer ",
             li, " ", name, " is ", l->rows, " x ", l->cols);
  }
}

void GpuModel::Impl::hand_over(cudaStream_t from, cudaStream_t to, cudaEvent_t e) {
  cuda::check(cudaEventRecord(e, from), "branch event record");
  cuda::check(cudaStreamWaitEvent(to, e, 0), "branch event wait");
}

void GpuModel::Impl::mark(const std::string& name) {
  if (!opt.profile_layers) return;
  if (prof_n == prof.size()) {
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreate(&e), "cudaEventCreate (profile)");
    prof.emplace_back(std::string(), e);
  }
  prof[prof_n].first = name;
  cuda::check(cudaEventRecord(prof[prof_n].second, stream), "profile event");
  ++prof_n;
}

void GpuModel::Impl::timeline_record(int layer, TimelinePoint point, cudaStream_t on) {
  const size_t i = static_cast<size_t>(layer) * kTimelinePoints + point;
  if (i >= timeline.size()) return;  // none, or an MTP layer (the timeline covers the main layers)
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(on, &cs), "timeline capture status");
  // While capturing, an external event node (records at replay); a plain record would only be a graph edge.
  const unsigned flags = cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault;
  cuda::check(cudaEventRecordWithFlags(timeline[i], on, flags), "timeline event");
  timeline_set[i] = 1;
}

std::vector<GpuModel::BranchTiming> GpuModel::branch_timeline() const {
  const Impl& im = *impl_;
  std::vector<BranchTiming> out;
  if (im.timeline.empty()) return out;
  cuda::check(cudaStreamSynchronize(im.stream), "timeline");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const size_t n = im.timeline.size() / Impl::kTimelinePoints;
  for (size_t li = 0; li < n; ++li) {
    const size_t b = li * Impl::kTimelinePoints;
    // Microseconds from point `from` to point `to` of this layer (NaN unless both were recorded).
    const auto span_us = [&](int from, int to) {
      if (!im.timeline_set[b + from] || !im.timeline_set[b + to]) return nan;
      float ms = 0;
      cuda::check(cudaEventElapsedTime(&ms, im.timeline[b + from], im.timeline[b + to]), "timeline");
      return 1e3f * ms;
    };
    const auto after_qnorm = [&](int point) { return span_us(Impl::kQNormDone, point); };
    out.push_back({span_us(Impl::kMainAtJoin, Impl::kIndexerDone), span_us(Impl::kMainAtJoin, Impl::kCompressorDone),
                   after_qnorm(Impl::kIndexGemvDone), after_qnorm(Impl::kIndexScoresDone),
                   after_qnorm(Impl::kIndexerDone), after_qnorm(Impl::kMainWqbDone), after_qnorm(Impl::kMainQDone),
                   after_qnorm(Impl::kMainAtJoin)});
  }
  return out;
}

std::vector<std::pair<std::string, double>> GpuModel::step_profile_ms() const {
  std::vector<std::pair<std::string, double>> ms;
  const Impl& im = *impl_;
  if (im.prof_n < 2) return ms;
  cuda::check(cudaEventSynchronize(im.prof[im.prof_n - 1].second), "profile events");
  for (size_t i = 1; i < im.prof_n; ++i) {
    float t = 0;
    cuda::check(cudaEventElapsedTime(&t, im.prof[i - 1].second, im.prof[i].second), "profile events");
    ms.emplace_back(im.prof[i].first, t);
  }
  return ms;
}

size_t GpuModel::weight_bytes() const { return impl_->w.bytes; }
size_t GpuModel::state_bytes() const { return impl_->st->bytes; }

std::unique_ptr<GpuSequence> GpuModel::new_sequence() {
  auto& pool = impl_->st->slots;
  if (pool->free.empty()) fail("GPU engine: all ", opt_.max_seqs, " sequence slots are in use (max_seqs)");
  std::unique_ptr<GpuSequence> s(new GpuSequence());
  s->pool_ = pool;
  s->slot_ = pool->free.back();
  pool->free.pop_back();
  return s;
}

void GpuModel::check_batch_size(const char* what, size_t n) const {
  if (static_cast<int>(n) > opt_.max_seqs)
    fail(what, ": ", n, " sequences in one batch; at most max_seqs = ", opt_.max_seqs);
}

void GpuModel::check_chunk(const char* what, const GpuSequence* seq, const std::vector<int32_t>& tokens,
                           int64_t length, std::set<const GpuSequence*>& seen) const {
  if (!seq || seq->slot_ < 0) fail(what, ": chunk without a sequence");
  if (tokens.empty()) fail(what, ": empty chunk");
  if (!seen.insert(seq).second) fail(what, ": a sequence appears twice in one batch");
  if (length + static_cast<int64_t>(tokens.size()) > opt_.max_model_len)
    fail(what, ": sequence would reach ", length + static_cast<int64_t>(tokens.size()), " positions; max_model_len is ",
         opt_.max_model_len);
  const int64_t V = cfg_.vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("token id ", tokens[i], " at input position ", i, " is outside the vocabulary [0, ", V, ")");
}

std::vector<ChunkOutput> GpuModel::forward(std::vector<GpuSeqChunk>& batch) {
  const ModelConfig& c = config();
  const int64_t V = c.vocab_size;
  Impl& im = *impl_;
  // Validate everything before any state changes.
  check_batch_size("GPU forward", batch.size());
  std::set<const GpuSequence*> seen;
  for (const GpuSeqChunk& ch : batch) {
    check_chunk("GPU forward", ch.seq, ch.tokens, ch.seq ? ch.seq->length : 0, seen);
    validate(ch.sampling);
  }
  const int64_t stream_floats = static_cast<int64_t>(c.hc_mult) * c.hidden_size;  // one token's streams
  std::vector<ChunkOutput> out(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    out[b].rows = !batch[b].return_logits ? 0 : batch[b].all_logits ? static_cast<int64_t>(batch[b].tokens.size()) : 1;
    out[b].logits.resize(out[b].rows * V);
    if (batch[b].keep_streams) out[b].streams.resize(batch[b].tokens.size() * stream_floats);
    batch[b].error.clear();
  }
  // Steps (engine/step_plan.h): up to prefill_chunk tokens of every chunk per step (1: decode steps).
  std::vector<StepChunk> chunks(batch.size());
  for (size_t b = 0; b < batch.size(); ++b)
    chunks[b] = StepChunk{batch[b].seq->slot_, batch[b].seq->length, batch[b].tokens.data(),
                          static_cast<int64_t>(batch[b].tokens.size()), batch[b].all_logits};
  std::vector<int64_t> done;
  Step step;
  while (next_step(chunks, done, opt_.prefill_chunk, im.cap_tokens, step, im.logits_cap)) {
    const std::vector<StepSeq>& seqs = step.seqs;
    const std::vector<StepOut>& rows = step.outs;
    const int T = step.tokens;
    im.set_out_rows(step);
    auto lrow = [&](size_t r) { return im.logits_row(step, r); };
    im.set_step(seqs);
    im.launch_step(T);
    im.copy_streams(seqs, cudaMemcpyDeviceToHost, [&](const StepSeq& q) {  // keep_streams: the pre-head streams
      return batch[q.chunk].keep_streams
                 ? out[q.chunk].streams.data() + (q.start - batch[q.chunk].seq->length) * stream_floats
                 : nullptr;
    });
    const int n_out = static_cast<int>(rows.size());
    const int n_rows = static_cast<int>(im.meta.out_rows.size());
    // Draw a token from every logits row (only a chunk's last row counts; rows nobody needs draw greedily).
    bool any_logits = false, all_greedy = true;
    for (int lr = 0; lr < n_rows; ++lr) im.s.sample_params_host[lr] = glue::SampleRowParams{};
    for (int r = 0; r < n_out; ++r) {
      const GpuSeqChunk& ch = batch[rows[r].chunk];
      any_logits |= ch.return_logits;
      glue::SampleRowParams& sp = im.s.sample_params_host[lrow(r)];
      sp.temperature = ch.sampling.temperature;
      sp.top_k = ch.sampling.top_k;
      sp.top_p = ch.sampling.top_p;
      sp.min_p = ch.sampling.min_p;
      sp.seed = ch.sampling.seed;
      sp.step = ch.seq->draws;
      all_greedy &= sp.temperature == 0.0f || sp.top_k == 1;
    }
    if (n_rows > 0) {
      cuda::check(cudaMemcpyAsync(im.s.sample_params, im.s.sample_params_host, sizeof(glue::SampleRowParams) * n_rows,
                                  cudaMemcpyHostToDevice, im.stream), "upload sampling parameters");
      glue::sample_rows(im.s.logits, n_rows, V, im.s.sample_params, im.s.next, im.s.next + n_rows, im.s.sample_ws,
                        im.stream, all_greedy);
      cuda::check(cudaMemcpyAsync(im.s.next_host, im.s.next, sizeof(int32_t) * 2 * n_rows, cudaMemcpyDeviceToHost,
                                  im.stream), "download next tokens");
      if (any_logits)
        cuda::check(cudaMemcpyAsync(im.s.logits_host, im.s.logits, sizeof(float) * n_rows * V, cudaMemcpyDeviceToHost,
                                    im.stream), "download logits");
    }
    cuda::check(cudaStreamSynchronize(im.stream), "GPU forward step");
    for (int r = 0; r < n_out; ++r) {
      GpuSeqChunk& ch = batch[rows[r].chunk];
      const int lr = lrow(r);
      if (rows[r].last) {
        const int32_t status = im.s.next_host[n_rows + lr];
        ch.next_token = im.s.next_host[lr];
        if (status == glue::kSampleNonFinite) {
          ch.next_token = -1;
          ch.error = "non-finite logits (NaN or +inf) at position " + std::to_string(ch.seq->length + rows[r].index) +
                     ": refusing to sample (see failure mode F1)" +
                     (im.opt.f16_activations && !im.opt.exact_linear
                          ? std::string("; the FP8 GEMVs read f16 activations, so an activation beyond +-65504 also "
                                        "gives this: retry with f16 activations off (GpuOptions::f16_activations)")
                          : std::string());
        } else if (status == glue::kSampleHostFallback) {
          // The kept set reaches past the GPU's candidates: draw on the host from this row, same rule; the
          // stream position (seed, draws) seeds it so the draw stays reproducible.
          std::vector<float> row(static_cast<size_t>(V));
          cuda::check(cudaMemcpy(row.data(), im.s.logits + static_cast<int64_t>(lr) * V, sizeof(float) * V,
                                 cudaMemcpyDeviceToHost), "download a logits row for the host sampler");
          SamplingParams hp = ch.sampling;
          hp.seed = glue::sample_mix64(ch.sampling.seed ^ glue::sample_mix64(ch.seq->draws));
          ch.next_token = Sampler(hp).sample(row.data(), V);
        } else if (status != glue::kSampleOk) {
          fail("GPU sampler: status ", status, " for a validated request (internal error)");
        }
        ++ch.seq->draws;
      }
      if (!ch.return_logits) continue;
      const int64_t row = ch.all_logits ? rows[r].index : 0;
      std::memcpy(out[rows[r].chunk].logits.data() + row * V, im.s.logits_host + static_cast<int64_t>(lr) * V,
                  sizeof(float) * V);
    }
  }
  for (GpuSeqChunk& ch : batch) ch.seq->length += static_cast<int64_t>(ch.tokens.size());
  return out;
}

void GpuModel::Impl::set_out_rows(const Step& step) {
  // A step of one token per sequence (decode, or token-by-token prefill) computes the head on every row, so its
  // launch sequence depends only on (T, bucket) and replays a CUDA graph; a prefill-chunk step computes it only on
  // the rows whose logits are needed.
  meta.out_rows.clear();
  if (one_per_seq(step))
    for (int t = 0; t < step.tokens; ++t) meta.out_rows.push_back(t);
  else
    for (const StepOut& o : step.outs) meta.out_rows.push_back(o.row);
  if (static_cast<int>(meta.out_rows.size()) > logits_cap)
    fail("GPU engine (internal): ", meta.out_rows.size(), " logits rows in a step; the buffer holds ", logits_cap);
}

void GpuModel::Impl::copy_streams(const std::vector<StepSeq>& seqs, cudaMemcpyKind kind,
                                  const std::function<float*(const StepSeq&)>& host) {
  const int64_t per = static_cast<int64_t>(c->hc_mult) * c->hidden_size;
  int t = 0;
  for (const StepSeq& q : seqs) {
    if (float* p = host(q)) {
      const bool down = kind == cudaMemcpyDeviceToHost;
      float* dev = s.h + t * per;
      cuda::check(cudaMemcpyAsync(down ? p : dev, down ? dev : p, sizeof(float) * per * q.count, kind, stream),
                  "copy the hyper-connection streams");
    }
    t += q.count;
  }
}

std::vector<ChunkOutput> GpuModel::mtp_forward(std::vector<GpuMtpChunk>& batch) {
  const ModelConfig& c = config();
  const int64_t V = c.vocab_size, per = static_cast<int64_t>(c.hc_mult) * c.hidden_size;
  Impl& im = *impl_;
  if (!opt_.load_mtp) fail("GPU mtp_forward: the model was loaded without its MTP block (GpuOptions::load_mtp)");
  // Validate everything before any state changes.
  check_batch_size("GPU mtp_forward", batch.size());
  std::set<const GpuSequence*> seen;
  for (const GpuMtpChunk& ch : batch) {
    check_chunk("GPU mtp_forward", ch.seq, ch.next_tokens, ch.seq ? ch.seq->mtp_length : 0, seen);
    if (ch.streams.size() != ch.next_tokens.size() * static_cast<size_t>(per))
      fail("GPU mtp_forward: streams must be [tokens, hc_mult, hidden] for the given next tokens");
  }
  std::vector<ChunkOutput> out(batch.size());
  std::vector<StepChunk> chunks(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    out[b].rows = batch[b].all_logits ? static_cast<int64_t>(batch[b].next_tokens.size()) : 1;
    out[b].logits.resize(out[b].rows * V);
    chunks[b] = StepChunk{batch[b].seq->slot_, batch[b].seq->mtp_length, batch[b].next_tokens.data(),
                          static_cast<int64_t>(batch[b].next_tokens.size()), batch[b].all_logits};
  }
  std::vector<int64_t> done;
  Step step;
  while (next_step(chunks, done, opt_.prefill_chunk, im.cap_tokens, step, im.logits_cap)) {
    const int T = step.tokens;
    im.set_out_rows(step);
    im.set_step(step.seqs);
    im.copy_streams(step.seqs, cudaMemcpyHostToDevice, [&](const StepSeq& q) {  // the input streams, into s.h
      return batch[q.chunk].streams.data() + (q.start - batch[q.chunk].seq->mtp_length) * per;
    });
    im.run_mtp_step(T);
    const int n_rows = static_cast<int>(im.meta.out_rows.size());
    cuda::check(cudaMemcpyAsync(im.s.logits_host, im.s.logits, sizeof(float) * n_rows * V, cudaMemcpyDeviceToHost,
                                im.stream), "download MTP logits");
    cuda::check(cudaStreamSynchronize(im.stream), "GPU mtp_forward step");
    for (size_t r = 0; r < step.outs.size(); ++r) {
      const StepOut& o = step.outs[r];
      const int64_t row = batch[o.chunk].all_logits ? o.index : 0;
      std::memcpy(out[o.chunk].logits.data() + row * V, im.s.logits_host + static_cast<int64_t>(im.logits_row(step, r)) * V,
                  sizeof(float) * V);
    }
  }
  for (GpuMtpChunk& ch : batch) ch.seq->mtp_length += static_cast<int64_t>(ch.next_tokens.size());
  return out;
}

}  // namespace dsv4::gpu
