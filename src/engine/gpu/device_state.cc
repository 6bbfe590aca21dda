#include "engine/gpu/device_state.h"

#include <cuda_runtime.h>

#include "backend/cuda/kernels_compressor_mhc.h"
#include "core/error.h"

namespace dsv4::gpu {

DeviceState::DeviceState(const ModelConfig& c, KvDtype dtype, int max_seqs_, int64_t max_len, bool poison,
                         int64_t ring_size, int n_layers)
    : max_seqs(max_seqs_), max_model_len(max_len) {
  format = dtype == KvDtype::kF32 ? cuda::KvRowFormat::kF32
           : dtype == KvDtype::kBF16 ? cuda::KvRowFormat::kBF16 : cuda::KvRowFormat::kFP8;
  fmt_code = dtype == KvDtype::kF32 ? 0 : dtype == KvDtype::kBF16 ? 1 : 2;
  // Same layouts as the CPU engine's codecs (forward.cc: Model::load).
  row_bytes = KvCodec(dtype, c.head_dim, c.rope_head_dim, 64).row_bytes();
  const int id = c.index_head_dim > 0 ? c.index_head_dim : 64;
  index_row_bytes = KvCodec(dtype, id, 0, id).row_bytes();
  ring = ring_size > 0 ? ring_size : c.sliding_window;
  if (ring < c.sliding_window) fail("GPU state: ring of ", ring, " rows is below the window ", c.sliding_window);
  if (n_layers < 0) n_layers = c.num_hidden_layers;
  for (int i = 0; i < n_layers; ++i) {
    LayerPools p;
    p.ratio = c.compress_ratio(i);
    p.rows_per_seq = ring + (p.ratio ? max_len / p.ratio : 0);
    p.kv = static_cast<uint8_t*>(alloc(row_bytes * p.rows_per_seq * max_seqs, poison));
    if (p.ratio)
      p.comp_state = static_cast<float*>(
          alloc(cuda::compressor_state_floats(p.ratio, c.head_dim) * sizeof(float) * max_seqs, poison));
    if (c.attn_kind(i) == AttnKind::kCSA) {
      p.keys_per_seq = max_len / 4;
      p.index_keys = static_cast<uint8_t*>(alloc(index_row_bytes * p.keys_per_seq * max_seqs, poison));
      p.index_comp_state =
          static_cast<float*>(alloc(cuda::compressor_state_floats(4, id) * sizeof(float) * max_seqs, poison));
    }
    layers.push_back(p);
  }
  slots = std::make_shared<SlotPool>();
  for (int s = max_seqs - 1; s >= 0; --s) slots->free.push_back(s);
}

DeviceState::~DeviceState() {
  for (void* p : allocs_) cudaFree(p);
}

void* DeviceState::alloc(size_t n, bool poison) {
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, n), "cudaMalloc (sequence state)");
  allocs_.push_back(p);
  // 0xFF bytes are NaN in f32, bf16 and e4m3: a read of a row never written shows up in the logits.
  if (poison) cuda::check(cudaMemset(p, 0xff, n), "poison sequence state");
  bytes += n;
  return p;
}

}  // namespace dsv4::gpu
