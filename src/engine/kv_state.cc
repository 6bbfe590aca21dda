#include "engine/kv_state.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/numerics.h"

namespace dsv4 {

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kBF16: return "bf16";
    case KvDtype::kFP8: return "fp8";
  }
  return "?";
}

KvDtype parse_kv_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return KvDtype::kF32;
  if (s == "bf16" || s == "bfloat16" || s == "auto") return KvDtype::kBF16;
  if (s == "fp8" || s == "fp8_e4m3") return KvDtype::kFP8;
  fail("--kv-cache-dtype: unknown value '", s, "' (expected bf16, fp8 or f32)");
}

KvCodec::KvCodec(KvDtype dtype, int dim, int rope_dim, int scale_block)
    : dtype_(dtype), dim_(dim), rope_dim_(rope_dim), block_(scale_block) {
  const int nope = dim - rope_dim;
  switch (dtype) {
    case KvDtype::kF32: row_bytes_ = 4u * dim; break;
    case KvDtype::kBF16: row_bytes_ = 2u * dim; break;
    case KvDtype::kFP8:
      if (nope % block_)
        fail("fp8 KV cache: ", nope, " non-RoPE dims are not a multiple of the ", block_, "-wide scale block");
      row_bytes_ = (nope + 2u * rope_dim + nope / block_ + 7u) / 8u * 8u;
      break;
  }
}

namespace {
std::atomic<float> g_encode_nudge{0.f};
}
void set_kv_encode_nudge(float rel) { g_encode_nudge.store(rel, std::memory_order_relaxed); }
float kv_encode_nudge() { return g_encode_nudge.load(std::memory_order_relaxed); }

void KvCodec::encode(const float* x, uint8_t* out) const {
  if (const float nudge = kv_encode_nudge(); nudge != 0.f && dtype_ != KvDtype::kF32) {
    thread_local std::vector<float> nudged;
    nudged.assign(x, x + dim_);
    for (float& v : nudged) v *= 1.f + nudge;
    x = nudged.data();
  }
  switch (dtype_) {
    case KvDtype::kF32: std::memcpy(out, x, 4u * dim_); return;
    case KvDtype::kBF16:
      for (int i = 0; i < dim_; ++i) {
        uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case KvDtype::kFP8: {
      // Quantization as the reference's act_quant (e4m3_block_exponent).
      const int nope = dim_ - rope_dim_;
      uint8_t* rope_out = out + nope;
      uint8_t* scales = out + nope + 2 * rope_dim_;
      for (int b = 0; b < nope / block_; ++b) {
        const int e = e4m3_block_exponent(x + b * block_, block_);
        const float scale = std::ldexp(1.0f, e);
        scales[b] = static_cast<uint8_t>(e + 127);
        for (int i = b * block_; i < (b + 1) * block_; ++i) out[i] = f32_to_fp8_e4m3(x[i] / scale);
      }
      for (int i = 0; i < rope_dim_; ++i) {
        uint16_t h = f32_to_bf16(x[nope + i]);
        std::memcpy(rope_out + 2 * i, &h, 2);
      }
      const size_t used = nope + 2 * rope_dim_ + nope / block_;
      std::memset(out + used, 0, row_bytes_ - used);
      return;
    }
  }
}

void KvCodec::decode(const uint8_t* in, float* x) const {
  switch (dtype_) {
    case KvDtype::kF32: std::memcpy(x, in, 4u * dim_); return;
    case KvDtype::kBF16:
      for (int i = 0; i < dim_; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        x[i] = bf16_to_f32(h);
      }
      return;
    case KvDtype::kFP8: {
      const int nope = dim_ - rope_dim_;
      const float* lut = fp8_e4m3_table();
      const uint8_t* scales = in + nope + 2 * rope_dim_;
      for (int i = 0; i < nope; ++i) x[i] = lut[in[i]] * e8m0_to_f32(scales[i / block_]);
      for (int i = 0; i < rope_dim_; ++i) {
        uint16_t h;
        std::memcpy(&h, in + nope + 2 * i, 2);
        x[nope + i] = bf16_to_f32(h);
      }
      return;
    }
  }
}

void KvCodec::round_trip(float* x) const {
  if (dtype_ == KvDtype::kF32) return;
  std::vector<uint8_t> buf(row_bytes_);
  encode(x, buf.data());
  decode(buf.data(), x);
}

uint8_t* PagePool::alloc() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    storage_.emplace_back(new uint8_t[row_bytes_ * rows_per_page_]);
    return storage_.back().get();
  }
  uint8_t* p = free_.back();
  free_.pop_back();
  return p;
}

void PagePool::release(uint8_t* page) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(page);
}

size_t PagePool::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return storage_.size() - free_.size();
}

uint8_t* PagedRows::append() {
  const int rpp = pool_->rows_per_page();
  if (n_ == static_cast<int64_t>(pages_.size()) * rpp) pages_.push_back(pool_->alloc());
  uint8_t* r = pages_[n_ / rpp] + (n_ % rpp) * pool_->row_bytes();
  ++n_;
  return r;
}

const uint8_t* PagedRows::row(int64_t i) const {
  const int rpp = pool_->rows_per_page();
  return pages_[i / rpp] + (i % rpp) * pool_->row_bytes();
}

void PagedRows::truncate(int64_t n) {
  if (n >= n_) return;
  n_ = n;
  if (!pool_) return;
  const int rpp = pool_->rows_per_page();
  const size_t keep = static_cast<size_t>((n + rpp - 1) / rpp);
  while (pages_.size() > keep) {
    pool_->release(pages_.back());
    pages_.pop_back();
  }
}

SequenceSnapshot SequenceState::snapshot() const {
  SequenceSnapshot s;
  s.length = length;
  s.mtp_length = mtp_length;
  for (const LayerState& L : layers) {
    s.rings.push_back(L.ring);
    s.comps.push_back(L.comp);
    s.index_comps.push_back(L.index_comp);
    s.n_entries.push_back(L.entries.size());
    s.n_index_keys.push_back(L.index_keys.size());
  }
  return s;
}

void SequenceState::restore(const SequenceSnapshot& s) {
  if (s.rings.size() != layers.size()) fail("sequence restore: snapshot is from another model");
  if (s.length > length || s.mtp_length > mtp_length) fail("sequence restore: snapshot is newer than the state");
  length = s.length;
  mtp_length = s.mtp_length;
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].ring = s.rings[i];
    layers[i].comp = s.comps[i];
    layers[i].index_comp = s.index_comps[i];
    layers[i].entries.truncate(s.n_entries[i]);
    layers[i].index_keys.truncate(s.n_index_keys[i]);
  }
}

size_t SequenceState::fixed_bytes() const {
  size_t n = 0;
  for (const LayerState& L : layers) {
    n += L.ring.size();
    n += (L.comp.kv.size() + L.comp.score.size() + L.comp.prev_kv.size() + L.comp.prev_score.size()) * 4;
    n += (L.index_comp.kv.size() + L.index_comp.score.size() + L.index_comp.prev_kv.size() +
          L.index_comp.prev_score.size()) * 4;
  }
  return n;
}

}  // namespace dsv4
