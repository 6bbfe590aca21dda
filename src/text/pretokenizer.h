// The DeepSeek-V4 pre-tokenizer: three "Isolated" Split regexes applied in
// sequence (each to the pieces the previous one produced), then ByteLevel
// without regex (done by the BPE step). The regexes are matched by hand with
// Oniguruma's backtracking semantics; tokenizer.cc checks at load time that
// tokenizer.json holds exactly these patterns.
#pragma once

#include <string_view>
#include <vector>

namespace dsv4::text {

// The three patterns, as they appear (JSON-decoded) in tokenizer.json.
extern const std::string_view kDigitsPattern;  // \p{N}{1,3}
extern const std::string_view kCjkPattern;     // [一-龥ぁ-ゟ゠-ヿ]+
extern const std::string_view kMainPattern;    // the GPT-style word/punct/space rule

// Appends the pre-token pieces of `text` (well-formed UTF-8 without added
// tokens) to `out`, in order. The pieces concatenate back to `text`.
void pretokenize(std::string_view text, std::vector<std::string_view>& out);

}  // namespace dsv4::text
