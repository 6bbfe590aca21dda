// The FP8 tensor-core indexer kernel (indexer_wgmma.cu), called by cuda::indexer_scores_fp8 for
// IndexerArgs::fp8_q after it has validated the arguments.
#pragma once
#include "backend/cuda/kernels.h"

namespace dsv4::cuda::idx {

bool fp8_q_supported();  // compute capability 9.0
void launch_fp8_q(const IndexerArgs& a, cudaStream_t stream);

}  // namespace dsv4::cuda::idx
