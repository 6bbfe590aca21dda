// V4 chat encoding vs goldens rendered by DeepSeek's encoding_dsv4.py
// (tools/text/gen_chat_goldens.py), byte for byte, plus their token ids.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fixture_io.h"
#include "text/chat_encoding.h"
#include "text/python_json.h"
#include "text/tokenizer.h"

namespace dsv4::text {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& goldens() {
  static const ojson g = ojson::parse(testing::read_file(testing::data_path("chat_goldens.json")));
  return g;
}

ChatOptions options_of(const ojson& c) {
  ChatOptions o;
  o.mode = parse_thinking_mode(c["thinking_mode"].get<std::string>());
  o.effort = parse_reasoning_effort(c["reasoning_effort"].is_null() ? "" : c["reasoning_effort"].get<std::string>());
  o.drop_thinking = c["drop_thinking"].get<bool>();
  o.add_bos = c["add_default_bos_token"].get<bool>();
  return o;
}

TEST(ChatEncoding, GoldensFromEncodingDsv4) {
  ASSERT_GE(goldens().size(), 50u);
  for (const ojson& c : goldens()) {
    const ojson context = c["context"].is_null() ? ojson::array() : c["context"];
    const std::string got = encode_chat(c["messages"], options_of(c), context);
    EXPECT_EQ(got, c["prompt"].get<std::string>()) << c["name"];
  }
}

TEST(ChatEncoding, GoldenPromptIds) {
  const Tokenizer tok = Tokenizer::load(default_tokenizer_path());
  for (const ojson& c : goldens()) {
    const auto ids = tok.encode(c["prompt"].get<std::string>());
    EXPECT_EQ(ids, c["ids"].get<std::vector<std::int32_t>>()) << c["name"];
  }
}

TEST(ChatEncoding, ChatVsThinkingTail) {
  const ojson msgs = ojson::parse(R"([{"role":"user","content":"Hi"}])");
  ChatOptions chat, think;
  think.mode = ThinkingMode::kThinking;
  EXPECT_EQ(encode_chat(msgs, chat), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(encode_chat(msgs, think), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
}

TEST(ChatEncoding, AttachToolsInsertsSystem) {
  const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"f","parameters":{}}}])");
  const ojson msgs = attach_tools(ojson::parse(R"([{"role":"user","content":"Hi"}])"), tools);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0]["role"], "system");
  EXPECT_EQ(msgs[0]["tools"], tools);
  const std::string p = encode_chat(msgs, ChatOptions{});
  EXPECT_NE(p.find("### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {}}\n"), std::string::npos);
  // An existing system message gets them instead.
  const ojson msgs2 = attach_tools(ojson::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"}])"), tools);
  ASSERT_EQ(msgs2.size(), 2u);
  EXPECT_EQ(msgs2[0]["content"], "S");
}

TEST(ChatEncoding, ContentPartsAreJoined) {
  const ojson msgs = ojson::parse(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}])");
  EXPECT_EQ(encode_chat(msgs, ChatOptions{}), "<｜begin▁of▁sentence｜><｜User｜>ab<｜Assistant｜></think>");
}

TEST(ChatEncoding, ObjectArgumentsAccepted) {
  const ojson msgs = ojson::parse(R"([{"role":"user","content":"x"},{"role":"assistant","content":"",
    "tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":{"b":1,"a":"s"}}}]}])");
  const std::string p = encode_chat(msgs, ChatOptions{});
  EXPECT_NE(p.find("<｜DSML｜parameter name=\"b\" string=\"false\">1</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"a\" string=\"true\">s</｜DSML｜parameter>"),
            std::string::npos)
      << p;
}

TEST(ChatEncoding, Errors) {
  auto msg_of = [](const char* json) {
    try {
      encode_chat(ojson::parse(json), ChatOptions{});
    } catch (const TextError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg_of(R"([{"role":"developer","content":""}])").find("messages[0]"), std::string::npos);
  EXPECT_NE(msg_of(R"([{"role":"user","content":"a"},{"role":"wizard","content":"b"}])").find("messages[1]: unknown role"),
            std::string::npos);
  EXPECT_NE(msg_of(R"({"role":"user"})").find("array"), std::string::npos);
  EXPECT_NE(msg_of(R"([{"role":"user","content":"a","task":"dance"}])").find("invalid task"), std::string::npos);
  EXPECT_THROW(parse_thinking_mode("fast"), TextError);
  EXPECT_THROW(parse_reasoning_effort("low"), TextError);
}

TEST(PythonJson, MatchesJsonDumps) {
  EXPECT_EQ(python_json_dumps(ojson::parse(R"({"b":[1,2.5,true,null],"a":"x\"\n\u0001é"})")),
            "{\"b\": [1, 2.5, true, null], \"a\": \"x\\\"\\n\\u0001é\"}");
  EXPECT_EQ(python_json_dumps(ojson(1e-07)), "1e-07");
  EXPECT_EQ(python_json_dumps(ojson(1e20)), "1e+20");
  EXPECT_EQ(python_json_dumps(ojson(1e16)), "1e+16");
  EXPECT_EQ(python_json_dumps(ojson(1e15)), "1000000000000000.0");
  EXPECT_EQ(python_json_dumps(ojson(100.0)), "100.0");
  EXPECT_EQ(python_json_dumps(ojson(0.0001)), "0.0001");
  EXPECT_EQ(python_json_dumps(ojson(-0.5)), "-0.5");
  EXPECT_EQ(python_json_dumps(ojson(123.456)), "123.456");
  EXPECT_EQ(python_json_dumps(ojson(0.1 + 0.2)), "0.30000000000000004");
  EXPECT_EQ(python_json_dumps(ojson::object()), "{}");
  EXPECT_EQ(python_json_dumps(ojson::array()), "[]");
}

}  // namespace
}  // namespace dsv4::text
