// Prefill-shaped GEMMs: dequantize the FP8 / MXFP4 weight to bf16 (exact, see frag.cuh) and run cuBLAS's
// bf16 GEMM with fp32 accumulation. The dequantization reads 1 (FP8) or 0.53 (MXFP4) and writes 2 bytes per
// weight; at prefill sizes that is a few percent of the GEMM (docs/GEMM_MOE.md measures both).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/linear/device_check.h"
#include "backend/cuda/linear/frag.cuh"
#include "backend/cuda/linear/linear_cuda.h"
#include "core/error.h"

namespace dsv4::cudalin {
namespace {

// Each thread: 16 consecutive weights of one row (cols % 128 == 0 keeps them in one scale block).
__global__ void dequant_fp8_kernel(const uint8_t* w, const uint8_t* s, bool sf32, int64_t rows, int64_t cols,
                                   uint16_t* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t n16 = rows * cols / 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = (i * 16) / cols, k = (i * 16) % cols;
    const int64_t si = (r / 128) * (cols / 128) + k / 128;
    const float sc = sf32 ? reinterpret_cast<const float*>(s)[si] : dev::e8m0_f32(s[si]);
    const uint4 v = *reinterpret_cast<const uint4*>(w + i * 16);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // e4m3_02/_13 give bytes (0,2) and (1,3); unpack to natural order, scale in fp32 (exact), round to bf16.
      const uint32_t p02 = dev::e4m3_02(wd[q]), p13 = dev::e4m3_13(wd[q]);
      const uint32_t pr[2] = {dev::prmt(p02, p13, 0x5410), dev::prmt(p02, p13, 0x7632)};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float lo = __uint_as_float(pr[h] << 16) * sc, hi = __uint_as_float(pr[h] & 0xFFFF0000u) * sc;
        const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
        o[2 * q + h] = *reinterpret_cast<const uint32_t*>(&b);
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(out + i * 16);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__global__ void dequant_fp4_kernel(const uint8_t* w, const uint8_t* s, int64_t rows, int64_t cols, uint16_t* out) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int64_t n16 = rows * cols / 16;  // 16 weights = 8 bytes
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = (i * 16) / cols, k = (i * 16) % cols;
    const float sc = dev::e8m0_f32(s[r * (cols / 32) + k / 32]);
    const uint2 v = *reinterpret_cast<const uint2*>(w + i * 8);
    const uint32_t wd[2] = {v.x, v.y};
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (wd[q] >> (8 * b)) & 0xFFu;
        const float lo = __uint_as_float(dev::e2m1_pair<0>(byte) << 16) * 0x1p126f * sc;         // nibble 0
        const float hi = __uint_as_float(dev::e2m1_pair<1>(byte) << 16) * 0x1p126f * sc;         // nibble 1
        const __nv_bfloat162 bb = __floats2bfloat162_rn(lo, hi);
        o[4 * q + b] = *reinterpret_cast<const uint32_t*>(&bb);
      }
    uint4* dst = reinterpret_cast<uint4*>(out + i * 16);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// y[i] = float(bf16 x[i]): exact (a bf16 is the top half of an fp32).
__global__ void widen_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

// One handle per thread with a workspace of its own (32 MiB, NVIDIA's recommendation for Hopper), set again
// after every cublasSetStream (which resets it to cuBLAS's pool): a GEMM inside a captured CUDA graph (the
// engine's LM head at batch >= 16) then never allocates during capture. Callers issue on one stream at a time.
constexpr size_t kCublasWorkspace = size_t(32) << 20;
struct Cublas {
  cublasHandle_t h = nullptr;
  void* ws = nullptr;
};
Cublas& cublas() {
  static thread_local Cublas c = [] {
    Cublas x;
    if (cublasCreate(&x.h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    check_cuda(cudaMalloc(&x.ws, kCublasWorkspace), "cuBLAS workspace");
    return x;
  }();
  return c;
}
cublasHandle_t handle(cudaStream_t stream) {
  Cublas& c = cublas();
  if (cublasSetStream(c.h, stream) != CUBLAS_STATUS_SUCCESS) throw Error("cublasSetStream failed");
  if (cublasSetWorkspace(c.h, c.ws, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS) throw Error("cublasSetWorkspace failed");
  return c.h;
}

// Row-major y[M, rows] = x[M, cols] · W[rows, cols]ᵀ (x and W of type `type`, fp32 y) is, column-major,
// Y(rows x M) = op(A) B with op(A) = Aᵀ, A = W stored col-major cols x rows, and B = x (cols x M, leading
// dimension ldx); Y has leading dimension ldy.
void gemm_rows(const char* name, const void* x, cudaDataType type, int64_t ldx, int64_t M, const void* w, int64_t rows,
               int64_t cols, float* y, int64_t ldy, cublasComputeType_t compute, cudaStream_t stream) {
  if (M <= 0) return;
  const float alpha = 1.f, beta = 0.f;
  cublasHandle_t h = handle(stream);
  const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(M),
                                         static_cast<int>(cols), &alpha, w, type, static_cast<int>(cols), x, type,
                                         static_cast<int>(ldx), &beta, y, CUDA_R_32F, static_cast<int>(ldy), compute,
                                         CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(str_cat("cuda ", name, ": cublasGemmEx failed (", static_cast<int>(st), ") for ", M, " x [", rows, ", ",
                        cols, "]"));
}

}  // namespace

void dequant_to_bf16(const DevWeight& w, uint16_t* out, cudaStream_t stream) {
  require_supported_device();
  if (w.rows <= 0 || w.cols <= 0 || w.cols % 128 != 0)
    throw Error(str_cat("cuda dequant_to_bf16: weight shape [", w.rows, ", ", w.cols, "] unsupported (cols multiple of 128)"));
  const int64_t n16 = w.rows * w.cols / 16;
  const int blocks = static_cast<int>(std::min<int64_t>((n16 + 255) / 256, 65536));
  if (w.fmt == WeightFormat::kFP8Block) check_cuda(cuda::launch(dequant_fp8_kernel, dim3(blocks), dim3(256), 0, stream, w.w, w.scale, w.scale_is_f32, w.rows, w.cols, out), "dequant_fp8_kernel launch");
  else if (w.fmt == WeightFormat::kFP4) check_cuda(cuda::launch(dequant_fp4_kernel, dim3(blocks), dim3(256), 0, stream, w.w, w.scale, w.rows, w.cols, out), "dequant_fp4_kernel launch");
  else throw Error(str_cat("cuda dequant_to_bf16: weight [", w.rows, ", ", w.cols, "] is already BF16"));
}

void gemm_bf16(const uint16_t* x, int64_t M, const uint16_t* wbf16, int64_t rows, int64_t cols, float* y,
               cudaStream_t stream) {
  gemm_bf16(x, cols, M, wbf16, rows, cols, y, rows, stream);
}

void gemm_bf16(const uint16_t* x, int64_t ldx, int64_t M, const uint16_t* wbf16, int64_t rows, int64_t cols, float* y,
               int64_t ldy, cudaStream_t stream) {
  if (ldx < cols || ldy < rows)
    throw Error(str_cat("cuda gemm_bf16: row strides ", ldx, " / ", ldy, " below the shape [", rows, ", ", cols, "]"));
  gemm_rows("gemm_bf16", x, CUDA_R_16BF, ldx, M, wbf16, rows, cols, y, ldy, CUBLAS_COMPUTE_32F, stream);
}

void widen_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  check_cuda(cuda::launch(widen_bf16_kernel, dim3(blocks), dim3(256), 0, stream, x, y, n), "widen_bf16_kernel launch");
}

void gemm_f32(const float* x, int64_t M, const float* w, int64_t rows, int64_t cols, float* y, cudaStream_t stream) {
  // fp32 throughout: CUBLAS_COMPUTE_32F_PEDANTIC keeps cuBLAS off TF32 and any other reduced precision whatever
  // the handle's math mode or NVIDIA_TF32_OVERRIDE.
  gemm_rows("gemm_f32", x, CUDA_R_32F, cols, M, w, rows, cols, y, rows, CUBLAS_COMPUTE_32F_PEDANTIC, stream);
}

}  // namespace dsv4::cudalin
