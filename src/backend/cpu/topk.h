// Exact top-k of one row with a deterministic tie-break: among equal values the lowest index wins, so the
// result never depends on row length, batch or kernel path. NaN and -inf entries are never selected.
// Output: the selected indices in ascending index order, then -1 in the remaining slots (when fewer than
// k entries are selectable).
#pragma once
#include <cstdint>

namespace dsv4::cpu {

void topk_row(const float* scores, int64_t n, int k, int32_t* out);

}  // namespace dsv4::cpu
