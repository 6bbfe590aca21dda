// Byte-level BPE model: merges applied in rank order exactly like HF
// tokenizers' `Word::merge_all` (lowest rank first, ties to the leftmost pair).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dsv4::text {

class Bpe {
 public:
  // Pairs (left, right) of token strings, in rank order. `vocab` maps token
  // strings to ids. Throws TextError (naming `file`) on inconsistent input.
  Bpe(const std::unordered_map<std::string, std::int32_t>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges,
      bool ignore_merges, const std::string& file);

  // Appends the ids for one pre-token piece given as raw bytes.
  void encode_piece(std::string_view bytes, std::vector<std::int32_t>& out) const;

 private:
  void merge(std::string_view bytes, std::vector<std::int32_t>& out) const;

  struct Merge {
    std::int32_t rank;
    std::int32_t id;
  };
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::int32_t byte_id_[256];
  std::unordered_map<std::uint64_t, Merge> merges_;
  // Whole-piece lookup used when ignore_merges is set (keys are byte strings).
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> byte_vocab_;
  bool ignore_merges_;

  // Cache of piece -> ids (like HF's, bounded; it stops growing when full).
  static constexpr std::size_t kCacheCapacity = 1 << 17;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace dsv4::text
