// Incremental detokenizer: turns a stream of token ids into text pieces that
// are always complete UTF-8. The concatenation of all pieces (push... finish)
// equals Tokenizer::decode of the whole id sequence.
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace dsv4::text {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(tokenizer), skip_special_(skip_special) {}

  // Adds one id; returns the text that became final (possibly empty, when the
  // token ends inside a multi-byte character).
  std::string push(std::int32_t id);

  // Ends the stream: bytes of an unfinished character come out as U+FFFD.
  std::string finish();

  // Bytes held back waiting for the rest of a character.
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4::text
