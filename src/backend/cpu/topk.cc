#include "backend/cpu/topk.h"

#include "backend/cpu/selection_margin.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dsv4::cpu {

void topk_row(const float* scores, int64_t n, int k, int32_t* out) {
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(scores[i]) && scores[i] != -INFINITY) idx.push_back(static_cast<int32_t>(i));
  const size_t take = std::min<size_t>(static_cast<size_t>(k), idx.size());
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::nth_element(idx.begin(), idx.begin() + take, idx.end(), better);
  if (selection_margin_tracking() && take > 0 && take < idx.size()) {  // the first unselected is idx[take]
    float last = scores[idx[0]], scale = 0.0f;
    for (size_t i = 1; i < take; ++i) last = std::min(last, scores[idx[i]]);
    for (int32_t i : idx) scale = std::max(scale, std::fabs(scores[i]));
    note_selection_gap(last, scores[idx[take]], scale);
  }
  std::sort(idx.begin(), idx.begin() + take);
  for (size_t i = 0; i < take; ++i) out[i] = idx[i];
  for (size_t i = take; i < static_cast<size_t>(k); ++i) out[i] = -1;
}

}  // namespace dsv4::cpu
