// DeepSeek-V4 tokenizer: loads a Hugging Face tokenizer.json (byte-level BPE,
// the V4 Split pre-tokenizer, added/special tokens) and encodes/decodes exactly
// as HF `tokenizers` does.
//
// Input text that is not well-formed UTF-8 is first made so the way HF callers
// must (Python's bytes.decode("utf-8", "replace"), Rust's from_utf8_lossy):
// each maximal ill-formed subpart becomes U+FFFD. decode() returns the lossy
// UTF-8 of the token bytes, as HF does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/error.h"

namespace dsv4::text {

// Ids the engine relies on (spec 5.1); checked when a tokenizer is loaded.
inline constexpr std::int32_t kBosId = 0;
inline constexpr std::int32_t kEosId = 1;
inline constexpr std::int32_t kUserId = 128803;
inline constexpr std::int32_t kAssistantId = 128804;
inline constexpr std::int32_t kThinkId = 128821;
inline constexpr std::int32_t kThinkEndId = 128822;
inline constexpr std::int32_t kDsmlId = 128825;

class Tokenizer {
 public:
  // Loads and validates a tokenizer.json. Throws TextError naming the file and
  // the field when it cannot be read, uses a feature this tokenizer does not
  // implement, or lacks one of the special ids above.
  static Tokenizer load(const std::string& path);

  // Token ids for text; added and special tokens in the text are recognised.
  // No BOS is added (the V4 post-processor adds none).
  std::vector<std::int32_t> encode(std::string_view text) const;
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;

  // Text for ids (unknown ids are skipped, as HF does).
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // Appends the raw bytes of one token (before UTF-8 repair); false if unknown.
  bool token_bytes(std::int32_t id, std::string& out, bool skip_special = false) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // The token's string as stored (byte-level characters for BPE tokens); empty if unknown.
  std::string_view id_to_token(std::int32_t id) const;
  bool is_special(std::int32_t id) const;
  // One past the largest id.
  std::size_t vocab_size() const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Path of the vendored tokenizer (assets/tokenizer/tokenizer.json in the source
// tree), or the value of the DSV4_TOKENIZER environment variable when set.
std::string default_tokenizer_path();

}  // namespace dsv4::text
