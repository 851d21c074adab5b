#include "executor/dump_recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/npy.h"

namespace dsv4 {

DumpRecorder::DumpRecorder(const ModelConfig& config, std::int64_t tokens)
    : config_(config), tokens_(tokens), width_(config.hc_mult * config.hidden_size) {
  const auto layers = static_cast<std::size_t>(config.num_hidden_layers);
  const auto T = static_cast<std::size_t>(tokens);
  hidden_.assign(layers, std::vector<float>(T * static_cast<std::size_t>(width_), 0.0f));
  hidden_seen_.assign(layers, std::vector<bool>(T, false));
  window_.assign(layers, std::vector<std::vector<std::int64_t>>(T));
  compressed_.assign(layers, std::vector<std::vector<std::int64_t>>(T));
  scores_.assign(layers, std::vector<std::vector<float>>(T));
  attention_seen_.assign(layers, std::vector<bool>(T, false));
}

void DumpRecorder::hidden(std::int64_t layer, std::span<const std::int64_t>, std::span<const std::int64_t> positions,
                          std::span<const float> hidden) {
  for (std::size_t t = 0; t < positions.size(); ++t) {
    const std::int64_t p = positions[t];
    if (p < 0 || p >= tokens_) continue;
    std::copy_n(hidden.begin() + static_cast<std::ptrdiff_t>(t) * width_, width_,
                hidden_[static_cast<std::size_t>(layer)].begin() + p * width_);
    hidden_seen_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(p)] = true;
  }
}

void DumpRecorder::attention(std::int64_t layer, const AttentionTap& tap) {
  if (tap.position < 0 || tap.position >= tokens_) return;
  const auto l = static_cast<std::size_t>(layer), p = static_cast<std::size_t>(tap.position);
  window_[l][p].assign(tap.window_positions.begin(), tap.window_positions.end());
  compressed_[l][p].assign(tap.compressed_entries.begin(), tap.compressed_entries.end());
  scores_[l][p].assign(tap.indexer_scores.begin(), tap.indexer_scores.end());
  attention_seen_[l][p] = true;
}

void DumpRecorder::write_hidden(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  for (std::size_t l = 0; l < hidden_.size(); ++l) {
    if (std::find(hidden_seen_[l].begin(), hidden_seen_[l].end(), false) != hidden_seen_[l].end())
      fail("dump: block {} has positions that were never computed", l);
    const std::int64_t shape[3] = {tokens_, config_.hc_mult, config_.hidden_size};
    write_npy(dir / fmt::format("hidden{}.npy", l), hidden_[l], shape);
  }
}

namespace {

std::vector<std::int32_t> padded(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t width) {
  std::vector<std::int32_t> out(rows.size() * static_cast<std::size_t>(width), -1);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t k = 0; k < rows[r].size(); ++k)
      out[r * static_cast<std::size_t>(width) + k] = static_cast<std::int32_t>(rows[r][k]);
  return out;
}

template <typename T>
std::int64_t widest(const std::vector<std::vector<T>>& rows) {
  std::size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.size());
  return static_cast<std::int64_t>(w);
}

}  // namespace

void DumpRecorder::write_attention(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  for (std::size_t l = 0; l < window_.size(); ++l) {
    if (std::find(attention_seen_[l].begin(), attention_seen_[l].end(), false) != attention_seen_[l].end())
      fail("dump: block {} has positions that were never computed", l);
    const std::int64_t win = std::max(widest(window_[l]), config_.sliding_window);
    const std::int64_t window_shape[2] = {tokens_, win};
    write_npy(dir / fmt::format("window_keys{}.npy", l), padded(window_[l], win), window_shape);
    const std::int64_t ratio = config_.compress_ratio(static_cast<std::int64_t>(l));
    if (ratio == 0) continue;
    const std::int64_t k = widest(compressed_[l]);
    const std::int64_t compressed_shape[2] = {tokens_, k};
    write_npy(dir / fmt::format("compressed_keys{}.npy", l), padded(compressed_[l], k), compressed_shape);
    if (ratio != 4) continue;
    const std::int64_t n = widest(scores_[l]);
    std::vector<float> scores(static_cast<std::size_t>(tokens_ * n), -std::numeric_limits<float>::infinity());
    for (std::size_t p = 0; p < scores_[l].size(); ++p)
      std::copy(scores_[l][p].begin(), scores_[l][p].end(), scores.begin() + static_cast<std::ptrdiff_t>(p) * n);
    const std::int64_t score_shape[2] = {tokens_, n};
    write_npy(dir / fmt::format("indexer_scores{}.npy", l), scores, score_shape);
  }
}

}  // namespace dsv4
