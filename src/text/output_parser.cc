#include "text/output_parser.h"

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace dsv4::text {
namespace {

constexpr std::string_view kDsmlOpen = "<｜DSML｜";
constexpr std::string_view kDsmlOpenNl = "\n\n<｜DSML｜";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kMarkers[] = {kDsmlOpenNl, kDsmlOpen, kThinkEnd, kThinkStart, kEos};

struct Found {
  std::size_t pos = std::string_view::npos;
  std::string_view marker;
};

// Earliest marker in s; at equal positions the longest.
Found find_marker(std::string_view s) {
  Found f;
  for (const std::string_view m : kMarkers) {
    const std::size_t p = s.find(m);
    if (p == std::string_view::npos) continue;
    if (p < f.pos || (p == f.pos && m.size() > f.marker.size())) f = {p, m};
  }
  return f;
}

// Length of the longest suffix of s that is a proper prefix of some marker.
std::size_t partial_marker_suffix(std::string_view s) {
  std::size_t best = 0;
  for (const std::string_view m : kMarkers) {
    for (std::size_t l = std::min(m.size() - 1, s.size()); l > best; --l) {
      if (s.substr(s.size() - l) == m.substr(0, l)) {
        best = l;
        break;
      }
    }
  }
  return best;
}

}  // namespace

OutputParser::OutputParser(ParserOptions options)
    : opt_(std::move(options)), state_(opt_.thinking ? State::kReasoning : State::kContent) {}

void OutputParser::emit(State channel, std::string_view text, ParserDelta& d) {
  if (text.empty()) return;
  at_start_ = false;
  if (channel == State::kReasoning) {
    msg_.reasoning_content.append(text);
    d.reasoning_content.append(text);
  } else {
    if (after_block_) msg_.flags.text_after_tool_calls = true;
    if (state_ == State::kDone) msg_.flags.text_after_eos = true;
    msg_.content.append(text);
    d.content.append(text);
  }
}

void OutputParser::run(bool final, ParserDelta& d) {
  for (;;) {
    if (state_ == State::kBlock) {
      const auto status = block_.feed(pending_, final);
      pending_.clear();
      if (status == DsmlBlockParser::Status::kNeedMore) return;
      std::string text = block_.text();
      if (status == DsmlBlockParser::Status::kComplete) {
        msg_.markup_bytes += block_prefix_ + block_.block_length();
        for (const DsmlToolCall& c : block_.calls()) {
          ToolCall t;
          t.index = static_cast<int>(msg_.tool_calls.size());
          t.id = opt_.id_prefix + std::to_string(t.index);
          t.name = c.name;
          t.arguments = c.arguments;
          msg_.tool_calls.push_back(t);
          d.tool_calls.push_back(std::move(t));
        }
        if (block_.coerced()) msg_.flags.coerced_arguments = true;
        if (block_from_ == State::kReasoning) msg_.flags.tool_calls_in_reasoning = true;
        pending_ = text.substr(block_.block_length());
        state_ = State::kContent;
        after_block_ = true;
      } else {
        // Not a valid block: its opening goes out as plain text and the rest
        // is scanned again (it may hold a real tag or another block).
        msg_.flags.malformed_tool_calls = true;
        state_ = block_from_;
        emit(block_from_, std::string(block_prefix_, '\n') + std::string(kDsmlOpen), d);
        pending_ = text.substr(kDsmlOpen.size());
      }
      block_ = DsmlBlockParser();
      continue;
    }

    const Found f = state_ == State::kDone ? Found{} : find_marker(pending_);
    if (f.pos == std::string_view::npos) {
      std::size_t keep = pending_.size();
      if (!final) {
        if (state_ != State::kDone) keep -= partial_marker_suffix(pending_);
        keep = utf8::stable_prefix(std::string_view(pending_).substr(0, keep));
      }
      emit(state_ == State::kReasoning ? State::kReasoning : State::kContent,
           std::string_view(pending_).substr(0, keep), d);
      pending_.erase(0, keep);
      return;
    }

    emit(state_, std::string_view(pending_).substr(0, f.pos), d);
    const std::string_view m = f.marker;
    std::size_t consumed = f.pos + m.size();
    if (m == kDsmlOpenNl || m == kDsmlOpen) {
      block_from_ = state_;
      block_prefix_ = (m == kDsmlOpenNl) ? 2 : 0;
      consumed = f.pos + block_prefix_;  // the block parser gets "<｜DSML｜..."
      state_ = State::kBlock;
    } else {
      msg_.markup_bytes += m.size();
      if (m == kThinkEnd) {
        if (state_ == State::kReasoning) state_ = State::kContent;
        else msg_.flags.stray_think_tag = true;
      } else if (m == kThinkStart) {
        if (!(state_ == State::kReasoning && at_start_)) msg_.flags.stray_think_tag = true;
      } else {  // EOS
        if (state_ == State::kReasoning) msg_.flags.unterminated_reasoning = true;
        state_ = State::kDone;
      }
    }
    at_start_ = false;
    pending_.erase(0, consumed);
  }
}

ParserDelta OutputParser::feed(std::string_view text) {
  ParserDelta d;
  pending_.append(text);
  run(false, d);
  return d;
}

ParserDelta OutputParser::finish() {
  ParserDelta d;
  run(true, d);
  if (state_ == State::kReasoning) msg_.flags.unterminated_reasoning = true;
  return d;
}

std::string OutputParser::to_json() const {
  nlohmann::ordered_json j;
  j["role"] = "assistant";
  j["content"] = msg_.content;
  j["reasoning_content"] = msg_.reasoning_content;
  j["tool_calls"] = nlohmann::ordered_json::array();
  for (const ToolCall& t : msg_.tool_calls)
    j["tool_calls"].push_back({{"id", t.id}, {"type", "function"},
                               {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
  return j.dump();
}

}  // namespace dsv4::text
