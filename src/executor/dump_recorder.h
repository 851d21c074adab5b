// DumpRecorder: an Inspector that assembles one sequence's taps across steps (any mix of
// chunked prefill and decode) and writes them as .npy files (docs/inspection.md):
//   hiddenL.npy           float32 [T, hc, D]   residual streams right after block L
//   window_keysL.npy      int32   [T, win]     window positions each query attended, -1 padded
//   compressed_keysL.npy  int32   [T, K]       compressed entries attended (CSA: the indexer's
//                                              top-k; HCA: every complete block), -1 padded
//   indexer_scoresL.npy   float32 [T, T/4]     CSA layers: score of every complete entry,
//                                              -inf padded
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "executor/inspector.h"
#include "model/model_config.h"

namespace dsv4 {

class DumpRecorder final : public Inspector {
 public:
  DumpRecorder(const ModelConfig& config, std::int64_t tokens);

  void hidden(std::int64_t layer, std::span<const std::int64_t> seqs, std::span<const std::int64_t> positions,
              std::span<const float> hidden) override;
  void attention(std::int64_t layer, const AttentionTap& tap) override;

  // Throws Error when a position of the sequence was never recorded.
  void write_hidden(const std::filesystem::path& dir) const;
  void write_attention(const std::filesystem::path& dir) const;

  // For tests: what was recorded.
  const std::vector<float>& hidden_of(std::int64_t layer) const { return hidden_[static_cast<std::size_t>(layer)]; }
  const std::vector<std::vector<std::int64_t>>& window_of(std::int64_t layer) const {
    return window_[static_cast<std::size_t>(layer)];
  }
  const std::vector<std::vector<std::int64_t>>& compressed_of(std::int64_t layer) const {
    return compressed_[static_cast<std::size_t>(layer)];
  }
  const std::vector<std::vector<float>>& scores_of(std::int64_t layer) const {
    return scores_[static_cast<std::size_t>(layer)];
  }

 private:
  ModelConfig config_;
  std::int64_t tokens_;
  std::int64_t width_;  // hc * D
  std::vector<std::vector<float>> hidden_;                         // [layer][T * width]
  std::vector<std::vector<bool>> hidden_seen_;                     // [layer][T]
  std::vector<std::vector<std::vector<std::int64_t>>> window_;     // [layer][T][keys]
  std::vector<std::vector<std::vector<std::int64_t>>> compressed_;
  std::vector<std::vector<std::vector<float>>> scores_;
  std::vector<std::vector<bool>> attention_seen_;
};

}  // namespace dsv4
