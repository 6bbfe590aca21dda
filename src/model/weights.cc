#include "model/weights.h"

#include <cstring>

#include "core/error.h"
#include "core/numerics.h"

namespace dsv4 {

size_t LinearWeight::bytes() const {
  switch (fmt) {
    case WeightFormat::kBF16: return static_cast<size_t>(rows * cols * 2);
    case WeightFormat::kFP8Block: {
      size_t sb = static_cast<size_t>(((rows + block - 1) / block) * ((cols + block - 1) / block));
      return static_cast<size_t>(rows * cols) + sb * (scale_is_f32 ? 4 : 1);
    }
    case WeightFormat::kFP4: return static_cast<size_t>(rows * cols / 2 + rows * cols / 32);
  }
  return 0;
}

namespace {

std::vector<float> to_floats(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else if (t.dtype == DType::kBF16) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    }
  } else {
    fail(t.file, ": tensor ", t.name, ": cannot read dtype ", dtype_name(t.dtype), " as float");
  }
  return out;
}

class Binder {
 public:
  explicit Binder(const Checkpoint& ck) : ck_(ck), c_(ck.config()) {}

  std::vector<float> vec(const std::string& name) { return to_floats(ck_.tensor(name)); }

  LinearWeight linear(const std::string& base, WeightFormat fmt) {
    LinearWeight lw;
    lw.name = base;
    lw.fmt = fmt;
    lw.block = c_.weight_block;
    const TensorView& w = ck_.tensor(base + ".weight");
    lw.rows = w.shape[0];
    lw.cols = fmt == WeightFormat::kFP4 ? w.shape[1] * 2 : w.shape[1];
    lw.w = w.data;
    if (fmt != WeightFormat::kBF16) {
      const TensorView& s = ck_.tensor(base + ".scale");
      lw.scale = s.data;
      lw.scale_is_f32 = s.dtype == DType::kF32;
    }
    return lw;
  }

  HcWeights hc(const std::string& p, const std::string& site) {
    return {vec(p + "hc_" + site + "_fn"), vec(p + "hc_" + site + "_base"), vec(p + "hc_" + site + "_scale")};
  }

  CompressorWeights compressor(const std::string& p, int ratio, int head) {
    CompressorWeights cw;
    cw.ratio = ratio;
    cw.head = head;
    cw.wkv = linear(p + "wkv", WeightFormat::kBF16);
    cw.wgate = linear(p + "wgate", WeightFormat::kBF16);
    cw.ape = vec(p + "ape");
    cw.norm = vec(p + "norm.weight");
    return cw;
  }

  LayerWeights layer(int i) {
    LayerWeights L;
    const std::string p = layer_prefix(c_, i);
    const WeightFormat lf = c_.linear_format;
    L.index = i;
    L.ratio = c_.compress_ratio(i);
    L.kind = c_.attn_kind(i);
    L.hash = c_.is_hash_layer(i);
    L.attn_norm = vec(p + "attn_norm.weight");
    L.ffn_norm = vec(p + "ffn_norm.weight");
    L.hc_attn = hc(p, "attn");
    L.hc_ffn = hc(p, "ffn");
    const std::string a = p + "attn.";
    L.attn_sink = vec(a + "attn_sink");
    L.wq_a = linear(a + "wq_a", lf);
    L.wq_b = linear(a + "wq_b", lf);
    L.wkv = linear(a + "wkv", lf);
    L.wo_a = linear(a + "wo_a", lf);
    L.wo_b = linear(a + "wo_b", lf);
    L.q_norm = vec(a + "q_norm.weight");
    L.kv_norm = vec(a + "kv_norm.weight");
    if (L.ratio) L.compressor = compressor(a + "compressor.", L.ratio, c_.head_dim);
    if (L.kind == AttnKind::kCSA) {
      L.index_wq_b = linear(a + "indexer.wq_b", lf);
      L.index_weights_proj = linear(a + "indexer.weights_proj", WeightFormat::kBF16);
      L.index_compressor = compressor(a + "indexer.compressor.", 4, c_.index_head_dim);
    }
    const std::string f = p + "ffn.";
    L.gate = linear(f + "gate", WeightFormat::kBF16);
    if (L.hash) {
      const TensorView& t = ck_.tensor(f + "gate.tid2eid");
      L.tid2eid.resize(static_cast<size_t>(t.numel()));
      for (size_t k = 0; k < L.tid2eid.size(); ++k) {
        int64_t v;
        if (t.dtype == DType::kI64) std::memcpy(&v, t.data + 8 * k, 8);
        else { int32_t v32; std::memcpy(&v32, t.data + 4 * k, 4); v = v32; }
        if (v < 0 || v >= c_.n_routed_experts)
          fail(t.file, ": tensor ", t.name, " holds expert id ", v, " at entry ", k, ", outside [0, ",
               c_.n_routed_experts, ")");
        L.tid2eid[k] = static_cast<int32_t>(v);
      }
    } else {
      L.gate_bias = vec(f + "gate.bias");
    }
    L.has_shared = c_.n_shared_experts > 0;
    if (L.has_shared)
      L.shared = {linear(f + "shared_experts.w1", lf), linear(f + "shared_experts.w2", lf),
                  linear(f + "shared_experts.w3", lf)};
    for (int e = 0; e < c_.n_routed_experts; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      L.experts.push_back({linear(x + "w1", c_.expert_format), linear(x + "w2", c_.expert_format),
                           linear(x + "w3", c_.expert_format)});
    }
    if (i >= c_.num_hidden_layers) {
      L.is_mtp = true;
      L.e_proj = linear(p + "e_proj", lf);
      L.h_proj = linear(p + "h_proj", lf);
      L.enorm = vec(p + "enorm.weight");
      L.hnorm = vec(p + "hnorm.weight");
      L.norm = vec(p + "norm.weight");
      L.hc_head = {vec(p + "hc_head_fn"), vec(p + "hc_head_base"), vec(p + "hc_head_scale")};
    }
    return L;
  }

 private:
  const Checkpoint& ck_;
  const ModelConfig& c_;
};

}  // namespace

ModelWeights bind_weights(const Checkpoint& ck) {
  Binder b(ck);
  ModelWeights m;
  m.embed = b.linear("embed", WeightFormat::kBF16);
  m.head = b.linear("head", WeightFormat::kBF16);
  m.norm = b.vec("norm.weight");
  m.hc_head = {b.vec("hc_head_fn"), b.vec("hc_head_base"), b.vec("hc_head_scale")};
  for (int i = 0; i < ck.config().num_layers_total(); ++i) m.layers.push_back(b.layer(i));
  return m;
}

size_t device_weight_bytes(const ModelWeights& w, int num_hidden_layers, int mtp_layers) {
  size_t n = 0;
  auto vec = [&](const auto& v) { n += v.size() * sizeof(v[0]); };
  auto hc = [&](const HcWeights& h) { vec(h.fn), vec(h.base), vec(h.scale); };
  auto comp = [&](const CompressorWeights& c) { n += c.wkv.bytes() + c.wgate.bytes(), vec(c.ape), vec(c.norm); };
  n += w.embed.bytes() + w.head.bytes();
  vec(w.norm);
  hc(w.hc_head);
  for (int i = 0; i < num_hidden_layers + mtp_layers && i < static_cast<int>(w.layers.size()); ++i) {
    const LayerWeights& L = w.layers[i];
    if (L.is_mtp) {  // the MTP block's own tensors (engine/gpu/device_weights.cc, put_layer)
      n += L.e_proj.bytes() + L.h_proj.bytes();
      vec(L.enorm), vec(L.hnorm), vec(L.norm);
      hc(L.hc_head);
    }
    vec(L.attn_norm), vec(L.ffn_norm), vec(L.attn_sink), vec(L.q_norm), vec(L.kv_norm), vec(L.gate_bias);
    vec(L.tid2eid);
    hc(L.hc_attn), hc(L.hc_ffn);
    for (const LinearWeight* l : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.gate, &L.index_wq_b,
                                  &L.index_weights_proj, &L.shared.w1, &L.shared.w2, &L.shared.w3})
      n += l->bytes();
    if (L.ratio) comp(L.compressor);
    if (L.kind == AttnKind::kCSA) comp(L.index_compressor);
    for (const ExpertWeights& e : L.experts) n += e.w1.bytes() + e.w2.bytes() + e.w3.bytes() + kDeviceExpertTableBytes;
  }
  return n;
}

}  // namespace dsv4
