#include "text/added_tokens.h"

namespace dsv4::text {

std::int32_t AddedTokenMatcher::child(std::int32_t node, unsigned char b) const {
  for (const auto& [c, n] : nodes_[node].next)
    if (c == b) return n;
  return -1;
}

void AddedTokenMatcher::add(std::string_view content, std::int32_t id) {
  if (content.empty()) return;
  first_byte_[static_cast<unsigned char>(content[0])] = true;
  std::int32_t node = 0;
  for (const char ch : content) {
    const auto b = static_cast<unsigned char>(ch);
    std::int32_t nx = child(node, b);
    if (nx < 0) {
      nx = static_cast<std::int32_t>(nodes_.size());
      nodes_[node].next.emplace_back(b, nx);
      nodes_.emplace_back();
    }
    node = nx;
  }
  if (nodes_[node].id < 0) nodes_[node].id = id;  // first one wins, like HF
}

AddedTokenMatcher::Match AddedTokenMatcher::find(std::string_view text, std::size_t from) const {
  for (std::size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    Match best;
    std::int32_t node = 0;
    for (std::size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[node].id >= 0) best = {i, j + 1 - i, nodes_[node].id};
    }
    if (best.id >= 0) return best;
  }
  return {};
}

}  // namespace dsv4::text
