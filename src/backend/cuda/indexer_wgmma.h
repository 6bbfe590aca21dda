// The FP8 tensor-core indexer kernel (indexer_wgmma.cu), called by cuda::indexer_scores_fp8 for
// IndexerArgs::fp8_q after it has validated the arguments.
#pragma once
#include "backend/cuda/kernels.h"

namespace dsv4::cuda::idx {

// How both indexer kernels split a row of n_units key units over CTAs: ctas per query group (of groups) and
// units per worker (warp or warpgroup; `workers` per CTA), at least min_units each. At most one wave of the
// `slots` resident CTAs over all groups (floor: a second, mostly empty wave would double the time), at least one.
struct KeySplit {
  int64_t ctas = 1, units_per_worker = 1;
};
KeySplit split_keys(int64_t slots, int64_t groups, int64_t n_units, int workers, int64_t min_units);

bool fp8_q_supported();  // compute capability 9.0
void launch_fp8_q(const IndexerArgs& a, cudaStream_t stream);

}  // namespace dsv4::cuda::idx
