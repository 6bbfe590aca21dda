// RMSNorm and DeepSeek-V4's interleaved partial RoPE (with the YaRN frequency ramp on compressed layers).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsv4::cpu {

// y = w ⊙ x · rsqrt(mean(x²) + eps), fp32; w may be null (unweighted norm). x and y may alias.
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* y);

// Inverse frequencies, one per rotated pair (rope_head_dim / 2 of them), as float32 like the references.
// Window-only layers: theta = rope_theta, no YaRN. Compressed layers (and their compressors and indexer):
// theta = compress_rope_theta with DeepSeek's YaRN ramp (no attention scaling).
std::vector<float> rope_inv_freq(const ModelConfig& c, bool compressed_layer);
std::vector<float> rope_inv_freq(double theta, int rope_dim, const YarnConfig& yarn);

// Rotates the last 2*inv_freq.size() values of x[0..n) at position `pos`: pairs (2i, 2i+1) are complex
// numbers multiplied by e^{±i·pos·f_i} (inverse = conjugate, used on the attention output). The angle is
// the float32 product pos·f_i, as torch computes it.
void rope(float* x, int64_t n, const std::vector<float>& inv_freq, int64_t pos, bool inverse = false);

}  // namespace dsv4::cpu
