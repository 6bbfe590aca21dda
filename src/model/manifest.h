// The tensors a checkpoint must hold for a given config, in the official DeepSeek-V4 naming (spec section 3):
// no `model.` prefix; `embed`, `head`, `norm`, `hc_head_*`, `layers.N.attn.*`, `layers.N.ffn.*`, `mtp.K.*`.
// Shapes and dtypes follow from the config alone; the loader checks every header against this list
// before any compute.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace dsv4 {

struct ExpectedTensor {
  std::string name;
  std::vector<DType> dtypes;  // any of these is accepted
  Shape shape;
};

// Name prefix of layer `i`: "layers.i." for main layers, "mtp.k." for MTP layer k = i - num_hidden_layers.
std::string layer_prefix(const ModelConfig& c, int layer);

// Appends the tensors of one linear weight `<base>.weight` (+ `<base>.scale`) stored in format `fmt`.
void expect_linear(std::vector<ExpectedTensor>& out, const std::string& base, WeightFormat fmt, int64_t rows,
                   int64_t cols, int block);

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);

}  // namespace dsv4
