#include "core/dtype.h"

namespace dsv4 {

namespace {
struct Entry { DType d; const char* name; size_t size; };
constexpr Entry kTable[] = {
    {DType::kBF16, "BF16", 2},   {DType::kF16, "F16", 2},        {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},     {DType::kI8, "I8", 1},          {DType::kU8, "U8", 1},
    {DType::kI16, "I16", 2},     {DType::kI32, "I32", 4},        {DType::kI64, "I64", 8},
    {DType::kBool, "BOOL", 1},   {DType::kF8_E4M3, "F8_E4M3", 1}, {DType::kF8_E8M0, "F8_E8M0", 1},
};
}  // namespace

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& e : kTable)
    if (s == e.name) return e.d;
  return std::nullopt;
}

const char* dtype_name(DType d) {
  for (const auto& e : kTable)
    if (e.d == d) return e.name;
  return "?";
}

size_t dtype_size(DType d) {
  for (const auto& e : kTable)
    if (e.d == d) return e.size;
  return 0;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace dsv4
