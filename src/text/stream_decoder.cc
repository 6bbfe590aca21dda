#include "text/stream_decoder.h"

#include "text/utf8.h"

namespace dsv4::text {

std::string StreamDecoder::push(std::int32_t id) {
  tok_.token_bytes(id, pending_, skip_special_);
  const std::size_t ready = utf8::stable_prefix(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4::text
