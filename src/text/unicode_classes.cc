#include "text/unicode_classes.h"

#include <vector>

namespace dsv4::text {
namespace {

struct CodeRange {
  char32_t first, last;
};

#include "text/unicode_classes.inc"

std::vector<std::uint8_t> build_table() {
  std::vector<std::uint8_t> t(0x110000, 0);
  auto mark = [&t](const auto& ranges, std::uint16_t bit) {
    for (const CodeRange& r : ranges)
      for (char32_t c = r.first; c <= r.last; ++c) t[c] |= static_cast<std::uint8_t>(bit);
  };
  mark(kLRanges, kClassL);
  mark(kNRanges, kClassN);
  mark(kMRanges, kClassM);
  mark(kPRanges, kClassP);
  mark(kSRanges, kClassS);
  mark(kWSRanges, kClassWS);
  return t;
}

}  // namespace

std::uint8_t char_class(char32_t cp) {
  static const std::vector<std::uint8_t> table = build_table();
  return cp < 0x110000 ? table[cp] : 0;
}

}  // namespace dsv4::text
