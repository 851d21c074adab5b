// Indexer scores on FP8 tensor cores for FP4 and FP8 indexer keys (indexer_scores_e4m3.cu);
// indexer_scores (indexer.h) calls it when the call carries a q_work buffer.
#pragma once

#include <cstdint>

#include "cuda/kernels/indexer.h"

namespace dsv4::gpu {

void indexer_scores_e4m3(const IndexerArgs& args, float weight_scale, gpu_stream_t stream);

}  // namespace dsv4::gpu
