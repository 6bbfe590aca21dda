// Finds added tokens in text with leftmost-longest matching (what HF's
// AddedVocabulary does with its aho-corasick tries).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

class AddedTokenMatcher {
 public:
  void add(std::string_view content, std::int32_t id);
  bool empty() const { return nodes_.size() <= 1; }

  struct Match {
    std::size_t pos = std::string_view::npos;  // npos: no match
    std::size_t len = 0;
    std::int32_t id = -1;
  };
  // The leftmost match at or after `from`, longest among those starting there.
  Match find(std::string_view text, std::size_t from) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> next;  // byte -> node
    std::int32_t id = -1;                                      // token ending here
  };
  std::int32_t child(std::int32_t node, unsigned char b) const;

  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
};

}  // namespace dsv4::text
