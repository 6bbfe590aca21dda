// Per-sequence attention state (spec section 4, design notes "State that can be paged"):
//   - the window ring: the last `sliding_window` KV rows, slot = position % window, every layer;
//   - compressor running rows (main and indexer branches) for compressed layers;
//   - compressed KV entries (one per 4 or 128 tokens) and indexer keys (one per 4 tokens), appended to
//     fixed-size pages from a shared pool and addressed through a per-sequence page table.
// Rows are stored in the selected KV dtype and decoded to fp32 when read:
//   f32  : exact (used to compare against references bit for bit),
//   bf16 : every value rounded to bf16,
//   fp8  : the DeepSeek reference's quantization-aware layout: the non-RoPE dims as e4m3 with one UE8M0
//          scale per 64 dims, the RoPE dims bf16. For 512-wide rows: 448 + 128 + 7 bytes, padded to 584.
//          Indexer keys (no RoPE split): e4m3 with one UE8M0 scale per key.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/compressor.h"
#include "model/config.h"

namespace dsv4 {

enum class KvDtype { kF32, kBF16, kFP8 };
const char* kv_dtype_name(KvDtype d);
KvDtype parse_kv_dtype(const std::string& s);  // "f32" | "bf16" | "fp8"; throws naming the value

// Encodes/decodes one row of `dim` floats whose last `rope_dim` values carry RoPE.
class KvCodec {
 public:
  KvCodec(KvDtype dtype, int dim, int rope_dim, int scale_block);
  size_t row_bytes() const { return row_bytes_; }
  void encode(const float* x, uint8_t* out) const;
  void decode(const uint8_t* in, float* x) const;
  // x -> stored -> x: what every reader of the cache sees.
  void round_trip(float* x) const;
  KvDtype dtype() const { return dtype_; }
  int dim() const { return dim_; }

 private:
  KvDtype dtype_;
  int dim_, rope_dim_, block_;
  size_t row_bytes_;
};

// Test instrumentation (tests/tools/kv_rounding_sensitivity.cc, the GPU engine test's bf16 / fp8 KV bound): while
// set to a nonzero rel, KvCodec::encode multiplies every value by (1 + rel) before rounding it to a 16- or 8-bit
// KV format, so that values within ~rel of a rounding boundary land on the other code, as another
// implementation's slightly different fp32 values do. f32 KV is never touched. 0 (the default): no effect.
void set_kv_encode_nudge(float rel);
float kv_encode_nudge();

// Fixed-size pages of rows. Thread-safe.
class PagePool {
 public:
  PagePool(size_t row_bytes, int rows_per_page) : row_bytes_(row_bytes), rows_per_page_(rows_per_page) {}
  uint8_t* alloc();
  void release(uint8_t* page);
  size_t row_bytes() const { return row_bytes_; }
  int rows_per_page() const { return rows_per_page_; }
  size_t pages_in_use() const;

 private:
  size_t row_bytes_;
  int rows_per_page_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::vector<uint8_t*> free_;
};

// Append-only rows addressed through a page table; truncation frees trailing pages.
class PagedRows {
 public:
  explicit PagedRows(PagePool* pool = nullptr) : pool_(pool) {}
  ~PagedRows() { truncate(0); }
  PagedRows(PagedRows&& o) noexcept : pool_(o.pool_), pages_(std::move(o.pages_)), n_(o.n_) { o.n_ = 0; }
  PagedRows& operator=(PagedRows&&) = delete;
  PagedRows(const PagedRows&) = delete;

  int64_t size() const { return n_; }
  uint8_t* append();  // returns the new row's bytes
  const uint8_t* row(int64_t i) const;
  void truncate(int64_t n);

 private:
  PagePool* pool_;
  std::vector<uint8_t*> pages_;
  int64_t n_ = 0;
};

struct LayerState {
  std::vector<uint8_t> ring;  // [window, row_bytes]
  cpu::CompressorState comp, index_comp;
  PagedRows entries, index_keys;
  LayerState(PagePool* kv_pool, PagePool* index_pool) : entries(kv_pool), index_keys(index_pool) {}
};

// What a rollback needs: rings and compressor rows are copied (small, fixed size); entry lists are only
// truncated back to their counts.
struct SequenceSnapshot {
  int64_t length = 0, mtp_length = 0;
  std::vector<std::vector<uint8_t>> rings;
  std::vector<cpu::CompressorState> comps, index_comps;
  std::vector<int64_t> n_entries, n_index_keys;
};

class SequenceState {
 public:
  int64_t length = 0;      // tokens processed by the main layers
  int64_t mtp_length = 0;  // tokens processed by the MTP layer(s)
  std::vector<LayerState> layers;  // main layers, then MTP layers

  SequenceSnapshot snapshot() const;
  void restore(const SequenceSnapshot& s);
  size_t fixed_bytes() const;  // rings and compressor rows; entry pages are counted by their pools
};

}  // namespace dsv4
