// Embedding gather, RMSNorm, per-head norm + RoPE, and KV row encoding (KvCodec::encode) into a row pool.
#include <algorithm>
#include <cmath>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"
#include "backend/cuda/rope.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {

// (restrict: lets later loads issue ahead of earlier stores, which could otherwise alias them; Nsight Compute
// timed the unrestricted kernel at ~10 us for one 4096-wide token, run 3 in docs/PERFORMANCE.md.)
__global__ void embed_kernel(const uint16_t* __restrict__ embed, const int32_t* __restrict__ tokens, int64_t dim,
                             int n, float* __restrict__ out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x;
  const uint16_t* row = embed + static_cast<int64_t>(tokens[t]) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = bf16_bits_to_f32(row[d]);
    for (int j = 0; j < n; ++j) out[(static_cast<int64_t>(t) * n + j) * dim + d] = v;
  }
}

// The same with 8 elements per thread (16-byte loads, 32-byte stores per stream), grid (T, dim / 8 / 256): one
// load per thread, so the row's latency is paid once (the loop above, a load per trip, took ~10 us per decode
// step at dim 4096; run 110). Needs dim % 8 == 0 and 16-byte aligned embed and out.
__global__ void embed8_kernel(const uint16_t* __restrict__ embed, const int32_t* __restrict__ tokens, int64_t dim,
                              int n, float* __restrict__ out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x;
  const int64_t d = 8 * (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x);
  if (d >= dim) return;
  const uint4 b = *reinterpret_cast<const uint4*>(embed + static_cast<int64_t>(tokens[t]) * dim + d);
  const float4 lo = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                                __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
  const float4 hi = make_float4(__uint_as_float(b.z << 16), __uint_as_float(b.z & 0xffff0000u),
                                __uint_as_float(b.w << 16), __uint_as_float(b.w & 0xffff0000u));
  for (int j = 0; j < n; ++j) {
    float4* o = reinterpret_cast<float4*>(out + (static_cast<int64_t>(t) * n + j) * dim + d);
    o[0] = lo;
    o[1] = hi;
  }
}

// cpu::rope on the last 2 * n_freq dims of v at position p (inverse: the conjugate rotation); the whole block
// takes part, each pair by one thread.
__device__ __forceinline__ void rope_row(float* v, int dim, int64_t p, const float* inv_freq, int n_freq, bool inverse) {
  float* rr = v + (dim - 2 * n_freq);
  for (int i = threadIdx.x; i < n_freq; i += blockDim.x) {
    const float2 r = cuda::rope_rotate(rr[2 * i], rr[2 * i + 1], p, inv_freq[i], inverse);
    rr[2 * i] = r.x;
    rr[2 * i + 1] = r.y;
  }
}

// KvCodec::encode of one row xr [dim] into out (a pool row); the whole block takes part.
__device__ __forceinline__ void encode_row(const float* xr, int dim, int fmt, int rope_dim, int scale_block, uint8_t* out) {
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

// Rows longer than a single-pass block holds: reads x twice.
__global__ void rmsnorm_kernel(const float* x, int64_t ldx, const float* w, int64_t n, float eps, float* y,
                               int64_t ldy, uint16_t* yb, bool f16) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  const double ss = block_sum_squares(xr, n);
  const float r = 1.0f / sqrtf(static_cast<float>(ss / n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float o = w ? w[i] * (xr[i] * r) : xr[i] * r;
    yr[i] = o;
    if (yb) yb[blockIdx.x * ldy + i] = act16_bits_rn(o, f16);
  }
}

// Single pass for n <= kNormMax: every thread loads its elements once into registers, the block sums their
// squares (double, like cpu::rmsnorm), then the same thread writes the same elements, so y may alias x.
// V = 4: float4 loads (n % 4 == 0, x, y, w 16-byte aligned); V = 1: scalar. Element q of a thread is
// (tid + (q / V) * kNormThreads) * V + q % V.
constexpr int kNormThreads = 256;
constexpr int kNormPer = 32;  // elements per thread
constexpr int64_t kNormMax = int64_t{kNormThreads} * kNormPer;  // 8192

// The window KV row's tail after its RMSNorm (rmsnorm_rope_encode): RoPE at the token's position, then
// KvCodec::encode into the token's pool row, by the same block (the three kernels' arithmetic, one launch).
struct KvTail {
  const int64_t* pos = nullptr;  // nullptr: no tail
  const float* inv_freq = nullptr;
  int n_freq = 0, fmt = 0, rope_dim = 0, scale_block = 0;
  uint8_t* pool = nullptr;
  int64_t row_bytes = 0;
  const int64_t* row_index = nullptr;
};

template <int V>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_1pass_kernel(const float* x, int64_t ldx, const float* w,
                                                                     int n, float eps, float* y, int64_t ldy,
                                                                     uint16_t* yb, bool f16, KvTail tail) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ double part[kNormThreads / 32];
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  // x and w are both loaded before any store: y may alias them, so no load could be moved past a store.
  float v[kNormPer], g[kNormPer];
#pragma unroll
  for (int u = 0; u < kNormPer / V; ++u) {
    const int i = (threadIdx.x + u * kNormThreads) * V;
    if constexpr (V == 4) {
      const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 a = i < n ? *reinterpret_cast<const float4*>(xr + i) : z;
      const float4 b = w && i < n ? *reinterpret_cast<const float4*>(w + i) : z;
      v[4 * u] = a.x, v[4 * u + 1] = a.y, v[4 * u + 2] = a.z, v[4 * u + 3] = a.w;
      g[4 * u] = b.x, g[4 * u + 1] = b.y, g[4 * u + 2] = b.z, g[4 * u + 3] = b.w;
    } else {
      v[u] = i < n ? xr[i] : 0.0f;
      g[u] = w && i < n ? w[i] : 0.0f;
    }
  }
  double s = 0.0;
#pragma unroll
  for (int q = 0; q < kNormPer; ++q) s += static_cast<double>(v[q]) * v[q];  // padding zeros add nothing
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kNormThreads / 32; ++i) ss += part[i];  // fixed order: same bits every launch
  const float r = 1.0f / sqrtf(static_cast<float>(ss / n) + eps);
#pragma unroll
  for (int q = 0; q < kNormPer; ++q) v[q] = w ? g[q] * (v[q] * r) : v[q] * r;  // as cpu::rmsnorm
#pragma unroll
  for (int u = 0; u < kNormPer / V; ++u) {
    const int i = (threadIdx.x + u * kNormThreads) * V;
    if (i >= n) break;
    if constexpr (V == 4)
      *reinterpret_cast<float4*>(yr + i) = make_float4(v[4 * u], v[4 * u + 1], v[4 * u + 2], v[4 * u + 3]);
    else
      yr[i] = v[u];
    if (yb) {
#pragma unroll
      for (int e = 0; e < V; ++e) yb[blockIdx.x * ldy + i + e] = act16_bits_rn(v[V * u + e], f16);
    }
  }
  if (!tail.pos) return;
  __syncthreads();  // the row's global writes are visible to the whole block after the barrier
  rope_row(yr, n, tail.pos[blockIdx.x], tail.inv_freq, tail.n_freq, false);
  __syncthreads();
  encode_row(yr, n, tail.fmt, tail.rope_dim, tail.scale_block, tail.pool + tail.row_index[blockIdx.x] * tail.row_bytes);
}

// One block per (token, head).
__global__ void heads_norm_rope_kernel(float* x, int heads, int dim, const int64_t* pos, const float* inv_freq,
                                       int n_freq, bool norm, float eps, bool inverse, uint16_t* xb, bool f16) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  float* v = x + static_cast<int64_t>(blockIdx.x) * dim;
  const int64_t p = pos[blockIdx.x / heads];
  if (norm) {
    const double ss = block_sum_squares(v, dim);
    const float r = 1.0f / sqrtf(static_cast<float>(ss / dim) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) v[i] = v[i] * r;
    __syncthreads();
  }
  rope_row(v, dim, p, inv_freq, n_freq, inverse);
  if (xb) {  // the bf16 copy of the whole head, after its rotation is visible to the block
    __syncthreads();
    uint16_t* o = xb + static_cast<int64_t>(blockIdx.x) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = act16_bits_rn(v[i], f16);
  }
}

// The same as heads_norm_rope_kernel for rows of dim <= 4 * kHeadThreads, dim % 4 == 0 and a rotated block
// starting at a multiple of 4 (both RoPE pairs of a float4 inside one thread): thread t holds elements 4t ..
// 4t + 3 in registers, and the position, the row and the thread's two inverse frequencies are read together,
// before the norm (the generic kernel re-reads the row after it and reads inv_freq only in the RoPE step: one
// more round trip on the decode chain). The sum of squares is the generic kernel's block_sum_squares, run on a
// copy of the row in shared memory, so the results are the same bits.
constexpr int kHeadThreads = 128;
__global__ void __launch_bounds__(kHeadThreads) heads_norm_rope4_kernel(float* x, int heads, int dim,
                                                                        const int64_t* pos, const float* inv_freq,
                                                                        int n_freq, bool norm, float eps,
                                                                        bool inverse, uint16_t* xb, bool f16) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  __shared__ float row[4 * kHeadThreads];
  float* v = x + static_cast<int64_t>(blockIdx.x) * dim;
  const int t = threadIdx.x, r0 = dim - 2 * n_freq;
  const bool mine = 4 * t < dim, rot = mine && 4 * t >= r0;
  const int64_t p = pos[blockIdx.x / heads];
  float f0 = 0.0f, f1 = 0.0f;
  if (rot) {
    const int i = (4 * t - r0) / 2;
    f0 = inv_freq[i];
    f1 = inv_freq[i + 1];
  }
  float4 a = mine ? reinterpret_cast<const float4*>(v)[t] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (norm) {
    if (mine) reinterpret_cast<float4*>(row)[t] = a;
    __syncthreads();
    const double ss = block_sum_squares(row, dim);  // the generic kernel's function, on the copy
    const float r = 1.0f / sqrtf(static_cast<float>(ss / dim) + eps);
    a = make_float4(a.x * r, a.y * r, a.z * r, a.w * r);
  }
  if (!mine) return;
  if (rot) {
    const float2 lo = cuda::rope_rotate(a.x, a.y, p, f0, inverse), hi = cuda::rope_rotate(a.z, a.w, p, f1, inverse);
    a = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  reinterpret_cast<float4*>(v)[t] = a;
  if (xb) {
    const uint32_t b01 = act16_bits_rn(a.x, f16) | (static_cast<uint32_t>(act16_bits_rn(a.y, f16)) << 16);
    const uint32_t b23 = act16_bits_rn(a.z, f16) | (static_cast<uint32_t>(act16_bits_rn(a.w, f16)) << 16);
    reinterpret_cast<uint2*>(xb + static_cast<int64_t>(blockIdx.x) * dim)[t] = make_uint2(b01, b23);
  }
}

// One thread per (token, angle).
__global__ void rope_table_kernel(const int64_t* pos, int T, const float* inv_freq, int n_freq, float2* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(T) * n_freq) return;
  out[i] = cuda::rope_cos_sin(pos[i / n_freq], inv_freq[i % n_freq], false);
}

// One block per token. fp8: one warp per scale block (amax over the block, floored at 1e-4).
__global__ void kv_encode_kernel(const float* x, int dim, int fmt, int rope_dim, int scale_block, uint8_t* pool,
                                 int64_t row_bytes, const int64_t* row_index) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  encode_row(x + static_cast<int64_t>(blockIdx.x) * dim, dim, fmt, rope_dim, scale_block,
             pool + row_index[blockIdx.x] * row_bytes);
}

}  // namespace

namespace {
__global__ void add_to_streams_kernel(const float* __restrict__ e, int64_t dim, int n, float* __restrict__ h) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int t = blockIdx.x;
  for (int64_t d = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; d < dim;
       d += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const float v = e[static_cast<int64_t>(t) * dim + d];
    for (int j = 0; j < n; ++j) h[(static_cast<int64_t>(t) * n + j) * dim + d] += v;
  }
}
}  // namespace

void add_to_streams(const float* e, int T, int64_t dim, int n_streams, float* h, cudaStream_t stream) {
  if (T <= 0) return;
  const unsigned ny = static_cast<unsigned>(std::min<int64_t>((dim + 255) / 256, 64));
  cuda::check(cuda::launch(add_to_streams_kernel, dim3(T, ny), dim3(256), 0, stream, e, dim, n_streams, h),
              "add_to_streams_kernel launch");
}

void embed_streams(const uint16_t* embed, const int32_t* tokens, int T, int64_t dim, int n_streams, float* out,
                   cudaStream_t stream) {
  if (T <= 0) return;
  if (dim % 8 == 0 && reinterpret_cast<uintptr_t>(embed) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const unsigned ny = static_cast<unsigned>((dim / 8 + 255) / 256);
    cuda::check(cuda::launch(embed8_kernel, dim3(T, ny), dim3(256), 0, stream, embed, tokens, dim, n_streams, out),
                "embed8_kernel launch");
    return;
  }
  cuda::check(cuda::launch(embed_kernel, dim3(T), dim3(256), 0, stream, embed, tokens, dim, n_streams, out), "embed_kernel launch");
}

void rmsnorm_rows(const float* x, int64_t ldx, const float* w, int rows, int64_t n, float eps, float* y,
                  int64_t ldy, cudaStream_t stream, uint16_t* yb, bool f16) {
  if (rows <= 0) return;
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = n % 4 == 0 && ldx % 4 == 0 && ldy % 4 == 0 && a16(x) && a16(y) && (!w || a16(w));
  const int ni = static_cast<int>(n);
  if (n <= kNormMax && vec)
    cuda::check(cuda::launch(rmsnorm_1pass_kernel<4>, dim3(rows), dim3(kNormThreads), 0, stream, x, ldx, w, ni, eps,
                             y, ldy, yb, f16, KvTail{}),
                "rmsnorm_1pass_kernel<4> launch");
  else if (n <= kNormMax)
    cuda::check(cuda::launch(rmsnorm_1pass_kernel<1>, dim3(rows), dim3(kNormThreads), 0, stream, x, ldx, w, ni, eps,
                             y, ldy, yb, f16, KvTail{}),
                "rmsnorm_1pass_kernel<1> launch");
  else
    cuda::check(cuda::launch(rmsnorm_kernel, dim3(rows), dim3(256), 0, stream, x, ldx, w, n, eps, y, ldy, yb, f16),
                "rmsnorm_kernel launch");
}

namespace {
bool g_heads_norm_rope_generic = false;
}  // namespace
void set_heads_norm_rope_generic(bool on) { g_heads_norm_rope_generic = on; }

void heads_norm_rope(float* x, int T, int heads, int dim, const int64_t* pos, const float* inv_freq, int n_freq,
                     bool norm, float eps, bool inverse, cudaStream_t stream, uint16_t* xb, bool f16) {
  if (T <= 0) return;
  const int r0 = dim - 2 * n_freq;
  if (!g_heads_norm_rope_generic && dim % 4 == 0 && dim <= 4 * kHeadThreads && n_freq >= 0 && r0 >= 0 && r0 % 4 == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(xb) % 8 == 0) {
    cuda::check(cuda::launch(heads_norm_rope4_kernel, dim3(T * heads), dim3(kHeadThreads), 0, stream, x, heads, dim,
                             pos, inv_freq, n_freq, norm, eps, inverse, xb, f16),
                "heads_norm_rope4_kernel launch");
    return;
  }
  cuda::check(cuda::launch(heads_norm_rope_kernel, dim3(T * heads), dim3(128), 0, stream, x, heads, dim, pos,
                           inv_freq, n_freq, norm, eps, inverse, xb, f16),
              "heads_norm_rope_kernel launch");
}

void rope_table(const int64_t* pos, int T, const float* inv_freq, int n_freq, float2* out, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(T) * n_freq;
  if (n <= 0) return;
  cuda::check(cuda::launch(rope_table_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, pos,
                           T, inv_freq, n_freq, out),
              "rope_table_kernel launch");
}

void kv_encode(const float* x, int T, int dim, int fmt, int rope_dim, int scale_block, uint8_t* pool,
               int64_t row_bytes, const int64_t* row_index, cudaStream_t stream) {
  if (T <= 0) return;
  cuda::check(cuda::launch(kv_encode_kernel, dim3(T), dim3(256), 0, stream, x, dim, fmt, rope_dim, scale_block, pool, row_bytes, row_index), "kv_encode_kernel launch");
}

void rmsnorm_rope_encode(const float* x, int64_t ldx, const float* w, int T, int dim, float eps, float* y,
                         const int64_t* pos, const float* inv_freq, int n_freq, int fmt, int rope_dim,
                         int scale_block, uint8_t* pool, int64_t row_bytes, const int64_t* row_index,
                         cudaStream_t stream) {
  if (T <= 0) return;
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dim > kNormMax || dim % 4 || ldx % 4 || !a16(x) || !a16(y) || (w && !a16(w))) {  // the three launches
    rmsnorm_rows(x, ldx, w, T, dim, eps, y, dim, stream);
    heads_norm_rope(y, T, 1, dim, pos, inv_freq, n_freq, false, eps, false, stream);
    kv_encode(y, T, dim, fmt, rope_dim, scale_block, pool, row_bytes, row_index, stream);
    return;
  }
  const KvTail tail{pos, inv_freq, n_freq, fmt, rope_dim, scale_block, pool, row_bytes, row_index};
  cuda::check(cuda::launch(rmsnorm_1pass_kernel<4>, dim3(T), dim3(kNormThreads), 0, stream, x, ldx, w, dim, eps, y,
                           static_cast<int64_t>(dim), static_cast<uint16_t*>(nullptr), false, tail),
              "rmsnorm_1pass_kernel<4> (kv tail) launch");
}

}  // namespace dsv4::glue
