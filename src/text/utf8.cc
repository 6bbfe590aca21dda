#include "text/utf8.h"

namespace dsv4::text::utf8 {

Decoded decode(std::string_view s, std::size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  Decoded d;
  if (pos >= n) return d;
  const unsigned char b0 = p[pos];
  if (b0 < 0x80) return {b0, 1, true, false};
  std::size_t need;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1; cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {kReplacement, 1, false, false};  // 80..C1, F5..FF
  }
  std::size_t i = 1;
  for (; i <= need; ++i) {
    if (pos + i >= n) return {kReplacement, i, false, true};
    const unsigned char b = p[pos + i];
    const unsigned char l = (i == 1) ? lo : 0x80, h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) return {kReplacement, i, false, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true, false};
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    const Decoded d = decode(s, i);
    if (!d.valid) return false;
    i += d.len;
  }
  return true;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.valid) out.append(s.substr(i, d.len));
    else append(out, kReplacement);
    i += d.len;
  }
  return out;
}

std::size_t stable_prefix(std::string_view s) {
  // A trailing incomplete sequence is at most 3 bytes long; look for its lead.
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const std::size_t pos = n - back;
    const auto b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) break;             // ASCII: nothing pending after it
    if (b >= 0xC0) {                 // a lead byte: is it cut off?
      const Decoded d = decode(s, pos);
      return d.incomplete ? pos : n;
    }
  }
  return n;
}

}  // namespace dsv4::text::utf8
