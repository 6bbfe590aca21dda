// DeepSeek-V4 chat encoding: OpenAI-style messages -> the exact prompt string
// DeepSeek's encoding_dsv4.py (`encode_messages`) produces (spec 5.2).
//
// Messages are nlohmann::ordered_json so that tool schemas keep their key order
// (they are written into the prompt with Python's json.dumps formatting).
// Supported roles: system, developer, user, assistant (content,
// reasoning_content, tool_calls, wo_eos), tool (tool_call_id, content),
// latest_reminder; per-message "tools" and "response_format" on system or
// developer messages, and "task" (quick-instruction tokens), as in the script.
//
// Where encoding_dsv4.py would crash, we throw TextError naming the message
// index. Deliberate extensions (the script has no behaviour for them):
// OpenAI content-part arrays [{"type":"text","text":...}] on system, user,
// developer and assistant messages are joined into one string, a null content
// counts as "", and tool-call "arguments" given as a JSON object (instead of a
// JSON string) are used as the parsed arguments.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "text/error.h"

namespace dsv4::text {

enum class ThinkingMode { kChat, kThinking };
// kHigh adds nothing to the prompt (as in the script); kMax prepends the
// "Reasoning Effort: Absolute maximum..." paragraph in thinking mode.
enum class ReasoningEffort { kNone, kHigh, kMax };

struct ChatOptions {
  ThinkingMode mode = ThinkingMode::kChat;
  ReasoningEffort effort = ReasoningEffort::kNone;
  bool drop_thinking = true;  // drop earlier turns' reasoning (kept anyway when tools are present)
  bool add_bos = true;        // BOS when there is no context
};

// encode_messages(messages, thinking_mode, context, drop_thinking,
// add_default_bos_token, reasoning_effort). `context`: messages already in the
// KV cache (an array, possibly empty); only `messages` are rendered.
std::string encode_chat(const nlohmann::ordered_json& messages, const ChatOptions& options,
                        const nlohmann::ordered_json& context = nlohmann::ordered_json::array());

// OpenAI request-level tools/response_format -> the script's per-message form:
// attached to the first message when it is a system message, else to a new
// empty system message inserted first. Either may be null/empty.
nlohmann::ordered_json attach_tools(nlohmann::ordered_json messages, const nlohmann::ordered_json& tools,
                                    const nlohmann::ordered_json& response_format = nullptr);

// Parses "chat" / "thinking" and "high" / "max" / "" as the script spells them.
ThinkingMode parse_thinking_mode(const std::string& s);
ReasoningEffort parse_reasoning_effort(const std::string& s);

}  // namespace dsv4::text
