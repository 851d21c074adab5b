// The lightning indexer of CSA layers on the GPU (SPEC.md 3.4, 5a). CPU twins: cpu/indexer.h.
//
//   indexer_query     q [tokens][heads][128] (the wq_b product, bf16) finished in place: RoPE
//                     on the last 64 dims of each head (bf16), Hadamard (scale 128^-0.5, bf16),
//                     FP4-simulated in blocks of 32 (stored as the exact bf16 values).
//   indexer_scores    score[t][j] = bf16(sum_h bf16(ReLU(bf16(q_h . k_j)) * w_h)) for every
//                     complete entry j < (position + 1) / 4 of the token's row, keys read from
//                     the indexer cache (fp4 / fp8 / bf16) through the block table; w_h =
//                     bf16(weights_proj product * 128^-0.5 * heads^-0.5). FP4 and FP8 keys: FP8
//                     tensor cores on the exact e4m3 forms of q and k (indexer_scores_e4m3.cu,
//                     needs q_work); bf16 keys: bf16 mma. Entries past a token's complete ones
//                     are not written.
//   indexer_top_k     per token, the min(k, complete) best entries (ties to the lower index,
//                     as top_k_indices), listed in ascending entry order, and their count. A
//                     radix select on the scores' 16-bit keys: one CTA a token, or, for long
//                     rows and few tokens, each row split into segments (indexer_top_k_segments)
//                     whose CTAs build the histograms and write their selections in place
//                     (needs top_k_work and key_counts; without them one CTA a token). Call it after
//                     indexer_scores with the same args: with key_counts, the FP8 tensor-core
//                     scores kernel does the first radix pass itself (indexer_scores_count_keys).
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/kernels/compressor.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

struct IndexerArgs {
  const DeviceStep* step = nullptr;
  std::int32_t capacity = 0;          // tokens the grid covers
  std::int32_t token0 = 0;            // first step token of this call (the step may be split)
  std::int32_t heads = 64;
  std::uint16_t* q = nullptr;         // [tokens][heads][128]
  const std::uint16_t* weights = nullptr;  // [tokens][heads] bf16 (weights_proj product, unscaled)
  std::int32_t key_group = 0;         // the indexer-KV group in step->groups
  std::int32_t layer_slot = 0;
  IndexerFormat format = IndexerFormat::kFp4;
  float* scores = nullptr;            // [capacity][max_entries], row i = token token0 + i
  std::int64_t max_entries = 0;
  std::int32_t top_k = 512;
  std::int32_t* top_idx = nullptr;    // [capacity][top_k] ascending entries
  std::int32_t* top_count = nullptr;  // [capacity]
  std::int32_t sm_count = 132;        // the GPU's SMs (how many CTAs share a token's entries)
  std::int32_t ctas_per_token = 0;    // 0: chosen by the grid size (tests force 1: one CTA walks every tile)
  std::int32_t top_k_segments = 0;    // 0: indexer_top_k_segments; 1: one CTA a token
  std::int32_t* top_k_work = nullptr; // indexer_top_k_work_ints(capacity, segments) ints (null: one CTA a token)
  std::uint8_t* q_work = nullptr;     // indexer_q_work_bytes(capacity): needed for FP4 / FP8 keys
                                      // (scored on FP8 tensor cores); bf16 keys do not use it
  std::int32_t* key_counts = nullptr; // indexer_key_count_ints(capacity) ints, zero before the first call
                                      // (fill them once; each call leaves them zero), or null: the
                                      // top-k then takes one CTA a token
};

// Bytes of IndexerArgs::q_work for `tokens` tokens (the queries folded to e4m3, the weights).
std::int64_t indexer_q_work_bytes(std::int64_t tokens);

// Ints of IndexerArgs::key_counts for `tokens` tokens (a token's two radix passes: 256 counts and
// an arrival count each).
std::int64_t indexer_key_count_ints(std::int64_t tokens);

// Segments a row for indexer_top_k (1: one CTA a token), and the workspace they need.
std::int32_t indexer_top_k_segments(std::int64_t capacity, std::int64_t max_entries, std::int32_t sm_count);
std::int32_t indexer_top_k_segments(const IndexerArgs& args);  // args.top_k_segments, or the choice above
std::int64_t indexer_top_k_work_ints(std::int64_t capacity, std::int32_t segments);

void indexer_query(const IndexerArgs& args, gpu_stream_t stream);
void indexer_scores(const IndexerArgs& args, gpu_stream_t stream);
void indexer_top_k(const IndexerArgs& args, gpu_stream_t stream);

}  // namespace dsv4::gpu
