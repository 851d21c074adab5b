// Indexer scores on FP8 tensor cores for FP4 and FP8 indexer keys (indexer_scores_e4m3.cu);
// indexer_scores (indexer.h) calls it for those formats.
#pragma once

#include <cstdint>

#include "cuda/kernels/indexer.h"

namespace dsv4::gpu {

void indexer_scores_e4m3(const IndexerArgs& args, float weight_scale, gpu_stream_t stream);

// Whether indexer_scores, called with these args, also does the top-k's first radix pass: it
// counts the scores' high key bytes into key_counts and its last CTA of a token writes the bin of
// the k-th largest key (and how many of it are still needed) into the top-k workspace's sel, so
// indexer_top_k starts at the second pass. The FP8 tensor-core path with key counts and a
// segmented top-k workspace.
inline bool indexer_scores_count_keys(const IndexerArgs& args) {
  return args.key_counts != nullptr && args.q_work != nullptr && args.format != IndexerFormat::kBf16 && args.top_k_work != nullptr &&
         indexer_top_k_segments(args) > 1;
}

}  // namespace dsv4::gpu
