// Per-sequence attention state on the device, for a fixed number of sequence slots and positions.
// Per layer one contiguous row pool in the KV dtype holding, for every slot, [window ring | compressed
// entries] so the sparse attention kernel reads a whole query's keys from one pool:
//   slot s, window position p -> row s * rows_per_seq + p % R;  entry j -> row s * rows_per_seq + R + j.
// The ring has R = W + C - 1 rows, C the most tokens of one sequence in one step (decode: C = 1, R = W), so
// a step's window writes never land on a row one of its own queries still reads (engine/step_plan.h).
// Indexer keys (CSA layers): slot s, key j -> row s * keys_per_seq + j of the layer's key pool.
// Compressor rows (fp32, layout of cuda::compressor's state slots): one slot per sequence slot.
// Nothing needs clearing when a slot is reused: every reader is bounded by the sequence's positions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/kernels.h"
#include "engine/kv_state.h"
#include "model/config.h"

namespace dsv4::gpu {

struct LayerPools {
  int ratio = 0;
  int64_t rows_per_seq = 0;  // ring + max entries
  uint8_t* kv = nullptr;
  int64_t keys_per_seq = 0;  // CSA only
  uint8_t* index_keys = nullptr;
  float* comp_state = nullptr;
  float* index_comp_state = nullptr;
};

// Free sequence slots, shared with the sequences so a slot returns when its sequence dies.
struct SlotPool {
  std::vector<int> free;
};

class DeviceState {
 public:
  // ring: rows of the window ring (engine/step_plan.h ring_rows; 0 = the window). n_layers: the layers to hold
  // state for (-1: the main layers; c.num_layers_total() with the MTP block, GpuOptions::load_mtp).
  DeviceState(const ModelConfig& c, KvDtype dtype, int max_seqs, int64_t max_model_len, bool poison,
              int64_t ring = 0, int n_layers = -1);
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;
  ~DeviceState();

  cuda::KvRowFormat format;
  int fmt_code = 0;       // 0 f32, 1 bf16, 2 fp8 (glue kernels)
  size_t row_bytes = 0;   // main rows (head_dim wide)
  size_t index_row_bytes = 0;
  int max_seqs = 0;
  int64_t max_model_len = 0;
  int64_t ring = 0;        // window ring rows R (see above)
  std::vector<LayerPools> layers;
  std::shared_ptr<SlotPool> slots;
  size_t bytes = 0;

 private:
  void* alloc(size_t n, bool poison);
  std::vector<void*> allocs_;
};

}  // namespace dsv4::gpu
