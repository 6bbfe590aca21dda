// Readers for the binary fixtures written by tools/text/gen_tokenizer_corpus.py.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsv4::text::testing {

inline std::string data_path(const std::string& name) {
  return std::string(DSV4_SOURCE_DIR) + "/tests/text/data/" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Reader {
 public:
  Reader(std::string data, const std::string& magic) : d_(std::move(data)) {
    if (d_.compare(0, magic.size(), magic) != 0) throw std::runtime_error("bad magic " + magic);
    p_ = magic.size();
  }
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(d_[p_ + i])) << (8 * i);
    p_ += 4;
    return v;
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      need(1);
      const auto b = static_cast<unsigned char>(d_[p_++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::string bytes(std::size_t n) {
    need(n);
    std::string s = d_.substr(p_, n);
    p_ += n;
    return s;
  }
  std::vector<std::int32_t> ids() {
    std::vector<std::int32_t> v(varint());
    for (auto& x : v) x = static_cast<std::int32_t>(varint());
    return v;
  }

 private:
  void need(std::size_t n) const {
    if (p_ + n > d_.size()) throw std::runtime_error("truncated fixture");
  }
  std::string d_;
  std::size_t p_ = 0;
};

inline std::vector<std::string> read_corpus() {
  Reader r(read_file(data_path("corpus.bin")), "DSV4CORP");
  std::vector<std::string> docs(r.u32());
  for (auto& d : docs) d = r.bytes(r.u32());
  return docs;
}

inline std::vector<std::vector<std::int32_t>> read_corpus_ids() {
  Reader r(read_file(data_path("corpus_ids.bin")), "DSV4IDS1");
  std::vector<std::vector<std::int32_t>> ids(r.u32());
  for (auto& v : ids) v = r.ids();
  return ids;
}

}  // namespace dsv4::text::testing
