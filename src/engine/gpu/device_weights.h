// Every tensor of a checkpoint uploaded to the device in its shipped format (FP8 + UE8M0 tiles, MXFP4 +
// scales, BF16, F32), copied straight from the safetensors mmap. Views for the two kernel families: the
// weight-streaming GEMV/MoE kernels (cudalin) and the fp32-activation glue linear (glue).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/glue/glue.h"
#include "backend/cuda/linear/linear_cuda.h"
#include "model/weights.h"

namespace dsv4::gpu {

struct DevLinear {
  WeightFormat fmt = WeightFormat::kBF16;
  int64_t rows = 0, cols = 0;
  glue::Weight g;         // any format, fp32 activations
  cudalin::DevWeight d;   // FP8 / MXFP4 only, bf16 activations
  // The rows [row_begin, row_begin + rows) as a weight of their own (FP8: row_begin a multiple of the tile).
  cudalin::DevWeight row_block(int64_t row_begin, int64_t rows) const;
  // The same rows as a DevLinear (both views; FP8/MXFP4 only, FP8 row_begin a multiple of the tile).
  DevLinear rows_view(int64_t row_begin, int64_t rows) const;
};

// Whether cudalin::gemv takes this weight (FP8/MXFP4, rows a multiple of 16, cols of 128).
bool gemv_applies(const DevLinear& w);

struct DevHc {
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;
};

struct DevCompressor {
  int ratio = 0, head = 0;
  DevLinear wkv, wgate;
  const float *ape = nullptr, *norm = nullptr;
};

struct DevLayer {
  const float *attn_norm = nullptr, *ffn_norm = nullptr, *attn_sink = nullptr, *q_norm = nullptr,
              *kv_norm = nullptr;
  DevHc hc_attn, hc_ffn;
  DevLinear wq_a, wq_b, wkv, wo_a, wo_b;
  // wq_a and wkv read the same x: stored as one [q_lora + head_dim, hidden] weight (wq_a and wkv are views
  // of its rows) so one GEMV serves both; rows == 0 where the formats do not stack (then separate).
  DevLinear wq_a_wkv;
  DevCompressor comp, index_comp;
  DevLinear index_wq_b, index_weights_proj;
  DevLinear gate;
  const float* gate_bias = nullptr;
  const int32_t* tid2eid = nullptr;
  bool has_shared = false;
  DevLinear sh_w1, sh_w2, sh_w3;
  DevLinear sh_w13;  // w1 rows then w3 rows, as wq_a_wkv (sh_w1, sh_w3 are its views)
  WeightFormat expert_fmt = WeightFormat::kFP4;
  const cudalin::DevExpert* experts = nullptr;  // device array [n_experts] (MXFP4 experts only)
  const glue::Expert* experts_exact = nullptr;  // device array [n_experts]
  // Every expert scale lies where moe_decode's f16 path is exact (cudalin::moe_scales_fit_f16; set at load).
  bool experts_fit_f16 = false;
  // The MTP block only (engine/forward.cc: Model::mtp_forward): x = e_proj(enorm(embed(next))) broadcast to the
  // streams + h_proj(hnorm(h_j)), then the layer, then its own hc_head and final norm before the shared LM head.
  bool is_mtp = false;
  DevLinear e_proj, h_proj;
  const float *enorm = nullptr, *hnorm = nullptr, *mtp_norm = nullptr;
  DevHc mtp_hc_head;
};

class DeviceWeights {
 public:
  DeviceWeights() = default;
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
  ~DeviceWeights();

  // Uploads the main layers into `layers` and, with `mtp`, the MTP layers into `mtp_layers`. Progress on stderr
  // when `progress`.
  void upload(const ModelWeights& w, const ModelConfig& c, bool progress, bool mtp = false);

  const uint16_t* embed = nullptr;
  DevLinear head;
  const float* norm = nullptr;
  DevHc hc_head;
  std::vector<DevLayer> layers;
  std::vector<DevLayer> mtp_layers;  // GpuOptions::load_mtp (GpuModel appends them to `layers` after the main ones)
  size_t bytes = 0;

 private:
  const void* put(const void* host, size_t n);
  const float* put(const std::vector<float>& v) { return static_cast<const float*>(put(v.data(), v.size() * 4)); }
  const void* put_concat(const void* a, size_t na, const void* b, size_t nb);
  DevLinear put(const LinearWeight& w);
  void put_stacked(const LinearWeight& a, const LinearWeight& b, DevLinear& stacked, DevLinear& va, DevLinear& vb);
  DevHc put(const HcWeights& h);
  DevCompressor put(const CompressorWeights& c);
  DevLayer put_layer(const LayerWeights& L, int index);

  std::vector<void*> allocs_;
  size_t total_ = 0;
  bool progress_ = false;
};

}  // namespace dsv4::gpu
