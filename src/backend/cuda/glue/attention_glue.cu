// Indexer scores over f32/bf16/fp8 keys with a per-query key base, slot lists for the sparse attention
// kernel and visible-entry counts.
#include <cmath>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {
constexpr int kKeyWarps = 8;  // keys per block

__device__ __forceinline__ float key_at(const uint8_t* row, int fmt, int d, int i) {
  if (fmt == 0) return reinterpret_cast<const float*>(row)[i];
  if (fmt == 1) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  return e4m3_to_f32(row[i]) * e8m0_to_f32(row[d]);
}

// One warp per (query, key): sum over heads of (w[h] * w_scale) * ReLU(q[h] . k) * d^-0.5 (cpu::indexer_scores
// order of the head sum, the weight scaled first as the CPU engine's iw *= ws).
__global__ void indexer_kernel(const float* q, const float* w, float w_scale, int H, int d, const uint8_t* pool,
                               int64_t row_bytes, int fmt, const int64_t* key_base, const int32_t* n_visible,
                               float* scores, int64_t n_cols) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kKeyWarps + threadIdx.x / 32;
  if (j >= n_cols) return;
  const int lane = threadIdx.x % 32;
  float* out = scores + static_cast<int64_t>(t) * n_cols + j;
  if (j >= n_visible[t]) {
    if (lane == 0) *out = -INFINITY;
    return;
  }
  const uint8_t* row = pool + (key_base[t] + j) * row_bytes;
  const float softmax_scale = 1.0f / sqrtf(static_cast<float>(d));
  const float* qt = q + static_cast<int64_t>(t) * H * d;
  float s = 0.0f;
  for (int h = 0; h < H; ++h) {
    float qk = 0.0f;
    for (int i = lane; i < d; i += 32) qk += qt[h * d + i] * key_at(row, fmt, d, i);
    qk = warp_sum(qk);
    const float wh = w[static_cast<int64_t>(t) * H + h] * w_scale;
    s += (qk > 0.0f ? qk : 0.0f) * softmax_scale * wh;
  }
  if (lane == 0) *out = s;
}

__global__ void slots_kernel(const int64_t* pos, const int64_t* base, int window, int ring, int kind, int ratio,
                             const int32_t* sel, int topk, int n_slots, int32_t* slots) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x;
  const int64_t p = pos[t], b = base[t];
  const int64_t first = p - window + 1 > 0 ? p - window + 1 : 0;
  const int64_t n_win = p - first + 1;
  const int64_t visible = ratio ? (p + 1) / ratio : 0;
  int32_t* out = slots + static_cast<int64_t>(t) * n_slots;
  const int n_write = kind == 3 ? window : n_slots;  // kind 3: the top-k wrote the selection part
  for (int j = threadIdx.x; j < n_write; j += blockDim.x) {
    int64_t row = -1;
    if (j < window) {
      if (j < n_win) row = b + (first + j) % ring;
    } else {
      const int e = j - window;
      if (kind == 2 && e < visible) row = b + ring + e;
      if (kind == 1 && e < topk && sel[static_cast<int64_t>(t) * topk + e] >= 0)
        row = b + ring + sel[static_cast<int64_t>(t) * topk + e];
    }
    out[j] = static_cast<int32_t>(row);
  }
}

__global__ void visible_kernel(int T, const int64_t* pos, int ratio, int32_t* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T) out[t] = static_cast<int32_t>((pos[t] + 1) / ratio);
}

}  // namespace

void indexer_scores(const float* q, const float* w, float w_scale, int T, int H, int d, const uint8_t* pool,
                    int64_t row_bytes, int fmt, const int64_t* key_base, const int32_t* n_visible, float* scores,
                    int64_t n_cols, cudaStream_t stream) {
  if (T <= 0 || n_cols <= 0) return;
  cuda::check(cuda::launch(indexer_kernel, dim3(blocks_for(n_cols, kKeyWarps), T), dim3(kKeyWarps * 32), 0, stream, 
      q, w, w_scale, H, d, pool, row_bytes, fmt, key_base, n_visible, scores, n_cols), "indexer_kernel launch");
}

void build_slots(int T, const int64_t* pos, const int64_t* base, int window, int ring, int kind, int ratio,
                 const int32_t* sel, int topk, int n_slots, int32_t* slots, cudaStream_t stream) {
  if (T <= 0) return;
  cuda::check(cuda::launch(slots_kernel, dim3(T), dim3(256), 0, stream, pos, base, window, ring, kind, ratio, sel, topk, n_slots, slots), "slots_kernel launch");
}

void visible_counts(int T, const int64_t* pos, int ratio, int32_t* out, cudaStream_t stream) {
  if (T <= 0) return;
  cuda::check(cuda::launch(visible_kernel, dim3(blocks_for(T, 128)), dim3(128), 0, stream, T, pos, ratio, out), "visible_kernel launch");
}

}  // namespace dsv4::glue
