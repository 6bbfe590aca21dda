#include "text/tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

#ifndef DSV4_SOURCE_DIR
#define DSV4_SOURCE_DIR "."
#endif

namespace dsv4::text {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Bpe> bpe;
  std::unordered_map<std::string, std::int32_t> token_to_id;  // vocab + added
  std::vector<std::string> id_to_token;                        // "" where unused
  std::vector<bool> added;                                     // id is an added token
  std::vector<bool> special;
  AddedTokenMatcher raw_tokens;         // added tokens with normalized=false
  AddedTokenMatcher normalized_tokens;  // added tokens with normalized=true

  void encode_plain(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<std::int32_t>& out) const;
};

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& field, const std::string& why) {
  throw TextError(file + ": field '" + field + "' " + why);
}

const json& need(const json& obj, const char* key, const std::string& file, const std::string& field) {
  if (!obj.is_object() || !obj.contains(key)) fail(file, field, "is missing");
  return obj.at(key);
}

bool is_null_or(const json& obj, const char* key, const json& allowed) {
  return !obj.contains(key) || obj.at(key).is_null() || obj.at(key) == allowed;
}

void check_normalizer(const json& root, const std::string& file) {
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return;
  const json& n = root["normalizer"];
  if (n.value("type", "") == "Sequence" && n.contains("normalizers") &&
      n["normalizers"].is_array() && n["normalizers"].empty())
    return;
  fail(file, "normalizer", "is not supported (only none or an empty Sequence): " + n.dump());
}

void check_split(const json& p, std::size_t i, std::string_view pattern, const std::string& file) {
  const std::string field = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
  if (p.value("type", "") != "Split") fail(file, field + ".type", "must be Split");
  const json& pat = need(p, "pattern", file, field + ".pattern");
  if (!pat.contains("Regex") || pat["Regex"].get<std::string>() != pattern)
    fail(file, field + ".pattern.Regex",
         "is not the DeepSeek-V4 pattern this tokenizer implements (got " + pat.dump() + ")");
  if (p.value("behavior", "") != "Isolated") fail(file, field + ".behavior", "must be Isolated");
  if (p.value("invert", false)) fail(file, field + ".invert", "must be false");
}

void check_pre_tokenizer(const json& root, const std::string& file) {
  const json& pt = need(root, "pre_tokenizer", file, "pre_tokenizer");
  if (pt.value("type", "") != "Sequence") fail(file, "pre_tokenizer.type", "must be Sequence");
  const json& seq = need(pt, "pretokenizers", file, "pre_tokenizer.pretokenizers");
  if (!seq.is_array() || seq.size() != 4)
    fail(file, "pre_tokenizer.pretokenizers", "must hold 3 Split and 1 ByteLevel entries");
  check_split(seq[0], 0, kDigitsPattern, file);
  check_split(seq[1], 1, kCjkPattern, file);
  check_split(seq[2], 2, kMainPattern, file);
  const json& bl = seq[3];
  if (bl.value("type", "") != "ByteLevel" || bl.value("add_prefix_space", true) ||
      bl.value("use_regex", true))
    fail(file, "pre_tokenizer.pretokenizers[3]",
         "must be ByteLevel with add_prefix_space=false, use_regex=false");
}

void check_post_and_decoder(const json& root, const std::string& file) {
  if (root.contains("post_processor") && !root["post_processor"].is_null() &&
      root["post_processor"].value("type", "") != "ByteLevel")
    fail(file, "post_processor.type", "is not supported (only ByteLevel, which adds no tokens)");
  if (!root.contains("decoder") || root["decoder"].value("type", "") != "ByteLevel")
    fail(file, "decoder.type", "must be ByteLevel");
}

struct ModelData {
  std::unordered_map<std::string, std::int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
};

ModelData read_model(const json& root, const std::string& file) {
  const json& m = need(root, "model", file, "model");
  if (m.value("type", "") != "BPE") fail(file, "model.type", "must be BPE");
  if (!is_null_or(m, "dropout", nullptr)) fail(file, "model.dropout", "must be null");
  if (!is_null_or(m, "continuing_subword_prefix", nullptr))
    fail(file, "model.continuing_subword_prefix", "must be null");
  if (!is_null_or(m, "end_of_word_suffix", nullptr)) fail(file, "model.end_of_word_suffix", "must be null");
  if (!is_null_or(m, "byte_fallback", false)) fail(file, "model.byte_fallback", "must be false");
  ModelData d;
  d.ignore_merges = m.value("ignore_merges", false);
  const json& vocab = need(m, "vocab", file, "model.vocab");
  if (!vocab.is_object()) fail(file, "model.vocab", "must be an object");
  d.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<std::int64_t>() < 0)
      fail(file, "model.vocab[\"" + it.key() + "\"]", "must be a non-negative integer id");
    d.vocab.emplace(it.key(), it.value().get<std::int32_t>());
  }
  const json& merges = need(m, "merges", file, "model.merges");
  if (!merges.is_array()) fail(file, "model.merges", "must be an array");
  d.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    if (e.is_string()) {  // "left right"
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(file, "model.merges[" + std::to_string(i) + "]", "must be \"left right\"");
      d.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      d.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      fail(file, "model.merges[" + std::to_string(i) + "]", "must be a pair of strings");
    }
  }
  return d;
}

void check_special_ids(const std::string& path,
                       const std::unordered_map<std::string, std::int32_t>& token_to_id) {
  struct Want {
    const char* token;
    std::int32_t id;
  };
  static const Want wants[] = {
      {"<｜begin▁of▁sentence｜>", kBosId}, {"<｜end▁of▁sentence｜>", kEosId},
      {"<｜User｜>", kUserId},             {"<｜Assistant｜>", kAssistantId},
      {"<think>", kThinkId},               {"</think>", kThinkEndId},
      {"｜DSML｜", kDsmlId},
  };
  for (const Want& w : wants) {
    const auto it = token_to_id.find(w.token);
    if (it == token_to_id.end())
      throw TextError(path + ": field 'added_tokens' lacks the token " + w.token +
                      " (expected id " + std::to_string(w.id) + ")");
    if (it->second != w.id)
      throw TextError(path + ": field 'added_tokens': token " + w.token + " has id " +
                      std::to_string(it->second) + ", expected " + std::to_string(w.id));
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TextError(path + ": cannot open tokenizer file");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    throw TextError(path + ": not valid JSON: " + e.what());
  }
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  try {
    check_normalizer(root, path);
    check_pre_tokenizer(root, path);
    check_post_and_decoder(root, path);
    ModelData model = read_model(root, path);
    impl->bpe = std::make_unique<Bpe>(model.vocab, model.merges, model.ignore_merges, path);

    std::size_t size = 0;
    for (const auto& [tok, id] : model.vocab) size = std::max<std::size_t>(size, id + 1);
    const json& added = need(root, "added_tokens", path, "added_tokens");
    if (!added.is_array()) fail(path, "added_tokens", "must be an array");
    for (const json& a : added) size = std::max<std::size_t>(size, a.value("id", 0) + 1);
    impl->id_to_token.assign(size, {});
    impl->added.assign(size, false);
    impl->special.assign(size, false);
    for (auto& [tok, id] : model.vocab) impl->id_to_token[id] = tok;
    impl->token_to_id = std::move(model.vocab);

    for (std::size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      const std::string content = need(a, "content", path, field + ".content").get<std::string>();
      const auto id = need(a, "id", path, field + ".id").get<std::int32_t>();
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
        fail(path, field, "uses lstrip/rstrip/single_word, which is not supported (" + content + ")");
      impl->id_to_token[id] = content;
      impl->added[id] = true;
      impl->special[id] = a.value("special", false);
      impl->token_to_id[content] = id;
      if (a.value("normalized", !a.value("special", false)))
        impl->normalized_tokens.add(content, id);
      else
        impl->raw_tokens.add(content, id);
    }
  } catch (const json::exception& e) {
    throw TextError(path + ": unexpected JSON structure: " + e.what());
  }
  check_special_ids(path, impl->token_to_id);
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<std::int32_t>& out) const {
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  pretokenize(text, pieces);
  for (std::string_view p : pieces) bpe->encode_piece(p, out);
}

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<std::int32_t>& out) const {
  // The normalizer is the identity (checked at load), so this is the second
  // added-token pass over the pieces left by the first.
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto m = normalized_tokens.find(text, pos);
    if (m.id < 0) break;
    if (m.pos > pos) encode_plain(text.substr(pos, m.pos - pos), out);
    out.push_back(m.id);
    pos = m.pos + m.len;
  }
  if (pos < text.size()) encode_plain(text.substr(pos), out);
}

void Tokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::sanitize(text);
    text = repaired;
  }
  const Impl& t = *impl_;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto m = t.raw_tokens.find(text, pos);
    if (m.id < 0) break;
    if (m.pos > pos) t.encode_normalized(text.substr(pos, m.pos - pos), out);
    out.push_back(m.id);
    pos = m.pos + m.len;
  }
  if (pos < text.size()) t.encode_normalized(text.substr(pos), out);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, out);
  return out;
}

bool Tokenizer::token_bytes(std::int32_t id, std::string& out, bool skip_special) const {
  const Impl& t = *impl_;
  if (id < 0 || static_cast<std::size_t>(id) >= t.id_to_token.size() || t.id_to_token[id].empty())
    return false;
  if (skip_special && t.special[id]) return true;
  byte_level::token_to_bytes(t.id_to_token[id], out);
  return true;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const std::int32_t id : ids) token_bytes(id, bytes, skip_special);
  return utf8::is_valid(bytes) ? bytes : utf8::sanitize(bytes);
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::id_to_token(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_to_token.size()) return {};
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[id];
}

std::size_t Tokenizer::vocab_size() const { return impl_->id_to_token.size(); }

const std::string& Tokenizer::path() const { return impl_->path; }

std::string default_tokenizer_path() {
  if (const char* env = std::getenv("DSV4_TOKENIZER"); env != nullptr && *env != '\0') return env;
  return std::string(DSV4_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json";
}

}  // namespace dsv4::text
