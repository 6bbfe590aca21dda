// One decode step of the GPU forward: the block loop of engine/forward.cc and the attention sub-layer of
// engine/attention.cc, operation for operation, on device buffers. T tokens, one per sequence.
#include <algorithm>
#include <cmath>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_compressor_mhc.h"
#include "core/error.h"
#include "engine/gpu/gpu_impl.h"

namespace dsv4::gpu {

namespace {
int ratio_index(int r) { return r == 0 ? 0 : r == 4 ? 1 : 2; }
}  // namespace

bool GpuModel::Impl::use_gemv(const DevLinear& wt) const {
  return !opt.exact_linear && gemv_applies(wt);
}

bool GpuModel::Impl::h16(const DevLinear& wt, int T) const {
  // The f16 GEMV exists only in the v2 kernels and has no fallback for unaligned weights. act_quant's values
  // are held in bf16 (f16's range would not hold every e4m3 value times its scale).
  return opt.f16_activations && !opt.act_quant && T <= 64 && wt.fmt == WeightFormat::kFP8Block && use_gemv(wt) &&
         cudalin::linear_kernel_version() == 2 && reinterpret_cast<uintptr_t>(wt.d.w) % 16 == 0;
}

bool GpuModel::Impl::h16_all(int T, std::initializer_list<const DevLinear*> consumers) const {
  bool any = false;
  for (const DevLinear* wt : consumers) {
    if (!wt || wt->rows == 0 || !use_gemv(*wt)) continue;
    if (!h16(*wt, T)) return false;
    any = true;
  }
  return any;
}

bool GpuModel::Impl::attn_x_h16(int li, int T) const {
  const DevLayer& L = w.layers[li];
  return !opt.exact_linear && h16_all(T, {L.wq_a_wkv.rows > 0 ? &L.wq_a_wkv : nullptr, &L.wq_a, &L.wkv});
}

bool GpuModel::Impl::shared_x_h16(int li, int T) const {
  const DevLayer& L = w.layers[li];
  return !opt.exact_linear && L.has_shared && h16_all(T, {L.sh_w13.rows > 0 ? &L.sh_w13 : nullptr, &L.sh_w1, &L.sh_w3});
}

bool GpuModel::Impl::moe_h16(int li, int T) const {
  return opt.f16_activations && !opt.act_quant && !opt.exact_linear && !opt.exact_moe && moe_kernel_ok && T <= 64 &&
         cudalin::linear_kernel_version() == 2 && w.layers[li].experts_fit_f16;
}

void GpuModel::Impl::lin(const DevLinear& wt, const float* x, int64_t ldx, int T, float* y, int64_t ldy, Act16 xb) {
  if (!use_gemv(wt)) {
    glue::linear(wt.g, 0, wt.rows, x, T, ldx, y, ldy, stream);
    return;
  }
  const bool f16 = h16(wt, T);
  if (opt.act_quant) {  // GpuOptions::act_quant: the e4m3 values of x, from fp32 (wo_a does not come here)
    glue::act_quant_rows(x, ldx, T, wt.cols, nullptr, 0, s.xb, ldx, stream);
    xb = {s.xb, false};
  } else if (!xb.p || xb.f16 != f16) {
    if (f16) cudalin::cast_f32_to_f16(x, s.xb, static_cast<int64_t>(T) * ldx, stream);
    else cudalin::cast_f32_to_bf16(x, s.xb, static_cast<int64_t>(T) * ldx, stream);
    xb = {s.xb, f16};
  }
  matmul(wt.d, xb.p, ldx, T, y, ldy, f16);
}

// y [T, w.rows] = x · wᵀ for a BF16 weight on the fp32 x: above 64 tokens a pure fp32 cuBLAS GEMM on the weight
// widened exactly into wf32 (GpuOptions::gemm_f32_linears; null when off), else the fp32 glue linear.
void GpuModel::Impl::linear_f32(const glue::Weight& w, float* wf32, int T, float* y) {
  if (wf32 && T > 64 && w.fmt == glue::WFormat::kBF16) {
    cudalin::widen_bf16_to_f32(reinterpret_cast<const uint16_t*>(w.w), wf32, w.rows * w.cols, stream);
    cudalin::gemm_f32(s.x, T, wf32, w.rows, w.cols, y, stream);
  } else {
    glue::linear(w, 0, w.rows, s.x, T, w.cols, y, w.rows, stream);
  }
}

uint16_t* GpuModel::Impl::x_bf16() const {
  return opt.exact_linear ? nullptr : s.xbx;  // exact mode: every linear reads the fp32 x
}

void GpuModel::Impl::matmul(const cudalin::DevWeight& w, const uint16_t* xb, int64_t ldx, int T, float* y,
                            int64_t ldy, bool f16) {
  if (T <= 64) {
    cudalin::gemv(w, xb, ldx, T, y, ldy, ws, stream, f16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16);
    return;
  }
  if (f16) fail("GPU forward: f16 activations above 64 tokens (internal error)");
  // Compute-bound: dequantize once (exact), then a bf16 tensor-core GEMM. s.wbuf exists whenever a step can
  // exceed 64 tokens (alloc_scratch) and holds the largest FP8/MXFP4 weight.
  cudalin::dequant_to_bf16(w, s.wbuf, stream);
  cudalin::gemm_bf16(xb, ldx, T, s.wbuf, w.rows, w.cols, y, ldy, stream);
}

void GpuModel::Impl::attention(int li, int T, const X16Formats& x16) {
  const DevLayer& L = w.layers[li];
  const LayerPools& P = st->layers[li];
  const int r = P.ratio, ri = ratio_index(r);
  const AttnKind kind = c->attn_kind(li);
  const int64_t D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, qlr = c->q_lora_rank;
  const int W = c->sliding_window;
  const float eps = static_cast<float>(c->rms_norm_eps);
  const float* freq = r ? freq_comp : freq_window;
  const int64_t* pos = meta.dev(StepMeta::kPos);

  // Compressed entries closed by these tokens go to rows W + j before attention reads them.
  auto compress = [&](const DevCompressor& C, float* kvbuf, float* gbuf, float* state, uint8_t* out,
                      int64_t out_row_bytes, const int64_t* out_first, int rope_dims, int scale_block) {
    const int64_t width = C.wkv.rows;
    const uint16_t* xb = x_bf16();
    if (T > 64 && xb && C.wkv.fmt == WeightFormat::kBF16 && C.wgate.fmt == WeightFormat::kBF16) {
      // Chunked prefill: cuBLAS on the bf16 copy of x that hc_pre wrote (the fp32 glue kernel re-reads the
      // weight for every 8 tokens; it was 20% of a 512-token chunk at V4-Flash width).
      cudalin::gemm_bf16(xb, D, T, reinterpret_cast<const uint16_t*>(C.wkv.g.w), width, D, kvbuf, width, stream);
      cudalin::gemm_bf16(xb, D, T, reinterpret_cast<const uint16_t*>(C.wgate.g.w), width, D, gbuf, width, stream);
    } else {
      glue::linear(C.wkv.g, 0, width, s.x, T, D, kvbuf, width, stream);
      glue::linear(C.wgate.g, 0, width, s.x, T, D, gbuf, width, stream);
    }
    cuda::CompressorArgs a;
    a.ratio = C.ratio;
    a.head = C.head;
    a.kv = kvbuf;
    a.gate = gbuf;
    a.row_stride = width;
    a.ape = C.ape;
    a.norm = C.norm;
    a.eps = eps;
    a.inv_freq = freq;
    a.n_freq = n_freq;
    a.n_seqs = meta.n_seqs;  // each sequence's tokens of the step, in position order
    a.seq_first = meta.dev(StepMeta::kSeqFirst);
    a.seq_count = meta.dev(StepMeta::kSeqCount);
    a.seq_start = meta.dev(StepMeta::kSeqStart);
    a.max_count = meta.max_count;
    a.state = state;
    a.state_slot = meta.dev(StepMeta::kStateSlot);
    a.out = out;
    a.out_row_bytes = out_row_bytes;
    a.out_first = out_first;
    a.format = st->format;
    a.fp8_rope_dims = rope_dims;
    a.fp8_scale_block = scale_block;
    cuda::compressor(a, stream);
  };
  // The indexer of a CSA layer (scores over the compressed keys, exact top-k -> s.sel), in two parts: what
  // reads only x, and what needs the normalized q_lora rows.
  const int topk = c->index_topk;
  const int IH = c->index_n_heads, Id = c->index_head_dim;
  // GpuOptions::index_all_when_short: rows of at most topk columns select every visible key whatever the scores
  // (finite ones), so the indexer's head weights, q and scores are not computed, and the selection is written
  // with the x part (it needs no q); its compressor still runs.
  // par: the CSA indexer on its own stream (overlap_branches).
  const bool csa = kind == AttnKind::kCSA, par = csa && overlap(T);
  const bool index_all = csa && opt.index_all_when_short && meta.n_cols4() <= topk;
  // The head weights' 1/sqrt(heads), applied as the scores kernels load them (the CPU path's iw *= ws).
  const float index_w_scale = 1.0f / std::sqrt(static_cast<float>(IH));
  // Slots per token: the window rows, then the CSA selection or every visible HCA entry.
  const int extra = csa ? topk : kind == AttnKind::kHCA ? static_cast<int>(meta.n_entries128()) : 0;
  const int n_slots = W + extra;
  const bool topk_slots = csa && opt.topk_writes_slots;  // GpuOptions::topk_writes_slots
  // branch_timeline's points inside the q path (only where the indexer has its own stream).
  auto q_point = [&](TimelinePoint p) {
    if (par) timeline_record(li, p, stream);
  };
  // Where the selection goes: with topk_slots the selected pool rows (base + ring + index) after the W window rows
  // of each slot list, else the index list s.sel.
  cuda::TopkOutput sel_place;
  int32_t* sel_out = s.sel;
  if (topk_slots) {
    sel_place.stride = n_slots;
    sel_place.add = static_cast<int64_t>(st->ring);
    sel_place.row_add = meta.dev(static_cast<StepMeta::I64>(StepMeta::kBase0 + ri));
    sel_out = s.slots + W;
  }
  const int64_t n_cols = meta.n_cols4();
  const int32_t* vis = meta.dev(StepMeta::kVis4);
  auto index_from_x = [&]() {
    compress(L.index_comp, s.ick, s.icg, P.index_comp_state, P.index_keys, static_cast<int64_t>(st->index_row_bytes),
             meta.dev(StepMeta::kKeyFirst), 0, Id);
    if (!index_all) linear_f32(L.index_weights_proj.g, s.iwp_f32, T, s.iw);  // scaled by w_scale in the scores kernel
    mark(li, "index.compress");
    if (index_all) {  // every visible key, as topk_rows would select it from finite scores
      cuda::select_all_rows(n_cols, vis, T, topk, sel_out, stream, sel_place);
      mark(li, "index.topk");
    }
  };
  auto index_from_q = [&](Act16 qrb) {
    if (index_all) {  // the selection is written (index_from_x); only the timeline's points remain
      q_point(kIndexGemvDone);
      q_point(kIndexScoresDone);
      return;
    }
    lin(L.index_wq_b, s.qr, qlr, T, s.iq, static_cast<int64_t>(IH) * Id, qrb);
    q_point(kIndexGemvDone);
    const bool fp8_keys = st->fmt_code == 2 && IH == cuda::kIndexerHeads && Id == cuda::kIndexerDim;
    // GpuOptions::index_rope_in_scores: the FP8 scores kernels rotate q as they load it, with the step's factors
    // (run_step; they are for freq_comp, which every compressed layer's RoPE uses).
    const bool rope_in_scores = fp8_keys && s.rope_cs != nullptr && freq == freq_comp;
    if (!rope_in_scores) glue::heads_norm_rope(s.iq, T, IH, Id, pos, freq, n_freq, false, eps, false, stream);
    mark(li, "index.q");
    if (fp8_keys) {
      // FP8 keys: the tensor-core indexer, one launch for the step (per-query key offsets on the device).
      cuda::IndexerArgs ia;
      ia.q = s.iq;
      if (rope_in_scores) {
        ia.rope_cs = s.rope_cs;
        ia.rope_n_freq = n_freq;
      }
      ia.w = s.iw;
      ia.w_scale = index_w_scale;
      ia.keys = P.index_keys;
      ia.n_keys = n_cols;
      ia.row_bytes = static_cast<int64_t>(st->index_row_bytes);
      ia.n_visible = vis;
      ia.scores = s.scores;
      ia.score_stride = n_cols;
      ia.n_queries = T;
      ia.key_offset = meta.dev(StepMeta::kKeyBase);
      ia.exact_q = opt.exact_linear;  // exact mode: q as bf16 hi + lo (~2^-16) instead of one fp16 rounding
      ia.fp8_q = opt.indexer_fp8_q && !opt.exact_linear;
      ia.queries_share_keys = meta.max_count > 1;  // a prefill chunk: runs of one sequence's tokens
      cuda::indexer_scores_fp8(ia, stream);
    } else {
      glue::indexer_scores(s.iq, s.iw, index_w_scale, T, IH, Id, P.index_keys, static_cast<int64_t>(st->index_row_bytes),
                           st->fmt_code, meta.dev(StepMeta::kKeyBase), vis, s.scores, n_cols, stream);
    }
    q_point(kIndexScoresDone);
    mark(li, "index.scores");
    cuda::topk_rows(s.scores, n_cols, n_cols, vis, T, topk, sel_out, stream, sel_place);
    mark(li, "index.topk");
  };
  // The slot lists over the layer's pool: the window rows and the CSA selection or every visible HCA entry. They
  // need only the step's positions and (CSA) the top-k, so with overlap_branches they are built on the branch
  // stream that runs before the join (CSA: after the top-k; HCA, and CSA with topk_slots, where only the window
  // rows remain to write: after the compressor), off the main stream (GpuOptions::slots_on_branches).
  bool slots_built = false;
  auto slot_lists = [&]() {
    const int slot_kind = kind == AttnKind::kCSA ? (topk_slots ? 3 : 1) : kind == AttnKind::kHCA ? 2 : 0;
    glue::build_slots(T, pos, meta.dev(static_cast<StepMeta::I64>(StepMeta::kBase0 + ri)), W, static_cast<int>(st->ring),
                      slot_kind, r, s.sel, topk, n_slots, s.slots, stream);
    slots_built = true;
  };
  // overlap_branches: the indexer runs on the side stream, its x part from the start, its q part once
  // q_norm has written s.qr / s.xbq; the main stream waits for it before the attention.
  if (par) {
    hand_over(stream, side, ev_fork);
    OnSide on(*this);
    index_from_x();
  }
  // overlap_branches: the attention compressor (it reads only x) runs on the third stream from the start; the
  // main stream waits for it before the slot lists.
  auto compress_main = [&]() {
    compress(L.comp, s.ckv, s.cg, P.comp_state, P.kv, static_cast<int64_t>(st->row_bytes),
             meta.dev(static_cast<StepMeta::I64>(StepMeta::kEntry0 + ri)), c->rope_head_dim, 64);
  };
  const bool par_comp = r && overlap(T);
  if (par_comp) {
    hand_over(stream, side2, ev_fork2);
    OnSide on(*this, side2, cudalin::Workspace{}, s.xb_side2);
    compress_main();
    if ((!csa || topk_slots) && opt.slots_on_branches) slot_lists();  // joined with the compressor (ev_join2)
  }

  // Q: qr = q_norm(wq_a x); q = wq_b qr, per-head unweighted RMSNorm, RoPE.
  // 16-bit copies of x (written by hc_pre, layer(), in the format x16.attn names) and of the normalized
  // q_lora activations, each cast once for the linears that share it.
  const Act16 xb{x_bf16(), x16.attn};
  // wq_a and wkv read the same x: one GEMV over their stacked rows where it applies (s.qkv = [qr | kv]).
  const bool qkv_stacked = L.wq_a_wkv.rows > 0 && use_gemv(L.wq_a_wkv);
  const float* qr_in = s.qr;
  const float* kv_in = s.kv;
  int64_t qr_ld = qlr, kv_ld = hd;
  // The window row of each token: kv_norm, RoPE and the encode into its ring slot in one launch
  // (glue::rmsnorm_rope_encode); the query reads it back from there.
  auto encode_kv = [&]() {
    glue::rmsnorm_rope_encode(kv_in, kv_ld, L.kv_norm, T, static_cast<int>(hd), eps, s.kv, pos, freq, n_freq,
                              st->fmt_code, c->rope_head_dim, 64, P.kv, static_cast<int64_t>(st->row_bytes),
                              meta.dev(static_cast<StepMeta::I64>(StepMeta::kRing0 + ri)), stream);
  };
  // GpuOptions::kv_row_on_side: on the compressor's stream once the stacked GEMV has written kv (joined with
  // the compressor, ev_join2, before the slot lists).
  const bool kv_side = qkv_stacked && par_comp && opt.kv_row_on_side;
  if (qkv_stacked) {
    lin(L.wq_a_wkv, s.x, D, T, s.qkv, qlr + hd, xb);
    qr_in = s.qkv, kv_in = s.qkv + qlr, qr_ld = kv_ld = qlr + hd;
  } else {
    lin(L.wq_a, s.x, D, T, s.qr, qlr, xb);
  }
  if (kv_side) {
    hand_over(stream, side2, ev_kv);
    OnSide on(*this, side2, cudalin::Workspace{}, s.xb_side2);
    encode_kv();
  }
  // The 16-bit copy for wq_b and index wq_b, written here.
  const Act16 qrb{opt.exact_linear ? nullptr : s.xbq, h16_all(T, {&L.wq_b, csa ? &L.index_wq_b : nullptr})};
  glue::rmsnorm_rows(qr_in, qr_ld, L.q_norm, T, qlr, eps, s.qr, qlr, stream, const_cast<uint16_t*>(qrb.p), qrb.f16);
  q_point(kQNormDone);
  // The index wq_b GEMV stays on the indexer's stream: run on the main stream before wq_b instead, the step took
  // 0.02-0.09 ms longer at every context and batch 16 (run 136), though --timeline showed it ending only ~2 us
  // after the main wq_b GEMV on its own stream.
  if (par) {
    hand_over(stream, side, ev_mid);
    OnSide on(*this);
    index_from_q(qrb);
    if (opt.slots_on_branches && !topk_slots) slot_lists();  // after the top-k it reads; joined with the indexer
  }
  lin(L.wq_b, s.qr, qlr, T, s.q, H * hd, qrb);
  q_point(kMainWqbDone);
  glue::heads_norm_rope(s.q, T, static_cast<int>(H), static_cast<int>(hd), pos, freq, n_freq, true, eps, false, stream);
  q_point(kMainQDone);
  mark(li, "q");

  if (!qkv_stacked) lin(L.wkv, s.x, D, T, s.kv, hd, xb);
  if (!kv_side) encode_kv();
  mark(li, "kv");

  if (r && !par_comp) compress_main();
  mark(li, "compress");

  if (csa && !par) {
    index_from_x();
    index_from_q(qrb);
  }
  if (par || par_comp) timeline_record(li, kMainAtJoin, stream);  // branch_timeline only
  if (par) {
    timeline_record(li, kIndexerDone, side);
    hand_over(side, stream, ev_join);
  }
  if (par_comp) {
    timeline_record(li, kCompressorDone, side2);
    hand_over(side2, stream, ev_join2);
  }

  // Slot lists (unless a branch built them), sparse attention with sinks, inverse RoPE.
  if (!slots_built) slot_lists();
  cuda::SparseAttentionArgs sa;
  sa.q = s.q;
  sa.kv = P.kv;
  sa.n_rows = P.rows_per_seq * st->max_seqs;
  sa.row_bytes = static_cast<int64_t>(st->row_bytes);
  sa.format = st->format;
  sa.slots = s.slots;
  sa.n_slots = n_slots;
  sa.sink = L.attn_sink;
  sa.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  sa.out = s.o;
  sa.n_queries = T;
  sa.workspace = s.attn_ws;
  // Exact mode keeps the fp32 CUDA-core kernel; otherwise tensor cores with q and P split into bf16 hi + lo.
  sa.precision = opt.exact_linear ? cuda::AttnPrecision::kFp32 : cuda::AttnPrecision::kSplitBf16;
  // Grouped low-rank output: z_g = wo_a[g] · o_g, out = wo_b · z, o's 16-bit copy for the grouped GEMV.
  const int64_t G = c->o_groups, olr = c->o_lora_rank, gin = H * hd / G;
  DevLinear wo_a_group{L.wo_a.fmt, olr, gin, {}, {}};
  wo_a_group.d.w = L.wo_a.d.w;  // h16 checks the real weight's alignment
  const bool grouped_gemv = !opt.exact_linear && olr % 128 == 0 && gemv_applies(wo_a_group);
  const bool o_h16 = grouped_gemv && h16(wo_a_group, T);
  // The inverse RoPE of o and its 16-bit copy: the attention's output epilogue (in its split combine, no
  // launch of its own; bit for bit glue::heads_norm_rope). The load refuses head_dim != 512 or RoPE dims != 64,
  // so the epilogue always takes the shape (32 frequencies: even, 64 of the 512 dims).
  sa.rope_pos = pos, sa.rope_inv_freq = freq, sa.rope_n_freq = n_freq;
  sa.out16 = grouped_gemv ? s.xb : nullptr, sa.out16_f16 = o_h16;
  cuda::sparse_attention(sa, stream);
  mark(li, "sparse_attention");

  Act16 zb;  // the 16-bit copy of z for wo_b, written by the grouped GEMV's epilogue (no cast launch)
  if (grouped_gemv && T <= 64) {
    // One launch for all groups: group g's rows read o's column block g (cudalin::gemv_grouped).
    require_small_step("the grouped wo_a GEMV");
    uint16_t* zcopy = use_gemv(L.wo_b) ? s.zb : nullptr;  // h16() implies use_gemv()
    zb = {zcopy, h16(L.wo_b, T)};
    cudalin::gemv_grouped(L.wo_a.d, olr, gin, s.xb, H * hd, T, s.z, G * olr, ws, stream,
                          o_h16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16,
                          {zcopy, zb.f16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16});
  } else {
    for (int64_t g = 0; g < G; ++g) {
      if (grouped_gemv)
        matmul(L.wo_a.row_block(g * olr, olr), s.xb + g * gin, H * hd, T, s.z + g * olr, G * olr, o_h16);
      else
        glue::linear(L.wo_a.g, g * olr, olr, s.o + g * gin, T, H * hd, s.z + g * olr, G * olr, stream);
    }
  }
  lin(L.wo_b, s.z, G * olr, T, s.y, D, zb);
  mark(li, "wo");
}

void GpuModel::Impl::ffn(int li, int T, const X16Formats& x16) {
  const DevLayer& L = w.layers[li];
  const int64_t D = c->hidden_size;
  const int E = c->n_routed_experts, K = c->num_experts_per_tok;
  const int64_t I = c->moe_intermediate_size;
  const float limit = static_cast<float>(c->swiglu_limit);
  const int sf = c->scoring_func == ScoreFunc::kSqrtSoftplus ? 0 : c->scoring_func == ScoreFunc::kSigmoid ? 1 : 2;

  // Written by hc_pre: the bf16 copy of x (s.xbx) and, where a GEMV takes f16, the f16 one (s.xhx).
  const uint16_t* xb = x_bf16();
  const Act16 xs = x16.shared ? Act16{s.xhx, true} : Act16{xb, false};
  // The shared expert writes s.y (the routed experts then accumulate into it); with overlap_branches it
  // runs on the side stream beside the router.
  auto shared_expert = [&]() {
    const int64_t Is = L.sh_w1.rows;
    if (L.sh_w13.rows > 0 && use_gemv(L.sh_w13)) {  // one GEMV over w1 | w3 stacked: s.shg = [g | u] per token
      lin(L.sh_w13, s.x, D, T, s.shg, 2 * Is, xs);
      const bool h_h16 = h16(L.sh_w2, T);  // + the 16-bit copy for w2
      glue::swiglu_rows(s.shg, s.shg + Is, T, Is, 2 * Is, limit, s.shh, stream, s.xb, h_h16);
      lin(L.sh_w2, s.shh, Is, T, s.y, D, {s.xb, h_h16});
    } else {
      lin(L.sh_w1, s.x, D, T, s.shg, Is, xs);
      lin(L.sh_w3, s.x, D, T, s.shu, Is, xs);
      glue::swiglu(s.shg, s.shu, T * Is, limit, s.shh, stream);
      lin(L.sh_w2, s.shh, Is, T, s.y, D);
    }
  };
  const bool par = L.has_shared && overlap(T);
  // GpuOptions::PriorityStream::kBranch raises `side` for the indexer branch; the shared expert then takes side2
  // (default priority, idle in the FFN) so that its blocks do not go before the routed experts' w1/w3.
  cudaStream_t sh_stream = opt.priority_stream == GpuOptions::PriorityStream::kBranch ? side2 : side;
  if (par) {
    hand_over(stream, sh_stream, ev_fork);
    OnSide on(*this, sh_stream, ws_side, s.xb_side);
    shared_expert();
  }
  linear_f32(L.gate.g, s.gate_f32, T, s.router);
  glue::route(s.router, T, E, K, sf, L.gate_bias, L.tid2eid, meta.dev(StepMeta::kTokens), c->norm_topk_prob,
              static_cast<float>(c->routed_scaling_factor), s.idx, s.wts, stream);
  mark(li, "router");
  const bool moe_kernels = !opt.exact_linear && !opt.exact_moe && !opt.act_quant && moe_kernel_ok &&
                           L.expert_fmt == WeightFormat::kFP4;
  // GpuOptions::shared_join_at_w2: the MoE decode's w1/w3 run beside the shared expert, whose stream is joined
  // just before w2 (the first kernel that touches s.y: moe_decode's out_ready).
  const bool join_at_w2 = par && opt.shared_join_at_w2 && moe_kernels && T <= 64;
  bool accumulate = false;
  if (L.has_shared) {
    if (join_at_w2) cuda::check(cudaEventRecord(ev_join, sh_stream), "cudaEventRecord (the shared expert's join)");
    else if (par) hand_over(sh_stream, stream, ev_join);
    else shared_expert();
    accumulate = true;
    mark(li, "shared_expert");
  }
  if (moe_kernels) {
    cudalin::MoeShape shape{static_cast<int>(D), static_cast<int>(I), E, K, limit};
    if (T <= 64)
      cudalin::moe_decode(shape, L.experts, x16.moe ? s.xhx : xb, s.idx, s.wts, T, s.y, accumulate, moe_ws, stream,
                          x16.moe ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16,
                          join_at_w2 ? ev_join : nullptr);
    else if (opt.f16_activations && opt.moe_prefill_f16 && L.experts_fit_f16)  // chunked prefill, f16 (x from fp32)
      cudalin::moe_prefill_f16(shape, L.experts, s.x, s.idx, s.wts, T, s.y, accumulate, moe_prefill_ws, stream);
    else  // chunked prefill: the grouped GEMM path (docs/GEMM_MOE.md, "MoE prefill")
      cudalin::moe_prefill(shape, L.experts, xb, s.idx, s.wts, T, s.y, accumulate, moe_prefill_ws, stream);
  } else if (opt.act_quant) {
    // x's e4m3 values in fp32 go to s.o (the attention output, dead once wo_a has read it); moe_exact quantizes h.
    glue::act_quant_rows(s.x, D, T, D, s.o, D, nullptr, 0, stream);
    glue::moe_exact(L.experts_exact, D, I, K, limit, s.o, s.idx, s.wts, T, s.hexact, s.y, accumulate, stream, true);
  } else {
    glue::moe_exact(L.experts_exact, D, I, K, limit, s.x, s.idx, s.wts, T, s.hexact, s.y, accumulate, stream);
  }
  mark(li, "routed_experts");
}

void GpuModel::Impl::layer(int li, int T) {
  const DevLayer& L = w.layers[li];
  const int64_t D = c->hidden_size;
  const int n = c->hc_mult;
  const float eps = static_cast<float>(c->rms_norm_eps);
  auto pre = [&](const DevHc& hw, const float* norm_w) {
    cuda::HcArgs a;
    a.n_tokens = T;
    a.dim = D;
    a.n = n;
    take_pending_post(a);
    a.fn = hw.fn;
    a.base = hw.base;
    a.scale = hw.scale;
    a.sinkhorn_iters = c->hc_sinkhorn_iters;
    a.hc_eps = static_cast<float>(c->hc_eps);
    a.norm_eps = eps;
    a.x = s.x;
    a.post = s.post;
    a.comb = s.comb;
    a.workspace = s.hc_ws;
    if (opt.hc_one_kernel) a.counter = s.hc_counter;
    a.norm_w = norm_w;  // the sub-layer's RMSNorm, fused
    return a;
  };
  auto run_pre = [&](const cuda::HcArgs& a) {
    cuda::hc_pre(a, stream);
    mark(li, "hc_pre+norm");
  };
  auto post = [&]() {
    // The streams ping-pong between s.h and s.res: hc_post reads the current ones as its residual and
    // writes the new ones to the other buffer (no copy; it must not write its input in place).
    float* next = h_cur == s.h ? s.res : s.h;
    // Fused into the next hc_pre / hc_head in the range where they fuse it (cuda::kHcFusedPostTokens); with the
    // profile on, hc_post keeps its own launch and mark.
    if (T <= cuda::kHcFusedPostTokens && !opt.profile_layers) pending_res = h_cur;
    else cuda::hc_post(T, D, n, s.y, h_cur, s.post, s.comb, next, stream);
    h_cur = next;
    mark(li, "hc_post");
  };
  // and the 16-bit copies of x its linears read: attention's in one format (s.xbx); the FFN's in bf16 (s.xbx)
  // and, when the shared expert's GEMVs or the routed experts take f16, in f16 (s.xhx). Their formats are
  // decided here once, for hc_pre and the linears alike.
  const X16Formats x16 = x16_formats(li, T);
  cuda::HcArgs pa = pre(L.hc_attn, L.attn_norm);
  (x16.attn ? pa.xh : pa.xb) = x_bf16();
  run_pre(pa);
  attention(li, T, x16);
  post();
  cuda::HcArgs pf = pre(L.hc_ffn, L.ffn_norm);
  pf.xb = x_bf16();
  if (x16.shared || x16.moe) {
    require_small_step("the FFN's f16 copy of x");
    pf.xh = s.xhx;
  }
  run_pre(pf);
  ffn(li, T, x16);
  post();
}

void GpuModel::Impl::take_pending_post(cuda::HcArgs& a) {
  a.h = h_cur;
  if (!pending_res) return;
  a.prev_y = s.y, a.prev_res = pending_res, a.prev_post = s.post, a.prev_comb = s.comb;
  pending_res = nullptr;
}

void GpuModel::Impl::require_small_step(const char* what) const {
  if (step_tokens > s.small_cap)
    fail("GPU engine (internal): ", what, " in a step of ", step_tokens, " tokens; its buffers hold ", s.small_cap);
}

void GpuModel::Impl::begin_step(int T) {
  step_tokens = T;
  prof_n = 0;
  mark("start");
  h_cur = s.h;  // every step starts here, so a captured step replays the same buffer sequence
  pending_res = nullptr;
}

void GpuModel::Impl::run_step(int T) {
  begin_step(T);
  const int64_t D = c->hidden_size;
  glue::embed_streams(w.embed, meta.dev(StepMeta::kTokens), T, D, c->hc_mult, h_cur, stream);
  // The CSA indexers' RoPE factors, once for the step's 21 (V4-Flash) CSA layers (GpuOptions::index_rope_in_scores).
  if (s.rope_cs) glue::rope_table(meta.dev(StepMeta::kPos), T, freq_comp, n_freq, s.rope_cs, stream);
  mark("embed");
  for (int li = 0; li < c->num_hidden_layers; ++li) layer(li, T);
  head(w.hc_head, w.norm, T);
}

void GpuModel::Impl::run_mtp_step(int T) {
  begin_step(T);
  const int64_t D = c->hidden_size;
  const int n = c->hc_mult;
  const int li = c->num_hidden_layers;  // the MTP block follows the main layers (GpuModel::load)
  if (li >= static_cast<int>(w.layers.size()) || !w.layers[li].is_mtp)
    fail("GPU engine (internal): no MTP layer at index ", li);
  const DevLayer& L = w.layers[li];
  const float eps = static_cast<float>(c->rms_norm_eps);
  // x = e_proj(enorm(embed(next))) + h_proj(hnorm(h_j)) per stream j (engine/forward.cc, Model::mtp_forward).
  glue::embed_streams(w.embed, meta.dev(StepMeta::kTokens), T, D, 1, s.x, stream);
  glue::rmsnorm_rows(s.x, D, L.enorm, T, D, eps, s.x, D, stream);
  lin(L.e_proj, s.x, D, T, s.y, D);
  glue::rmsnorm_rows(s.h, D, L.hnorm, T * n, D, eps, s.res, D, stream);
  // h_proj over the T * n normalized streams as rows, at most 64 per call (the GEMV's rows; the buffers hold
  // cap_tokens * hc_mult rows of hidden, so no call reads past them).
  for (int r0 = 0; r0 < T * n; r0 += 64)
    lin(L.h_proj, s.res + r0 * D, D, std::min(64, T * n - r0), s.h + r0 * D, D);
  glue::add_to_streams(s.y, T, D, n, s.h, stream);
  if (s.rope_cs) glue::rope_table(meta.dev(StepMeta::kPos), T, freq_comp, n_freq, s.rope_cs, stream);
  mark("mtp.input");
  layer(li, T);
  head(L.mtp_hc_head, L.mtp_norm, T);
}

void GpuModel::Impl::head(const DevHc& hc, const float* norm_w, int T) {
  const int64_t D = c->hidden_size;
  cuda::HcArgs a;
  a.n_tokens = T;
  a.dim = D;
  a.n = c->hc_mult;
  take_pending_post(a);
  // Every sub-layer's hc_post flips the streams between s.h and s.res, twice per layer: the pre-head streams
  // (GpuSeqChunk::keep_streams) end in s.h.
  if (h_cur != s.h) fail("GPU engine (internal): the pre-head streams are not in s.h");
  a.fn = hc.fn;
  a.base = hc.base;
  a.scale = hc.scale;
  a.sinkhorn_iters = c->hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c->hc_eps);
  a.norm_eps = static_cast<float>(c->rms_norm_eps);
  a.x = s.y;
  a.workspace = s.hc_ws;
  if (opt.hc_one_kernel) a.counter = s.hc_counter;
  a.norm_w = norm_w;  // the final RMSNorm, fused
  cuda::hc_head(a, stream);
  mark("hc_head+norm");
  // The LM head only for the rows whose logits are needed (a prefill step needs few of its tokens').
  const int n_out = static_cast<int>(meta.out_rows.size());
  const float* head_in = s.y;
  if (n_out < T) {
    for (int r = 0; r < n_out; ++r)
      cuda::check(cudaMemcpyAsync(s.x + static_cast<int64_t>(r) * D, s.y + static_cast<int64_t>(meta.out_rows[r]) * D,
                                  sizeof(float) * D, cudaMemcpyDeviceToDevice, stream), "gather head rows");
    head_in = s.x;
  }
  if (!opt.exact_linear && n_out >= 16 && w.head.g.fmt == glue::WFormat::kBF16) {
    // Many rows: the fp32 glue linear would stream the 1 GB head once per 8 rows; cuBLAS on bf16
    // activations reads it once (the head weight is bf16 already; the activation rounding is the same 2^-9
    // the FP8/MXFP4 GEMVs apply, inside the kernel path's bound).
    cudalin::cast_f32_to_bf16(head_in, s.xb, static_cast<int64_t>(n_out) * D, stream);
    cudalin::gemm_bf16(s.xb, D, n_out, reinterpret_cast<const uint16_t*>(w.head.g.w), c->vocab_size, D, s.logits,
                       c->vocab_size, stream);
  } else {
    glue::linear(w.head.g, 0, c->vocab_size, head_in, n_out, D, s.logits, c->vocab_size, stream);
  }
  mark("head");
}

}  // namespace dsv4::gpu
