#include "text/dsml_block.h"

#include <nlohmann/json.hpp>

#include "text/python_json.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

constexpr std::string_view kOpen = "<｜DSML｜tool_calls>\n";
constexpr std::string_view kClose = "</｜DSML｜tool_calls>";
constexpr std::string_view kInvoke = "<｜DSML｜invoke";
constexpr std::string_view kInvokeEnd = "</｜DSML｜invoke>\n";
constexpr std::string_view kParam = "<｜DSML｜parameter name=\"";
constexpr std::string_view kParamEnd = "</｜DSML｜parameter>\n";
constexpr std::size_t kMaxName = 512;

enum class M { kOk, kNeedMore, kInvalid };

// Does s[p..] start with lit? kNeedMore when s ends inside a matching prefix.
M match(std::string_view s, std::size_t p, std::string_view lit) {
  const std::size_t n = std::min(lit.size(), s.size() - p);
  if (s.substr(p, n) != lit.substr(0, n)) return M::kInvalid;
  return n < lit.size() ? M::kNeedMore : M::kOk;
}

// A name runs up to the closing quote; no quote, newline or angle bracket in it.
M read_name(std::string_view s, std::size_t& p, std::string& out) {
  for (std::size_t i = p; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      out.assign(s.substr(p, i - p));
      p = i + 1;
      return M::kOk;
    }
    if (c == '\n' || c == '<' || c == '>' || i - p >= kMaxName) return M::kInvalid;
  }
  return s.size() - p >= kMaxName ? M::kInvalid : M::kNeedMore;
}

}  // namespace

DsmlBlockParser::Status DsmlBlockParser::feed(std::string_view more, bool final) {
  if (status_ != Status::kNeedMore) return status_;
  text_.append(more);
  for (;;) {
    const Step s = step();
    if (s == Step::kInvalid) return status_ = Status::kInvalid;
    if (s == Step::kNeedMore) return status_ = final ? Status::kInvalid : Status::kNeedMore;
    if (state_ == State::kDone) return status_ = Status::kComplete;
  }
}

#define DSV4_MATCH(expr)                                 \
  do {                                                   \
    const M m_ = (expr);                                 \
    if (m_ == M::kInvalid) return Step::kInvalid;        \
    if (m_ == M::kNeedMore) return Step::kNeedMore;      \
  } while (0)

DsmlBlockParser::Step DsmlBlockParser::step() {
  const std::string_view s = text_;
  std::size_t p = pos_;
  switch (state_) {
    case State::kHeader:
      DSV4_MATCH(match(s, p, kOpen));
      pos_ = p + kOpen.size();
      state_ = State::kBetweenInvokes;
      return Step::kOk;
    case State::kBetweenInvokes: {
      if (p < s.size() && match(s, p, kClose) != M::kInvalid) {
        DSV4_MATCH(match(s, p, kClose));
        pos_ = p + kClose.size();
        state_ = State::kDone;
        return Step::kOk;
      }
      DSV4_MATCH(match(s, p, kInvoke));
      p += kInvoke.size();
      while (p < s.size() && (s[p] == ' ' || s[p] == '\t')) ++p;
      DSV4_MATCH(match(s, p, "name=\""));
      p += 6;
      DSV4_MATCH(read_name(s, p, name_));
      DSV4_MATCH(match(s, p, ">\n"));
      pos_ = p + 2;
      name_ = utf8::sanitize(name_);
      args_.clear();
      blank_ok_ = true;
      value_scan_ = 0;
      state_ = State::kInInvoke;
      return Step::kOk;
    }
    case State::kInInvoke: {
      // encoding_dsv4.py writes an invoke without parameters with a blank line.
      if (blank_ok_ && p < s.size() && s[p] == '\n') {
        blank_ok_ = false;
        pos_ = p + 1;
        return Step::kOk;
      }
      if (p < s.size()) blank_ok_ = false;
      if (p < s.size() && match(s, p, kInvokeEnd) != M::kInvalid) {
        DSV4_MATCH(match(s, p, kInvokeEnd));
        // Arguments JSON exactly as decode_dsml_to_arguments writes it.
        std::string json = "{";
        for (std::size_t i = 0; i < args_.size(); ++i) {
          if (i) json += ", ";
          json += python_json_dumps(nlohmann::ordered_json(args_[i].first)) + ": " + args_[i].second;
        }
        json += "}";
        calls_.push_back({name_, std::move(json)});
        pos_ = p + kInvokeEnd.size();
        state_ = State::kBetweenInvokes;
        return Step::kOk;
      }
      const Step st = parse_param(p);
      if (st == Step::kOk) pos_ = p;
      return st;
    }
    case State::kDone:
      return Step::kOk;
  }
  return Step::kInvalid;
}

DsmlBlockParser::Step DsmlBlockParser::parse_param(std::size_t& p) {
  const std::string_view s = text_;
  DSV4_MATCH(match(s, p, kParam));
  p += kParam.size();
  std::string key;
  DSV4_MATCH(read_name(s, p, key));
  DSV4_MATCH(match(s, p, " string=\""));
  p += 9;
  bool is_string;
  if (match(s, p, "true\">") != M::kInvalid) {
    DSV4_MATCH(match(s, p, "true\">"));
    is_string = true;
    p += 6;
  } else {
    DSV4_MATCH(match(s, p, "false\">"));
    is_string = false;
    p += 7;
  }
  // The value runs to the first end tag; resume the search where it stopped.
  constexpr std::string_view kEndTag = "</｜DSML｜parameter";
  const std::size_t from = std::max(p, value_scan_);
  const std::size_t end = s.find(kEndTag, from);
  if (end == std::string_view::npos) {
    value_scan_ = s.size() >= kEndTag.size() ? std::max(p, s.size() - kEndTag.size() + 1) : p;
    return Step::kNeedMore;
  }
  const std::string_view value = s.substr(p, end - p);
  p = end;
  DSV4_MATCH(match(s, p, kParamEnd));
  p += kParamEnd.size();
  std::string json_value;
  key = utf8::sanitize(key);
  for (const auto& kv : args_)
    if (kv.first == key) return Step::kInvalid;  // duplicate parameter
  if (is_string) {
    json_value = python_json_dumps(nlohmann::ordered_json(utf8::sanitize(value)));
  } else if (nlohmann::json::accept(value)) {
    json_value = std::string(value);  // a JSON literal, kept verbatim
  } else {
    json_value = python_json_dumps(nlohmann::ordered_json(utf8::sanitize(value)));
    coerced_ = true;
  }
  args_.emplace_back(std::move(key), std::move(json_value));
  value_scan_ = 0;
  return Step::kOk;
}

#undef DSV4_MATCH

}  // namespace dsv4::text
