// Embedding gather, RMSNorm, per-head norm + RoPE, and KV row encoding (KvCodec::encode) into a row pool.
#include <cmath>

#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {

__global__ void embed_kernel(const uint16_t* embed, const int32_t* tokens, int64_t dim, int n, float* out) {
  const int t = blockIdx.x;
  const uint16_t* row = embed + static_cast<int64_t>(tokens[t]) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = bf16_bits_to_f32(row[d]);
    for (int j = 0; j < n; ++j) out[(static_cast<int64_t>(t) * n + j) * dim + d] = v;
  }
}

__global__ void rmsnorm_kernel(const float* x, int64_t ldx, const float* w, int64_t n, float eps, float* y,
                               int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  const double ss = block_sum_squares(xr, n);
  const float r = 1.0f / sqrtf(static_cast<float>(ss / n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? w[i] * (xr[i] * r) : xr[i] * r;
}

// One block per (token, head).
__global__ void heads_norm_rope_kernel(float* x, int heads, int dim, const int64_t* pos, const float* inv_freq,
                                       int n_freq, bool norm, float eps, bool inverse) {
  float* v = x + static_cast<int64_t>(blockIdx.x) * dim;
  const int64_t p = pos[blockIdx.x / heads];
  if (norm) {
    const double ss = block_sum_squares(v, dim);
    const float r = 1.0f / sqrtf(static_cast<float>(ss / dim) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) v[i] = v[i] * r;
    __syncthreads();
  }
  float* rr = v + (dim - 2 * n_freq);
  for (int i = threadIdx.x; i < n_freq; i += blockDim.x) {
    const float angle = static_cast<float>(p) * inv_freq[i];
    const float c = cosf(angle);
    const float s = inverse ? -sinf(angle) : sinf(angle);
    const float a = rr[2 * i], b = rr[2 * i + 1];
    rr[2 * i] = a * c - b * s;
    rr[2 * i + 1] = b * c + a * s;
  }
}

// One block per token. fp8: one warp per scale block (amax over the block, floored at 1e-4).
__global__ void kv_encode_kernel(const float* x, int dim, int fmt, int rope_dim, int scale_block, uint8_t* pool,
                                 int64_t row_bytes, const int64_t* row_index) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  uint8_t* out = pool + row_index[blockIdx.x] * row_bytes;
  if (fmt == 0) {
    float* o = reinterpret_cast<float*>(out);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i];
    return;
  }
  if (fmt == 1) {
    __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(out);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __float2bfloat16_rn(xr[i]);
    return;
  }
  const int nope = dim - rope_dim, nb = nope / scale_block;
  uint8_t* scales = out + nope + 2 * rope_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int b = warp; b < nb; b += nw) {
    float amax = 1e-4f;
    for (int i = lane; i < scale_block; i += 32) amax = fmaxf(amax, fabsf(xr[b * scale_block + i]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int e = static_cast<int>(ceilf(log2f(amax / 448.0f)));  // same expression as KvCodec::encode
    const float sc = ldexpf(1.0f, e);
    if (lane == 0) scales[b] = static_cast<uint8_t>(e + 127);
    for (int i = lane; i < scale_block; i += 32) {
      const int k = b * scale_block + i;
      out[k] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(xr[k] / sc, __NV_SATFINITE, __NV_E4M3));
    }
  }
  __nv_bfloat16* ro = reinterpret_cast<__nv_bfloat16*>(out + nope);
  for (int i = threadIdx.x; i < rope_dim; i += blockDim.x) ro[i] = __float2bfloat16_rn(xr[nope + i]);
  const int used = nope + 2 * rope_dim + nb;
  const int padded = (used + 7) / 8 * 8;
  for (int i = used + threadIdx.x; i < padded; i += blockDim.x) out[i] = 0;
}

}  // namespace

void embed_streams(const uint16_t* embed, const int32_t* tokens, int T, int64_t dim, int n_streams, float* out,
                   cudaStream_t stream) {
  if (T <= 0) return;
  embed_kernel<<<T, 256, 0, stream>>>(embed, tokens, dim, n_streams, out);
  check_launch("glue::embed_streams");
}

void rmsnorm_rows(const float* x, int64_t ldx, const float* w, int rows, int64_t n, float eps, float* y,
                  int64_t ldy, cudaStream_t stream) {
  if (rows <= 0) return;
  rmsnorm_kernel<<<rows, 256, 0, stream>>>(x, ldx, w, n, eps, y, ldy);
  check_launch("glue::rmsnorm_rows");
}

void heads_norm_rope(float* x, int T, int heads, int dim, const int64_t* pos, const float* inv_freq, int n_freq,
                     bool norm, float eps, bool inverse, cudaStream_t stream) {
  if (T <= 0) return;
  heads_norm_rope_kernel<<<T * heads, 128, 0, stream>>>(x, heads, dim, pos, inv_freq, n_freq, norm, eps, inverse);
  check_launch("glue::heads_norm_rope");
}

void kv_encode(const float* x, int T, int dim, int fmt, int rope_dim, int scale_block, uint8_t* pool,
               int64_t row_bytes, const int64_t* row_index, cudaStream_t stream) {
  if (T <= 0) return;
  kv_encode_kernel<<<T, 256, 0, stream>>>(x, dim, fmt, rope_dim, scale_block, pool, row_bytes, row_index);
  check_launch("glue::kv_encode");
}

}  // namespace dsv4::glue
