// Dense linear layers on the CPU: y = x · Wᵀ with W dequantized exactly from its shipped format
// (BF16, FP8 e4m3 with 128x128 UE8M0 tiles, MXFP4 e2m1 with per-32 UE8M0 scales). Activations and
// accumulation are fp32; this is the reference every GPU GEMM is tested against.
#pragma once
#include <cstdint>

#include "model/weights.h"

namespace dsv4::cpu {

// Dequantizes row `row` of `w` (w.cols floats) into `out`.
void dequant_row(const LinearWeight& w, int64_t row, float* out);

// y[t, r] = sum_k x[t, k] * W[row_begin + r, k] for t < T, r < rows.  x: [T, w.cols] with row stride
// x_stride; y: row stride y_stride. Multithreaded over weight rows.
void linear_rows(const LinearWeight& w, int64_t row_begin, int64_t rows, const float* x, int64_t T,
                 int64_t x_stride, float* y, int64_t y_stride);

// y[T, w.rows] = x[T, w.cols] · Wᵀ.
inline void linear(const LinearWeight& w, const float* x, int64_t T, float* y) {
  linear_rows(w, 0, w.rows, x, T, w.cols, y, w.rows);
}

float dot(const float* a, const float* b, int64_t n);

// Test instrumentation (the GPU engine test's act_quant bound, as engine/kv_state.h's set_kv_encode_nudge): while
// set to a nonzero rel, linear_rows multiplies a kE4m3 linear's activations by (1 + rel) before act_quant, so
// that values within ~rel of an e4m3 rounding boundary take the other code, as another implementation's slightly
// different fp32 values do. 0 (the default): no effect.
void set_act_quant_nudge(float rel);

}  // namespace dsv4::cpu
