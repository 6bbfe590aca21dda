// Internals of GpuModel shared by gpu_model.cc (load, batching into steps) and gpu_layer.cc (one step's
// forward): device weights and state, per-step metadata and scratch buffers sized for max_seqs tokens.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/glue/sample.h"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "engine/gpu/device_state.h"
#include "engine/gpu/device_weights.h"
#include "engine/gpu/gpu_model.h"
#include "engine/step_plan.h"

namespace dsv4::gpu {

// Metadata of one step, uploaded once per step. The step's tokens are its sequences' tokens back to back.
// Per-token arrays are indexed by token t, per-sequence arrays by the sequence's index s in the step (a
// decode step has one token per sequence, so t == s). Ratio index ri: 0 window, 1 ratio 4, 2 ratio 128.
struct StepMeta {
  enum I64 {
    kPos, kBase0, kBase1, kBase2, kRing0, kRing1, kRing2, kKeyBase,  // per token
    kSeqStart, kEntry0, kEntry1, kEntry2, kKeyFirst,                   // per sequence
    kN64
  };
  enum I32 {
    kTokens, kVis4, kVis128,          // per token
    kSeqFirst, kSeqCount, kStateSlot,  // per sequence
    kN32
  };
  int cap = 0;
  int n_seqs = 0, max_count = 0;  // sequences in the step, most tokens of one sequence
  // Tokens whose logits the step computes, in order (every token of a decode step; else the rows needed).
  std::vector<int> out_rows;
  int64_t* h64 = nullptr;  // pinned [kN64, cap]
  int32_t* h32 = nullptr;  // pinned [kN32, cap]
  int64_t* d64 = nullptr;
  int32_t* d32 = nullptr;
  // Context bucket of the step: the next power of two >= the largest position + 1 (at least 128, at most
  // max_model_len rounded up). Launch shapes that grow with the context (indexer score columns, HCA slots)
  // are sized by the bucket, never by the exact lengths, so a step's launch sequence depends only on
  // (T, bucket) and one CUDA graph per pair replays it; the kernels read the exact lengths from device memory.
  int64_t bucket = 128;
  int64_t n_cols4() const { return std::max<int64_t>(1, bucket / 4); }
  int64_t n_entries128() const { return bucket / 128; }
  const int64_t* dev(I64 a) const { return d64 + static_cast<int64_t>(a) * cap; }
  const int32_t* dev(I32 a) const { return d32 + static_cast<int64_t>(a) * cap; }
  int64_t& host(I64 a, int t) { return h64[static_cast<int64_t>(a) * cap + t]; }
  int32_t& host(I32 a, int t) { return h32[static_cast<int64_t>(a) * cap + t]; }
};

struct Scratch {
  // h and res: the hyper-connection streams [cap, hc_mult, hidden], used in turn (GpuModel::Impl::h_cur).
  float *h, *res, *x, *y, *post, *comb, *qr, *qkv, *q, *kv, *ckv, *cg, *ick, *icg, *iq, *iw, *scores, *o, *z, *router,
      *wts, *shg, *shu, *shh, *hexact, *logits;
  // (cos, sin) of each token's compressed-RoPE angles [cap, n_freq] (glue::rope_table), written at the step's
  // start for the CSA indexers' q when GpuOptions::index_rope_in_scores (else null).
  float2* rope_cs = nullptr;
  uint16_t* xb;             // 16-bit activations of the linear at hand (bf16, or f16: GpuOptions::f16_activations)
  // Buffers only steps of <= 64 tokens use (the side streams, f16 activations and the grouped GEMV run only
  // there) hold small_cap = min(cap, 64) rows; GpuModel::Impl::require_small_step guards them.
  int64_t small_cap = 0;
  uint16_t *xb_side, *xb_side2;  // the same for work on the side streams (OnSide swaps them in as xb) [small_cap]
  uint16_t *xbx, *xbq;      // 16-bit copies of x [cap, hidden] and of q_lora [cap, q_lora_rank]
  uint16_t* xhx;            // f16 copy of the FFN's x [small_cap, hidden] (xbx stays bf16 for the MoE prefill)
  uint16_t* zb;             // 16-bit copy of z [small_cap, o_groups * o_lora_rank] from the grouped wo_a GEMV
  int32_t *idx, *sel, *slots;
  void *hc_ws, *attn_ws;
  int* hc_counter;          // cuda::HcArgs::counter of the main stream's hc_pre / hc_head (zeroed at allocation)
  int64_t score_cols = 0, max_slots = 0;
  float* logits_host = nullptr;  // pinned [logits_cap, vocab] (logits: the same on the device)
  uint16_t* wbuf = nullptr;       // bf16 copy of the largest dense FP8/MXFP4 weight (steps > 64 tokens only)
  float* gate_f32 = nullptr;      // the router's weight widened to fp32 (GpuOptions::gemm_f32_linears, > 64 tokens)
  float* iwp_f32 = nullptr;       // the indexer's weights_proj widened to fp32 (the same)
  int32_t* next = nullptr;        // device [2, cap]: the token drawn from each row of the step, its status
  int32_t* next_host = nullptr;   // pinned [2, cap]
  glue::SampleRowParams* sample_params = nullptr;       // device [cap]
  glue::SampleRowParams* sample_params_host = nullptr;  // pinned [cap]
  void* sample_ws = nullptr;
};

// A 16-bit copy of a linear's input written by the kernel that produced it: bf16, or f16 (Impl::h16).
struct Act16 {
  const uint16_t* p = nullptr;
  bool f16 = false;
};

// Formats of hc_pre's 16-bit copies of a layer's x, decided once per layer step (Impl::x16_formats): the same
// value tells hc_pre which copies to write and the linears which to read.
struct X16Formats {
  bool attn = false;    // attention's copy (s.xbx) is f16 (attn_x_h16)
  bool shared = false;  // the shared expert's GEMVs read the f16 copy s.xhx (shared_x_h16)
  bool moe = false;     // the routed experts (moe_decode) read the f16 copy s.xhx (moe_h16)
};

struct GpuModel::Impl {
  const ModelConfig* c = nullptr;
  GpuOptions opt;
  cudaStream_t stream = nullptr;
  // The second stream of GpuOptions::overlap_branches, its GEMV split-K workspace, and the events that
  // fork work onto it and join it back (each record is waited on before the next record of the same event).
  cudaStream_t side = nullptr;
  cudalin::Workspace ws_side{};
  cudaEvent_t ev_fork = nullptr, ev_mid = nullptr, ev_join = nullptr;
  // A third stream for the attention compressor of decode steps (it reads only x; its linears are glue
  // kernels there, so it needs no GEMV workspace), with its own fork / join events.
  cudaStream_t side2 = nullptr;
  cudaEvent_t ev_fork2 = nullptr, ev_join2 = nullptr, ev_kv = nullptr;  // ev_kv: GpuOptions::kv_row_on_side
  DeviceWeights w;
  std::unique_ptr<DeviceState> st;
  const float *freq_window = nullptr, *freq_comp = nullptr;
  int n_freq = 0;
  StepMeta meta;
  float* h_cur = nullptr;  // the current hyper-connection streams of the step: s.h or s.res (ping-pong)
  // Decode steps fuse each hc_post into the next hc_pre / hc_head (HcArgs::prev_*): post() then only records
  // the residual it would have read, and h_cur already names the buffer the fused kernel writes.
  const float* pending_res = nullptr;
  // Sets a's h and, when an hc_post is pending, its fused inputs.
  void take_pending_post(cuda::HcArgs& a);
  Scratch s{};
  cudalin::Workspace ws{};
  cudalin::MoeWorkspace moe_ws{};
  cudalin::MoePrefillWorkspace moe_prefill_ws{};  // steps of more than 64 tokens (chunked prefill)
  int cap_tokens = 0;                             // most tokens in one step: max_seqs + prefill chunk
  int logits_cap = 0;                             // most logits rows in one step (MemoryPlan's logits_rows)
  int step_tokens = 0;                            // tokens of the step being launched (run_step)
  // Throws (an internal error, naming `what`) unless the step fits the small_cap-row buffers.
  void require_small_step(const char* what) const;
  bool moe_kernel_ok = false;
  // Captured decode steps, keyed by (T, context bucket); see StepMeta::bucket and docs/GPU_ENGINE.md.
  std::map<std::pair<int, int64_t>, cudaGraphExec_t> graphs;
  std::map<std::pair<int, int64_t>, int> seen;  // eager runs per key (a key is captured on its second use)
  // profile_layers: an event per mark(name) of the step, in order; prof_n of them used by the last step.
  std::vector<std::pair<std::string, cudaEvent_t>> prof;
  size_t prof_n = 0;
  // branch_timeline: per layer kTimelinePoints timing events (main at the join, indexer done, compressor done;
  // CSA layers also: q_norm done, and after it the index wq_b GEMV, the scores, the main wq_b GEMV and its heads
  // norm/RoPE done) and whether each was recorded (by a capture or an eager step; a replay records the same ones
  // again).
  enum TimelinePoint {
    kMainAtJoin, kIndexerDone, kCompressorDone, kQNormDone, kIndexGemvDone, kIndexScoresDone, kMainWqbDone,
    kMainQDone, kTimelinePoints
  };
  std::vector<cudaEvent_t> timeline;
  std::vector<uint8_t> timeline_set;
  void timeline_record(int layer, TimelinePoint point, cudaStream_t on);
  // Whether a step of T tokens forks branches onto `side` (decode steps; not when profiling, whose events
  // time one stream; not above 64 tokens, whose cuBLAS calls share one handle and one dequant buffer).
  bool overlap(int T) const { return opt.overlap_branches && T <= 64 && !opt.profile_layers; }
  // `to` waits for everything issued so far on `from` (an event record + wait; a graph edge when captured).
  void hand_over(cudaStream_t from, cudaStream_t to, cudaEvent_t e);
  // While alive, the launch helpers (lin, matmul, glue calls through `stream`) issue onto `side` (or the
  // given stream) with its own GEMV workspace and its own 16-bit cast buffer (s.xb).
  struct OnSide {
    Impl& im;
    cudaStream_t saved_stream;
    cudalin::Workspace saved_ws;
    uint16_t* saved_xb;
    explicit OnSide(Impl& i) : OnSide(i, i.side, i.ws_side, i.s.xb_side) {}
    OnSide(Impl& i, cudaStream_t s, cudalin::Workspace w, uint16_t* xb)
        : im(i), saved_stream(i.stream), saved_ws(i.ws), saved_xb(i.s.xb) {
      im.require_small_step("a side stream");
      im.stream = s;
      im.ws = w;
      im.s.xb = xb;  // casts on this stream never touch the main stream's buffer
    }
    ~OnSide() {
      im.stream = saved_stream;
      im.ws = saved_ws;
      im.s.xb = saved_xb;
    }
  };
  // Records the end of the operation `name` (profile_layers only; every call site is a host-side constant).
  void mark(const std::string& name);
  void mark(int layer, const char* op) {
    if (opt.profile_layers) mark("L" + std::to_string(layer) + "." + op);
  }
  std::vector<void*> dev_allocs, host_allocs;

  ~Impl();
  void* dalloc(size_t bytes);
  void* halloc(size_t bytes);
  void alloc_scratch();
  void check_act_quant() const;  // GpuOptions::act_quant's shape requirement, at load

  // Fills and uploads the metadata of one step; meta.out_rows must be set before.
  void set_step(const std::vector<StepSeq>& seqs);
  // meta.out_rows of a step: every token of a step of one token per sequence, else the tokens whose logits are
  // needed. logits_row(step, r): the logits row (s.logits) of the step's r-th needed token (step.outs[r]).
  void set_out_rows(const Step& step);
  static bool one_per_seq(const Step& step) { return static_cast<int>(step.seqs.size()) == step.tokens; }
  static int logits_row(const Step& step, size_t r) { return one_per_seq(step) ? step.outs[r].row : static_cast<int>(r); }
  // The hyper-connection streams of a step's tokens (s.h [T, hc_mult, hidden], the sequences back to back) from or
  // to host(q) for each sequence q of the step where that is non-null: after a step (cudaMemcpyDeviceToHost) the
  // pre-head streams (keep_streams), before an MTP step (cudaMemcpyHostToDevice) its input. On `stream`.
  void copy_streams(const std::vector<StepSeq>& seqs, cudaMemcpyKind kind,
                    const std::function<float*(const StepSeq&)>& host);
  // Embedding, all layers, hc_head, norm, LM head: logits [out_rows, vocab] in s.logits.
  void run_step(int T);
  // run_step through the graph cache when GpuOptions::cuda_graphs (eager on a key's first use).
  void launch_step(int T);
  // The MTP block (Model::mtp_forward) on a step's tokens (the next tokens), its input streams in s.h [T, hc_mult,
  // hidden]: logits [out_rows, vocab] in s.logits. Eager.
  void run_mtp_step(int T);

 private:
  void layer(int li, int T);
  // A step's start: its token count, the profile's first mark, the streams in s.h, no pending hc_post.
  void begin_step(int T);
  // hc_head (weights hc, the final RMSNorm norm_w fused) on the streams in h_cur, then the LM head on the step's
  // out_rows: logits in s.logits.
  void head(const DevHc& hc, const float* norm_w, int T);
  // x16: the formats layer() had hc_pre write the 16-bit copies of x in.
  void attention(int li, int T, const X16Formats& x16);
  void ffn(int li, int T, const X16Formats& x16);
  // y = x · Wᵀ: the weight-streaming GEMV (16-bit activations) where it applies, else the fp32 glue linear.
  // xb: x already cast (by the kernel that wrote x); cast here into s.xb when absent or of the other format.
  void lin(const DevLinear& wt, const float* x, int64_t ldx, int T, float* y, int64_t ldy, Act16 xb = {});
  // The 16-bit copy of the sub-layer input x that hc_pre writes beside x (s.xbx); nullptr in exact mode.
  uint16_t* x_bf16() const;
  void linear_f32(const glue::Weight& w, float* wf32, int T, float* y);
  // y = x · Wᵀ over T rows of 16-bit activations: cudalin::gemv up to 64 rows; above (chunked prefill) the
  // weight is dequantized to bf16 into s.wbuf and multiplied by cuBLAS (cudalin::gemm_bf16; bf16 only).
  void matmul(const cudalin::DevWeight& w, const uint16_t* xb, int64_t ldx, int T, float* y, int64_t ldy,
              bool f16 = false);
  bool use_gemv(const DevLinear& wt) const;
  // Whether a T-token step feeds wt's GEMV f16 activations (GpuOptions::f16_activations, FP8, <= 64 tokens).
  bool h16(const DevLinear& wt, int T) const;
  // The format of a copy shared by several linears: f16 when every one of them that takes a GEMV takes f16.
  bool h16_all(int T, std::initializer_list<const DevLinear*> consumers) const;
  // Formats of hc_pre's copies of x: attention's (s.xbx) and, for the FFN, whether the shared expert's GEMVs
  // and the routed experts (moe_decode) read the f16 copy s.xhx.
  bool attn_x_h16(int li, int T) const;
  bool shared_x_h16(int li, int T) const;
  bool moe_h16(int li, int T) const;
  X16Formats x16_formats(int li, int T) const { return {attn_x_h16(li, T), shared_x_h16(li, T), moe_h16(li, T)}; }
};

}  // namespace dsv4::gpu
