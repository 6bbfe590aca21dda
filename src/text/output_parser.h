// Streaming parser for DeepSeek-V4 output text (spec 5.3): reasoning until
// </think>, then content, with DSML tool-call blocks turned into OpenAI-style
// tool calls. Feed decoded text as it is generated (any chunking, even
// mid-character); each call returns the new deltas. The final message does not
// depend on how the text was chunked.
//
// Rules:
//  * Thinking mode: the text starts inside the reasoning (the prompt ended
//    with <think>; a repeated <think> at the very start is dropped). </think>
//    ends it. A DSML block that opens inside the reasoning also ends it (the
//    model skipped </think>; flag tool_calls_in_reasoning).
//  * A "<｜DSML｜" in reasoning or content starts a tool-call block (with the
//    "\n\n" before it, when present, as part of the delimiter). A complete,
//    well-formed block yields tool calls; anything else (malformed, truncated,
//    a stray DSML fragment) is given back verbatim as text of the channel it
//    appeared in, with flag malformed_tool_calls. No text is ever lost.
//  * <｜end▁of▁sentence｜> ends the message; <think> / </think> in content
//    are control tags, never shown (flag stray_think_tag).
//  * Text is never emitted while it could still be the start of a tag, nor
//    while it ends inside a UTF-8 character.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/dsml_block.h"

namespace dsv4::text {

struct ToolCall {
  int index = 0;          // position in the message's tool_calls
  std::string id;         // id_prefix + index
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParserFlags {
  bool malformed_tool_calls = false;     // DSML text that did not parse is in reasoning/content
  bool tool_calls_in_reasoning = false;  // a tool block opened before </think>
  bool unterminated_reasoning = false;   // thinking mode ended without </think>
  bool stray_think_tag = false;          // <think>/</think> in content, dropped
  bool coerced_arguments = false;        // a string="false" value was not JSON; sent as a string
  bool text_after_tool_calls = false;    // content followed a tool block (the format wants EOS)
  bool text_after_eos = false;           // text followed <｜end▁of▁sentence｜> (kept as content)
  bool operator==(const ParserFlags&) const = default;
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  ParserFlags flags;
  std::size_t markup_bytes = 0;  // input bytes consumed as tags and tool blocks
};

struct ParserDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls, emitted when their block closes
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

struct ParserOptions {
  bool thinking = false;           // the prompt ended with <think>
  std::string id_prefix = "call_";
};

class OutputParser {
 public:
  explicit OutputParser(ParserOptions options = {});

  ParserDelta feed(std::string_view text);
  // End of generation: everything held back is resolved and emitted.
  ParserDelta finish();

  const ParsedMessage& message() const { return msg_; }
  bool done() const { return state_ == State::kDone; }

  // The message as encoding_dsv4.py's assistant dict + our flags, as JSON:
  // {"role":"assistant","content":...,"reasoning_content":...,"tool_calls":[...]}
  std::string to_json() const;

 private:
  enum class State { kReasoning, kContent, kBlock, kDone };
  void run(bool final, ParserDelta& d);
  void emit(State channel, std::string_view text, ParserDelta& d);

  ParserOptions opt_;
  State state_;
  State block_from_ = State::kContent;  // the channel a block attempt started in
  std::size_t block_prefix_ = 0;         // length of the "\n\n" before "<｜DSML｜"
  bool at_start_ = true;                 // nothing consumed yet (for a leading <think>)
  bool after_block_ = false;
  std::string pending_;
  DsmlBlockParser block_;
  ParsedMessage msg_;
};

}  // namespace dsv4::text
