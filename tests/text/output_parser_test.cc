// Streaming output parser: goldens from encoding_dsv4.py's
// parse_message_from_completion_text, table-driven cases split at every byte
// boundary, and a fuzz test over random DSML fragments.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "fixture_io.h"
#include "text/output_parser.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kEos = "<｜end▁of▁sentence｜>";

// Everything the parser decides, for comparing runs.
struct Outcome {
  ParsedMessage msg;
  std::string reasoning_deltas, content_deltas;
  std::vector<ToolCall> call_deltas;
  bool deltas_valid_utf8 = true;
};

// Feeds `text` cut at the given offsets (sorted, inside the text).
Outcome run(const std::string& text, bool thinking, const std::vector<std::size_t>& cuts) {
  OutputParser p(ParserOptions{thinking, "call_"});
  Outcome o;
  auto take = [&o](const ParserDelta& d) {
    o.reasoning_deltas += d.reasoning_content;
    o.content_deltas += d.content;
    o.call_deltas.insert(o.call_deltas.end(), d.tool_calls.begin(), d.tool_calls.end());
    if (!utf8::is_valid(d.content) || !utf8::is_valid(d.reasoning_content)) o.deltas_valid_utf8 = false;
  };
  std::size_t prev = 0;
  for (const std::size_t c : cuts) {
    take(p.feed(std::string_view(text).substr(prev, c - prev)));
    prev = c;
  }
  take(p.feed(std::string_view(text).substr(prev)));
  take(p.finish());
  o.msg = p.message();
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& where) {
  EXPECT_EQ(a.msg.reasoning_content, b.msg.reasoning_content) << where;
  EXPECT_EQ(a.msg.content, b.msg.content) << where;
  ASSERT_EQ(a.msg.tool_calls.size(), b.msg.tool_calls.size()) << where;
  for (std::size_t i = 0; i < a.msg.tool_calls.size(); ++i) {
    EXPECT_EQ(a.msg.tool_calls[i].name, b.msg.tool_calls[i].name) << where;
    EXPECT_EQ(a.msg.tool_calls[i].arguments, b.msg.tool_calls[i].arguments) << where;
  }
  EXPECT_TRUE(a.msg.flags == b.msg.flags) << where;
  EXPECT_EQ(a.msg.markup_bytes, b.msg.markup_bytes) << where;
}

// Deltas add up to the final message; nothing is taken back.
void expect_consistent(const Outcome& o, const std::string& text, const std::string& where) {
  EXPECT_EQ(o.reasoning_deltas, o.msg.reasoning_content) << where;
  EXPECT_EQ(o.content_deltas, o.msg.content) << where;
  EXPECT_EQ(o.call_deltas.size(), o.msg.tool_calls.size()) << where;
  // No lost text: every input byte is reasoning, content or markup.
  EXPECT_EQ(text.size(), o.msg.reasoning_content.size() + o.msg.content.size() + o.msg.markup_bytes) << where;
}

// Whole, every single split point, and byte by byte must agree.
Outcome check_all_splits(const std::string& text, bool thinking, const std::string& name) {
  const Outcome whole = run(text, thinking, {});
  expect_consistent(whole, text, name + " whole");
  for (std::size_t i = 1; i < text.size(); ++i) {
    const Outcome split = run(text, thinking, {i});
    expect_same(whole, split, name + " split at " + std::to_string(i));
    expect_consistent(split, text, name + " split at " + std::to_string(i));
    if (::testing::Test::HasFailure()) return whole;
  }
  std::vector<std::size_t> every;
  for (std::size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const Outcome bytes = run(text, thinking, every);
  expect_same(whole, bytes, name + " byte by byte");
  expect_consistent(bytes, text, name + " byte by byte");
  return whole;
}

TEST(OutputParser, GoldensFromEncodingDsv4) {
  const ojson cases = ojson::parse(testing::read_file(testing::data_path("parse_goldens.json")));
  ASSERT_GE(cases.size(), 10u);
  for (const ojson& c : cases) {
    const std::string name = c["name"].get<std::string>();
    const std::string text = c["completion"].get<std::string>();
    const bool thinking = c["thinking_mode"] == "thinking";
    const Outcome o = check_all_splits(text, thinking, name);
    const ojson& want = c["expected"];
    EXPECT_EQ(o.msg.content, want["content"].get<std::string>()) << name;
    EXPECT_EQ(o.msg.reasoning_content, want["reasoning_content"].get<std::string>()) << name;
    ASSERT_EQ(o.msg.tool_calls.size(), want["tool_calls"].size()) << name;
    for (std::size_t i = 0; i < o.msg.tool_calls.size(); ++i) {
      EXPECT_EQ(o.msg.tool_calls[i].name, want["tool_calls"][i]["function"]["name"].get<std::string>()) << name;
      EXPECT_EQ(o.msg.tool_calls[i].arguments, want["tool_calls"][i]["function"]["arguments"].get<std::string>())
          << name;
      EXPECT_EQ(o.msg.tool_calls[i].id, "call_" + std::to_string(i));
      EXPECT_TRUE(ojson::accept(o.msg.tool_calls[i].arguments)) << name;
    }
    EXPECT_TRUE(o.msg.flags == ParserFlags{}) << name;
  }
}

struct Case {
  const char* name;
  bool thinking;
  std::string text;
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  ParserFlags flags;
};

ParserFlags flags(std::initializer_list<bool ParserFlags::*> on) {
  ParserFlags f;
  for (auto m : on) f.*m = true;
  return f;
}

const std::string kCall1 =
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
    "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"n\" string=\"false\">2</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

std::vector<Case> cases() {
  using F = ParserFlags;
  return {
      {"plain_chat", false, "Hello 世界 🙂" + kEos, "", "Hello 世界 🙂", {}, {}},
      {"chat_no_eos", false, "Truncated answer", "", "Truncated answer", {}, {}},
      {"thinking", true, "hmm</think>answer" + kEos, "hmm", "answer", {}, {}},
      {"thinking_leading_think_tag", true, "<think>hmm</think>ok", "hmm", "ok", {}, {}},
      {"thinking_unterminated", true, "still thinking", "still thinking", "", {},
       flags({&F::unterminated_reasoning})},
      {"thinking_eos_in_reasoning", true, "abc" + kEos, "abc", "", {}, flags({&F::unterminated_reasoning})},
      {"tool_call", false, "Sure.\n\n" + kCall1 + kEos, "", "Sure.", {{"f", "{\"a\": \"x\", \"n\": 2}"}}, {}},
      {"tool_call_no_blank_line", false, "Sure." + kCall1, "", "Sure.", {{"f", "{\"a\": \"x\", \"n\": 2}"}}, {}},
      {"tool_call_in_reasoning", true, "I should call f.\n\n" + kCall1 + kEos, "I should call f.", "",
       {{"f", "{\"a\": \"x\", \"n\": 2}"}}, flags({&F::tool_calls_in_reasoning})},
      {"two_blocks", false, kCall1 + "\n\n" + kCall1, "", "",
       {{"f", "{\"a\": \"x\", \"n\": 2}"}, {"f", "{\"a\": \"x\", \"n\": 2}"}}, {}},
      {"text_after_block", false, kCall1 + "oops", "", "oops", {{"f", "{\"a\": \"x\", \"n\": 2}"}},
       flags({&F::text_after_tool_calls})},
      {"truncated_block", false, "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param", "",
       "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param", {}, flags({&F::malformed_tool_calls})},
      {"corrupted_opener", false, "A\n\n<｜DSML｜toolcalls>\nX", "", "A\n\n<｜DSML｜toolcalls>\nX", {},
       flags({&F::malformed_tool_calls})},
      {"stray_dsml_fragment", false, "see ｜DSML｜ and <｜DSML｜ here", "", "see ｜DSML｜ and <｜DSML｜ here", {},
       flags({&F::malformed_tool_calls})},
      {"duplicate_param", false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
       "<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       "",
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
       "<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       {}, flags({&F::malformed_tool_calls})},
      {"malformed_then_valid", false, "<｜DSML｜oops " + kCall1, "", "<｜DSML｜oops ",
       {{"f", "{\"a\": \"x\", \"n\": 2}"}}, flags({&F::malformed_tool_calls})},
      {"not_json_value", false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"g\">\n"
       "<｜DSML｜parameter name=\"v\" string=\"false\">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "</｜DSML｜tool_calls>",
       "", "", {{"g", "{\"v\": \"not json\"}"}}, flags({&F::coerced_arguments})},
      {"empty_args", false, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"h\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       "", "", {{"h", "{}"}}, {}},
      {"stray_think_end_in_content", false, "a</think>b", "", "ab", {}, flags({&F::stray_think_tag})},
      {"text_after_eos", false, "a" + kEos + "b", "", "ab", {}, flags({&F::text_after_eos})},
      {"partial_tags_as_text", false, "a <thin b </thi c <｜end d \n\n<｜DS e\n", "",
       "a <thin b </thi c <｜end d \n\n<｜DS e\n", {}, {}},
      {"value_with_newlines_and_tags", false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w\">\n"
       "<｜DSML｜parameter name=\"code\" string=\"true\">int main() {\n  return 0; // </think> <b>\n}\n"
       "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       "", "", {{"w", "{\"code\": \"int main() {\\n  return 0; // </think> <b>\\n}\\n\"}"}}, {}},
  };
}

TEST(OutputParser, TableEverySplit) {
  for (const Case& c : cases()) {
    const Outcome o = check_all_splits(c.text, c.thinking, c.name);
    EXPECT_EQ(o.msg.reasoning_content, c.reasoning) << c.name;
    EXPECT_EQ(o.msg.content, c.content) << c.name;
    ASSERT_EQ(o.msg.tool_calls.size(), c.calls.size()) << c.name;
    for (std::size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(o.msg.tool_calls[i].name, c.calls[i].first) << c.name;
      EXPECT_EQ(o.msg.tool_calls[i].arguments, c.calls[i].second) << c.name;
    }
    EXPECT_TRUE(o.msg.flags == c.flags) << c.name;
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(OutputParser, NeverShowsPartialTag) {
  // Streamed byte by byte, a well-formed tool call never leaks DSML into content.
  const std::string text = "Answer.\n\n" + kCall1 + kEos;
  OutputParser p;
  std::string shown;
  for (const char ch : text) {
    const ParserDelta d = p.feed(std::string_view(&ch, 1));
    shown += d.content;
    EXPECT_EQ(shown.find("<｜"), std::string::npos) << shown;
    EXPECT_EQ(shown.find("\n"), std::string::npos) << shown;
  }
  p.finish();
  EXPECT_EQ(shown, "Answer.");
  EXPECT_EQ(p.message().tool_calls.size(), 1u);
}

TEST(OutputParser, ToJson) {
  OutputParser p;
  p.feed(kCall1);
  p.finish();
  const ojson j = ojson::parse(p.to_json());
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(j["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
}

TEST(OutputParser, FuzzRandomDsmlFragments) {
  const std::vector<std::string> frags = {
      "<｜DSML｜", "｜DSML｜", "tool_calls>", "<｜DSML｜tool_calls>\n", "</｜DSML｜tool_calls>",
      "<｜DSML｜invoke name=\"f\">\n", "</｜DSML｜invoke>\n", "<｜DSML｜parameter name=\"k\" string=\"true\">",
      "<｜DSML｜parameter name=\"k\" string=\"false\">", "</｜DSML｜parameter>\n", "v", "[1, 2]", "\"q\"",
      "\n", "\n\n", " ", "<", "</", ">", "\"", "</think>", "<think>", kEos, "text", "世界", "🙂", "name=\"",
      "string=\"", "\xF0\x9F", kCall1, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"g\">\n"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 25);
    for (int i = 0; i < n; ++i) text += frags[rng() % frags.size()];
    const bool thinking = rng() % 2;
    const Outcome whole = run(text, thinking, {});
    const std::string where = "iter " + std::to_string(iter);
    expect_consistent(whole, text, where);
    // Random chunkings give the same message.
    for (int k = 0; k < 3; ++k) {
      std::vector<std::size_t> cuts;
      for (std::size_t i = 1; i < text.size(); ++i)
        if (rng() % 4 == 0) cuts.push_back(i);
      const Outcome o = run(text, thinking, cuts);
      expect_same(whole, o, where);
      expect_consistent(o, text, where);
    }
    for (const ToolCall& t : whole.msg.tool_calls) EXPECT_TRUE(ojson::accept(t.arguments)) << where;
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "input: " << text;
      return;
    }
  }
}

}  // namespace
}  // namespace dsv4::text
