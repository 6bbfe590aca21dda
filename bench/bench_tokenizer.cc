// Encode throughput of dsv4::text::Tokenizer on the tokenizer test corpus
// (tests/text/data/corpus.bin), single-threaded. Not a test. Run through
// tools/text/bench_tokenizer.sh, which also times HF tokenizers on the same
// documents.
//
// Usage: bench_tokenizer [corpus.bin] [tokenizer.json] [passes]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

std::vector<std::string> read_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string d{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (d.size() < 12 || d.compare(0, 8, "DSV4CORP") != 0) {
    std::fprintf(stderr, "bad corpus %s\n", path.c_str());
    std::exit(1);
  }
  auto u32 = [&d](std::size_t p) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(d[p + i])) << (8 * i);
    return v;
  };
  std::vector<std::string> docs(u32(8));
  std::size_t p = 12;
  for (auto& doc : docs) {
    const std::uint32_t n = u32(p);
    doc = d.substr(p + 4, n);
    p += 4 + n;
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string src = DSV4_SOURCE_DIR;
  const std::string corpus = argc > 1 ? argv[1] : src + "/tests/text/data/corpus.bin";
  const std::string tok_path = argc > 2 ? argv[2] : dsv4::text::default_tokenizer_path();
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;

  const auto docs = read_corpus(corpus);
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto tok = dsv4::text::Tokenizer::load(tok_path);
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();

  std::vector<std::int32_t> ids;
  double best = 1e30, first = 0;
  std::size_t n_ids = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t = clock::now();
    n_ids = 0;
    for (const auto& d : docs) {
      ids.clear();
      tok.encode(d, ids);
      n_ids += ids.size();
    }
    const double s = std::chrono::duration<double>(clock::now() - t).count();
    if (pass == 0) first = s;
    best = std::min(best, s);
  }
  std::printf("dsv4 load: %.3f s\n", load_s);
  std::printf("dsv4 encode: %zu docs, %.2f MB, %zu ids; first pass %.3f s (%.2f MB/s), best of %d %.3f s (%.2f MB/s)\n",
              docs.size(), bytes / 1e6, n_ids, first, bytes / 1e6 / first, passes, best, bytes / 1e6 / best);
  return 0;
}
