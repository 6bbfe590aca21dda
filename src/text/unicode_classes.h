// Character classes used by the DeepSeek-V4 pre-tokenizer regexes, exactly as
// HF tokenizers' Oniguruma engine sees them (tables generated from it by
// tools/text/gen_unicode_classes.py, so the Unicode version matches too).
#pragma once

#include <cstdint>

namespace dsv4::text {

// Class bits.
inline constexpr std::uint16_t kClassL = 1 << 0;   // \p{L}
inline constexpr std::uint16_t kClassN = 1 << 1;   // \p{N}
inline constexpr std::uint16_t kClassM = 1 << 2;   // \p{M}
inline constexpr std::uint16_t kClassP = 1 << 3;   // \p{P}
inline constexpr std::uint16_t kClassS = 1 << 4;   // \p{S}
inline constexpr std::uint16_t kClassWS = 1 << 5;  // \s

// Bit set of the classes above for a code point (0 for values above U+10FFFF).
std::uint8_t char_class(char32_t cp);

}  // namespace dsv4::text
