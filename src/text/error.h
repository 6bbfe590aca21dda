// Errors raised by the text layer (tokenizer loading, chat encoding input).
#pragma once

#include <stdexcept>
#include <string>

namespace dsv4::text {

// Every error from src/text is a TextError; its message names the file and the
// field (or the message index) that was wrong.
class TextError : public std::runtime_error {
 public:
  explicit TextError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace dsv4::text
