#include "text/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dsv4::text {
namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);  // ensure_ascii=False: everything else verbatim
        }
    }
  }
  out.push_back('"');
}

// Python's float repr: shortest round-trip digits; exponent form when the
// decimal exponent is < -4 or >= 16, else fixed notation with at least ".0".
void dump_float(double v, std::string& out) {
  if (std::isnan(v)) { out += "NaN"; return; }
  if (std::isinf(v)) { out += v > 0 ? "Infinity" : "-Infinity"; return; }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  std::string sign;
  if (sci[0] == '-') { sign = "-"; sci.erase(0, 1); }
  const auto e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (std::size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  out += sign;
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exp - 1), '0');
    out += digits;
  } else {
    const auto ip = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= ip) {
      out += digits;
      out.append(ip - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, ip);
      out += '.';
      out += digits.substr(ip);
    }
  }
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: out += "null"; break;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: out += std::to_string(v.get<std::int64_t>()); break;
    case T::number_unsigned: out += std::to_string(v.get<std::uint64_t>()); break;
    case T::number_float: dump_float(v.get<double>(), out); break;
    case T::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case T::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out.push_back(']');
      break;
    }
    case T::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    default: out += "null"; break;  // binary/discarded: not produced by the parser
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace dsv4::text
