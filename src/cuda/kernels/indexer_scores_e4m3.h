// Indexer scores on FP8 tensor cores for FP4 and FP8 indexer keys (indexer_scores_e4m3.cu);
// indexer_scores (indexer.h) calls it for those formats.
#pragma once

#include <cstdint>

#include "cuda/kernels/indexer.h"

namespace dsv4::gpu {

void indexer_scores_e4m3(const IndexerArgs& args, float weight_scale, gpu_stream_t stream);

// Whether indexer_scores, called with these args, also counts the scores' high key bytes into
// the top-k workspace (hist0 row 0 of each token), so that indexer_top_k skips that pass: the
// FP8 tensor-core path with a segmented top-k workspace.
inline bool indexer_scores_count_keys(const IndexerArgs& args) {
  return args.q_work != nullptr && args.format != IndexerFormat::kBf16 && args.top_k_work != nullptr &&
         indexer_top_k_segments(args) > 1;
}

}  // namespace dsv4::gpu
