// Inspector: taps into an executor (CPU or GPU) for layer-by-layer comparison with other engines
// (`dsv4 logits --dump-hidden / --dump-attention`, docs/inspection.md). The executor calls
// it once per layer of every step, after the block, with the step's tokens identified by
// (sequence, position), so a recorder can assemble whole sequences across chunked prefill
// and decode steps.
#pragma once

#include <cstdint>
#include <span>

namespace dsv4 {

struct AttentionTap {
  std::int64_t seq = 0;
  std::int64_t position = 0;
  std::span<const std::int64_t> window_positions;     // ascending: max(0, t-127)..t
  std::span<const std::int64_t> compressed_entries;   // ascending entry indices j attended
  std::span<const float> indexer_scores;              // CSA: score of every complete entry; else empty
};

class Inspector {
 public:
  virtual ~Inspector() = default;
  // Residual streams after block `layer`: hidden [tokens, hc * D], tokens in step order.
  virtual void hidden(std::int64_t layer, std::span<const std::int64_t> seqs, std::span<const std::int64_t> positions,
                      std::span<const float> hidden) = 0;
  // The key set of one query of block `layer`.
  virtual void attention(std::int64_t layer, const AttentionTap& tap) = 0;
};

}  // namespace dsv4
