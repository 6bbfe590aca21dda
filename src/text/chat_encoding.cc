#include "text/chat_encoding.h"

#include <algorithm>
#include <map>
#include <vector>

#include "text/python_json.h"

namespace dsv4::text {

using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
constexpr const char* kEos = "<｜end▁of▁sentence｜>";
constexpr const char* kThinkStart = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kDsml = "｜DSML｜";
constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
constexpr const char* kLatestReminder = "<｜latest_reminder｜>";

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},  {"read_url", "<｜read_url｜>"}};
  return m;
}

constexpr const char* kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

std::string tools_block(const std::string& schemas) {
  const std::string d = kDsml;
  return "## Tools\n\n"
         "You have access to a set of tools to help answer the user's question. You can invoke tools "
         "by writing a \"<" + d + "tool_calls>\" block like the following:\n\n"
         "<" + d + "tool_calls>\n"
         "<" + d + "invoke name=\"$TOOL_NAME\">\n"
         "<" + d + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d +
         "parameter>\n"
         "...\n"
         "</" + d + "invoke>\n"
         "<" + d + "invoke name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</" + d + "invoke>\n"
         "</" + d + "tool_calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types "
         "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by " + std::string(kThinkStart) + "), you MUST output "
         "your complete reasoning inside " + kThinkStart + "..." + kThinkEnd +
         " BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after " + kThinkEnd + " with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n" + schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
         "calls.\n";
}

// msg.get(key): nullptr when absent or null.
const ojson* get(const ojson& msg, const char* key) {
  if (!msg.is_object()) return nullptr;
  const auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string role_of(const ojson& msg) {
  const ojson* r = get(msg, "role");
  return r && r->is_string() ? r->get<std::string>() : std::string();
}

// Python truthiness for the values the script tests with `if x:`.
bool truthy(const ojson* v) {
  if (!v) return false;
  if (v->is_string() || v->is_array() || v->is_object()) return !v->empty();
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number()) return v->get<double>() != 0;
  return false;
}

// A content value as text. Strings as-is; null -> ""; an array of OpenAI
// content parts -> the text parts joined (our extension).
std::string text_of(const ojson* v) {
  if (!v) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_array()) {
    std::string s;
    for (const auto& part : *v)
      if (part.is_object() && part.value("type", "") == "text") s += part.value("text", "");
    return s;
  }
  return python_json_dumps(*v);
}

// str(value) as "{content}".format(content=value) writes it.
std::string py_str(const ojson* v) {
  if (!v) return "None";
  if (v->is_string()) return v->get<std::string>();
  return python_json_dumps(*v);
}

[[noreturn]] void bad(std::size_t index, const std::string& why) {
  throw TextError("chat messages[" + std::to_string(index) + "]: " + why);
}

// ---- merge_tool_messages / sort_tool_results_by_call_order

std::vector<ojson> merge_tool_messages(const std::vector<ojson>& messages) {
  std::vector<ojson> merged;
  for (const ojson& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "tool") {
      ojson block = ojson::object();
      block["type"] = "tool_result";
      block["tool_use_id"] = msg.contains("tool_call_id") ? msg["tool_call_id"] : ojson("");
      block["content"] = msg.contains("content") ? msg["content"] : ojson("");
      if (!merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        ojson m = ojson::object();
        m["role"] = "user";
        m["content_blocks"] = ojson::array({std::move(block)});
        merged.push_back(std::move(m));
      }
    } else if (role == "user") {
      const ojson content = msg.contains("content") ? msg["content"] : ojson("");
      ojson block = ojson::object();
      block["type"] = "text";
      block["text"] = content;
      if (!merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks") &&
          !get(merged.back(), "task")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        ojson m = ojson::object();
        m["role"] = "user";
        m["content"] = content;
        m["content_blocks"] = ojson::array({std::move(block)});
        for (const char* key : {"task", "wo_eos", "mask"})
          if (msg.contains(key)) m[key] = msg[key];
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

void sort_tool_results_by_call_order(std::vector<ojson>& messages) {
  std::map<std::string, int> order;
  for (ojson& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(get(msg, "tool_calls"))) {
      order.clear();
      int idx = 0;
      for (const ojson& tc : msg["tool_calls"]) {
        std::string id;
        if (const ojson* v = get(tc, "id"); truthy(v) && v->is_string()) {
          id = v->get<std::string>();
        } else if (const ojson* f = get(tc, "function")) {
          if (const ojson* fid = get(*f, "id"); fid && fid->is_string()) id = fid->get<std::string>();
        }
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(get(msg, "content_blocks"))) {
      std::vector<ojson> tool_blocks;
      for (const ojson& b : msg["content_blocks"])
        if (b.is_object() && b.value("type", "") == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto rank = [&order](const ojson& b) {
          const ojson* id = get(b, "tool_use_id");
          if (!id || !id->is_string()) return 0;
          const auto it = order.find(id->get<std::string>());
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const ojson& a, const ojson& b) { return rank(a) < rank(b); });
        std::size_t k = 0;
        for (ojson& b : msg["content_blocks"])
          if (b.is_object() && b.value("type", "") == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

int find_last_user_index(const std::vector<ojson>& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string r = role_of(messages[i]);
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

std::vector<ojson> drop_thinking_messages(const std::vector<ojson>& messages) {
  const int last_user = find_last_user_index(messages);
  std::vector<ojson> out;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const std::string r = role_of(messages[i]);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" ||
        r == "direct_search_results" || i >= last_user) {
      out.push_back(messages[i]);
    } else if (r == "assistant") {
      ojson m = messages[i];
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }  // earlier developer (and other) messages are dropped
  }
  return out;
}

// ---- DSML for assistant tool calls

std::string encode_arguments_to_dsml(const ojson& arguments_field) {
  ojson args;
  if (arguments_field.is_object()) {
    args = arguments_field;  // extension: already-parsed arguments
  } else {
    const std::string raw = arguments_field.is_string() ? arguments_field.get<std::string>() : std::string();
    bool ok = arguments_field.is_string();
    if (ok) {
      try {
        args = ojson::parse(raw);
      } catch (const ojson::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      args = ojson::object();
      args["arguments"] = arguments_field;
    }
  }
  if (!args.is_object()) throw TextError("tool call arguments must be a JSON object: " + args.dump());
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = it.value().is_string();
    out += std::string("<") + kDsml + "parameter name=\"" + it.key() + "\" string=\"" +
           (is_str ? "true" : "false") + "\">" +
           (is_str ? it.value().get<std::string>() : python_json_dumps(it.value())) + "</" + kDsml +
           "parameter>";
  }
  return out;
}

std::string render_tool_calls(const ojson& tool_calls, std::size_t index) {
  std::string calls;
  bool first = true;
  for (const ojson& tc : tool_calls) {
    const ojson* fn = get(tc, "function");
    if (!fn || !fn->is_object()) bad(index, "tool_calls entry without a \"function\" object");
    const std::string name = py_str(get(*fn, "name"));
    const ojson args = fn->contains("arguments") ? (*fn)["arguments"] : ojson();
    if (!first) calls += "\n";
    first = false;
    calls += std::string("<") + kDsml + "invoke name=\"" + name + "\">\n" + encode_arguments_to_dsml(args) +
             "\n</" + kDsml + "invoke>";
  }
  return std::string("\n\n<") + kDsml + "tool_calls>\n" + calls + "\n</" + kDsml + "tool_calls>";
}

std::string render_tools(const ojson& tools, std::size_t index) {
  std::string schemas;
  bool first = true;
  for (const ojson& t : tools) {
    const ojson* fn = get(t, "function");
    if (!fn) bad(index, "tools entry without a \"function\" object");
    if (!first) schemas += "\n";
    first = false;
    schemas += python_json_dumps(*fn);
  }
  return tools_block(schemas);
}

std::string response_format_block(const ojson& rf) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         python_json_dumps(rf);
}

std::string render_user_blocks(const ojson& blocks) {
  std::string out;
  bool first = true;
  for (const ojson& block : blocks) {
    if (!first) out += "\n\n";
    first = false;
    const std::string type = block.is_object() ? block.value("type", "") : "";
    if (type == "text") {
      out += text_of(get(block, "text"));
    } else if (type == "tool_result") {
      const ojson* c = get(block, "content");
      std::string tool_content;
      if (c && c->is_array()) {
        bool f2 = true;
        for (const ojson& b : *c) {
          if (!f2) tool_content += "\n\n";
          f2 = false;
          if (b.is_object() && b.value("type", "") == "text") tool_content += text_of(get(b, "text"));
          else tool_content += "[Unsupported " + py_str(b.is_object() ? get(b, "type") : nullptr) + "]";
        }
      } else {
        tool_content = block.contains("content") ? py_str(c) : std::string();
      }
      out += "<tool_result>" + tool_content + "</tool_result>";
    } else {
      out += "[Unsupported " + py_str(block.is_object() ? get(block, "type") : nullptr) + "]";
    }
  }
  return out;
}

std::string render_message(std::size_t index, const std::vector<ojson>& messages, const ChatOptions& o,
                           bool drop_thinking) {
  const bool thinking = o.mode == ThinkingMode::kThinking;
  const ojson& msg = messages[index];
  const int last_user = find_last_user_index(messages);
  const std::string role = role_of(msg);
  const ojson* tools = get(msg, "tools");
  const ojson* response_format = get(msg, "response_format");
  std::string prompt;

  if (index == 0 && thinking && o.effort == ReasoningEffort::kMax) prompt += kReasoningEffortMax;

  if (role == "system") {
    prompt += text_of(get(msg, "content"));
    if (truthy(tools)) prompt += "\n\n" + render_tools(*tools, index);
    if (truthy(response_format)) prompt += "\n\n" + response_format_block(*response_format);
  } else if (role == "developer") {
    const std::string content = text_of(get(msg, "content"));
    if (content.empty()) bad(index, "a developer message needs non-empty content");
    prompt += kUser + content;
    if (truthy(tools)) prompt += "\n\n" + render_tools(*tools, index);
    if (truthy(response_format)) prompt += "\n\n" + response_format_block(*response_format);
  } else if (role == "user") {
    prompt += kUser;
    if (const ojson* blocks = get(msg, "content_blocks"); truthy(blocks))
      prompt += render_user_blocks(*blocks);
    else
      prompt += text_of(get(msg, "content"));
  } else if (role == "latest_reminder") {
    prompt += kLatestReminder + py_str(get(msg, "content"));
  } else if (role == "assistant") {
    std::string tc;
    if (const ojson* calls = get(msg, "tool_calls"); truthy(calls)) tc = render_tool_calls(*calls, index);
    const bool prev_has_task = index >= 1 && get(messages[index - 1], "task") != nullptr;
    std::string reasoning;
    if (thinking && !prev_has_task && (!drop_thinking || static_cast<int>(index) > last_user))
      reasoning = text_of(get(msg, "reasoning_content")) + kThinkEnd;
    prompt += reasoning + text_of(get(msg, "content")) + tc;
    const ojson* wo_eos = get(msg, "wo_eos");
    if (!truthy(wo_eos)) prompt += kEos;
  } else {
    bad(index, "unknown role \"" + role + "\"");
  }

  // Transition to what follows.
  if (index + 1 < messages.size()) {
    const std::string next = role_of(messages[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (const ojson* task = get(msg, "task")) {
    const auto it = task->is_string() ? task_tokens().find(task->get<std::string>()) : task_tokens().end();
    if (it == task_tokens().end()) bad(index, "invalid task " + task->dump());
    if (it->first != "action") {
      prompt += it->second;
    } else {
      prompt += kAssistant;
      prompt += thinking ? kThinkStart : kThinkEnd;
      prompt += it->second;
    }
  } else if (role == "user" || role == "developer") {
    prompt += kAssistant;
    if (thinking && (!drop_thinking || static_cast<int>(index) >= last_user))
      prompt += kThinkStart;
    else
      prompt += kThinkEnd;
  }
  return prompt;
}

std::vector<ojson> as_vector(const ojson& a, const char* what) {
  if (a.is_null()) return {};
  if (!a.is_array()) throw TextError(std::string("chat ") + what + ": must be a JSON array of messages");
  std::vector<ojson> v(a.begin(), a.end());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!v[i].is_object()) throw TextError(std::string("chat ") + what + "[" + std::to_string(i) + "]: must be an object");
  return v;
}

}  // namespace

std::string encode_chat(const ojson& messages_in, const ChatOptions& o, const ojson& context_in) {
  std::vector<ojson> context = as_vector(context_in, "context");
  std::vector<ojson> messages = merge_tool_messages(as_vector(messages_in, "messages"));
  {
    // The script sorts context (not yet merged) + messages together, then
    // keeps the messages part.
    std::vector<ojson> all = context;
    all.insert(all.end(), messages.begin(), messages.end());
    sort_tool_results_by_call_order(all);
    messages.assign(all.begin() + static_cast<std::ptrdiff_t>(context.size()), all.end());
    if (!context.empty()) {
      context.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(context.size()));
      context = merge_tool_messages(context);
      sort_tool_results_by_call_order(context);
    }
  }
  std::vector<ojson> full = context;
  full.insert(full.end(), messages.begin(), messages.end());

  std::string prompt = (o.add_bos && context.empty()) ? kBos : "";
  bool drop = o.drop_thinking;
  for (const ojson& m : full)
    if (truthy(get(m, "tools"))) drop = false;

  std::size_t num_to_render, context_len;
  if (o.mode == ThinkingMode::kThinking && drop) {
    full = drop_thinking_messages(full);
    num_to_render = full.size() - drop_thinking_messages(context).size();
    context_len = full.size() - num_to_render;
  } else {
    num_to_render = messages.size();
    context_len = context.size();
  }
  for (std::size_t i = 0; i < num_to_render; ++i) prompt += render_message(i + context_len, full, o, drop);
  return prompt;
}

ojson attach_tools(ojson messages, const ojson& tools, const ojson& response_format) {
  const bool has_tools = tools.is_array() && !tools.empty();
  const bool has_rf = !response_format.is_null() && !response_format.empty();
  if (!has_tools && !has_rf) return messages;
  if (!messages.is_array()) throw TextError("chat messages: must be a JSON array of messages");
  if (messages.empty() || role_of(messages[0]) != "system") {
    ojson sys = ojson::object();
    sys["role"] = "system";
    sys["content"] = "";
    messages.insert(messages.begin(), std::move(sys));
  }
  if (has_tools) messages[0]["tools"] = tools;
  if (has_rf) messages[0]["response_format"] = response_format;
  return messages;
}

ThinkingMode parse_thinking_mode(const std::string& s) {
  if (s == "chat") return ThinkingMode::kChat;
  if (s == "thinking") return ThinkingMode::kThinking;
  throw TextError("thinking_mode: expected \"chat\" or \"thinking\", got \"" + s + "\"");
}

ReasoningEffort parse_reasoning_effort(const std::string& s) {
  if (s.empty()) return ReasoningEffort::kNone;
  if (s == "high") return ReasoningEffort::kHigh;
  if (s == "max") return ReasoningEffort::kMax;
  throw TextError("reasoning_effort: expected \"high\" or \"max\", got \"" + s + "\"");
}

}  // namespace dsv4::text
