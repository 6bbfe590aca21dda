#include "text/byte_level.h"

#include <vector>

#include "text/utf8.h"

namespace dsv4::text::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::vector<int> to_byte = std::vector<int>(512, -1);  // all mapped chars < U+0200
  Tables() {
    // Printable bytes map to themselves; the rest to U+0100 + n in byte order.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append(to_char[b], c);
      to_byte[c] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_token_char(std::uint8_t b) { return tables().to_char[b]; }

std::optional<std::uint8_t> char_to_byte(char32_t c) {
  const auto& t = tables().to_byte;
  if (c < t.size() && t[c] >= 0) return static_cast<std::uint8_t>(t[c]);
  return std::nullopt;
}

void token_to_bytes(std::string_view token, std::string& out) {
  const std::size_t mark = out.size();
  for (std::size_t i = 0; i < token.size();) {
    const utf8::Decoded d = utf8::decode(token, i);
    const auto b = d.valid ? char_to_byte(d.cp) : std::nullopt;
    if (!b) {
      out.resize(mark);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(*b));
    i += d.len;
  }
}

}  // namespace dsv4::text::byte_level
