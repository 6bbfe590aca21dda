// Storage dtypes as spelled in safetensors headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

enum class DType { kBF16, kF16, kF32, kF64, kI8, kU8, kI16, kI32, kI64, kBool, kF8_E4M3, kF8_E8M0 };

std::optional<DType> parse_dtype(std::string_view s);
const char* dtype_name(DType d);
size_t dtype_size(DType d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

}  // namespace dsv4
