#include "text/pretokenizer.h"

#include <cstdint>

#include "text/unicode_classes.h"
#include "text/utf8.h"

namespace dsv4::text {

const std::string_view kDigitsPattern = "\\p{N}{1,3}";
const std::string_view kCjkPattern =
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
const std::string_view kMainPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

namespace {

// Per code point flags: the CharClass bits plus the literal sets the patterns use.
constexpr std::uint16_t kCjk = 1 << 8;         // [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]
constexpr std::uint16_t kCrLf = 1 << 9;        // [\r\n]
constexpr std::uint16_t kAsciiAlpha = 1 << 10; // [A-Za-z]
constexpr std::uint16_t kAsciiPunct = 1 << 11; // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
constexpr std::uint16_t kSpace = 1 << 12;      // ' '

std::uint16_t flags_of(char32_t c) {
  std::uint16_t f = char_class(c);
  if ((c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF)) f |= kCjk;
  if (c == '\r' || c == '\n') f |= kCrLf;
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) f |= kAsciiAlpha;
  if ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
      (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E))
    f |= kAsciiPunct;
  if (c == ' ') f |= kSpace;
  return f;
}

struct Ctx {
  std::vector<std::uint16_t> fl;  // flags per code point
  std::vector<std::size_t> off;   // byte offset per code point (+ end)
};

// Length of the run of code points in [i, end) that have any of `mask`.
inline std::size_t run(const Ctx& c, std::size_t i, std::size_t end, std::uint16_t mask) {
  std::size_t j = i;
  while (j < end && (c.fl[j] & mask)) ++j;
  return j - i;
}

// Length of the main pattern's match at i within the piece [i, end), 0 if none.
// Alternatives are tried in order, each with its backtracking outcome worked out.
std::size_t match_main(const Ctx& c, std::size_t i, std::size_t end) {
  const std::uint16_t f = c.fl[i];
  // 1. [punct][A-Za-z]+
  if ((f & kAsciiPunct) && i + 1 < end && (c.fl[i + 1] & kAsciiAlpha))
    return 1 + run(c, i + 1, end, kAsciiAlpha);
  // 2. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
  if (!(f & (kCrLf | kClassL | kClassP | kClassS))) {
    if (i + 1 < end) {
      const std::size_t r = run(c, i + 1, end, kClassL | kClassM);
      if (r > 0) return 1 + r;
    }
  }
  if (f & (kClassL | kClassM)) return run(c, i, end, kClassL | kClassM);
  // 3. ' '?[\p{P}\p{S}]+[\r\n]*
  {
    std::size_t j = i;
    if ((f & kSpace) && i + 1 < end && (c.fl[i + 1] & (kClassP | kClassS))) j = i + 1;
    const std::size_t r = run(c, j, end, kClassP | kClassS);
    if (r > 0) {
      const std::size_t k = j + r;
      return k + run(c, k, end, kCrLf) - i;
    }
  }
  if (!(f & kClassWS)) return 0;
  const std::size_t ws = run(c, i, end, kClassWS);
  // 4. \s*[\r\n]+  -> up to and including the last CR/LF of the whitespace run
  for (std::size_t k = ws; k > 0; --k)
    if (c.fl[i + k - 1] & kCrLf) return k;
  // 5. \s+(?!\S)  -> the whole run at the end of the piece, else all but its last
  if (i + ws == end) return ws;
  if (ws >= 2) return ws - 1;
  // 6. \s+
  return ws;
}

// Emits the Isolated split of [b, e) by a matcher: matches and the gaps between.
template <typename Match, typename Emit>
void split_isolated(const Ctx& c, std::size_t b, std::size_t e, Match match, Emit emit) {
  std::size_t gap = b, i = b;
  while (i < e) {
    const std::size_t len = match(c, i, e);
    if (len == 0) { ++i; continue; }
    if (gap < i) emit(gap, i);
    emit(i, i + len);
    i += len;
    gap = i;
  }
  if (gap < e) emit(gap, e);
}

std::size_t match_digits(const Ctx& c, std::size_t i, std::size_t end) {
  std::size_t n = 0;
  while (n < 3 && i + n < end && (c.fl[i + n] & kClassN)) ++n;
  return n;
}

std::size_t match_cjk(const Ctx& c, std::size_t i, std::size_t end) {
  return run(c, i, end, kCjk);
}

}  // namespace

void pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  thread_local Ctx c;
  c.fl.clear();
  c.off.clear();
  for (std::size_t p = 0; p < text.size();) {
    const auto b = static_cast<unsigned char>(text[p]);
    char32_t cp;
    std::size_t len;
    if (b < 0x80) {
      cp = b; len = 1;
    } else {
      const utf8::Decoded d = utf8::decode(text, p);
      cp = d.valid ? d.cp : utf8::kReplacement;  // caller passes valid UTF-8
      len = d.len;
    }
    c.off.push_back(p);
    c.fl.push_back(flags_of(cp));
    p += len;
  }
  c.off.push_back(text.size());
  const std::size_t n = c.fl.size();
  auto emit_final = [&](std::size_t a, std::size_t b) {
    out.push_back(text.substr(c.off[a], c.off[b] - c.off[a]));
  };
  auto stage3 = [&](std::size_t a, std::size_t b) {
    split_isolated(c, a, b, match_main, emit_final);
  };
  auto stage2 = [&](std::size_t a, std::size_t b) {
    split_isolated(c, a, b, match_cjk, stage3);
  };
  split_isolated(c, 0, n, match_digits, stage2);
}

}  // namespace dsv4::text
