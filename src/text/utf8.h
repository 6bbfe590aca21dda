// UTF-8 helpers shared by the tokenizer and the streaming decoder.
//
// Invalid input is handled like Rust's String::from_utf8_lossy and Python's
// bytes.decode("utf-8", "replace"): each maximal ill-formed subpart becomes one
// U+FFFD (the Unicode "substitution of maximal subparts" practice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::text::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Result of decoding at one position. `len` bytes were consumed (always >= 1
// when bytes remain). `valid` is false when those bytes form an ill-formed
// subpart (the caller substitutes U+FFFD). `incomplete` is true when the bytes
// are a valid prefix of a sequence cut off by the end of the input.
struct Decoded {
  char32_t cp = 0;
  std::size_t len = 0;
  bool valid = false;
  bool incomplete = false;
};

Decoded decode(std::string_view s, std::size_t pos);

// Appends the UTF-8 encoding of cp to out.
void append(std::string& out, char32_t cp);

// True when s is well-formed UTF-8.
bool is_valid(std::string_view s);

// s with every maximal ill-formed subpart replaced by U+FFFD.
std::string sanitize(std::string_view s);

// Length of the longest prefix of s whose lossy decoding can no longer change
// when more bytes are appended: everything except a trailing incomplete (but so
// far valid) sequence.
std::size_t stable_prefix(std::string_view s);

}  // namespace dsv4::text::utf8
