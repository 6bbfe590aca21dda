#include "engine/gpu/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::gpu {

namespace {
size_t weight_bytes(const LinearWeight& w) {
  switch (w.fmt) {
    case WeightFormat::kBF16: return static_cast<size_t>(w.rows * w.cols * 2);
    case WeightFormat::kFP8Block: return static_cast<size_t>(w.rows * w.cols);
    case WeightFormat::kFP4: return static_cast<size_t>(w.rows * w.cols / 2);
  }
  return 0;
}
size_t scale_bytes(const LinearWeight& w) {
  switch (w.fmt) {
    case WeightFormat::kBF16: return 0;
    case WeightFormat::kFP8Block:
      return static_cast<size_t>(((w.rows + w.block - 1) / w.block) * ((w.cols + w.block - 1) / w.block)) *
             (w.scale_is_f32 ? 4 : 1);
    case WeightFormat::kFP4: return static_cast<size_t>(w.rows * w.cols / 32);
  }
  return 0;
}
glue::WFormat glue_format(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16: return glue::WFormat::kBF16;
    case WeightFormat::kFP8Block: return glue::WFormat::kFP8Block;
    case WeightFormat::kFP4: return glue::WFormat::kFP4;
  }
  return glue::WFormat::kBF16;
}
}  // namespace

bool gemv_applies(const DevLinear& w) {
  return w.fmt != WeightFormat::kBF16 && w.rows % 16 == 0 && w.cols % 128 == 0;
}

cudalin::DevWeight DevLinear::row_block(int64_t row_begin, int64_t n) const {
  cudalin::DevWeight r = d;
  r.rows = n;
  if (fmt == WeightFormat::kFP8Block) {
    if (row_begin % g.block) fail("row block at ", row_begin, " is not aligned to the ", g.block, "-row scale tile");
    r.w = d.w + row_begin * cols;
    r.scale = d.scale + (row_begin / g.block) * ((cols + g.block - 1) / g.block) * (d.scale_is_f32 ? 4 : 1);
  } else if (fmt == WeightFormat::kFP4) {
    r.w = d.w + row_begin * (cols / 2);
    r.scale = d.scale + row_begin * (cols / 32);
  } else {
    fail("row_block: BF16 weights have no cudalin view");
  }
  return r;
}

DevLinear DevLinear::rows_view(int64_t row_begin, int64_t n) const {
  DevLinear v = *this;
  v.rows = n;
  v.d = row_block(row_begin, n);
  v.g.rows = n;
  v.g.w = v.d.w;
  v.g.scale = v.d.scale;
  return v;
}

DeviceWeights::~DeviceWeights() {
  for (void* p : allocs_) cudaFree(p);
}

const void* DeviceWeights::put(const void* host, size_t n) { return put_concat(host, n, nullptr, 0); }

const void* DeviceWeights::put_concat(const void* a, size_t na, const void* b, size_t nb) {
  const size_t n = na + nb;
  if (n == 0) return nullptr;
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, n), "cudaMalloc (weights)");
  allocs_.push_back(p);
  if (na) cuda::check(cudaMemcpy(p, a, na, cudaMemcpyHostToDevice), "upload weights");
  if (nb) cuda::check(cudaMemcpy(static_cast<uint8_t*>(p) + na, b, nb, cudaMemcpyHostToDevice), "upload weights");
  bytes += n;
  // total_ counts the matrices; norms and other small vectors come on top, so the count is capped at it.
  if (progress_ && total_ > 0 && allocs_.size() % 64 == 0)
    std::fprintf(stderr, "\rloading weights to the GPU: %zu / %zu MiB", std::min(bytes, total_) >> 20, total_ >> 20);
  return p;
}

namespace {
// A DevLinear over device bytes wd / sd that hold `rows` rows in w's format, width and scale layout.
DevLinear dev_linear(const LinearWeight& w, int64_t rows, const uint8_t* wd, const uint8_t* sd) {
  DevLinear d;
  d.fmt = w.fmt;
  d.rows = rows;
  d.cols = w.cols;
  d.g = glue::Weight{glue_format(w.fmt), rows, w.cols, wd, sd, w.scale_is_f32, w.block};
  if (w.fmt != WeightFormat::kBF16) d.d = cudalin::DevWeight{w.fmt, rows, w.cols, wd, sd, w.scale_is_f32};
  return d;
}
}  // namespace

DevLinear DeviceWeights::put(const LinearWeight& w) {
  const auto* wd = static_cast<const uint8_t*>(put(w.w, weight_bytes(w)));
  const auto* sd = static_cast<const uint8_t*>(put(w.scale, scale_bytes(w)));
  return dev_linear(w, w.rows, wd, sd);
}

// Rows of a then rows of b in one allocation, when their formats stack: the same format, width and scale
// type, and (FP8) a's rows whole scale tiles, so the scale grid [rows/B, cols/B] stacks row-wise too.
// stacked.rows == 0 when they do not; va / vb are views of the two parts either way.
void DeviceWeights::put_stacked(const LinearWeight& a, const LinearWeight& b, DevLinear& stacked, DevLinear& va,
                                DevLinear& vb) {
  const bool ok = a.fmt == b.fmt && a.fmt != WeightFormat::kBF16 && a.cols == b.cols &&
                  a.scale_is_f32 == b.scale_is_f32 && a.block == b.block &&
                  (a.fmt != WeightFormat::kFP8Block || a.rows % a.block == 0);
  stacked = DevLinear{};
  if (!ok) {
    va = put(a);
    vb = put(b);
    return;
  }
  const auto* wd = static_cast<const uint8_t*>(put_concat(a.w, weight_bytes(a), b.w, weight_bytes(b)));
  const auto* sd = static_cast<const uint8_t*>(put_concat(a.scale, scale_bytes(a), b.scale, scale_bytes(b)));
  stacked = dev_linear(a, a.rows + b.rows, wd, sd);
  va = stacked.rows_view(0, a.rows);
  vb = stacked.rows_view(a.rows, b.rows);
}

DevHc DeviceWeights::put(const HcWeights& h) { return DevHc{put(h.fn), put(h.base), put(h.scale)}; }

DevCompressor DeviceWeights::put(const CompressorWeights& c) {
  DevCompressor d;
  d.ratio = c.ratio;
  d.head = c.head;
  d.wkv = put(c.wkv);
  d.wgate = put(c.wgate);
  d.ape = put(c.ape);
  d.norm = put(c.norm);
  return d;
}

void DeviceWeights::upload(const ModelWeights& w, const ModelConfig& c, bool progress, bool mtp) {
  progress_ = progress;
  total_ = 0;
  auto count = [&](const LinearWeight& l) { total_ += weight_bytes(l) + scale_bytes(l); };
  count(w.embed);
  count(w.head);
  const int n_layers = c.num_hidden_layers + (mtp ? c.num_nextn_predict_layers : 0);
  for (int i = 0; i < n_layers; ++i) {
    const LayerWeights& L = w.layers[i];
    for (const LinearWeight* l : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.gate}) count(*l);
    if (L.ratio) count(L.compressor.wkv), count(L.compressor.wgate);
    if (L.kind == AttnKind::kCSA)
      count(L.index_wq_b), count(L.index_weights_proj), count(L.index_compressor.wkv), count(L.index_compressor.wgate);
    if (L.has_shared) count(L.shared.w1), count(L.shared.w2), count(L.shared.w3);
    for (const ExpertWeights& e : L.experts) count(e.w1), count(e.w2), count(e.w3);
    if (L.is_mtp) count(L.e_proj), count(L.h_proj);
  }

  if (w.embed.fmt != WeightFormat::kBF16) fail("GPU engine: embed.weight must be BF16");
  embed = static_cast<const uint16_t*>(put(w.embed.w, weight_bytes(w.embed)));
  head = put(w.head);
  norm = put(w.norm);
  hc_head = put(w.hc_head);
  for (int i = 0; i < n_layers; ++i) (i < c.num_hidden_layers ? layers : mtp_layers).push_back(put_layer(w.layers[i], i));
  if (progress_) std::fprintf(stderr, "\rloading weights to the GPU: %zu MiB done\n", bytes >> 20);
}

DevLayer DeviceWeights::put_layer(const LayerWeights& L, int i) {
  DevLayer d;
  d.attn_norm = put(L.attn_norm);
  d.ffn_norm = put(L.ffn_norm);
  d.attn_sink = put(L.attn_sink);
  d.q_norm = put(L.q_norm);
  d.kv_norm = put(L.kv_norm);
  d.hc_attn = put(L.hc_attn);
  d.hc_ffn = put(L.hc_ffn);
  put_stacked(L.wq_a, L.wkv, d.wq_a_wkv, d.wq_a, d.wkv);
  d.wq_b = put(L.wq_b);
  d.wo_a = put(L.wo_a);
  d.wo_b = put(L.wo_b);
  if (L.ratio) d.comp = put(L.compressor);
  if (L.kind == AttnKind::kCSA) {
    d.index_comp = put(L.index_compressor);
    d.index_wq_b = put(L.index_wq_b);
    d.index_weights_proj = put(L.index_weights_proj);
  }
  d.gate = put(L.gate);
  if (L.hash) d.tid2eid = static_cast<const int32_t*>(put(L.tid2eid.data(), L.tid2eid.size() * 4));
  else d.gate_bias = put(L.gate_bias);
  d.has_shared = L.has_shared;
  if (L.has_shared) {
    put_stacked(L.shared.w1, L.shared.w3, d.sh_w13, d.sh_w1, d.sh_w3);
    d.sh_w2 = put(L.shared.w2);
  }
  std::vector<cudalin::DevExpert> ex;
  std::vector<glue::Expert> ex_exact;
  for (const ExpertWeights& e : L.experts) {
    DevLinear w1 = put(e.w1), w2 = put(e.w2), w3 = put(e.w3);
    d.expert_fmt = e.w1.fmt;
    ex.push_back({w1.g.w, w1.g.scale, w3.g.w, w3.g.scale, w2.g.w, w2.g.scale});
    if (e.w1.fmt == WeightFormat::kFP4 && !cudalin::moe_expert_aligned(ex.back()))
      fail("layer ", i, " expert ", ex.size() - 1, ": MXFP4 weights or scales not 16- / 4-byte aligned on the device");
    ex_exact.push_back({w1.g, w2.g, w3.g});
  }
  static_assert(sizeof(cudalin::DevExpert) + sizeof(glue::Expert) <= kDeviceExpertTableBytes,
                "the memory plan's allowance for the expert tables (model/weights.h)");
  d.experts = static_cast<const cudalin::DevExpert*>(put(ex.data(), ex.size() * sizeof(ex[0])));
  d.experts_exact = static_cast<const glue::Expert*>(put(ex_exact.data(), ex_exact.size() * sizeof(ex_exact[0])));
  if (L.is_mtp) {
    d.is_mtp = true;
    d.e_proj = put(L.e_proj);
    d.h_proj = put(L.h_proj);
    d.enorm = put(L.enorm);
    d.hnorm = put(L.hnorm);
    d.mtp_norm = put(L.norm);
    d.mtp_hc_head = put(L.hc_head);
  }
  return d;
}

}  // namespace dsv4::gpu
