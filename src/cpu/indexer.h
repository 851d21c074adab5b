// Lightning indexer of CSA layers (SPEC.md 3.4, 5a; DeepSeek-V4 inference/model.py Indexer).
// Its keys are the indexer compressor's entries (compressor.h, CompressorKind::kIndexer).
//
//   indexer_query:   q = wq_b . qr (linear: FP8 activations, bf16 out) viewed [n_heads, hd];
//                    per head RoPE on the last rope_dim dims at t (fp32, bf16 store), no head
//                    norm; Hadamard over hd (scale hd^-0.5, fp32) rounded to bf16 (the reference's
//                    rotate_activation returns bf16); FP4-simulate in blocks of 32.
//   indexer_weights: w = bf16(bf16(weights_proj . x) * fp32(hd^-0.5 * n_heads^-0.5))
//                    (bf16 linear, then the bf16 tensor times the scalar).
//   indexer_scores:  for key j: score_j = bf16( sum_h bf16( ReLU(bf16(q_h . k_j)) * w_h ) ) --
//                    the bf16 einsum (fp32 sequential dot, bf16 result), ReLU, the bf16 product
//                    with the weights, and the fp32 sum over heads (h ascending) rounded to bf16.
//   top_k_indices:   the min(k, n) highest scores; ties go to the lower index (NaN ranks
//                    lowest); returned by descending score, then ascending index.
// Size mismatches throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"
#include "numerics/rope.h"

namespace dsv4 {

struct IndexerParams {
  std::int64_t n_heads = 64;    // index_n_heads
  std::int64_t head_dim = 128;  // index_head_dim
  std::int64_t rope_dim = 64;
  std::int64_t topk = 512;  // index_topk
};

// qr [rows, q_lora] (bf16 values), positions [rows] -> q [rows, n_heads * head_dim].
void indexer_query(std::span<const float> qr, std::int64_t rows, std::span<const std::int64_t> positions,
                   const DenseWeight& wq_b, const RopeTable& rope, const IndexerParams& params, std::span<float> q,
                   ThreadPool* pool = nullptr);

// fp32(head_dim^-0.5 * n_heads^-0.5), the product taken in double as the reference's Python floats.
float indexer_weight_scale(const IndexerParams& params);

// x [rows, D] (bf16 values) -> w [rows, n_heads].
void indexer_weights(std::span<const float> x, std::int64_t rows, const DenseWeight& weights_proj,
                     const IndexerParams& params, std::span<float> w, ThreadPool* pool = nullptr);

// One query: q [n_heads * head_dim], w [n_heads], keys [n_keys * head_dim] -> scores [n_keys].
void indexer_scores(std::span<const float> q, std::span<const float> w, std::span<const float> keys,
                    const IndexerParams& params, std::span<float> scores, ThreadPool* pool = nullptr);

// Indices of the min(k, scores.size()) best scores (k >= 0), see above.
std::vector<std::int64_t> top_k_indices(std::span<const float> scores, std::int64_t k);

}  // namespace dsv4
