// DeepSeek's act_quant on the GPU (GpuOptions::act_quant): each row's activations quantized to e4m3 in blocks
// of 128 and dequantized again, the same function as core/numerics act_quant_e4m3 (bit for bit: the scale
// expression is the CPU's, the division by a power of two is exact, and __nv_cvt_float_to_fp8 rounds to nearest
// even and saturates at 448 as f32_to_fp8_e4m3 does; NaN stays NaN).
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/glue/glue_common.cuh"

namespace dsv4::glue {
using namespace detail;

namespace {
constexpr int kBlock = 128;         // act_quant's block (spec dsv4-model.md 3.3)
constexpr int kWarps = 8;           // blocks of 128 per CUDA block
constexpr int kPer = kBlock / 32;   // elements per lane

// One warp per (row, block of 128): amax floored at 1e-4 (NaN ignored, as std::max keeps the left operand),
// scale 2^ceil(log2(amax / 448)), each value rounded to e4m3 at that scale. In place is allowed (y == x,
// ldy == ldx): a lane writes only the elements it read, after the warp's amax.
__global__ void act_quant_kernel(const float* x, int64_t ldx, int64_t cols, float* y, int64_t ldy, uint16_t* yb,
                                 int64_t ldyb) {
  cuda::pdl::enter();  // PDL: every global access after this (backend/cuda/pdl.cuh)
  const int lane = threadIdx.x % 32;
  const int64_t b0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kBlock;
  if (b0 >= cols) return;
  const int64_t row = blockIdx.y;
  const float* xr = x + row * ldx;
  float v[kPer];
  float amax = 1e-4f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t k = b0 + j * 32 + lane;
    v[j] = k < cols ? xr[k] : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float sc = ldexpf(1.0f, static_cast<int>(ceilf(log2f(amax / 448.0f))));  // as e4m3_block_exponent
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t k = b0 + j * 32 + lane;
    if (k >= cols) continue;
    const float q = e4m3_to_f32(static_cast<uint8_t>(__nv_cvt_float_to_fp8(v[j] / sc, __NV_SATFINITE, __NV_E4M3))) * sc;
    if (y) y[row * ldy + k] = q;
    if (yb) yb[row * ldyb + k] = bf16_bits_rn(q);  // exact: 4 significant bits, an exponent in fp32's range
  }
}
}  // namespace

void act_quant_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* y, int64_t ldy, uint16_t* yb,
                    int64_t ldyb, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (rows > 65535) {  // gridDim.y
    for (int64_t r0 = 0; r0 < rows; r0 += 65535)
      act_quant_rows(x + r0 * ldx, ldx, std::min<int64_t>(65535, rows - r0), cols, y ? y + r0 * ldy : nullptr, ldy,
                     yb ? yb + r0 * ldyb : nullptr, ldyb, stream);
    return;
  }
  const int64_t nblocks = (cols + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>(blocks_for(nblocks, kWarps)), static_cast<unsigned>(rows));
  cuda::check(cuda::launch(act_quant_kernel, grid, dim3(kWarps * 32), 0, stream, x, ldx, cols, y, ldy, yb, ldyb),
              "act_quant_kernel launch");
}

}  // namespace dsv4::glue
