#include "text/bpe.h"

#include <queue>

#include "text/byte_level.h"
#include "text/error.h"
#include "text/utf8.h"

namespace dsv4::text {

Bpe::Bpe(const std::unordered_map<std::string, std::int32_t>& vocab,
         const std::vector<std::pair<std::string, std::string>>& merges,
         bool ignore_merges, const std::string& file)
    : ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    const std::string& c = byte_level::byte_to_token_char(static_cast<std::uint8_t>(b));
    const auto it = vocab.find(c);
    if (it == vocab.end())
      throw TextError(file + ": field 'model.vocab' lacks the byte-level token for byte " +
                      std::to_string(b));
    byte_id_[b] = it->second;
  }
  merges_.reserve(merges.size() * 2);
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end())
      throw TextError(file + ": field 'model.merges[" + std::to_string(r) + "]' (\"" + a + " " +
                      b + "\") names a token missing from 'model.vocab'");
    // A repeated pair keeps its first (lowest) rank, as a map insert would.
    merges_.try_emplace(key(ia->second, ib->second),
                        Merge{static_cast<std::int32_t>(r), ic->second});
  }
  if (ignore_merges_) {
    for (const auto& [tok, id] : vocab) {
      std::string bytes;
      byte_level::token_to_bytes(tok, bytes);
      byte_vocab_.emplace(std::move(bytes), id);
    }
  }
}

void Bpe::encode_piece(std::string_view bytes, std::vector<std::int32_t>& out) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    out.push_back(byte_id_[static_cast<std::uint8_t>(bytes[0])]);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t start = out.size();
  if (ignore_merges_) {
    const auto it = byte_vocab_.find(bytes);
    if (it != byte_vocab_.end()) out.push_back(it->second);
    else merge(bytes, out);
  } else {
    merge(bytes, out);
  }
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < kCacheCapacity)
    cache_.emplace(std::string(bytes), std::vector<std::int32_t>(out.begin() + start, out.end()));
}

void Bpe::merge(std::string_view bytes, std::vector<std::int32_t>& out) const {
  struct Symbol {
    std::int32_t id;
    int prev, next;
    bool alive;
  };
  struct Cand {
    std::int32_t rank;
    int pos;
    std::int32_t id;
    // priority_queue is a max-heap: "less" means higher rank, then later pos.
    bool operator<(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int n = static_cast<int>(bytes.size());
  std::vector<Symbol> sym(n);
  for (int i = 0; i < n; ++i)
    sym[i] = {byte_id_[static_cast<std::uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1, true};

  std::priority_queue<Cand> queue;
  auto consider = [&](int pos) {
    const int nx = sym[pos].next;
    if (nx < 0) return;
    const auto it = merges_.find(key(sym[pos].id, sym[nx].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Symbol& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    // Skip stale entries: the pair at this position must still produce top.id.
    const auto it = merges_.find(key(s.id, sym[s.next].id));
    if (it == merges_.end() || it->second.id != top.id) continue;
    Symbol& right = sym[s.next];
    s.id = top.id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(top.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace dsv4::text
