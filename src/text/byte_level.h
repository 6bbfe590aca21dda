// GPT-2 style byte <-> printable-character mapping used by ByteLevel BPE.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv4::text::byte_level {

// UTF-8 of the character that stands for byte b in the vocabulary.
const std::string& byte_to_token_char(std::uint8_t b);

// The byte a vocabulary character stands for, if it is one of the 256.
std::optional<std::uint8_t> char_to_byte(char32_t c);

// Maps a token's text back to bytes the way HF's ByteLevel decoder does: if
// every character is a byte character, the bytes they stand for; otherwise the
// token's own UTF-8 (added tokens such as "<｜User｜>").
void token_to_bytes(std::string_view token, std::string& out);

}  // namespace dsv4::text::byte_level
