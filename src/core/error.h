// Errors are values that travel up to the CLI or the HTTP response: every load or request error is a
// dsv4::Error whose message names the file, tensor, field or parameter at fault. Nothing on a bad-input
// path aborts the process.
#pragma once
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <string_view>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline std::string to_piece(const std::string& s) { return s; }
inline std::string to_piece(const char* s) { return s; }
inline std::string to_piece(std::string_view s) { return std::string(s); }
inline std::string to_piece(char c) { return std::string(1, c); }
inline std::string to_piece(char* s) { return s; }
template <typename T>
std::string to_piece(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    std::ostringstream os;
    os << v;
    return os.str();
  } else {
    return std::to_string(v);
  }
}
}  // namespace detail

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  ((out += detail::to_piece(args)), ...);
  return out;
}

// Throws an Error built from pieces: fail("file ", path, ": tensor ", name, " has dtype ", d).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace dsv4
